"""Block-sparse attention in Triton: launchers, exact merge, autograd, public wrapper.

Child et al., 2019, section 5.5 (block-sparse kernels) over the patterns of
section 4.3 and the head combinations of section 5.1 (eq. 5-8); FlashAttention-2
(Dao, 2023) for the forward/backward recipe.  The kernels are in
``fast/triton_kernels.py``; the block layouts (which key blocks every query
block reads, in which slot order) come from ``fast.layout.block_layout``.

A layout has one or more disjoint *parts* whose union is exactly
``reference.patterns.head_masks``.  The forward kernel runs the parts one after
another into one (out, lse) in position space, merging them exactly through
their log-sum-exp as it goes (``merge`` below is the same formula in torch):

    lse = logsumexp_p(lse_p),   out = sum_p exp(lse_p - lse) * out_p

(rows that read nothing in every part: out 0, lse -inf, never NaN).  The
backward pass gives every part the MERGED out and lse, which makes each part's
gradient its exact share of the merged gradient.

Run on a GPU, or on the CPU with ``TRITON_INTERPRET=1`` set before Triton is
imported (NumPy interpreter: float32 only, slow, for tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

try:
    import triton
except ImportError as err:  # pragma: no cover - exercised only without triton
    raise ImportError(
        "fast.kernels.triton_attention needs Triton (pip install 'sparse-transformer[triton]'); "
        "without it use fast.sparse_attention(..., backend='structured')"
    ) from err

from fast.kernels import triton_kernels as K
from fast.layout.tiles import tables

GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128
DEFAULT_BLOCK_GPU = 64
DEFAULT_BLOCK_INTERPRETER = 32


def interpreted() -> bool:
    """True when the kernels were built for the NumPy interpreter (TRITON_INTERPRET=1
    was set before Triton was imported)."""
    return type(K._fwd_kernel).__name__ == "InterpretedFunction"


# ----------------------------------------------------------------------------
# Look-up tables on the device
# ----------------------------------------------------------------------------

@dataclass
class DevicePart:
    """One layout part's tables as contiguous int32 tensors on the run device."""
    name: str
    q_pos: torch.Tensor        # (HL, Mq)
    k_pos: torch.Tensor        # (HL, Mk)
    kv_count: torch.Tensor     # (HL, NQB)
    kv_index: torch.Tensor     # (HL, NQB, MAXK)
    kv_mask: torch.Tensor      # (HL, NQB, MAXK)
    q_count: torch.Tensor      # (HL, NKB)
    q_index: torch.Tensor      # (HL, NKB, MAXQ)
    q_mask: torch.Tensor       # (HL, NKB, MAXQ)
    token_masks: torch.Tensor  # (max(NM, 1), BLOCK, BLOCK) int8
    blocks: int                # number of (query block, key block) pairs over all heads

    @property
    def n_heads(self) -> int:
        return self.q_pos.shape[0]


def _int32(x, device) -> torch.Tensor:
    return torch.as_tensor(x).to(device=device, dtype=torch.int32).contiguous()


def _table(index, mask, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, mask) as int32 (H, R, MAXK); an empty table (MAXK = 0) gets one unused column."""
    index, mask = _int32(index, device), _int32(mask, device)
    if index.shape[-1] == 0:
        index = torch.zeros(*index.shape[:-1], 1, dtype=torch.int32, device=device)
        mask = torch.full_like(index, -1)
    return index, mask


def device_part(part, block: int, device) -> DevicePart:
    """Copy a ``LayoutPart`` (or anything with its fields) to ``device`` as int32."""
    for field in ("q_pos", "k_pos"):
        # kernels of one part add into rows by position: each position may own one slot
        srt = torch.as_tensor(getattr(part, field)).cpu().sort(dim=1).values
        if ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any():
            raise ValueError(f"layout part {getattr(part, 'name', '?')!r}: {field} holds a "
                             "position twice in one head; every position may own one slot")
    name = getattr(part, "name", "?")
    part_block = getattr(part, "block_size", block)
    n_qb, n_kb = torch.as_tensor(part.kv_count).shape[-1], torch.as_tensor(part.q_count).shape[-1]
    if (part_block != block or torch.as_tensor(part.q_pos).shape[-1] != n_qb * block
            or torch.as_tensor(part.k_pos).shape[-1] != n_kb * block):
        raise ValueError(f"layout part {name!r} was built for another block size "
                         f"({part_block}; {n_qb} query blocks over "
                         f"{torch.as_tensor(part.q_pos).shape[-1]} slots) than block_size={block}")
    kv_index, kv_mask = _table(part.kv_index, part.kv_mask, device)
    q_index, q_mask = _table(part.q_index, part.q_mask, device)
    tm = torch.as_tensor(part.token_masks).reshape(-1, block, block)
    tm = tm.to(device=device, dtype=torch.int8).contiguous()
    if tm.shape[0] == 0:
        tm = torch.zeros(1, block, block, dtype=torch.int8, device=device)
    kv_count = _int32(part.kv_count, device)
    return DevicePart(
        name=str(getattr(part, "name", "part")),
        q_pos=_int32(part.q_pos, device), k_pos=_int32(part.k_pos, device),
        kv_count=kv_count, kv_index=kv_index, kv_mask=kv_mask,
        q_count=_int32(part.q_count, device), q_index=q_index, q_mask=q_mask,
        token_masks=tm, blocks=int(kv_count.sum().item()),
    )


@dataclass
class MaskPart:
    """A layout part in natural order built from a dense mask (``parts_from_masks``);
    it has the fields of ``fast.layout.LayoutPart`` that the kernels read."""
    name: str
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    kv_count: torch.Tensor
    kv_index: torch.Tensor
    kv_mask: torch.Tensor
    q_count: torch.Tensor
    q_index: torch.Tensor
    q_mask: torch.Tensor
    token_masks: torch.Tensor


def parts_from_masks(masks, block: int, names=None) -> list[MaskPart]:
    """Natural-order layout parts from dense bool masks, one part per mask.

    masks: a list of (H, n, n) bool arrays/tensors (True = query i reads key j),
    pairwise disjoint (their union is what the attention reads). O(H n^2) work and
    memory: for tests, teaching and small custom masks, not for the fast path
    (``fast.layout`` builds the real layouts from closed forms).
    """
    parts = []
    for p, m in enumerate(masks):
        m = (m if torch.is_tensor(m) else torch.from_numpy(np.array(m, dtype=bool))).bool().cpu()
        if m.dim() == 2:
            m = m[None]
        hh, n, _ = m.shape
        nb = -(-n // block)
        size = nb * block
        pad = torch.zeros(hh, size, size, dtype=torch.bool)
        pad[:, :n, :n] = m
        tiles = pad.view(hh, nb, block, nb, block).permute(0, 1, 3, 2, 4)  # (H, NQB, NKB, B, B)
        pos = torch.full((size,), -1, dtype=torch.long)
        pos[:n] = torch.arange(n)
        valid = (pos >= 0).view(nb, block)
        pair_ok = valid[:, None, :, None] & valid[None, :, None, :]       # (NQB, NKB, B, B)
        t_any = tiles.flatten(-2).any(-1)                                  # (H, NQB, NKB)
        t_full = (tiles | ~pair_ok).flatten(-2).all(-1) & t_any
        h, qb, kb = torch.nonzero(t_any, as_tuple=True)
        full = t_full[h, qb, kb]
        mid = torch.full_like(h, -1)
        part_idx = torch.nonzero(~full).squeeze(1)
        token = torch.zeros(0, block, block, dtype=torch.bool)
        if part_idx.numel():
            sel = tiles[h[part_idx], qb[part_idx], kb[part_idx]]             # (P, B, B)
            token, inv = torch.unique(sel.flatten(1), dim=0, return_inverse=True)
            token = token.view(-1, block, block)
            mid[part_idx] = inv
        kv = tables(h, qb, kb, mid, hh, nb)
        qt = tables(h, kb, qb, mid, hh, nb)
        name = names[p] if names is not None else f"mask{p}"
        parts.append(MaskPart(name, pos.expand(hh, size).clone(), pos.expand(hh, size).clone(),
                              *kv, *qt, token))
    return parts


# ----------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------

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


def merge(outs: list[torch.Tensor], lses: list[torch.Tensor]):
    """The exact log-sum-exp merge of parts, in torch (float32; empty rows -> 0, -inf):
    lse = logsumexp_p(lse_p), out = sum_p exp(lse_p - lse) out_p. The forward kernel
    does the same merge in place (ACCUMULATE); this is its readable twin (tests)."""
    lse_all = torch.stack(lses)                                      # (P, B, H, n)
    lse = torch.logsumexp(lse_all, dim=0)                            # (B, H, n)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w = torch.exp(lse_all - safe)                                    # (P, B, H, n), 0 for -inf
    out = (w.unsqueeze(-1) * torch.stack(outs)).sum(0)               # (B, H, n, d)
    return out, lse


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
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, lse, grad_out, ctx.parts, ctx.scale, ctx.block)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def attention_with_parts(q, k, v, parts, *, scale=None, block_size: int) -> torch.Tensor:
    """Run the kernels on already-built layout parts (``LayoutPart``-like objects or
    ``DevicePart``); q, k, v (B, H, n, d). Used by the wrapper and by the tests."""
    q, k, v, parts, scale = _prepare(q, k, v, parts, scale, block_size)
    return BlockSparseAttention.apply(q, k, v, parts, scale, block_size)


def attention_lse(q, k, v, parts, *, scale=None, block_size: int):
    """Forward only, returning (out, lse) in float32 (for tests and the notebook)."""
    q, k, v, parts, scale = _prepare(q, k, v, parts, scale, block_size)
    return forward(q, k, v, parts, scale, block_size)


def _prepare(q, k, v, parts, scale, block_size: int):
    """Checks, parts on q's device, the default scale, contiguous q, k, v."""
    _check_qkv(q, k, v)
    _check_runnable(q)
    parts = [p if isinstance(p, DevicePart) else device_part(p, block_size, q.device)
             for p in parts]
    n_heads, n = q.shape[1], q.shape[2]
    for p in parts:
        if p.n_heads not in (1, n_heads):
            raise ValueError(f"layout part {p.name!r} has {p.n_heads} heads; q has {n_heads} "
                             f"(a part serves 1 head, shared, or all of them)")
        top = max(int(p.q_pos.max()), int(p.k_pos.max()))
        if top >= n:
            raise ValueError(f"layout part {p.name!r} reads position {top}, but n = {n}: it "
                             f"was built for a longer sequence")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v = (t.contiguous() for t in (q, k, v))
    return q, k, v, parts, scale


# ----------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------

def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not torch.is_tensor(t):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, n, d), got shape {tuple(t.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            "q, k and v must have one shape (B, H, n, d) (causal self-attention), got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    B, H, n, d = q.shape
    if min(B, H, n, d) < 1:
        raise ValueError(f"every dimension of (B, H, n, d) must be >= 1, got {tuple(q.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in GPU_DTYPES:
        raise ValueError(f"dtype must be one of {GPU_DTYPES}, got {q.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if d > MAX_HEAD_DIM:
        raise ValueError(
            f"head dimension d must be at most {MAX_HEAD_DIM} for the Triton kernel, got d={d} "
            "(d that is not a power of two is padded inside the kernel)"
        )


def _check_runnable(q) -> None:
    if q.device.type == "cpu":
        if not interpreted():
            raise RuntimeError(
                "the Triton kernels got a CPU tensor but were compiled for a GPU: set the "
                "environment variable TRITON_INTERPRET=1 before importing triton (slow, for "
                "tests), move q, k, v to CUDA, or use fast.sparse_attention(..., "
                "backend='structured') on the CPU"
            )
        if q.dtype != torch.float32:
            raise ValueError(
                f"the Triton interpreter (TRITON_INTERPRET=1) runs float32 only, got {q.dtype}"
            )
    elif q.device.type == "cuda" and interpreted():
        raise RuntimeError(
            "TRITON_INTERPRET=1 is set, so the Triton kernels run on the CPU: "
            "pass CPU tensors or unset TRITON_INTERPRET to run on the GPU"
        )
    elif q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cuda (or cpu with TRITON_INTERPRET=1), got {q.device}")


# ----------------------------------------------------------------------------
# Layouts: built by fast.layout, cached per (pattern, n, H, combine, layer, params, block, device)
# ----------------------------------------------------------------------------

_LAYOUTS: dict = {}


def _hashable(x):
    if isinstance(x, (list, tuple, range, np.ndarray)):
        return tuple(_hashable(y) for y in x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def cached_layout(pattern: str, n: int, n_heads: int, combine: str, layer: int,
                  params: dict, block: int, device,
                  order: str = "structured") -> tuple[list[DevicePart], object]:
    """The layout's parts on ``device`` (built once, then cached), and the layout.
    ``order="natural"`` (one part, natural token order) is for comparisons only."""
    key = (pattern, n, n_heads, combine, layer,
           tuple(sorted((k, _hashable(v)) for k, v in params.items())), block, str(device),
           order)
    hit = _LAYOUTS.get(key)
    if hit is None:
        from fast.layout import block_layout
        lay = block_layout(pattern, n, n_heads=n_heads, combine=combine, layer=layer,
                           block_size=block, order=order, **params)
        hit = ([device_part(p, block, device) for p in lay.parts], lay)
        _LAYOUTS[key] = hit
    return hit


def default_block(device) -> int:
    return DEFAULT_BLOCK_INTERPRETER if torch.device(device).type == "cpu" else DEFAULT_BLOCK_GPU


def triton_sparse_attention(q, k, v, pattern: str, *, stride=None, c=None,
                            combine: str = "merged", layer: int = 0, scale=None,
                            block_size=None, order: str = "structured",
                            **pattern_params) -> torch.Tensor:
    """Sparse Transformer attention with the block-sparse Triton kernels.

    q, k, v: (B, H, n, d), any n, d <= 128, float32/float16/bfloat16 on CUDA (float32
    on the CPU under TRITON_INTERPRET=1). pattern: "full", "strided" (stride),
    "fixed" (stride, c), "longformer" (window, dilation, global_tokens) or
    "bigbird" (window, n_random, n_global, seed); combine: "merged", "multihead"
    or "interleaved" (sec. 5.1), ``layer`` picks the interleaved head. Head h of
    q reads exactly ``reference.patterns.head_masks(pattern, n, H, combine, layer)[h]``.
    Differentiable in q, k, v. Returns (B, H, n, d) in q's dtype.
    block_size: tile size (power of two >= 16; default 64 on CUDA, 32 under the
    interpreter). order: "structured" (default: strided columns transposed, fixed
    summaries gathered, so every part is truly block-sparse) or "natural" (one
    part in natural order, for comparison in the benchmark).
    """
    _check_qkv(q, k, v)
    _check_runnable(q)
    B, H, n, d = q.shape
    block = default_block(q.device) if block_size is None else block_size
    if not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
    params = dict(pattern_params)
    if stride is not None:
        params["stride"] = stride
    if c is not None:
        params["c"] = c
    parts, _ = cached_layout(pattern, n, H, combine, layer, params, block, q.device, order)
    return attention_with_parts(q, k, v, parts, scale=scale, block_size=block)
