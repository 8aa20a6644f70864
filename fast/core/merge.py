"""The exact merge of attention pieces of the same rows through their log-sum-exp.

Child et al., 2019, eq. 7 (the merged head reads A(1) | A(2)): if a row's keys
are split into disjoint sets a and b, with partial results
o_a = softmax(s_a) v_a and lse_a = log sum exp(s_a) (and the same for b), then

    lse = log(e^lse_a + e^lse_b)
    out = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b

is exactly attention over a | b; more pieces fold in one after another. A piece
that reads nothing in a row has lse = -inf and out 0 there, and weight 0. The
empty-row rule: a row that reads nothing in every piece gets out 0, lse -inf
(never NaN).

Two forms, one formula: ``merge_into`` (two pieces, written in place: the
structured backend's path) and ``merge`` (a list of pieces, built on
``merge_into``). The Triton forward kernel does the same merge in registers
(``fast.kernels.triton_kernels``, ``LOAD_PREV``); ``merge`` is its readable twin,
which the tests compare it with.
"""

from __future__ import annotations

import torch

from fast.core.precision import acc_dtype


def merge_into(out: torch.Tensor, lse_out: torch.Tensor, o_a: torch.Tensor, lse_a: torch.Tensor,
               o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Write the merge of (o_a, lse_a) and (o_b, lse_b) into out (..., rows, d) and
    lse_out (..., rows). Inputs may be strided views; out / lse_out may be o_a /
    lse_a themselves (merging a third piece into the first two).

    Since w_a + w_b = 1 with w_b = e^lse_b / (e^lse_a + e^lse_b) = sigmoid(lse_b - lse_a),
    the outputs combine in ONE pass, out = o_a + w_b (o_b - o_a) (``torch.lerp``,
    straight into ``out`` for float32/float64; low-precision outputs are combined
    in float32). The whole merge is three small passes over the rows plus one pass
    over the outputs (few passes matter: on a shared 2-core machine every parallel
    op waits for both cores). A row empty in both pieces has w_b = NaN, set to 0:
    out = o_a there (0 by the empty-row rule), lse_out = -inf.
    """
    w_b = torch.sigmoid(lse_b - lse_a).nan_to_num_(0.0)[..., None]      # (..., rows, 1)
    torch.logaddexp(lse_a, lse_b, out=lse_out)
    if acc_dtype(out.dtype) == out.dtype:
        torch.lerp(o_a, o_b, w_b.to(out.dtype), out=out)
    else:
        out.copy_(torch.lerp(o_a.float(), o_b.float(), w_b.float()))


def merge(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge of any number of pieces: outs [(..., rows, d)], lses [(..., rows)]
    -> (out, lse), new tensors of the first piece's dtypes. Pieces fold into the
    first one by one (``merge_into``); rows that read nothing in every piece end
    with out 0 and lse -inf whatever the pieces hold there."""
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError(f"merge needs one lse per output and at least one piece, "
                         f"got {len(outs)} outputs and {len(lses)} lses")
    out, lse = outs[0].clone(), lses[0].clone()
    for o, m in zip(outs[1:], lses[1:]):
        merge_into(out, lse, out, lse, o, m)
    out.masked_fill_(torch.isneginf(lse)[..., None], 0.0)               # the empty-row rule
    return out, lse
