"""Exact merge of two attention pieces of the same rows through their log-sum-exp.

Child et al., 2019, eq. 7 (the merged head reads A(1) | A(2)): if a row's keys
are split into two disjoint sets a and b, with partial results
o_a = softmax(s_a) v_a and lse_a = log sum exp(s_a) (and the same for b), then

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

is exactly attention over a | b. A piece that reads nothing in a row has lse =
-inf there and weight 0. Since w_a + w_b = 1, the outputs combine in ONE pass,
``torch.lerp(o_a, o_b, w_b)`` written straight into ``out`` (float32/float64);
low-precision outputs are combined in float32.
"""

from __future__ import annotations

import torch


def merge_into(out: torch.Tensor, lse_out: torch.Tensor, o_a: torch.Tensor, lse_a: torch.Tensor,
               o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Write the merge of (o_a, lse_a) and (o_b, lse_b) into out (..., rows, d) and
    lse_out (..., rows). Inputs may be strided views; out / lse_out may be o_a /
    lse_a themselves (merging a third piece into the first two).

    Piece a must read something in every row (lse_a > -inf; b may be empty):
    then w_b = exp(lse_b) / (exp(lse_a) + exp(lse_b)) = sigmoid(lse_b - lse_a)
    is never NaN, and the whole merge is three small passes over the rows plus
    one pass over the outputs (few passes matter: on a shared 2-core machine
    every parallel op waits for both cores).
    """
    w_b = torch.sigmoid(lse_b - lse_a)[..., None]                       # (..., rows, 1)
    torch.logaddexp(lse_a, lse_b, out=lse_out)
    if out.dtype in (torch.float32, torch.float64):
        # one pass: out = o_a + w_b (o_b - o_a) = w_a o_a + w_b o_b
        torch.lerp(o_a, o_b, w_b.to(out.dtype), out=out)
    else:
        out.copy_(torch.lerp(o_a.float(), o_b.float(), w_b.float()))
