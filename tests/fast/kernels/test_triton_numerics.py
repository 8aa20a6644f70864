"""The Triton kernels at the edges of float32: any finite scale, ties of large scores,
NaN and inf.

Child et al., 2019, section 4 (eq. 2-4: softmax of scaled scores) and section 5.5
(block-sparse kernels whose parts merge through their softmax statistics). Under
the interpreter (float32) every case is compared with the float64 reference:

* any finite scale -- large (one-hot rows), tiny (uniform rows), zero and negative --
  gives the reference's output and q, k, v gradients by the flash-attention rule
  (the low-precision reference is exact on one-hot rows, so the kernel must be too);
* when every score a row reads is equal and large, the parts merge with their exact
  weights (a merge through one float32 log-sum-exp loses them);
* with no finiteness check (``check_finite=False``), a NaN or inf reaches exactly the
  rows that read it, as the reference's formula evaluated on each row's pairs does:
  never a finite stand-in (the 0 of an empty row) in their place, never a NaN in a
  row that does not read it (forward; in the backward a tile may also spread it to
  rows that share the tile, as the dense reference spreads it to every row).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import sparse_attention
from tests.fast.kernels.triton_helpers import (
    flash_rule,
    make_inputs,
    needs_runner,
    ref_masks,
    triton_attention,
)

# NumPy in the interpreter warns of exp2 overflowing on pairs that are masked out after it
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")

BLOCK = 16
# (pattern, combine, params, H, n, d): two parts each, odd n
STRIDED = ("strided", "merged", dict(stride=7), 2, 45, 16)
FIXED = ("fixed", "multihead", dict(stride=8, c=2), 2, 37, 16)


def _masks(pattern, combine, params, H, n) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(ref_masks(pattern, n, H, combine, 0, **params)))


def _kernel(pattern, combine, params, variant, scale, entry="kernel"):
    if entry == "kernel":
        return lambda a, b, c: triton_attention.triton_sparse_attention(
            a, b, c, pattern, combine=combine, scale=scale, block_size=BLOCK, variant=variant,
            **params)
    return lambda a, b, c: sparse_attention(a, b, c, pattern, combine=combine, scale=scale,
                                            backend="triton", variant=variant,
                                            check_finite=False, **params)


# ----------------------------------------------------------------------------
# Any finite scale
# ----------------------------------------------------------------------------

SCALES = [  # (scale, variant, entry, case): every scale once, each path on a few
    *[(s, "baseline", "kernel", STRIDED) for s in (1e4, 1e10, 1e-30, 5e-324, 0.0, -0.7)],
    (1e6, "all", "kernel", STRIDED), (1e-45, "all", "kernel", STRIDED),
    (-1e6, "baseline", "sparse_attention", STRIDED), (1e10, "all", "sparse_attention", FIXED),
]


@pytest.mark.slow
@needs_runner
@pytest.mark.parametrize("scale,variant,entry,case", SCALES,
                         ids=[f"{s}-{v}-{e}-{c[0]}" for s, v, e, c in SCALES])
def test_any_finite_scale_matches_the_reference(scale, variant, entry, case):
    """Large scales make rows one-hot: delta must cancel dP exactly there (the
    low-precision reference's softmax backward does), and the backward must find
    the forward's maximum again exactly (a log-sum-exp rounded in float32 at
    |scale q.k| ~ 1e11 misses it by thousands). Tiny and zero scales make rows
    uniform; negative ones reverse the order of the scores."""
    pattern, combine, params, H, n, d = case
    masks = _masks(pattern, combine, params, H, n)
    q, k, v, do = make_inputs(1, H, n, d, seed=3, dtype=torch.float64)
    flash_rule(_kernel(pattern, combine, params, variant, scale, entry), (q, k, v), do, masks,
               scale, torch.float32, 1e-4, f"{pattern} {combine} scale={scale} {variant} {entry}")


# ----------------------------------------------------------------------------
# Ties of large scores
# ----------------------------------------------------------------------------

TIES = [(4e4, "baseline", STRIDED), (3.6e7, "baseline", STRIDED), (3.6e7, "baseline", FIXED),
        (3.6e7, "all", STRIDED)]


@pytest.mark.slow
@needs_runner
@pytest.mark.parametrize("score,variant,case", TIES,
                         ids=[f"{s:g}-{v}-{c[0]}" for s, v, c in TIES])
def test_tied_large_scores_merge_exactly(score, variant, case):
    """Every score a row reads equal to ``score``: each row's output is the mean of the
    values it reads, exactly, however its keys are split among the parts."""
    for pattern, combine, params, H, n, d in [case]:
        masks = _masks(pattern, combine, params, H, n)
        _, _, v, do = make_inputs(1, H, n, d, seed=4, dtype=torch.float64)
        a = 1000.0
        q = torch.full((1, H, n, d), a, dtype=torch.float64)
        k = torch.full((1, H, n, d), a, dtype=torch.float64)
        scale = score / (d * a * a)                                   # scale q.k = score
        kernel = _kernel(pattern, combine, params, variant, scale)
        got = flash_rule(kernel, (q, k, v), do, masks, scale, torch.float32, 1e-4,
                         f"{pattern} {combine} tied scores {score:g} {variant}")
        reads = masks.double()[None]                                   # (1, H, n, n)
        mean = (reads @ v) / reads.sum(-1, keepdim=True).clamp(min=1)
        err = (got[0].double() - mean).abs().max().item()
        print(f"{pattern} {combine} tied scores {score:g}: output vs the mean {err:.2e}")
        assert err < 1e-5


# ----------------------------------------------------------------------------
# NaN and inf without a finiteness check
# ----------------------------------------------------------------------------

def _per_row(q, k, v, masks, scale) -> torch.Tensor:
    """The reference's formula (``reference.attention``) in float64 IEEE arithmetic,
    each row over only the pairs it reads: out (B, H, n, d); a row whose scores are
    all -inf reads nothing (0), as there."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    B, H, n, _ = q.shape
    for b in range(B):
        for h in range(H):
            for i in range(n):
                j = torch.nonzero(masks[h, i]).flatten()
                if j.numel() == 0:
                    continue
                s = scale * (k[b, h, j].double() @ q[b, h, i].double())        # (|j|,)
                m = s.max()
                if bool(m == float("-inf")):
                    continue
                p = torch.exp(s - m)
                out[b, h, i] = (p @ v[b, h, j].double()) / p.sum()
    return out


def _grads(fn, q, k, v, do):
    ins = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = fn(*ins)
    out.backward(do)
    return [out.detach()] + [t.grad for t in ins]


BAD = [  # (tensor, row, column, value, variant, case)
    ("q", 20, None, float("nan"), "baseline", STRIDED),      # a whole query row
    ("q", 31, 0, float("inf"), "all", FIXED),
    ("k", 9, 2, float("nan"), "baseline", STRIDED),
    ("k", 14, 0, float("-inf"), "all", STRIDED),
    ("v", 17, 5, float("nan"), "baseline", FIXED),
    ("v", 6, 1, float("inf"), "all", STRIDED),
]


@pytest.mark.slow
@needs_runner
@pytest.mark.parametrize("bad", BAD, ids=lambda b: f"{b[0]}{b[1]}-{b[3]}-{b[4]}-{b[5][0]}")
def test_nan_and_inf_reach_the_rows_that_read_them(bad):
    which, row, col, value, variant, case = bad
    for pattern, combine, params, H, n, d in [case]:
        masks = _masks(pattern, combine, params, H, n)                 # (H, n, n)
        q, k, v, do = make_inputs(1, H, n, d, seed=5)
        x = dict(q=q, k=k, v=v)[which]
        x[0, :, row, slice(None) if col is None else col] = value
        scale = d ** -0.5
        got = _grads(_kernel(pattern, combine, params, variant, scale, "sparse_attention"),
                     q, k, v, do)
        out, dq, dk, dv = (t[0] for t in got)                          # (H, n, d)
        want = _per_row(q, k, v, masks, scale)[0]
        # rows that read the bad value (q: its own row; k, v: the rows reading that key)
        bad_rows = torch.zeros(H, n, dtype=torch.bool)
        if which == "q":
            bad_rows[:, row] = True
        else:
            bad_rows |= masks[:, :, row]
        print(f"{pattern} {which}[{row}] = {value}: rows NaN/inf "
              f"{int((~torch.isfinite(out)).any(-1).sum())}, reference "
              f"{int((~torch.isfinite(want)).any(-1).sum())}")
        if which in ("q", "k"):     # the forward masks scores before it uses them
            nonfinite = ~torch.isfinite(want)
            assert torch.equal(~torch.isfinite(out.double()), nonfinite), "NaN/inf rows differ"
            np.testing.assert_allclose(out.double()[~nonfinite], want[~nonfinite], atol=2e-5)
        else:                       # p v: a tile spreads it to the rows sharing it
            assert bool((~torch.isfinite(out[bad_rows])).any(-1).all())
        # the backward: a row whose output is not finite has no finite dq, and the keys
        # it read no finite dk, dv in its head (never the 0 of an empty row)
        for h, i in torch.nonzero((~torch.isfinite(want)).any(-1)).tolist():
            assert not bool(torch.isfinite(dq[h, i]).all()), f"dq[{h}, {i}] finite"
            read = torch.nonzero(masks[h, i]).flatten()
            assert not bool(torch.isfinite(dk[h, read]).all(-1).any()), f"dk of row {i} finite"
        # rows that do not read it keep their value (q and k: forward, and q: dq)
        if which in ("q", "k"):
            clean = [t.clone() for t in (q, k, v)]
            dict(q=clean[0], k=clean[1], v=clean[2])[which][0, :, row] = 0.0
            ref = _grads(_kernel(pattern, combine, params, "baseline", scale), *clean, do)
            keep = ~bad_rows
            np.testing.assert_allclose(out[keep].numpy(), ref[0][0][keep].numpy(), atol=2e-5)
            if which == "q":
                np.testing.assert_allclose(dq[keep].numpy(), ref[1][0][keep].numpy(), atol=2e-5)
