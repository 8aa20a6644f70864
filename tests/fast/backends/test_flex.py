"""Tests of fast.backends.flex: FlexAttention mask_mod / BlockMask against reference/.

Child et al., 2019, sec. 4.3 and 5.1 (patterns, combine modes), and the two
neighbours Longformer and BigBird. PyTorch 2.13 has no FlexAttention backward on
CPU, so only the forward is compared.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from fast.backends.flex import block_mask, flex_sparse_attention, mask_mod
from fast.layout import block_layout
from reference import patterns as ref
from reference.attention import attend
from tests.conftest import make_qkv

CASES = [  # (pattern, n, n_heads, combine, layer, params): odd n, n < 128, H = 1 and H > 1
    ("full", 150, 1, "merged", 0, {}),
    ("strided", 150, 3, "merged", 0, dict(stride=7)),
    ("strided", 61, 2, "multihead", 0, dict(stride=16)),
    ("strided", 130, 2, "interleaved", 1, dict(stride=12)),
    ("fixed", 150, 4, "merged", 0, dict(stride=16, c=4)),
    ("fixed", 140, 4, "multihead", 0, dict(stride=16, c=4)),   # odd heads: empty early rows
    ("fixed", 97, 1, "interleaved", 1, dict(stride=10, c=3)),
    ("longformer", 150, 2, "merged", 0, dict(window=5, dilation=3, global_tokens=(0, 77))),
    ("bigbird", 150, 3, "merged", 0, dict(window=4, n_random=3, n_global=2, seed=1)),
]


def reference_mask(pattern, n, n_heads, combine, layer, params) -> np.ndarray:
    """bool (H, n, n) from reference.patterns."""
    if pattern == "longformer":
        m = ref.longformer(n, params["window"], params.get("dilation", 1),
                           params.get("global_tokens", ()))
    elif pattern == "bigbird":
        m = ref.bigbird(n, params["window"], params["n_random"], params["n_global"],
                        params.get("seed", 0))
    else:
        return ref.head_masks(pattern, n, n_heads, combine, layer, **params)
    return np.broadcast_to(m, (n_heads, n, n))


def ordered_to_dense(count, index, nb) -> torch.Tensor:
    """(H, nb, nb) bool from FlexAttention's ordered tables count (H, nb), index (H, nb, K)."""
    out = torch.zeros(count.shape[0], nb, nb, dtype=torch.bool)
    for h in range(count.shape[0]):
        for qb in range(nb):
            out[h, qb, index[h, qb, : int(count[h, qb])].long()] = True
    return out


def ids(case):
    return f"{case[0]}-n{case[1]}-H{case[2]}-{case[3]}{case[4]}"


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_mask_mod_matches_reference(case):
    pattern, n, n_heads, combine, layer, params = case
    mod = mask_mod(pattern, n, n_heads, combine, layer, **params)
    h = torch.arange(n_heads)[:, None, None]
    i = torch.arange(n)[None, :, None]
    j = torch.arange(n)[None, None, :]
    got = mod(torch.zeros((), dtype=torch.long), h, i, j).expand(n_heads, n, n)  # (H, n, n)
    np.testing.assert_array_equal(got.numpy(), reference_mask(*case))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_block_mask_is_the_natural_layout(case):
    pattern, n, n_heads, combine, layer, params = case
    bm = block_mask(pattern, n, n_heads, combine, layer, **params)
    layout = block_layout(pattern, n, n_heads, combine, layer, block_size=128,
                          order="natural", **params)
    part, nb = layout.parts[0], layout.n_blocks
    assert bm.BLOCK_SIZE == (128, 128) and bm.seq_lengths == (n, n)
    want_full = torch.zeros(n_heads, nb, nb, dtype=torch.bool)
    want_partial = torch.zeros(n_heads, nb, nb, dtype=torch.bool)
    for h in range(n_heads):
        for qb in range(nb):
            c = int(part.kv_count[h, qb])
            for kb, m in zip(part.kv_index[h, qb, :c].tolist(), part.kv_mask[h, qb, :c].tolist()):
                (want_full if m < 0 else want_partial)[h, qb, kb] = True
    got_partial = ordered_to_dense(bm.kv_num_blocks[0], bm.kv_indices[0], nb)
    got_full = ordered_to_dense(bm.full_kv_num_blocks[0], bm.full_kv_indices[0], nb)
    assert torch.equal(got_partial, want_partial)
    assert torch.equal(got_full, want_full)
    # FlexAttention's own builder (which evaluates all n^2 pairs; fine at this n)
    # finds the same full and partial blocks from our mask_mod.
    theirs = create_block_mask(mask_mod(pattern, n, n_heads, combine, layer, **params),
                               1, n_heads, n, n, device="cpu")
    assert torch.equal(theirs.to_dense().bool(), bm.to_dense().bool())
    assert torch.equal(theirs.full_kv_num_blocks, bm.full_kv_num_blocks)


# Eager FlexAttention pays a few seconds once per shape: most cases share one.
FLEX_CASES = [
    ("full", 150, 4, "merged", 0, {}),
    ("strided", 150, 4, "merged", 0, dict(stride=7)),
    ("strided", 150, 4, "multihead", 0, dict(stride=16)),
    ("fixed", 150, 4, "multihead", 0, dict(stride=16, c=4)),   # odd heads: empty early rows
    ("fixed", 150, 4, "interleaved", 1, dict(stride=10, c=2)),
    ("longformer", 150, 4, "merged", 0, dict(window=5, dilation=3, global_tokens=(0, 77))),
    ("bigbird", 150, 4, "merged", 0, dict(window=4, n_random=3, n_global=2, seed=1)),
    ("strided", 61, 1, "interleaved", 1, dict(stride=12)),     # n < block, one head
]


@pytest.mark.parametrize("case", FLEX_CASES, ids=ids)
def test_flex_attention_matches_reference(case):
    pattern, n, n_heads, combine, layer, params = case
    q, k, v = make_qkv(n, 48, (1, n_heads))
    want, _ = attend(q, k, v, reference_mask(*case))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        got = flex_sparse_attention(*(torch.from_numpy(x).float() for x in (q, k, v)),
                                    pattern, combine=combine, layer=layer, compile=False,
                                    **params)
    err = float(np.abs(got.double().numpy() - want).max())
    print(f"{ids(case)}: max |flex - reference| = {err:.2e}")
    assert got.shape == (1, n_heads, n, 48)
    assert err < 1e-5


@pytest.mark.slow
def test_compiled_flex_attention_matches_reference():
    """One compiled case (about 20 s to compile on a CPU): per-head lookup tensors
    must be contiguous for inductor's CPU template, and rows that read nothing
    (odd heads of fixed multihead at the start) must give 0."""
    case = ("fixed", 140, 2, "multihead", 0, dict(stride=16, c=4))
    q, k, v = make_qkv(140, 48, (1, 2))
    want, _ = attend(q, k, v, reference_mask(*case))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = flex_sparse_attention(*(torch.from_numpy(x).float() for x in (q, k, v)),
                                    "fixed", stride=16, c=4, combine="multihead")
    err = float(np.abs(got.double().numpy() - want).max())
    print(f"compiled fixed multihead: max |flex - reference| = {err:.2e}")
    assert err < 1e-5
    assert torch.equal(got[0, 1, :12], torch.zeros(12, 48))   # reads nothing before j = 12


@pytest.mark.parametrize("kwargs,match", [
    (dict(pattern="dense", n=8, n_heads=1), "pattern must be one of"),
    (dict(pattern="strided", n=8, n_heads=1), "needs the parameter 'stride'"),
    (dict(pattern="fixed", n=8, n_heads=1, stride=4, c=8), "at most the stride"),
    (dict(pattern="full", n=8, n_heads=0), "n_heads must be"),
    (dict(pattern="full", n=8, n_heads=1, combine="sum"), "combine must be"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mask_mod(**kwargs)
    with pytest.raises(ValueError, match=match):
        block_mask(**kwargs)


def test_bad_qkv_shape():
    x = torch.zeros(4, 8, 16)
    with pytest.raises(ValueError, match=r"\(B, H, n, d\)"):
        flex_sparse_attention(x, x, x, "full", compile=False)
    q, kv = torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flex_sparse_attention(q, kv, kv, "full", compile=False)
    with pytest.raises(ValueError, match="n_q <= n_k"):
        flex_sparse_attention(q, q[:, :, :5], q[:, :, :5], "full", compile=False)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.5", True])
def test_bad_scale_and_dtypes(scale):
    """A scale that sparse_attention refuses is refused here too (NaN and inf came back
    as an all-NaN output); mixed dtypes are refused (eager returned float32); compiled
    float64 on the CPU is refused before the compiler fails inside."""
    q = torch.zeros(1, 2, 8, 16)
    with pytest.raises(ValueError, match="scale must be a finite real number or None"):
        flex_sparse_attention(q, q, q, "full", scale=scale, compile=False)
    with pytest.raises(ValueError, match="one dtype, got torch.float32, torch.float64"):
        flex_sparse_attention(q, q.double(), q, "full", compile=False)
    with pytest.raises(ValueError, match=r"compiled FlexAttention on the CPU takes .*got "
                                         r"torch.float64; allowed: .*compile=False"):
        flex_sparse_attention(q.double(), q.double(), q.double(), "full")


@pytest.mark.parametrize("pattern,combine,params,H,Hkv", [
    ("strided", "multihead", dict(stride=7), 4, 2),
    ("fixed", "merged", dict(stride=8, c=2), 4, 1),
    ("bigbird", "merged", dict(window=4, n_random=3, n_global=2, seed=1), 2, 2),
])
def test_flex_queries_padding_and_grouped_heads(pattern, combine, params, H, Hkv):
    """As sparse_attention: n_q in {1, 3, n_k} aligned to the end, Hkv dividing H
    (enable_gqa), right and left padding (lengths, offsets), forward (FlexAttention has
    no CPU backward), against the reference."""
    from tests.fast.api_helpers import inputs, truth_masks

    B, n, d = 2, 45, 16
    for n_q in (1, 3, n):
        for lengths, offsets in ((None, None), ([45, 30], None), (None, [0, 11])):
            q, k, v, _ = inputs(B, H, Hkv, n_q, n, d, seed=n_q, dtype=torch.float32)
            mask = truth_masks(pattern, B, H, n_q, n, combine, lengths=lengths,
                               offsets=offsets, **params)
            kr, vr = (np.repeat(t.double().numpy(), H // Hkv, axis=1) for t in (k, v))
            want, _ = attend(q.double().numpy(), kr, vr, mask)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = flex_sparse_attention(q, k, v, pattern, combine=combine, compile=False,
                                            enable_gqa=Hkv != H, lengths=lengths,
                                            offsets=offsets, **params)
            err = float(np.abs(got.double().numpy() - want).max())
            assert err < 1e-5, f"n_q={n_q} lengths={lengths} offsets={offsets}: {err:.2e}"


def test_cache_key_accepts_array_and_list_parameters():
    """Parameters are checked (and made hashable) before they key the BlockMask cache:
    global_tokens as a NumPy array or a list, NumPy integers, all give the reference."""
    n, n_heads = 61, 2
    q, k, v = make_qkv(n, 16, (1, n_heads))
    want, _ = attend(q, k, v, reference_mask("longformer", n, n_heads, "merged", 0,
                                             dict(window=3, dilation=2, global_tokens=(5, 40))))
    qt, kt, vt = (torch.from_numpy(x).float() for x in (q, k, v))
    for tokens in (np.array([40, 5]), [5, 40, 5], (np.int64(5), 40)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = flex_sparse_attention(qt, kt, vt, "longformer", window=np.int64(3),
                                        dilation=2, global_tokens=tokens, compile=False)
        assert float(np.abs(got.double().numpy() - want).max()) < 1e-5


def _with_nan(q, k, v):
    """Float32 copies with a NaN in head 1's query 20 and in head 0's key 3."""
    q, k, v = (torch.from_numpy(x).float() for x in (q, k, v))
    q[0, 1, 20, 5] = float("nan")
    k[0, 0, 3, 7] = float("nan")
    return q, k, v


def _nan_rows_match_reference(got, q, k, v, case):
    """Rows that read the NaN are NaN, the others are the reference's answer without it."""
    mask = reference_mask(*case)                                    # (H, n, n)
    rows = np.zeros(mask.shape[:2], bool)                           # (H, n): rows with a NaN
    rows[0] = mask[0, :, 3]                                         # head 0: they read key 3
    rows[1, 20] = True                                              # head 1: query 20
    clean = [t.clone() for t in (q, k, v)]
    clean[0][0, 1, 20] = 0.0
    clean[1][0, 0, 3] = 0.0
    want, _ = attend(*(t.double().numpy() for t in clean), mask)
    nan = torch.isnan(got[0]).any(-1).numpy()                       # (H, n)
    print("NaN rows per head:", [np.flatnonzero(h).tolist() for h in nan])
    np.testing.assert_array_equal(nan, rows)
    assert torch.isnan(got[0][torch.from_numpy(rows)]).all()
    err = float(np.abs(got.double().numpy() - want)[0][~rows].max())
    assert err < 1e-5


@pytest.mark.slow
def test_flex_non_finite_values():
    """check_finite: None on the CPU and True reject NaN / inf; False gives NaN exactly in
    the rows that read it (eager FlexAttention here; the compiled one below)."""
    case = ("fixed", 140, 2, "multihead", 0, dict(stride=16, c=4))
    q, k, v = _with_nan(*make_qkv(140, 48, (1, 2)))
    for check in (None, True):
        with pytest.raises(ValueError, match="non-finite"):
            flex_sparse_attention(q, k, v, "fixed", stride=16, c=4, combine="multihead",
                                  compile=False, check_finite=check)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = flex_sparse_attention(q, k, v, "fixed", stride=16, c=4, combine="multihead",
                                    compile=False, check_finite=False)
    _nan_rows_match_reference(got, q, k, v, case)


@pytest.mark.slow
def test_compiled_flex_non_finite_values():
    """Before: the compiled CPU kernel output 0 in every row that read a NaN (the
    query's own row and the rows reading the key), hiding it."""
    case = ("fixed", 140, 2, "multihead", 0, dict(stride=16, c=4))
    q, k, v = _with_nan(*make_qkv(140, 48, (1, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = flex_sparse_attention(q, k, v, "fixed", stride=16, c=4, combine="multihead",
                                    check_finite=False)
    _nan_rows_match_reference(got, q, k, v, case)
