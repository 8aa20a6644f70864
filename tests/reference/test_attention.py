"""Tests of reference/attention.py: masked attention, its log-sum-exp and its gradient.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers",
section 4 (eq. 2-4): a(x_i, S_i) = softmax(q_i K_{S_i}^T / sqrt(d)) V_{S_i}.

``attend`` is checked against an independent, row-by-row formulation that
softmaxes over the explicit index set S_i in log space; ``attend_backward``
against central finite differences in float64. Rows that read nothing must give
out 0, lse -inf and zero gradients, never NaN.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import patterns
from reference.attention import attend, attend_backward
from tests.conftest import make_qkv


def attend_rows(q, k, v, mask, scale=None):
    """Independent formulation: one row at a time, softmax over S_i = {j : mask[i, j]}
    in log space with math.fsum. q (n, d), k (n_k, d), v (n_k, d_v), mask (n, n_k)."""
    n, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((n, v.shape[1]))
    lse = np.full(n, -np.inf)
    for i in range(n):
        S = np.flatnonzero(mask[i])
        if S.size == 0:
            continue
        s = [scale * math.fsum(q[i, c] * k[j, c] for c in range(d)) for j in S]
        top = max(s)
        lse[i] = top + math.log(math.fsum(math.exp(x - top) for x in s))
        p = np.array([math.exp(x - lse[i]) for x in s])  # sums to 1
        out[i] = p @ v[S]
    return out, lse


def loss(q, k, v, mask, g, scale=None):
    return float(np.sum(g * attend(q, k, v, mask, scale)[0]))


def finite_difference(f, x, index, eps=1e-6):
    """Central difference of f at x along one entry (x is changed in place and restored)."""
    old = x[index]
    x[index] = old + eps
    up = f()
    x[index] = old - eps
    down = f()
    x[index] = old
    return (up - down) / (2 * eps)


def fixed_summary(n, l=4, c=1):
    """A mask with empty rows: A(2) of the fixed pattern, rows 0..l-c-1 read nothing."""
    return patterns.fixed(n, l, c)[1]


# ----------------------------------------------------------------------------
# Forward: against the row-by-row formulation, lse, empty rows.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,params", [
    ("full", {}), ("strided", {"stride": 5}), ("fixed", {"stride": 6, "c": 2}),
])
@pytest.mark.parametrize("combine", patterns.COMBINES)
def test_attend_matches_rows(pattern, params, combine):
    n, d, H = 23, 6, 3
    q, k, v = make_qkv(n, d, (H,), seed=1, d_v=5)
    masks = patterns.head_masks(pattern, n, H, combine, layer=1, **params)   # (H, n, n)
    out, lse = attend(q, k, v, masks)
    assert out.shape == (H, n, 5) and lse.shape == (H, n)
    for h in range(H):
        want_out, want_lse = attend_rows(q[h], k[h], v[h], masks[h])
        np.testing.assert_allclose(out[h], want_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isinf(lse[h]), np.isinf(want_lse))
        np.testing.assert_allclose(lse[h], want_lse, rtol=1e-12, atol=1e-12)


def test_lse_is_log_sum_exp_of_allowed_scores():
    n, d = 17, 4
    q, k, v = make_qkv(n, d, seed=2)
    mask = patterns.union(*patterns.strided(n, 3))
    _, lse = attend(q, k, v, mask, scale=0.7)
    scores = 0.7 * q @ k.T                     # (n, n)
    for i in range(n):
        assert lse[i] == pytest.approx(np.logaddexp.reduce(scores[i, mask[i]]), rel=1e-13)


def test_custom_scale_and_large_scores():
    n, d = 12, 3
    q, k, v = make_qkv(n, d, seed=3)
    mask = patterns.full(n)
    out, lse = attend(q, k, v, mask, scale=0.25)
    want_out, want_lse = attend_rows(q, k, v, mask, scale=0.25)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)
    # scores in the thousands: the row max is subtracted, nothing overflows
    out, lse = attend(300 * q, 300 * k, v, mask)
    want_out, want_lse = attend_rows(300 * q, 300 * k, v, mask)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    np.testing.assert_allclose(out, want_out, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)


def test_empty_rows_give_zero_and_minus_inf():
    n, d = 14, 5
    q, k, v = make_qkv(n, d, seed=4)
    mask = fixed_summary(n)                    # rows 0, 1, 2 read nothing
    empty = ~mask.any(1)
    assert empty.sum() == 3
    with np.errstate(all="raise"):             # no 0/0, no log(0) warnings either
        out, lse = attend(q, k, v, mask)
    assert not np.any(np.isnan(out)) and not np.any(np.isnan(lse))
    np.testing.assert_array_equal(out[empty], 0.0)
    np.testing.assert_array_equal(lse[empty], -np.inf)
    assert np.all(np.isfinite(lse[~empty]))
    # a mask with no True at all
    out, lse = attend(q, k, v, np.zeros((n, n), dtype=bool))
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, -np.inf)


def test_broadcast_batch_and_determinism():
    n, d, B, H = 19, 4, 2, 3
    q, k, v = make_qkv(n, d, (B, H), seed=5)
    mask = patterns.union(*patterns.fixed(n, 5, 2))          # (n, n) broadcasts over (B, H)
    out, lse = attend(q, k, v, mask)
    assert out.shape == (B, H, n, d) and lse.shape == (B, H, n)
    for b in range(B):
        for h in range(H):
            np.testing.assert_allclose(out[b, h], attend_rows(q[b, h], k[b, h], v[b, h], mask)[0],
                                       rtol=1e-12, atol=1e-12)
    again, lse_again = attend(q, k, v, mask)
    assert np.array_equal(out, again) and np.array_equal(lse, lse_again)  # bitwise


def merge(out_a, lse_a, out_b, lse_b):
    """Combine attention over two disjoint key sets by their log-sum-exps."""
    lse = np.logaddexp(lse_a, lse_b)
    with np.errstate(invalid="ignore"):
        w_a = np.where(np.isinf(lse_a), 0.0, np.exp(lse_a - lse))[..., None]
        w_b = np.where(np.isinf(lse_b), 0.0, np.exp(lse_b - lse))[..., None]
    return w_a * out_a + w_b * out_b, lse


@pytest.mark.parametrize("n,l,c", [(25, 4, 1), (31, 6, 2)])
def test_lse_merge_of_disjoint_parts(n, l, c):
    """attend over A | B equals the lse-weighted merge of attend over A and over B
    (A, B disjoint): the identity fast kernels use to merge heads and blocks."""
    q, k, v = make_qkv(n, 8, seed=6)
    for a1, a2 in (patterns.strided(n, l), patterns.fixed(n, l, c)):
        a, b = a1 & ~a2, a2                    # disjoint, union unchanged
        want_out, want_lse = attend(q, k, v, a | b)
        got_out, got_lse = merge(*attend(q, k, v, a), *attend(q, k, v, b))
        np.testing.assert_allclose(got_out, want_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_lse, want_lse, rtol=1e-12)


# ----------------------------------------------------------------------------
# Backward: central finite differences in float64.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("mask_name", ["summary_with_empty_rows", "strided_merged", "full"])
def test_backward_matches_finite_differences(mask_name):
    n, d = 11, 4
    mask = {"summary_with_empty_rows": fixed_summary(n, 4, 2),
            "strided_merged": patterns.union(*patterns.strided(n, 3)),
            "full": patterns.full(n)}[mask_name]
    q, k, v = make_qkv(n, d, seed=7, d_v=3)
    g = np.random.default_rng(8).standard_normal((n, 3))
    dq, dk, dv = attend_backward(q, k, v, mask, g, scale=0.6)
    f = lambda: loss(q, k, v, mask, g, scale=0.6)  # noqa: E731
    rng = np.random.default_rng(9)
    entries = [(0, 0), (1, 2), (n - 1, d - 1)] + [tuple(rng.integers(0, [n, d])) for _ in range(5)]
    for x, grad in ((q, dq), (k, dk)):
        for idx in entries:
            assert grad[idx] == pytest.approx(finite_difference(f, x, idx), rel=1e-6, abs=1e-8)
    for idx in [(0, 0), (n - 1, 2), (5, 1)]:
        assert dv[idx] == pytest.approx(finite_difference(f, v, idx), rel=1e-6, abs=1e-8)


def test_backward_empty_rows_have_zero_gradient():
    n, d = 13, 4
    mask = fixed_summary(n, 5, 2)              # rows 0, 1, 2 read nothing
    empty = ~mask.any(1)
    q, k, v = make_qkv(n, d, seed=10)
    g = np.random.default_rng(11).standard_normal((n, d))
    with np.errstate(all="raise"):
        dq, dk, dv = attend_backward(q, k, v, mask, g)
    for grad in (dq, dk, dv):
        assert not np.any(np.isnan(grad))
    np.testing.assert_array_equal(dq[empty], 0.0)
    # grad_out on an empty row changes nothing
    g2 = g.copy()
    g2[empty] = 1e3
    for a, b in zip((dq, dk, dv), attend_backward(q, k, v, mask, g2)):
        np.testing.assert_array_equal(a, b)
    # keys that nobody reads get no gradient (column 0: j mod 5 = 0 is no summary)
    unread = ~mask.any(0)
    assert unread[0]
    np.testing.assert_array_equal(dk[unread], 0.0)
    np.testing.assert_array_equal(dv[unread], 0.0)
    # finite differences agree on an empty row and an unread key
    f = lambda: loss(q, k, v, mask, g)  # noqa: E731
    assert finite_difference(f, q, (0, 1)) == 0.0
    assert finite_difference(f, k, (0, 2)) == 0.0


def test_backward_batched_matches_per_head():
    n, d, H = 15, 3, 2
    q, k, v = make_qkv(n, d, (H,), seed=12)
    masks = patterns.head_masks("fixed", n, H, "multihead", stride=4, c=2)
    g = np.random.default_rng(13).standard_normal((H, n, d))
    grads = attend_backward(q, k, v, masks, g)
    for h in range(H):
        for a, b in zip(grads, attend_backward(q[h], k[h], v[h], masks[h], g[h])):
            np.testing.assert_allclose(a[h], b, rtol=1e-13, atol=1e-14)


# ----------------------------------------------------------------------------
# Random sizes and patterns (hypothesis).
# ----------------------------------------------------------------------------

@st.composite
def problems(draw):
    n = draw(st.integers(1, 40))
    d = draw(st.integers(1, 8))
    stride = draw(st.integers(1, 10))
    pattern = draw(st.sampled_from(patterns.PATTERNS))
    combine = draw(st.sampled_from(patterns.COMBINES))
    H = draw(st.integers(1, 3))
    layer = draw(st.integers(0, 1))
    params = {}
    if pattern in ("strided", "strided3"):
        params = {"stride": stride}
    elif pattern == "fixed":
        divisors = [c for c in range(1, stride + 1) if stride % c == 0]
        c = draw(st.sampled_from(divisors)) if H > 1 else draw(st.integers(1, stride))
        params = {"stride": stride, "c": c}
    elif pattern == "longformer":
        params = {"window": draw(st.integers(1, 6)), "dilation": draw(st.integers(1, 3)),
                  "global_tokens": draw(st.sets(st.integers(0, n - 1), max_size=2))}
    elif pattern == "bigbird":
        params = {"window": draw(st.integers(1, 6)), "n_random": draw(st.integers(0, 3)),
                  "n_global": draw(st.integers(0, min(n, 2))), "seed": draw(st.integers(0, 9))}
    seed = draw(st.integers(0, 2**16))
    return n, d, H, pattern, combine, layer, params, seed


@settings(max_examples=60)  # cheap (< 1 s); more than the suite's default 25
@given(problems())
def test_attend_random(problem):
    n, d, H, pattern, combine, layer, params, seed = problem
    q, k, v = make_qkv(n, d, (H,), seed=seed)
    masks = patterns.head_masks(pattern, n, H, combine, layer=layer, **params)
    out, lse = attend(q, k, v, masks)
    assert not np.any(np.isnan(out)) and not np.any(np.isnan(lse))
    for h in range(H):
        want_out, want_lse = attend_rows(q[h], k[h], v[h], masks[h])
        np.testing.assert_allclose(out[h], want_out, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse[h], want_lse, rtol=1e-12, atol=1e-12)
    # gradient: one random entry of each of dq, dk, dv by finite differences
    g = np.random.default_rng(seed + 1).standard_normal(out.shape)
    grads = attend_backward(q, k, v, masks, g)
    f = lambda: loss(q, k, v, masks, g)  # noqa: E731
    rng = np.random.default_rng(seed + 2)
    for x, grad in zip((q, k, v), grads):
        idx = tuple(rng.integers(0, x.shape))
        assert grad[idx] == pytest.approx(finite_difference(f, x, idx), rel=1e-5, abs=1e-7)


# ----------------------------------------------------------------------------
# Bad input: a ValueError that says what was given and what is allowed.
# ----------------------------------------------------------------------------

def _bad_cases():
    q, k, v = make_qkv(6, 4)
    m = patterns.full(6)
    nan = q.copy()
    nan[2, 1] = np.nan
    inf = v.copy()
    inf[0, 0] = np.inf
    return [
        ("rank-1 q", (q[0], k, v, m), "q must have shape \\(..., n, d\\)"),
        ("rank-1 v", (q, k, v[:, 0], m), "v must have shape"),
        ("d of q and k differ", (q, k[:, :3], v, m), "share the last dimension"),
        ("n of k and v differ", (q, k, v[:5], m), "same \\(..., n\\) shape"),
        ("mask too small", (q, k, v, m[:5]), "does not broadcast"),
        ("mask too many dims", (q, k, v, np.ones((2, 3, 6, 6), bool)), "does not broadcast"),
        ("NaN in q", (nan, k, v, m), "q holds non-finite"),
        ("inf in v", (q, k, inf, m), "v holds non-finite"),
        ("n = 0", (q[:0], k[:0], v[:0], m[:0, :0]), "n = 0"),
        # d = 0 was read as "no key": out 0 and lse -inf in every row
        ("d = 0", (q[:, :0], k[:, :0], v, m), "q has width d = 0 .*d must be >= 1"),
        ("d_v = 0", (q, k, v[:, :0], m), "v has width d_v = 0 .*d_v must be >= 1"),
        ("int mask", (q, k, v, m.astype(int)), "mask must be a bool array"),
        ("float mask", (q, k, v, m.astype(float)), "got dtype float64"),
        ("complex q", (q.astype(complex), k, v, m), "real numbers"),
        ("bool k", (q, k > 0, v, m), "real numbers"),
    ]


@pytest.mark.parametrize("name,args,match", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input(name, args, match):
    with pytest.raises(ValueError, match=match):
        attend(*args)
    if np.ndim(args[2]) >= 2:
        g = np.zeros(np.shape(args[0])[:-1] + (np.shape(args[2])[-1],))
    else:
        g = np.zeros(1)
    with pytest.raises(ValueError, match=match):
        attend_backward(*args, g)


def test_bad_scale_and_grad_out():
    q, k, v = make_qkv(6, 4)
    m = patterns.full(6)
    with pytest.raises(ValueError, match="scale must be finite"):
        attend(q, k, v, m, scale=np.inf)
    with pytest.raises(ValueError, match="grad_out must have the output's shape"):
        attend_backward(q, k, v, m, np.zeros((6, 3)))
    with pytest.raises(ValueError, match="grad_out holds non-finite"):
        attend_backward(q, k, v, m, np.full((6, 4), np.nan))


@pytest.mark.parametrize("scale", ["a", True, float("nan"), np.complex128(0.5), 0.5j])
def test_bad_scale_is_a_value_error(scale):
    q = np.ones((3, 2))
    with pytest.raises(ValueError, match="scale"):
        attend(q, q, q, np.tril(np.ones((3, 3), dtype=bool)), scale=scale)


# ----------------------------------------------------------------------------
# Dropout on the weights: keep (the kept weights) and dropout_p, checked.
# ----------------------------------------------------------------------------

def _both(q, k, v, m, **kw):
    """attend and attend_backward on the same arguments (they share the checks)."""
    attend(q, k, v, m, **kw)
    attend_backward(q, k, v, m, np.ones(q.shape[:-1] + v.shape[-1:]), **kw)


@pytest.mark.parametrize("shape", [(7, 6), (6, 7), (2, 3, 6, 6)])
def test_keep_of_a_wrong_shape_is_named(shape):
    # (7, 6) and (6, 7) used to raise NumPy's own "shape mismatch"
    q, k, v = make_qkv(6, 4)
    with pytest.raises(ValueError, match=f"keep of shape {re.escape(str(shape))} does not "
                                         f"broadcast to the weights' shape .* = \\(6, 6\\)"):
        _both(q, k, v, patterns.full(6), keep=np.ones(shape, bool), dropout_p=0.5)


@pytest.mark.parametrize("p", ["0.5", True, False, np.True_, None, 0.5 + 0j, np.array(0.5),
                               1.0, -0.1, float("nan")])
@pytest.mark.parametrize("with_keep", [True, False])
def test_dropout_p_must_be_a_real_number_in_0_1(p, with_keep):
    # "0.5" used to raise TypeError from '<=', False was taken as p = 0
    q, k, v = make_qkv(6, 4)
    keep = np.ones((6, 6), bool) if with_keep else None
    with pytest.raises(ValueError, match=r"dropout_p must be a real number in \[0, 1\), got"):
        _both(q, k, v, patterns.full(6), keep=keep, dropout_p=p)


def test_dropout_scales_the_kept_weights():
    q, k, v = make_qkv(6, 4)
    m = patterns.full(6)
    rows = np.arange(6) % 2 == 0                                  # keep the even keys
    want = (patterns.full(6) * rows) / m.sum(1, keepdims=True)           # q = 0: uniform weights
    for p in (0, 0.25, np.float32(0.5)):
        out, _ = attend(np.zeros_like(q), k, v, m, keep=rows[None, :], dropout_p=p)
        np.testing.assert_allclose(out, want / (1 - float(p)) @ v, rtol=1e-12)
