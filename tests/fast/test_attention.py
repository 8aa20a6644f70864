"""fast.sparse_attention against the NumPy ground truth (reference/), float64.

Child et al., 2019, sections 4.3 and 5.1: every head of every layer must read
exactly ``reference.patterns.head_masks(...)[h]``; forward and q/k/v gradients
are compared with ``reference.attention.attend`` / ``attend_backward`` on odd
sizes (n = 1, 7, 97, 1000 and multiples of the stride; d = 16, 48; H = 1, 4).
Low precision follows the flash-attention rule: err(fast) <= 2 * err(reference
run in the same low precision) + a small floor, both printed before asserting.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import attention as fast_attention
from fast import sparse_attention
from fast.attention import resolve_backend
from fast.attention.paths import _triton_available
from fast.backends import flash_cpu
from fast.backends.structured import strided
from fast.core.merge import merge, merge_into
from fast.measure.memory import peak_rss
from reference import patterns
from reference.attention import attend, attend_backward

BACKENDS = ["naive", "structured"]


def _rand(B, H, n, d, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, d, generator=g, dtype=torch.float64).to(dtype)
            for _ in range(4)]  # q, k, v, grad_out


def _ref_masks(pattern, n, H, combine, layer, params):
    if pattern == "longformer":
        return np.broadcast_to(patterns.longformer(n, **params), (H, n, n))
    if pattern == "bigbird":
        return np.broadcast_to(patterns.bigbird(n, **params), (H, n, n))
    return patterns.head_masks(pattern, n, H, combine, layer, **params)


def _reference(q, k, v, g, mask):
    """Ground truth in float64: (out, dq, dk, dv) as torch tensors."""
    args = [t.detach().double().numpy() for t in (q, k, v)]
    out, _ = attend(*args, mask)
    grads = attend_backward(*args, mask, g.detach().double().numpy())
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in (out, *grads)]


def _fast(q, k, v, g, pattern, combine, layer, backend, params):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                           backend=backend, **params)
    out.backward(g)
    return [out.detach(), q.grad, k.grad, v.grad]


# (pattern, params, combine, n, d, H): a covering set, not the cartesian product.
CASES = [
    ("full", {}, "merged", 1, 16, 1),
    ("full", {}, "multihead", 97, 48, 4),
    ("strided", {"stride": 4}, "merged", 1, 16, 4),
    ("strided", {"stride": 4}, "multihead", 7, 48, 4),
    ("strided", {"stride": 5}, "interleaved", 97, 16, 1),
    ("strided", {"stride": 5}, "merged", 97, 48, 4),
    ("strided", {"stride": 10}, "multihead", 100, 16, 1),
    ("strided", {"stride": 8}, "merged", 64, 48, 1),
    ("strided", {"stride": 3}, "interleaved", 7, 48, 4),
    pytest.param("strided", {"stride": 32}, "merged", 1000, 48, 1, marks=pytest.mark.slow),
    pytest.param("strided", {"stride": 31}, "multihead", 1000, 16, 4, marks=pytest.mark.slow),
    ("fixed", {"stride": 8, "c": 2}, "merged", 1, 48, 4),
    ("fixed", {"stride": 8, "c": 2}, "multihead", 97, 16, 4),
    ("fixed", {"stride": 8, "c": 2}, "merged", 97, 48, 4),
    ("fixed", {"stride": 6, "c": 3}, "interleaved", 7, 16, 4),
    ("fixed", {"stride": 5, "c": 2}, "merged", 97, 48, 1),
    ("fixed", {"stride": 5, "c": 2}, "multihead", 7, 16, 2),
    ("fixed", {"stride": 4, "c": 4}, "merged", 40, 48, 4),
    ("fixed", {"stride": 8, "c": 8}, "interleaved", 96, 16, 1),
    pytest.param("fixed", {"stride": 16, "c": 4}, "multihead", 1000, 48, 4, marks=pytest.mark.slow),
    pytest.param("fixed", {"stride": 32, "c": 8}, "merged", 1000, 16, 1, marks=pytest.mark.slow),
    # the strict band beside the column at its smallest strides, and n < 2 l
    ("strided", {"stride": 1}, "merged", 7, 16, 2),
    ("strided", {"stride": 2}, "merged", 9, 16, 2),
    ("strided", {"stride": 8}, "merged", 13, 48, 4),
    # the column's forward in corner parts (strided.corner_rows): 67 grid rows as 32, 32, 3
    ("strided", {"stride": 3}, "merged", 200, 16, 2),
    ("strided", {"stride": 3}, "multihead", 199, 48, 2),
    # the column cut in three problems (M >= strided.SPLIT_ROWS grid rows), odd M
    pytest.param("strided", {"stride": 2}, "merged", 775, 16, 2, marks=pytest.mark.slow),
    pytest.param("strided", {"stride": 2}, "multihead", 800, 16, 2, marks=pytest.mark.slow),
    # the band's backward chunks unlike its forward (64 and 32 rows)
    ("strided", {"stride": 128}, "merged", 300, 16, 2),
    ("strided", {"stride": 64}, "multihead", 200, 16, 2),
    # an odd number of heads in two groups: a group is a copy when B > 1, not a view
    ("strided", {"stride": 5}, "multihead", 23, 16, 3),
    ("fixed", {"stride": 6, "c": 2}, "multihead", 23, 16, 3),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern,params,combine,n,d,H", CASES)
def test_matches_reference_float64(pattern, params, combine, n, d, H, backend):
    B = 2 if n < 200 else 1
    for layer in ((0, 1) if combine == "interleaved" else (0,)):
        q, k, v, g = _rand(B, H, n, d, seed=n * 31 + d + H + layer)
        mask = _ref_masks(pattern, n, H, combine, layer, params)
        want = _reference(q, k, v, g, mask)
        got = _fast(q, k, v, g, pattern, combine, layer, backend, params)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert a.dtype == torch.float64
            err = (a - b).abs().max().item()
            assert err < 1e-10, f"{name}: max error {err:.3e} (layer {layer})"


@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("combine", ["merged", "multihead"])
def test_column_parts_match_reference(monkeypatch, rows, combine):
    """The column's forward cut in parts of ``rows`` grid rows (a corner mask from the
    second part on; the last part shorter): forward and backward as the reference; and
    the column's backward, given buffers (a piece after the first in its group), adds
    into them."""
    monkeypatch.setattr(strided, "corner_rows", lambda M: rows)
    H, d, n, params = 4, 16, 61, {"stride": 4}                      # M = 16 grid rows
    q, k, v, g = _rand(2, H, n, d, seed=47 + rows)
    want = _reference(q, k, v, g, _ref_masks("strided", n, H, combine, 0, params))
    got = _fast(q, k, v, g, "strided", combine, 0, "structured", params)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a - b).abs().max().item()
        assert err < 1e-10, f"{name}: max error {err:.3e} (parts of {rows} rows)"
    column, N = strided.Column(4, 0.25), 64
    t = [x[0, :, :N] for x in _rand(1, H, N, d, seed=5)] + [torch.rand(H, N, dtype=torch.float64)]
    fresh = column.backward(*t[:3], t[3], t[0], t[4])
    added = column.backward(*t[:3], t[3], t[0], t[4], [torch.ones_like(t[0]) for _ in range(3)])
    for a, b in zip(fresh, added):
        torch.testing.assert_close(a + 1, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [64, 61, 57])
@pytest.mark.parametrize("combine", ["merged", "multihead"])
def test_column_in_three_problems_matches_reference(monkeypatch, n, combine):
    """The column from ``SPLIT_ROWS`` grid rows on (lowered here to 4, so that a small n
    takes that path): the first half causal, the second causal over its own rows and a
    rectangle over the first half, merged through the lse; forward and backward as the
    reference. n = 64: M = 32 grid rows; 61: M = 31 (halves of 15 and 16); 57: M = 29,
    the last grid row padded."""
    monkeypatch.setattr(strided, "SPLIT_ROWS", 4)
    H, d, params = 2, 48, {"stride": 2}
    N = -(-n // 2) * 2
    assert [kind for *_, kind in strided.Column(2, 1.0)._parts(N, backward=False)] == \
        ["causal", "all", "causal"]
    q, k, v, g = _rand(2, H, n, d, seed=n)
    want = _reference(q, k, v, g, _ref_masks("strided", n, H, combine, 0, params))
    got = _fast(q, k, v, g, "strided", combine, 0, "structured", params)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a - b).abs().max().item()
        print(f"n = {n} {combine} {name}: max error {err:.3e}")
        assert err < 1e-10, f"{name}: max error {err:.3e} (column in three problems)"


@pytest.mark.parametrize("pattern,params,combine,n", [
    ("strided", {"stride": 8}, "merged", 101),
    ("strided", {"stride": 8}, "multihead", 99),
    ("strided", {"stride": 4}, "interleaved", 45),
])
def test_band_slabs_match_reference(monkeypatch, pattern, params, combine, n):
    """The band's kernel calls cut into slabs of a few chunks (flash_cpu.spans; in a real
    call only when its outputs pass SLAB_BYTES): every slab edge, and windows that
    overlap the next slab's, give the reference's answer, forward and backward."""
    H, d = 4, 16
    q, k, v, g = _rand(2, H, n, d, seed=43)
    want = _reference(q, k, v, g, _ref_masks(pattern, n, H, combine, 0, params))
    for budget in (1, 3 * 2 * H * 8 * d * 8):          # one chunk per slab; three chunks
        monkeypatch.setattr(flash_cpu, "SLAB_BYTES", budget)
        got = _fast(q, k, v, g, pattern, combine, 0, "structured", params)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            err = (a - b).abs().max().item()
            assert err < 1e-10, f"{name}: max error {err:.3e} (slab budget {budget})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern,params,combine,n,d,H", [
    ("strided", {"stride": 5}, "merged", 97, 48, 4),
    ("fixed", {"stride": 8, "c": 2}, "multihead", 97, 16, 4),
    ("fixed", {"stride": 32, "c": 8}, "interleaved", 1000, 48, 1),
])
def test_float32_within_1e5(pattern, params, combine, n, d, H, backend):
    q, k, v, g = _rand(1, H, n, d, seed=7, dtype=torch.float32)
    want = _reference(q, k, v, g, _ref_masks(pattern, n, H, combine, 0, params))
    got = _fast(q, k, v, g, pattern, combine, 0, backend, params)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == torch.float32
        err = (a.double() - b).abs().max().item()
        assert err < 1e-5, f"{name}: max error {err:.3e}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pattern,params,combine,n", [
    ("strided", {"stride": 8}, "merged", 97),
    ("fixed", {"stride": 8, "c": 2}, "multihead", 130),
])
def test_low_precision_flash_rule(pattern, params, combine, n, dtype, backend):
    """err(fast, low) <= 2 * err(naive SDPA math in low precision) + floor."""
    H, d = 4, 48
    q, k, v, g = _rand(1, H, n, d, seed=3, dtype=dtype)
    mask = _ref_masks(pattern, n, H, combine, 0, params)
    want = _reference(q, k, v, g, mask)
    got = _fast(q, k, v, g, pattern, combine, 0, backend, params)
    # The reference computed in the low dtype: plain matmul-softmax-matmul.
    ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    m = torch.from_numpy(np.ascontiguousarray(mask))
    s = (ql @ kl.transpose(-1, -2)) * (1.0 / d ** 0.5)
    p = torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1).nan_to_num(0.0)
    low = p @ vl
    low.backward(g)
    low_all = [low.detach(), ql.grad, kl.grad, vl.grad]
    floor = 1e-3 if dtype == torch.float16 else 8e-3
    for name, a, b, r in zip(("out", "dq", "dk", "dv"), got, want, low_all):
        assert a.dtype == dtype
        err_fast = (a.double() - b).abs().max().item()
        err_low = (r.double() - b).abs().max().item()
        print(f"{dtype} {pattern} {name}: err_fast {err_fast:.3e}  err_ref_low {err_low:.3e}")
        assert err_fast <= 2 * err_low + floor, name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern,params", [("strided", {"stride": 6}),
                                            ("fixed", {"stride": 6, "c": 2})])
def test_rows_that_read_nothing_give_zero(pattern, params, backend):
    """Second head in multihead (odd heads) / interleaved (odd layers): early rows
    read nothing under the fixed summary; the output there is 0, grads finite."""
    n, H, d = 20, 2, 16
    q, k, v, g = _rand(1, H, n, d, seed=11)
    for combine, layer, head in (("multihead", 0, 1), ("interleaved", 1, 0)):
        mask = patterns.head_masks(pattern, n, H, combine, layer, **params)[head]
        empty = ~mask.any(axis=1)
        got = _fast(q, k, v, g, pattern, combine, layer, backend, params)
        for t in got:
            assert torch.isfinite(t).all()
        if pattern == "fixed":
            assert empty[:4].all() and empty.sum() == 4       # rows 0..3 precede the summary
            assert (got[0][0, head, torch.from_numpy(empty)] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_k", [1, 3])
def test_a_query_that_reads_nothing_has_zero_gradients(n_k, backend):
    """One query (the one-query step on the structured path) at a position where the
    head reads nothing (fixed, interleaved, an odd layer: summaries only, before the
    first; one head, since heads read distinct summary sub-blocks): the output is 0 and
    q, k, v get zero gradients, not an output detached from them (whose backward would
    raise)."""
    q, k, v = (torch.randn(2, 1, m, 8, dtype=torch.float64, requires_grad=True)
               for m in (1, n_k, n_k))
    out = sparse_attention(q, k, v, "fixed", stride=6, c=2, combine="interleaved", layer=1,
                           backend=backend)
    out.sum().backward()
    assert (out == 0).all()
    for t in (q, k, v):
        assert t.grad is not None and (t.grad == 0).all()


@pytest.mark.parametrize("pattern,params", [
    ("longformer", {"window": 5}),
    ("longformer", {"window": 4, "dilation": 3, "global_tokens": (0, 17, 40)}),
    ("bigbird", {"window": 3, "n_random": 2, "n_global": 2, "seed": 5}),
])
def test_longformer_bigbird_naive(pattern, params):
    n, H, d = 97, 4, 48
    q, k, v, g = _rand(1, H, n, d, seed=13)
    want = _reference(q, k, v, g, _ref_masks(pattern, n, H, "merged", 0, params))
    for backend in ("auto", "naive"):
        got = _fast(q, k, v, g, pattern, "merged", 0, backend, params)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert (a - b).abs().max().item() < 1e-10, name


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic(backend):
    q, k, v, g = _rand(1, 4, 300, 48, seed=17, dtype=torch.float32)
    for pattern, params in (("strided", {"stride": 16}), ("fixed", {"stride": 16, "c": 4})):
        a = _fast(q, k, v, g, pattern, "merged", 0, backend, params)
        b = _fast(q, k, v, g, pattern, "merged", 0, backend, params)
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_scale_is_used():
    q, k, v, g = _rand(1, 2, 30, 16, seed=19)
    mask = patterns.head_masks("strided", 30, 2, "merged", 0, stride=4)
    for backend in BACKENDS:
        out = sparse_attention(q, k, v, "strided", stride=4, scale=0.3, backend=backend)
        want, _ = attend(q.numpy(), k.numpy(), v.numpy(), mask, scale=0.3)
        assert np.abs(out.numpy() - want).max() < 1e-10


def _ok():
    return [torch.zeros(1, 2, 9, 8) for _ in range(3)]


@pytest.mark.parametrize("change,message", [
    (lambda a: dict(a, q=torch.zeros(2, 9, 8)), "4 dimensions"),
    (lambda a: dict(a, k=torch.zeros(1, 2, 10, 8)), "one shape"),
    (lambda a: dict(a, v=torch.zeros(1, 2, 9, 8, dtype=torch.float64)), "one dtype"),
    (lambda a: dict(a, q=torch.zeros(1, 2, 9, 8, dtype=torch.int64)), "allowed"),
    (lambda a: dict(a, q=a["q"].clone().index_fill_(2, torch.tensor([3]), float("nan"))),
     "non-finite"),
    (lambda a: dict(a, q=torch.zeros(1, 2, 0, 8), k=torch.zeros(1, 2, 0, 8),
                    v=torch.zeros(1, 2, 0, 8)), "n = 0"),
    (lambda a: dict(a, q=np.zeros((1, 2, 9, 8))), "torch.Tensor"),
    (lambda a: dict(a, pattern="dense"), "pattern must be one of"),
    (lambda a: dict(a, combine="both"), "combine must be one of"),
    (lambda a: dict(a, backend="cuda"), "backend must be one of"),
    (lambda a: dict(a, stride=0), "stride l must be an integer >= 1"),
    (lambda a: dict(a, stride=2.5), "stride l must be an integer >= 1"),
    (lambda a: dict(a, pattern="fixed", c=5), "c must be at most the stride"),
    (lambda a: dict(a, pattern="fixed", c=0), "summary width c must be"),
    (lambda a: dict(a, pattern="fixed", stride=5, c=2), "multiple of c"),
    (lambda a: dict(a, pattern="fixed", c=None), "missing ['c']"),
    (lambda a: dict(a, stride=None), "missing ['stride']"),
    (lambda a: dict(a, c=2), "unexpected ['c']"),
    (lambda a: dict(a, layer=-1), "layer must be"),
    (lambda a: dict(a, scale=float("inf")), "scale must be"),
    (lambda a: dict(a, pattern="longformer", stride=None, window=0), "window must be"),
    (lambda a: dict(a, pattern="longformer", stride=None, window=2, global_tokens=(9,)),
     "global_tokens"),
    (lambda a: dict(a, pattern="bigbird", stride=None, window=2, n_random=1, n_global=10),
     "n_global must be"),
    (lambda a: dict(a, pattern="bigbird", stride=None, window=2, n_random=1, n_global=1,
                    backend="structured"), "backend 'structured' serves"),
])
def test_bad_input_raises_value_error(change, message):
    q, k, v = _ok()
    args = change(dict(q=q, k=k, v=v, pattern="strided", stride=4))
    q, k, v, pattern = args.pop("q"), args.pop("k"), args.pop("v"), args.pop("pattern")
    with pytest.raises(ValueError) as err:
        sparse_attention(q, k, v, pattern, **args)
    assert message in str(err.value), str(err.value)


def test_non_contiguous_inputs():
    """q, k, v as transposed views of a (B, n, H, d) tensor, as a model makes them."""
    B, H, n, d = 2, 4, 131, 16
    g = torch.Generator().manual_seed(23)
    qkv = torch.randn(B, n, 3, H, d, generator=g, dtype=torch.float64)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))          # (B, H, n, d) views
    assert not q.is_contiguous()
    for pattern, params in (("strided", {"stride": 16}), ("fixed", {"stride": 16, "c": 4})):
        for combine in ("merged", "multihead"):
            got = sparse_attention(q, k, v, pattern, combine=combine, backend="structured",
                                   **params)
            want = sparse_attention(q.contiguous(), k.contiguous(), v.contiguous(), pattern,
                                    combine=combine, backend="naive", **params)
            assert (got - want).abs().max().item() < 1e-12


@pytest.mark.parametrize("pattern,params", [("strided", {"stride": 128}),
                                            ("fixed", {"stride": 128, "c": 32})])
def test_structured_makes_no_n_by_n_tensor(pattern, params):
    """Peak memory of forward+backward at n = 8192 stays far below one n x n float32
    matrix (256 MiB): the structured path is O(n sqrt(n)) in memory too."""
    n = 8192
    q, k, v = (torch.randn(1, 1, n, 16, requires_grad=True) for _ in range(3))
    with peak_rss() as peak:
        sparse_attention(q, k, v, pattern, backend="structured", **params).sum().backward()
    if peak["peak_bytes"] is None:
        pytest.skip("peak RSS is not measurable here (not Linux)")
    print(f"{pattern}: peak {peak['peak_bytes'] / 2**20:.1f} MiB")
    assert peak["peak_bytes"] < n * n * 4 / 8


def test_merge_of_two_key_sets_is_attention_over_their_union():
    q, k, v, _ = _rand(1, 2, 9, 8, seed=29)
    rng = np.random.default_rng(0)
    a = rng.random((9, 9)) < 0.5
    a[:, 0] = True                                    # piece a reads something in every row
    b = ~a & (rng.random((9, 9)) < 0.5)
    b[3] = False                                      # piece b reads nothing in row 3
    parts = [attend(q.numpy(), k.numpy(), v.numpy(), m) for m in (a, b)]
    (oa, la), (ob, lb) = [(torch.from_numpy(o), torch.from_numpy(l)) for o, l in parts]
    out, lse = torch.empty_like(oa), torch.empty_like(la)
    merge_into(out, lse, oa, la, ob, lb)
    want, want_lse = attend(q.numpy(), k.numpy(), v.numpy(), a | b)
    assert np.abs(out.numpy() - want).max() < 1e-12
    assert np.abs(lse.numpy() - want_lse).max() < 1e-12


def test_merge_of_a_list_is_the_pairwise_merges_and_empty_rows_stay_empty():
    """merge(outs, lses) equals merging pairwise with merge_into; it is attention
    over the union of the pieces; a row that reads nothing in every piece gets
    out 0 and lse -inf (whatever the pieces hold there), never NaN."""
    q, k, v, _ = _rand(1, 2, 9, 8, seed=41)
    rng = np.random.default_rng(1)
    owner, keep = rng.integers(0, 3, size=(9, 9)), rng.random((9, 9)) < 0.7
    masks = [(owner == p) & keep for p in range(3)]     # three disjoint key sets
    for m in masks:
        m[4] = False                                    # row 4 reads nothing anywhere
    masks[0][6] = masks[1][6] = False                   # row 6 only in the last piece
    assert masks[2][6].any()
    pieces = [attend(q.numpy(), k.numpy(), v.numpy(), m) for m in masks]
    outs = [torch.from_numpy(o) for o, _ in pieces]
    lses = [torch.from_numpy(lse) for _, lse in pieces]
    out, lse = merge(outs, lses)
    pair_out, pair_lse = torch.empty_like(outs[0]), torch.empty_like(lses[0])
    merge_into(pair_out, pair_lse, outs[0], lses[0], outs[1], lses[1])
    merge_into(pair_out, pair_lse, pair_out, pair_lse, outs[2], lses[2])
    assert torch.equal(out, pair_out) and torch.equal(lse, pair_lse)
    want, want_lse = attend(q.numpy(), k.numpy(), v.numpy(), masks[0] | masks[1] | masks[2])
    assert np.abs(out.numpy() - want).max() < 1e-12
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=0, atol=1e-12)   # -inf in row 4
    assert (out[..., 4, :] == 0).all() and torch.isneginf(lse[..., 4]).all()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    junk = [o.clone().index_fill_(-2, torch.tensor([4]), 7.0) for o in outs]
    assert (merge(junk, lses)[0][..., 4, :] == 0).all()
    one_out, one_lse = merge(outs[:1], lses[:1])                # one piece: a copy
    assert torch.equal(one_out, outs[0]) and one_out is not outs[0]
    with pytest.raises(ValueError, match="at least one piece"):
        merge([], [])
    low = merge([o.to(torch.bfloat16) for o in outs], [m.float() for m in lses])[0]
    assert low.dtype == torch.bfloat16
    assert (low.double() - torch.from_numpy(want)).abs().max() < 2e-2


def test_cpu_kernel_facts_and_math_fallback_agree():
    """The facts fast.backends.flash_cpu relies on (strided views, top-left causal, empty
    rows give out 0), and its math fallback (used off the CPU) against the kernel."""
    if not flash_cpu.HAS_CPU_FLASH:
        pytest.skip("this torch has no CPU flash operator")
    q, k, v, g = _rand(2, 6, 12, 8, seed=31)
    qv, kv_, vv, gv = (t.transpose(1, 2)[:, :, 1:] for t in (q, k, v, g))  # (2, 12, 5, 8) views
    mask = torch.zeros(5, 5, dtype=torch.float64)
    mask[2] = float("-inf")                                              # row 2 reads nothing
    mask[3, 4] = float("-inf")
    for kw in ({"is_causal": True}, {"mask": mask[None, None]}):
        o1, l1 = flash_cpu.attention_forward(qv, kv_, vv, scale=0.3, **kw)
        o2, l2 = flash_cpu._math_forward(qv, kv_, vv, kw.get("is_causal", False),
                                         kw.get("mask"), 0.3)
        assert (o1 - o2).abs().max() < 1e-12 and (l1 - l2).abs().max() < 1e-12
        g1 = flash_cpu.attention_backward(gv, qv, kv_, vv, o1, l1, scale=0.3, **kw)
        g2 = flash_cpu._math_backward(gv, qv, kv_, vv, o1, l1, kw.get("is_causal", False),
                                      kw.get("mask"), 0.3)
        for a, b in zip(g1, g2):
            assert (a - b).abs().max() < 1e-12
    o1, l1 = flash_cpu.attention_forward(qv, kv_, vv, mask=mask[None, None], scale=0.3)
    assert (o1[:, :, 2] == 0).all() and (l1[:, :, 2] == 0).all()        # documented quirk


@pytest.mark.parametrize("pattern,params,combine", [
    ("strided", {"stride": 5}, "merged"), ("fixed", {"stride": 8, "c": 2}, "multihead"),
    ("fixed", {"stride": 8, "c": 2}, "merged")])
def test_structured_with_math_fallback(monkeypatch, pattern, params, combine):
    """The path taken off the CPU (CUDA, or a torch without the CPU operator)."""
    monkeypatch.setattr(flash_cpu, "HAS_CPU_FLASH", False)
    monkeypatch.setattr(flash_cpu, "MATH_CHUNK_ELEMENTS", 2000)   # several row chunks
    n, H, d = 41, 4, 16
    q, k, v, g = _rand(1, H, n, d, seed=37)
    want = _reference(q, k, v, g, _ref_masks(pattern, n, H, combine, 0, params))
    got = _fast(q, k, v, g, pattern, combine, 0, "structured", params)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert (a - b).abs().max().item() < 1e-10, name


def test_auto_backend_choice(monkeypatch):
    """auto: SDPA for full; Triton for the sparse patterns on CUDA (not float64, and
    not when Triton runs in its CPU interpreter); else CPU paths."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_backend("auto", "full", cuda, torch.float16) == "structured"
    assert resolve_backend("auto", "strided", cpu) == "structured"
    assert resolve_backend("auto", "bigbird", cpu) == "naive"
    assert resolve_backend("auto", "fixed", cuda, torch.float64) == "structured"
    for interpreted in (False, True):
        monkeypatch.setattr(fast_attention.paths, "_triton_interpreted", lambda x=interpreted: x)
        expected = "triton" if _triton_available() and not interpreted else "structured"
        assert resolve_backend("auto", "strided", cuda, torch.bfloat16) == expected
    assert resolve_backend("naive", "strided", cuda) == "naive"


def test_non_iterable_global_tokens_is_a_value_error():
    q = torch.zeros(1, 1, 8, 4)
    with pytest.raises(ValueError, match="iterable"):
        sparse_attention(q, q, q, "longformer", window=2, global_tokens=5)
