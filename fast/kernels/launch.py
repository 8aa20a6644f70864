"""Launching the block-sparse kernels: forward, backward and their autograd Function.

Child et al., 2019, section 5.5 (block-sparse kernels) with the FlashAttention-2
recipe (Dao, 2023) for the forward and backward passes; the kernels themselves
are in ``fast.kernels.triton_kernels``, their tables in ``fast.kernels.tables``.

A layout has one or more disjoint *parts* whose union is exactly
``reference.patterns.head_masks``. ``forward`` runs the parts one after another
into one (out, lse) in position space; every part after the first is launched
with ACCUMULATE and merges into what is there through the log-sum-exp,

    lse = logsumexp_p(lse_p),   out = sum_p exp(lse_p - lse) * out_p

(rows that read nothing in every part: out 0, lse -inf, never NaN; the same
formula in torch is ``fast.core.merge.merge``). ``backward`` gives every part
the MERGED out and lse, which makes each part's gradient its exact share of the
merged gradient. Neither reads a value back from the device: the tile counts
they branch on are plain ints of ``DevicePart``.

Run on a GPU, or on the CPU with ``TRITON_INTERPRET=1`` set before Triton is
imported (NumPy interpreter: float32 only, slow, for tests).
"""

from __future__ import annotations

import torch

try:
    import triton
except ImportError as err:  # pragma: no cover - exercised only without triton
    raise ImportError(
        "fast.kernels.triton_attention needs Triton (pip install 'sparse-transformer[triton]'); "
        "without it use fast.sparse_attention(..., backend='structured')"
    ) from err

from fast.core.autograd import once_differentiable
from fast.kernels import triton_kernels as K
from fast.kernels.tables import DevicePart


def interpreted() -> bool:
    """True when the kernels were built for the NumPy interpreter (TRITON_INTERPRET=1
    was set before Triton was imported)."""
    return type(K._fwd_kernel).__name__ == "InterpretedFunction"


def _meta(q: torch.Tensor) -> dict:
    d = q.shape[-1]
    if q.dtype != torch.float32:
        precision = "tf32"        # ignored for float16 / bfloat16 operands
    elif q.device.type == "cpu":
        precision = "ieee"        # the interpreter: plain float32 NumPy matmuls
    else:
        # float32 on a GPU: never plain TF32 (it would weaken the fp32 ground truth);
        # "tf32x3" (three TF32 products) keeps float32 accuracy on tensor cores, where
        # "ieee" compiles to an FMA loop that spills (Triton 3.9, sm_80 / sm_90).
        precision = "tf32x3"
    return dict(BLOCK_D=max(16, triton.next_power_of_2(d)), PRECISION=precision)


_STAGES: dict = {}  # (kernel, BLOCK, BLOCK_D, dtype, device) -> pipeline stages that fit


def _launch(kernel, grid, args, block: int, meta: dict, dtype, device, **extra) -> None:
    """Launch with 4 warps (8 for d > 64) and 2 pipeline stages; where the GPU's
    shared memory is too small for that (float32, d = 128 on a consumer card),
    retry once with 1 stage and remember it. The interpreter ignores both."""
    key = (id(kernel), block, meta["BLOCK_D"], dtype, str(device))
    warps = 4 if meta["BLOCK_D"] <= 64 else 8
    stages = _STAGES.get(key, 2)
    while True:
        try:
            kernel[grid](*args, BLOCK=block, num_warps=warps, num_stages=stages, **meta, **extra)
        except triton.runtime.errors.OutOfResources:
            if stages == 1:
                raise
            stages = 1
            continue
        _STAGES[key] = stages
        return


def forward(q, k, v, parts: list[DevicePart], scale: float, block: int, separate=False):
    """Merged (out, lse), both float32: out (B, H, n, d), lse (B, H, n), natural log.

    With ``separate=True`` returns the per-part lists ([out_p], [lse_p]) unmerged."""
    B, H, n, d = q.shape
    meta = _meta(q)
    out = lse = None
    outs, lses = [], []
    for part in parts:
        if out is None or separate:
            out = torch.zeros(B, H, n, d, dtype=torch.float32, device=q.device)
            lse = torch.full((B, H, n), float("-inf"), dtype=torch.float32, device=q.device)
            outs.append(out)
            lses.append(lse)
            first = True
        hl, mq = part.q_pos.shape
        nqb, maxk = part.kv_index.shape[1], part.kv_index.shape[2]
        if nqb > 0 and part.blocks > 0:
            _launch(K._fwd_kernel, (nqb, B * H), (
                q, k, v, out, lse,
                q.stride(0), q.stride(1), q.stride(2),
                k.stride(0), k.stride(1), k.stride(2),
                v.stride(0), v.stride(1), v.stride(2),
                out.stride(0), out.stride(1), out.stride(2),
                lse.stride(0), lse.stride(1),
                part.q_pos, part.k_pos, part.kv_count, part.kv_index, part.kv_mask,
                part.token_masks,
                H, hl, mq, part.k_pos.shape[1], nqb, maxk, d,
                scale * K.LOG2E,
            ), block, meta, q.dtype, q.device, ACCUMULATE=not first)
            first = False
    if separate:
        return outs, lses
    if out is None:  # no parts at all: nothing is read
        out = torch.zeros(B, H, n, d, dtype=torch.float32, device=q.device)
        lse = torch.full((B, H, n), float("-inf"), dtype=torch.float32, device=q.device)
    return out, lse


def backward(q, k, v, out, lse, grad_out, parts: list[DevicePart], scale: float, block: int):
    """(dq, dk, dv) in float32 from the merged out and lse (FlashAttention-2 backward)."""
    B, H, n, d = q.shape
    if k.stride() != v.stride():
        raise ValueError(f"k and v must share strides, got {k.stride()} and {v.stride()}")
    meta = _meta(q)
    do = grad_out.to(q.dtype).contiguous()
    delta = (grad_out.float() * out).sum(-1).contiguous()           # (B, H, n)
    lse = lse.contiguous()
    dq = torch.zeros(B, H, n, d, dtype=torch.float32, device=q.device)
    dk = torch.zeros_like(dq)
    dv = torch.zeros_like(dq)
    common = (
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
    )
    for part in parts:
        if part.blocks == 0:
            continue
        hl, mq = part.q_pos.shape
        mk = part.k_pos.shape[1]
        nqb, maxk = part.kv_index.shape[1], part.kv_index.shape[2]
        nkb, maxq = part.q_index.shape[1], part.q_index.shape[2]
        _launch(K._dq_kernel, (nqb, B * H), (
            q, k, v, do, lse, delta, dq, *common,
            part.q_pos, part.k_pos, part.kv_count, part.kv_index, part.kv_mask,
            part.token_masks,
            H, hl, n, mq, mk, nqb, maxk, d, scale * K.LOG2E, scale,
        ), block, meta, q.dtype, q.device)
        _launch(K._dkdv_kernel, (nkb, B * H), (
            q, k, v, do, lse, delta, dk, dv, *common,
            part.q_pos, part.k_pos, part.q_count, part.q_index, part.q_mask,
            part.token_masks,
            H, hl, n, mq, mk, nkb, maxq, d, scale * K.LOG2E, scale,
        ), block, meta, q.dtype, q.device)
    return dq, dk, dv


class BlockSparseAttention(torch.autograd.Function):
    """out = softmax(scale q k^T restricted to the layout) v, with a Triton backward."""

    @staticmethod
    def forward(ctx, q, k, v, parts, scale, block):
        out, lse = forward(q, k, v, parts, scale, block)
        out = out.to(q.dtype)  # saved as returned: delta = rowsum(dO * O) as in FlashAttention-2
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.parts, ctx.scale, ctx.block = parts, scale, block
        return out

    @staticmethod
    @once_differentiable("the Triton backend of sparse_attention")
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, lse, grad_out, ctx.parts, ctx.scale, ctx.block)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None
