"""Finite inputs whose scores overflow float32 are never silently wrong: on every path a row
gets what the float64 reference gives, or NaN -- never 0, never a row without its key.

Child et al., 2019, section 5.6 keeps q.k in float32. Entries near 1e20 are finite in
float32, but their products (1e40) are not: a score of +inf, or -inf, or NaN (inf - inf
within one dot product). An online softmax that treats -inf as "not read" and skips NaN
then drops a row's dominant key or returns the row as 0 -- what the CPU window kernel,
PyTorch's fused kernels (SDPA's "fully masked" rule), the Triton kernels and the compiled
decoding step did, with no NaN and no warning (docs/design.md, "Failing loudly"). The
reference (``reference/attention.py``, float64) computes every one of these exactly.

Three inputs: one key whose score overflows to +inf (the dominant key of every row that
reads it); every score overflowing to -inf (the softmax set by their differences); and a
score whose two large products cancel (+inf - inf: NaN in float32, exactly 0 in float64).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

from fast import SparseKVCache, sparse_attention
from fast.backends import cpu_window
from reference import patterns
from reference.attention import attend

N, D, H = 40, 16, 2
PATTERNS = [("strided", {"stride": 8}), ("fixed", {"stride": 8, "c": 2}), ("full", {})]


def _inputs(case: str, seed: int = 0):
    """float32 q, k, v (1, H, N, D), finite, whose scores overflow float32 (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, N, D, generator=g) for _ in range(3))
    if case == "dominant":           # key 5: score 1e40 for every row that reads it
        q[..., 0] = 1e20
        k[..., 0] = 0.0
        k[..., 5, 0] = 1e20
    elif case == "all_negative":     # every score near -1e40, apart by about 1e38
        q[..., 0] = 1e20
        k[..., 0] = -1e20 * (1 + 0.01 * torch.rand(1, H, N, generator=g))
    else:                            # "cancel": keys 3, 11, ...: 1e40 - 1e40 (0 in float64)
        q[..., :2] = 1e20
        q[..., 2:] = 0.0
        k[..., 3::8, 0] = 1e20
        k[..., 3::8, 1] = -1e20
    return q, k, v


CASES = ("dominant", "all_negative", "cancel")


def _reference(q, k, v, pattern, params, n_q=None):
    """The float64 reference's output (1, H, n_q, D) for the last n_q rows."""
    masks = patterns.head_masks(pattern, N, H, "merged", 1, **params)
    out, _ = attend(*(t.double().numpy() for t in (q, k, v)), masks)
    out = torch.from_numpy(np.ascontiguousarray(out))
    return out if n_q is None else out[:, :, N - n_q:]


def _nan_or_exact(got, want, what):
    """Every row of ``got`` is NaN throughout, or within float32's error of ``want``
    (never 0 where the reference is not, never another row's answer)."""
    got = got.detach().double()
    nan = got.isnan()
    rows = nan.any(-1)
    assert (nan == rows[..., None]).all(), f"{what}: a row partly NaN"
    err = (got - want).abs().amax(-1).masked_fill(rows, 0.0)
    zero = (got.abs().sum(-1) == 0) & (want.abs().sum(-1) > 0)
    print(f"{what}: NaN rows {int(rows.sum())}, largest error of the others {err.max():.1e}, "
          f"zero rows {int(zero.sum())}")
    assert not zero.any(), f"{what}: a row came back 0"
    assert (err < 1e-4).all(), f"{what}: a row lost a key (error {err.max():.2e})"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pattern,params", PATTERNS)
@pytest.mark.parametrize("backend", ["naive", "structured", "auto"])
def test_forward_is_exact_or_nan(backend, pattern, params, case):
    q, k, v = _inputs(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # the float64 recompute says so
        got = sparse_attention(q, k, v, pattern, backend=backend, **params)
    _nan_or_exact(got, _reference(q, k, v, pattern, params), f"{backend} {pattern} {case}")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pattern,params", PATTERNS[:2])
def test_pytorchs_kernel_in_the_structured_path_is_exact_or_nan(pattern, params, case,
                                                               monkeypatch):
    """The pieces through PyTorch's CPU kernel (the C kernel off), which gives a row whose
    every score overflowed to -inf an output of 0 and a finite log-sum-exp."""
    monkeypatch.setattr(cpu_window, "_STATE", {"lib": None, "missing": "off for this test"})
    q, k, v = _inputs(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = sparse_attention(q, k, v, pattern, backend="structured", **params)
    _nan_or_exact(got, _reference(q, k, v, pattern, params), f"PyTorch's kernel {case}")


@pytest.mark.skipif(cpu_window.library() is None, reason="no CPU window kernel")
@pytest.mark.parametrize("case", CASES)
def test_the_c_kernel_marks_overflowed_rows(case):
    """cpu_window.c itself: a row whose scores overflowed gets out NaN and lse +inf (the
    float64 recompute's signal), every other row its float32 answer; a merge into a
    marked row keeps the mark."""
    q, k, v = (t[0] for t in _inputs(case))                              # (H, N, D)
    out, lse = torch.empty(H, N, D), torch.empty(H, N)
    cpu_window.forward(q, k, v, out, lse, window=N, scale=0.25)
    masks = patterns.head_masks("full", N, H, "merged", 1)
    want, _ = attend(*(t[None].double().numpy() for t in (q, k, v)), masks, scale=0.25)
    marked = torch.isposinf(lse)
    print(case, "rows marked", int(marked.sum()))
    assert marked.any()
    assert out[marked].isnan().all() and not out[~marked].isnan().any()
    _nan_or_exact(out, torch.from_numpy(want[0]), f"C kernel {case}")
    cpu_window.forward(q, k, v, out, lse, window=1, scale=0.25, merge=True)
    assert torch.isposinf(lse[marked]).all() and out[marked].isnan().all()


@pytest.mark.parametrize("case", CASES)
def test_backward_through_the_structured_path_is_exact(case):
    """The overflowed call is recomputed in float64 forward and backward, so dv =
    P^T dO is the reference's (float64 autograd of the same masks). dq and dk, at
    q, k near 1e20, are 1e20 times a float64 rounding error whatever computes them
    (dS = P (dP - delta) with P one-hot), so only dv is compared."""
    q, k, v = _inputs(case)
    go = torch.randn(1, H, N, D, generator=torch.Generator().manual_seed(1))
    x = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sparse_attention(*x, "strided", backend="structured", stride=8).backward(go)
    m = torch.from_numpy(patterns.head_masks("strided", N, H, "merged", 1, stride=8))
    x64 = [t.double().requires_grad_(True) for t in (q, k, v)]
    s = (x64[0] @ x64[1].transpose(-1, -2)) * D ** -0.5
    want = torch.softmax(s.masked_fill(~m, float("-inf")), -1) @ x64[2]
    dv = torch.autograd.grad((want * go.double()).sum(), x64[2])[0]
    err = (x[2].grad.double() - dv).abs().max()
    print(case, f"dv error {err:.1e}")
    assert err < 1e-4


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pattern,params", PATTERNS)
def test_one_query_and_the_cache_step_are_exact_or_nan(pattern, params, case):
    """The one-query step (``fast.backends.one_query``) and ``SparseKVCache.step`` (decoding),
    position by position."""
    q, k, v = _inputs(case)
    want = _reference(q, k, v, pattern, params)
    cache = SparseKVCache(pattern, n_heads=H, key_dim=D, capacity=N, **params)
    rows, steps = [], []
    for t in range(N):
        rows.append(sparse_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1],
                                     pattern, backend="structured", **params))
        steps.append(cache.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
    _nan_or_exact(torch.cat(rows, 2), want, f"one query {pattern} {case}")
    _nan_or_exact(torch.cat(steps, 2), want, f"cache step {pattern} {case}")


@pytest.mark.parametrize("case", CASES)
def test_the_compiled_decoding_step_is_exact_or_nan(case):
    """The Numba step's attention of one head's row (``cpu_kernel._attend``) over every
    key: a row whose scores all overflowed to -inf was taken for one that reads nothing."""
    from fast.transformer.decoding import cpu_kernel

    q, k, v = (t[0, 0].numpy() for t in _inputs(case))                  # (N, D)
    store = np.concatenate([k, v], axis=1).astype(np.float32)
    rows = np.arange(N, dtype=np.int64)
    got = np.empty((N, D), dtype=np.float32)
    for t in range(N):
        scratch = np.empty(N, dtype=np.float32), np.empty(N, dtype=np.int64)
        cpu_kernel._attend((q[t] * D ** -0.5).astype(np.float32), store, rows[:t + 1],
                           np.zeros(0, dtype=np.bool_), *scratch, got[t])
    want = _reference(*_inputs(case), "full", {})[0, 0]
    _nan_or_exact(torch.from_numpy(got), want, f"compiled step {case}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the Triton kernels on the CPU: TRITON_INTERPRET=1 (make test)")
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pattern,params", PATTERNS)
def test_the_triton_kernels_are_exact_or_nan(pattern, params, case):
    pytest.importorskip("triton")
    q, k, v = _inputs(case)
    got = sparse_attention(q, k, v, pattern, backend="triton", **params)
    _nan_or_exact(got, _reference(q, k, v, pattern, params), f"triton {pattern} {case}")
