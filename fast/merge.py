"""Exact merge of two attention pieces of the same rows through their log-sum-exp.

Child et al., 2019, eq. 7 (the merged head reads A(1) | A(2)): if a row's keys
are split into two disjoint sets a and b, with partial results
o_a = softmax(s_a) v_a and lse_a = log sum exp(s_a) (and the same for b), then

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

is exactly attention over a | b. A piece that reads nothing has lse = -inf and
weight 0; a row where both read nothing gets out 0 and lse -inf (never NaN).
The weights are computed on the (.., rows) lse vectors; the outputs are combined
in one multiply and one fused multiply-add written straight into ``out``,
in float32 (float64 for float64 inputs) when the outputs are low precision.
"""

from __future__ import annotations

import torch


def merge_lse(lse_a: torch.Tensor, lse_b: torch.Tensor):
    """(lse, w_a, w_b) for the merge above; lse_* shaped (..., rows)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = lse.masked_fill(lse == float("-inf"), 0.0)
    return lse, torch.exp(lse_a - safe), torch.exp(lse_b - safe)


def merge_into(out: torch.Tensor, lse_out: torch.Tensor, o_a: torch.Tensor, lse_a: torch.Tensor,
               o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Write the merge of (o_a, lse_a) and (o_b, lse_b) into out (..., rows, d) and
    lse_out (..., rows). Inputs may be strided views; out must not alias them."""
    lse, w_a, w_b = merge_lse(lse_a, lse_b)
    lse_out.copy_(lse)
    w_a, w_b = w_a[..., None], w_b[..., None]
    if out.dtype in (torch.float32, torch.float64):
        torch.mul(o_a, w_a.to(out.dtype), out=out)
        out.addcmul_(o_b, w_b.to(out.dtype))
    else:
        out.copy_(torch.addcmul(o_a.float() * w_a, o_b.float(), w_b))
