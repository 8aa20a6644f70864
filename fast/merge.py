"""Exact merge of two attention pieces of the same rows through their log-sum-exp.

Child et al., 2019, eq. 7 (the merged head reads A(1) | A(2)): if a row's keys
are split into two disjoint sets a and b, with partial results
o_a = softmax(s_a) v_a and lse_a = log sum exp(s_a) (and the same for b), then

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

is exactly attention over a | b. A piece that reads nothing has lse = -inf and
weight 0; a row where both read nothing gets out 0 and lse -inf (never NaN).
The weights are computed on the (.., rows) lse vectors. Since w_a + w_b = 1, the
outputs combine in ONE pass, ``torch.lerp(o_a, o_b, w_b)`` written straight into
``out`` (float32/float64); low-precision outputs are combined in float32.
"""

from __future__ import annotations

import torch


def merge_lse(lse_a: torch.Tensor, lse_b: torch.Tensor):
    """(lse, w_b) for the merge above (w_a = 1 - w_b); lse_* shaped (..., rows).
    w_b = sigmoid(lse_b - lse_a): a few small passes over the rows, no sync. Rows
    where both read nothing get w_b = 0, so out = o_a = 0 (a kernel's empty row)."""
    lse = torch.logaddexp(lse_a, lse_b)
    # exp(lse_b) / (exp(lse_a) + exp(lse_b)); NaN (both -inf: nothing read) -> 0
    w_b = torch.sigmoid(lse_b - lse_a).nan_to_num_(0.0)
    return lse, w_b


def merge_into(out: torch.Tensor, lse_out: torch.Tensor, o_a: torch.Tensor, lse_a: torch.Tensor,
               o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Write the merge of (o_a, lse_a) and (o_b, lse_b) into out (..., rows, d) and
    lse_out (..., rows). Inputs may be strided views, and out may be o_a itself."""
    lse, w_b = merge_lse(lse_a, lse_b)
    lse_out.copy_(lse)
    w_b = w_b[..., None]
    if out.dtype in (torch.float32, torch.float64):
        # one pass: out = o_a + w_b (o_b - o_a) = w_a o_a + w_b o_b
        torch.lerp(o_a, o_b, w_b.to(out.dtype), out=out)
    else:
        out.copy_(torch.lerp(o_a.float(), o_b.float(), w_b.float()))
