"""Tests of the block-sparse Triton kernels against the NumPy ground truth.

Child et al., 2019, sections 4.3 and 5.1 (patterns, head combinations) and 5.5
(block-sparse kernels). Every case compares the forward output and the q, k, v
gradients with ``reference.attention`` under ``reference.patterns.head_masks``.

On a CPU machine the kernels run in Triton's NumPy interpreter
(``triton_helpers`` sets TRITON_INTERPRET=1 when it is unset, before Triton is
imported; ``make test`` sets it for the whole run). The interpreter is slow, so
the problems are small (n <= 100, block 16, float32) and the whole file takes
about a minute or two. With TRITON_INTERPRET=0 on a GPU the same cases run on
CUDA; every pattern x combine mode x dtype at larger n is in ``test_triton_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import sparse_attention
from fast.core.merge import merge
from fast.kernels import launch
from fast.layout import block_layout
from fast.layout.costs import ideal_speedup
from fast.measure.contenders import triton_contenders
from reference import attention, patterns
from tests.fast.kernels.triton_helpers import (
    DEVICE,
    make_inputs,
    needs_runner,
    ref_masks,
    triton_attention,
)

BLOCK = 16


def check_against_reference(run, masks, B, H, n, d, seed=0, atol=2e-5):
    """run(q, k, v) -> out; compare out and grads with reference.attention (float64)."""
    q, k, v, do = make_inputs(B, H, n, d, seed)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = run(qg, kg, vg)
    out.backward(do)
    qn, kn, vn, don = (t.double().cpu().numpy() for t in (q, k, v, do))
    ref_out, _ = attention.attend(qn, kn, vn, masks[None])
    ref = dict(zip("qkv", attention.attend_backward(qn, kn, vn, masks[None], don)))
    err = {"out": np.abs(out.detach().double().cpu().numpy() - ref_out).max()}
    for name, t in zip("qkv", (qg, kg, vg)):
        assert torch.isfinite(t.grad).all()
        err["d" + name] = np.abs(t.grad.double().cpu().numpy() - ref[name]).max()
    print(err)
    assert all(e < atol for e in err.values()), err
    return out.detach()


# ----------------------------------------------------------------------------
# The kernels on natural-order tables (independent of fast.layout)
# ----------------------------------------------------------------------------

@pytest.mark.slow
@needs_runner
def test_kernel_merges_disjoint_parts_exactly():
    """Strided local and column heads as two parts, merged through their lse."""
    B, H, n, d, stride = 1, 3, 70, 16, 8
    local, column = patterns.strided(n, stride)
    column = column & ~local
    parts = triton_attention.parts_from_masks([np.broadcast_to(local, (H, n, n)),
                                np.broadcast_to(column, (H, n, n))], BLOCK)
    masks = np.broadcast_to(local | column, (H, n, n))
    check_against_reference(lambda q, k, v: triton_attention.attention_with_parts(q, k, v, parts,
                                                                    block_size=BLOCK),
                            masks, B, H, n, d)
    # and the lse (natural log) matches the reference's
    q, k, v, _ = make_inputs(B, H, n, d)
    _, lse = triton_attention.attention_lse(q, k, v, parts, block_size=BLOCK)
    _, ref_lse = attention.attend(*(t.double().cpu().numpy() for t in (q, k, v)), masks[None])
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=2e-5)
    # the in-kernel merge equals the torch merge of the separately computed parts
    dparts = [p.to(q.device) for p in parts]
    outs, lses = triton_attention.forward(q, k, v, dparts, d ** -0.5, BLOCK, separate=True)
    assert len(outs) == 2 and all(torch.isfinite(x).any() for x in lses)
    out_t, lse_t = merge(outs, lses)
    out_k, lse_k = triton_attention.forward(q, k, v, dparts, d ** -0.5, BLOCK)
    torch.testing.assert_close(out_k, out_t, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse_k, lse_t, atol=1e-6, rtol=1e-5)


@needs_runner
def test_kernel_rows_that_read_nothing_are_zero():
    """fixed, interleaved layer 1: every head reads only summaries, so the first
    rows of the sequence read nothing: out 0, lse -inf, grads finite (no NaN)."""
    B, H, n, d = 1, 2, 40, 16
    masks = patterns.head_masks("fixed", n, H, "interleaved", 1, stride=8, c=2)
    empty = ~masks.any(-1)                                         # (H, n)
    assert empty.sum() > 0
    parts = triton_attention.parts_from_masks([masks], BLOCK)
    out = check_against_reference(
        lambda q, k, v: triton_attention.attention_with_parts(q, k, v, parts, block_size=BLOCK),
        masks, B, H, n, d)
    assert (out[0][torch.from_numpy(empty)] == 0).all()
    q, k, v, _ = make_inputs(B, H, n, d)
    _, lse = triton_attention.attention_lse(q, k, v, parts, block_size=BLOCK)
    assert torch.isneginf(lse[0][torch.from_numpy(empty)]).all()
    assert torch.isfinite(lse[0][torch.from_numpy(~empty)]).all()


# ----------------------------------------------------------------------------
# The public wrapper (layouts from fast.layout), every pattern and combine mode
# ----------------------------------------------------------------------------

CASES = [
    # (pattern, combine, layer, params, B, H, n, d)
    ("full", "merged", 0, {}, 1, 1, 37, 16),
    ("strided", "merged", 0, dict(stride=8), 2, 3, 70, 16),
    ("strided", "multihead", 0, dict(stride=7), 1, 3, 61, 32),
    ("strided", "interleaved", 1, dict(stride=8), 1, 1, 64, 16),
    ("fixed", "merged", 0, dict(stride=16, c=4), 1, 3, 70, 16),
    ("fixed", "multihead", 0, dict(stride=8, c=2), 1, 3, 53, 16),
    ("fixed", "interleaved", 1, dict(stride=8, c=4), 1, 3, 45, 16),
    ("longformer", "merged", 0, dict(window=5, dilation=2, global_tokens=(0, 17)), 1, 3, 60, 16),
    ("bigbird", "merged", 0, dict(window=4, n_random=2, n_global=2, seed=1), 1, 1, 50, 16),
    ("fixed", "merged", 0, dict(stride=8, c=4), 1, 1, 33, 48),   # d=48: padded to 64 inside
]


@needs_runner
@pytest.mark.parametrize("pattern,combine,layer,params,B,H,n,d", CASES,
                         ids=[f"{c[0]}-{c[1]}{c[2]}-H{c[5]}-n{c[6]}-d{c[7]}" for c in CASES])
def test_wrapper_matches_reference(pattern, combine, layer, params, B, H, n, d):
    masks = ref_masks(pattern, n, H, combine, layer, **params)
    out = check_against_reference(
        lambda q, k, v: triton_attention.triton_sparse_attention(q, k, v, pattern, combine=combine,
                                                  layer=layer, block_size=BLOCK, **params),
        masks, B, H, n, d)
    empty = torch.from_numpy(np.ascontiguousarray(~masks.any(-1)))  # (H, n)
    assert (out[:, empty] == 0).all()


@needs_runner
@pytest.mark.parametrize("combine,layer,H", [("merged", 0, 2), ("multihead", 0, 4),
                                             ("interleaved", 1, 2)])
def test_fixed_sequence_shorter_than_its_first_summary(combine, layer, H):
    """n < l - 2c: no head has a summary position yet, so every summary slot is padding,
    while the heads' summary sub-blocks (their slot maps' offsets) differ: the layout
    must still build and the kernel give the reference's answer."""
    params = dict(stride=16, c=4)
    masks = ref_masks("fixed", 7, H, combine, layer, **params)
    check_against_reference(
        lambda q, k, v: triton_attention.triton_sparse_attention(q, k, v, "fixed", combine=combine,
                                                  layer=layer, block_size=BLOCK, **params),
        masks, 1, H, 7, 16)


@pytest.mark.slow
@needs_runner
def test_layout_is_cached_and_results_are_deterministic():
    q, k, v, _ = make_inputs(1, 3, 50, 16)
    args = dict(stride=8, c=4, combine="multihead", block_size=BLOCK)
    a = triton_attention.triton_sparse_attention(q, k, v, "fixed", **args)
    n_cached = len(triton_attention._LAYOUTS)
    b = triton_attention.triton_sparse_attention(q, k, v, "fixed", **args)
    assert len(triton_attention._LAYOUTS) == n_cached
    assert torch.equal(a, b)
    grads = []
    for _ in range(2):  # no atomics: the backward is bitwise repeatable too
        qg = q.clone().requires_grad_(True)
        triton_attention.triton_sparse_attention(qg, k, v, "fixed", **args).sum().backward()
        grads.append(qg.grad)
    assert torch.equal(*grads)


@needs_runner
def test_bench_contenders_and_ideal_speedup():
    params = dict(stride=8, combine="multihead")
    fns = triton_contenders("strided", params, torch.float32, block_size=BLOCK)
    assert set(fns) == {"triton block-sparse", "triton natural order"}
    q, k, v, _ = make_inputs(1, 2, 48, 16)
    masks = ref_masks("strided", 48, 2, "multihead", 0, stride=8)
    ref_out, _ = attention.attend(*(t.double().cpu().numpy() for t in (q, k, v)), masks[None])
    for fn in fns.values():
        np.testing.assert_allclose(fn(q, k, v).cpu().numpy(), ref_out, atol=2e-5)
    # dense causal work / layout work: 1 for full; the transposed column order beats natural
    assert ideal_speedup("full", 200, 1, {}, block_size=BLOCK) == 1.0
    structured = ideal_speedup("strided", 1024, 2, params, block_size=BLOCK)
    natural = ideal_speedup("strided", 1024, 2, params, block_size=BLOCK, order="natural")
    print(f"strided l=8 n=1024 block 16: ideal speedup {structured:.2f} (natural {natural:.2f})")
    assert structured > natural >= 1.0


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------

def test_bad_inputs_raise_value_error():
    q = torch.zeros(1, 2, 20, 16)
    with pytest.raises(ValueError, match="shape"):
        triton_attention.triton_sparse_attention(q[0], q[0], q[0], "full")
    with pytest.raises(ValueError, match="one shape"):
        triton_attention.triton_sparse_attention(q, q, q[:, :, :10], "full")
    with pytest.raises(ValueError,
                       match="dtype" if not triton_attention.interpreted() else "float32 only"):
        triton_attention.triton_sparse_attention(q.double(), q.double(), q.double(), "full")
    big = torch.zeros(1, 1, 8, 129)
    with pytest.raises(ValueError, match="at most 128"):
        triton_attention.triton_sparse_attention(big, big, big, "full")
    with pytest.raises(ValueError, match="block_size"):
        triton_attention.triton_sparse_attention(q, q, q, "full", block_size=24)


def test_the_pattern_is_checked_as_everywhere_whatever_the_layout_cache_holds():
    """The kernels' own entry checks the layer and the parameters as sparse_attention and
    reference/ do, before the layout cache (whose key let 4.0 find the entry of 4 and
    took any layer), and takes global tokens as any iterable."""
    q = torch.randn(1, 1, 20, 16, generator=torch.Generator().manual_seed(0))
    triton_attention.triton_sparse_attention(q, q, q, "strided",
                                             stride=4)              # cached: stride 4
    for bad, says in (({"stride": 4.0}, "stride l must be an integer >= 1, got 4.0"),
                      ({"stride": 4, "layer": -1}, "layer must be an integer >= 0, got -1"),
                      ({"stride": 4, "layer": "x", "combine": "interleaved"},
                       "layer must be an integer >= 0, got 'x'")):
        with pytest.raises(ValueError, match=says):
            triton_attention.triton_sparse_attention(q, q, q, "strided", **bad)
    a = triton_attention.triton_sparse_attention(q, q, q, "longformer", window=3,
                                                 global_tokens={3, 7})
    b = triton_attention.triton_sparse_attention(q, q, q, "longformer", window=3,
                                                 global_tokens=[7, 3])
    assert torch.equal(a, b)


def test_parts_from_overlapping_masks_are_refused():
    """Parts must be disjoint (their union is what is read): a pair in two masks would be
    read twice, silently; refused, naming the pair."""
    full = patterns.head_masks("full", 20, 1)
    with pytest.raises(ValueError, match="pairwise disjoint .* mask1 and an earlier mask "
                                         "both hold head 0, query 3, key 1"):
        triton_attention.parts_from_masks([full, np.tril(np.ones((20, 20), bool))[None] & ~full
                            | (np.arange(20)[:, None] == 3) & (np.arange(20) == 1)], BLOCK)


BAD_QKV = [
    # (what is wrong, q, k, v)
    ("not a tensor", np.zeros((1, 2, 20, 16)), None, None),
    ("3 dimensions", torch.zeros(2, 20, 16), None, None),
    ("two shapes", None, None, torch.zeros(1, 2, 10, 16)),
    ("two dtypes", None, torch.zeros(1, 2, 20, 16, dtype=torch.float16), None),
    ("n = 0", *[torch.zeros(1, 2, 0, 16)] * 3),
    ("H = 0", *[torch.zeros(1, 0, 20, 16)] * 3),
]


@pytest.mark.parametrize("case", BAD_QKV, ids=[c[0] for c in BAD_QKV])
def test_both_entry_points_share_one_tensor_check(case):
    """fast.sparse_attention and the kernel's own entry point reject the same bad
    q, k, v with the same message (fast.core.checks.check_tensors)."""
    ok = torch.zeros(1, 2, 20, 16)
    q, k, v = (ok if t is None else t for t in case[1:])
    messages = []
    for entry in (sparse_attention, triton_attention.triton_sparse_attention):
        with pytest.raises(ValueError) as err:
            entry(q, k, v, "full")
        messages.append(str(err.value))
    assert messages[0] == messages[1], messages
    # the dtypes allowed differ (the kernel has no float64); the check and its words do not
    bad = torch.zeros(1, 2, 20, 16, dtype=torch.int64)
    for entry, allowed in ((sparse_attention, "torch.float64, torch.float32"),
                           (triton_attention.triton_sparse_attention,
                            "torch.float32, torch.float16")):
        with pytest.raises(ValueError, match=f"q has dtype torch.int64; allowed: {allowed}"):
            entry(bad, bad, bad, "full")


@needs_runner
def test_inputs_are_checked_once_per_call(monkeypatch):
    """q, k, v and the scale are checked once, at the entry the caller used:
    ``fast.sparse_attention`` checks them once per call signature (its call plan; a
    repeated call checks nothing again) and the kernel trusts it; the kernel's own entry
    checks them itself, on every call."""
    from fast.core import checks

    counts = {}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return wrapper

    for module in (checks, triton_attention):
        monkeypatch.setattr(module, "check_tensors", counted("tensors", module.check_tensors))
        monkeypatch.setattr(module, "check_scale", counted("scale", module.check_scale))
    q = torch.randn(1, 1, 20, 16)
    for entry, again in ((lambda: sparse_attention(q, q, q, "strided", stride=4,
                                                   backend="triton"), {}),
                         (lambda: triton_attention.triton_sparse_attention(q, q, q, "strided",
                                                                           stride=4,
                                                            block_size=BLOCK),
                          {"tensors": 1, "scale": 1})):
        counts.clear()
        entry()
        assert counts == {"tensors": 1, "scale": 1}, counts
        counts.clear()
        entry()
        assert counts == again, counts


def test_both_entry_points_share_one_scale_check():
    q = torch.zeros(1, 2, 20, 16)
    messages = []
    for entry in (sparse_attention, triton_attention.triton_sparse_attention):
        with pytest.raises(ValueError, match="scale must be a finite real number") as err:
            entry(q, q, q, "full", scale=float("nan"))
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_moved_part_counts_on_the_host():
    """A part moved to the run device carries its tile count and highest position as
    Python ints (``LayoutPart.facts``), so forward and backward never read them back
    from the device."""
    n = 40
    lay = block_layout("fixed", n, 2, combine="multihead", block_size=BLOCK, stride=8, c=2)
    for part in lay.parts:
        dp = part.to("cpu")
        assert type(dp.facts.tiles) is int and dp.facts.tiles == int(part.kv_count.sum())
        assert type(dp.facts.top) is int
        assert dp.facts.top == max(int(part.q_pos.max()), int(part.k_pos.max()))
        assert dp.facts.top < n


def test_part_with_a_position_twice_is_rejected():
    part = triton_attention.parts_from_masks([patterns.head_masks("full", 20, 1)], BLOCK)[0]
    part.q_pos[0, 1] = 0
    with pytest.raises(ValueError, match="twice"):
        part.to("cpu")


def test_cpu_without_interpreter_says_what_to_do(monkeypatch):
    monkeypatch.setattr(triton_attention, "interpreted", lambda: False)
    q = torch.zeros(1, 1, 8, 16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        triton_attention.triton_sparse_attention(q, q, q, "full")


@pytest.mark.skipif(not triton_attention.interpreted(), reason="interpreter-only check")
def test_interpreter_runs_float32_only():
    """Every other dtype is refused saying so, float64 included (it listed float16 and
    bfloat16 as allowed, which the next call then refused)."""
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        q = torch.zeros(1, 1, 8, 16, dtype=dtype)
        with pytest.raises(ValueError, match=f"float32 only, got {dtype}"):
            triton_attention.triton_sparse_attention(q, q, q, "full")


def test_parts_that_do_not_fit_the_inputs_are_rejected():
    """A part built for another block size, head count or a longer sequence raises."""
    q = k = v = torch.randn(1, 2, 40, 16)
    parts16 = block_layout("strided", 40, 2, block_size=16, stride=5).parts
    with pytest.raises(ValueError, match="block size"):
        triton_attention.attention_with_parts(q, k, v, parts16, block_size=32)
    parts3 = block_layout("strided", 40, 3, combine="multihead", block_size=16, stride=5).parts
    with pytest.raises(ValueError, match="heads"):
        triton_attention.attention_with_parts(q, k, v, parts3, block_size=16)
    longer = block_layout("strided", 64, 2, block_size=16, stride=5).parts
    with pytest.raises(ValueError, match="longer sequence"):
        triton_attention.attention_with_parts(q, k, v, longer, block_size=16)


# ----------------------------------------------------------------------------
# Variants: the code path each lever takes, and parts that do not cover every row
# ----------------------------------------------------------------------------

def test_variants_take_their_code_paths():
    """What each lever switches is really switched (no kernel runs): slot maps for the
    natural, transposed and gathered orders, range tables for range rows (listed ones
    kept where rows are not ranges), grouped launches for the few-tile part kinds, and
    the fused write order (a part that writes every row first and last)."""
    every, base = triton_attention.VARIANTS["all"], triton_attention.VARIANTS["baseline"]
    for pattern, n, params in (("strided", 45, dict(stride=7)),
                               ("fixed", 41, dict(stride=8, c=2))):
        parts, _ = triton_attention.cached_layout(pattern, n, 3, "multihead", 0, params, BLOCK,
                                                  "cpu")
        for p in parts:
            a, b = launch.part_args(p, every), launch.part_args(p, base)
            assert a.flags == dict(Q_MAP=True, K_MAP=True) and a.kv_range and a.qt_range, p
            assert b.flags == dict(Q_MAP=False, K_MAP=False) and not (b.kv_range or b.qt_range)
            assert every.settings(p.name, torch.float32, 16).group == (
                4 if p.name in ("local", "block") else 1)
    parts, _ = triton_attention.cached_layout("bigbird", 100, 1, "merged", 0,
                               dict(window=4, n_random=2, n_global=2, seed=1), BLOCK, "cpu")
    random = next(p for p in parts if p.name == "random")
    assert not launch.part_args(random, every).kv_range          # its rows are not ranges
    glob = next(p for p in parts if p.name == "global_keys")
    assert launch.part_args(glob, every).flags == dict(Q_MAP=True, K_MAP=False)  # keys listed
    # fixed: the summary's keys are only the summaries, so its dK/dV launch comes first
    parts, _ = triton_attention.cached_layout("fixed", 41, 2, "merged", 0, dict(stride=8, c=2),
                                              BLOCK, "cpu")
    k_order = launch._order(parts, lambda p: p.facts.k_real == 41, fused=True)
    assert [p.name for p in k_order.parts] == ["summary", "block"] and k_order.fill
    q_order = launch._order(parts, lambda p: p.facts.q_real == 41, fused=True)
    assert [p.name for p in q_order.parts] == ["block", "summary"]
    assert not (q_order.fill or q_order.cast)
    assert launch._order(parts, lambda p: True, fused=False) == (parts, True, True)


@needs_runner
@pytest.mark.parametrize("variant", ["baseline", "fused"])
def test_parts_that_do_not_cover_every_row(variant):
    """Parts whose queries (or keys) are a few gathered positions: no part writes every
    row of dq (or dk, dv), so the fused order starts from zeros and casts at the end."""
    n, H, d = 45, 1, 16
    lays = [block_layout("longformer", n, H, block_size=BLOCK, window=3, global_tokens=g)
            for g in ((0, 17), (5, 30))]
    for name in ("global_keys", "global_queries"):
        parts = [next(p for p in lay.parts if p.name == name) for lay in lays]
        masks = (parts[0].to_dense(n) | parts[1].to_dense(n)).numpy()        # (H, n, n)
        assert not (parts[0].to_dense(n) & parts[1].to_dense(n)).any()
        check_against_reference(
            lambda q, k, v, ps=parts: triton_attention.attention_with_parts(q, k, v, ps,
                                                                            block_size=BLOCK,
                                                             variant=variant),
            masks, 1, H, n, d)


def test_bad_variants_are_rejected():
    """A variant is a name in VARIANTS, a Variant or None; settings are checked when made;
    a variant for a backend other than Triton is refused, not ignored."""
    from fast.kernels.variants import Launch, Variant, resolve

    fused = triton_attention.VARIANTS["fused"]
    assert resolve(None) is fused and resolve("fused") is fused
    with pytest.raises(ValueError, match="variant must be one of"):
        resolve("fastest")
    with pytest.raises(TypeError, match="variant must be a name"):
        resolve(3)
    for bad in (dict(block=24), dict(block=8), dict(warps=3), dict(group=0), dict(stages=0)):
        with pytest.raises(ValueError, match="Launch"):
            Launch(**bad)
    with pytest.raises(TypeError, match="Variant.fused"):
        Variant("x", fused=1)
    with pytest.raises(TypeError, match="tuple of Launch"):
        Variant("x", launch=[Launch()])
    q = torch.zeros(1, 1, 8, 16)
    with pytest.raises(ValueError, match="selects a Triton kernel variant"):
        sparse_attention(q, q, q, "strided", stride=4, backend="structured", variant="fused")
    # every registered variant says what it should save
    assert all(v.prediction for v in triton_attention.VARIANTS.values())


# ----------------------------------------------------------------------------
# Beyond self-attention: n_q <= n_k, grouped key/value heads, padded batches
# ----------------------------------------------------------------------------

@needs_runner
@pytest.mark.parametrize("pattern,combine,params,H,Hkv", [
    ("strided", "merged", dict(stride=7), 4, 2),
    ("fixed", "multihead", dict(stride=8, c=2), 4, 1),
    ("longformer", "merged", dict(window=5, dilation=2, global_tokens=(0, 17)), 2, 1),
    ("full", "merged", {}, 2, 2),
], ids=["strided-merged-gqa2", "fixed-multihead-gqa4", "longformer-gqa2", "full"])
def test_queries_padding_and_grouped_heads(pattern, combine, params, H, Hkv):
    """sparse_attention(backend="triton"): n_q in {1, 3, n_k} (queries aligned to the end;
    the kernel computes n_k rows, q padded in front), key/value heads shared by H / Hkv
    query heads (read by the kernels at h // share, dk and dv summed over the query
    heads), left padding (offsets: each sequence rolled to start at 0), against the
    reference (float64), forward and backward."""
    from tests.fast.api_helpers import inputs, run, truth, truth_masks

    B, n_k, d = 2, 45, 16
    for n_q in (1, 3, n_k):
        for offsets in (None, [0, 9]):
            q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=n_q, dtype=torch.float32)
            q, k, v, go = (t.to(DEVICE) for t in (q, k, v, go))
            mask = truth_masks(pattern, B, H, n_q, n_k, combine, offsets=offsets, **params)
            want = truth(q.cpu(), k.cpu(), v.cpu(), go.cpu(), mask)
            got = run(lambda a, b, c, offsets=offsets: sparse_attention(
                a, b, c, pattern, combine=combine, backend="triton", enable_gqa=Hkv != H,
                offsets=offsets, **params), q, k, v, go)
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
                err = (a.double().cpu() - b).abs().max().item()
                assert err < 2e-5, f"n_q={n_q} offsets={offsets} {name}: max error {err:.2e}"


@needs_runner
def test_the_kernels_entry_takes_grouped_heads_and_shorter_queries():
    """triton_sparse_attention itself: enable_gqa (required for Hkv != H, as in SDPA) and
    n_q < n_k; the entries on already-built parts take self-attention only."""
    H, n_k, n_q = 3, 50, 7                       # one key/value head for the three
    masks = ref_masks("strided", n_k, H, "multihead", stride=8)[:, n_k - n_q:]
    q, k, v, do = make_inputs(1, H, n_k, 16, seed=2)
    q, do = q[:, :, n_k - n_q:], do[:, :, n_k - n_q:]
    k, v = k[:, :1], v[:, :1]
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = triton_attention.triton_sparse_attention(qg, kg, vg, "strided", stride=8,
                                                   combine="multihead",
                                    block_size=BLOCK, enable_gqa=True)
    out.backward(do)
    kr, vr = (t.expand(1, H, n_k, 16).double().cpu().numpy() for t in (k, v))
    qn, don = q.double().cpu().numpy(), do.double().cpu().numpy()
    ref_out, _ = attention.attend(qn, kr, vr, masks[None])
    dq, dk, dv = attention.attend_backward(qn, kr, vr, masks[None], don)
    for got, want in ((out.detach(), ref_out), (qg.grad, dq), (kg.grad, dk.sum(1, keepdims=True)),
                      (vg.grad, dv.sum(1, keepdims=True))):
        assert np.abs(got.double().cpu().numpy() - want).max() < 2e-5
    with pytest.raises(ValueError, match="needs enable_gqa=True"):
        triton_attention.triton_sparse_attention(q, k, v, "strided", stride=8)
    parts = block_layout("strided", n_k, H, block_size=BLOCK, stride=8).parts
    with pytest.raises(ValueError, match="already-built layout parts takes q, k, v of one"):
        triton_attention.attention_with_parts(q, k.expand(1, H, n_k, 16), v.expand(1, H, n_k, 16),
                                              parts,
                               block_size=BLOCK)


@pytest.mark.skipif(not triton_attention.interpreted(), reason="interpreter-only check")
def test_the_interpreters_refusal_names_the_cpu_path_for_other_dtypes():
    """The public entry with backend="triton" refuses float16, bfloat16 and float64 on the
    CPU naming the backend that takes them, which then runs them."""
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        q = torch.randn(1, 1, 8, 16).to(dtype)
        with pytest.raises(ValueError, match=f"float32 only, got {dtype}; .*backend='structured'"):
            sparse_attention(q, q, q, "strided", stride=3, backend="triton")
        assert sparse_attention(q, q, q, "strided", stride=3, backend="structured").dtype == dtype
