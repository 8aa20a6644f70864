"""Block-sparse attention in Triton: the public wrapper, its checks and the layout cache.

Child et al., 2019, section 5.5 (block-sparse kernels) over the patterns of
section 4.3 and the head combinations of section 5.1 (eq. 5-8). The pieces, one
job each:

* ``fast.kernels.triton_kernels`` -- the @triton.jit kernels (forward, dQ, dK/dV);
* ``fast.kernels.tables``         -- a layout part's tables on the device;
* ``fast.kernels.launch``         -- the launchers and the autograd Function;
* this module                     -- ``triton_sparse_attention`` (pattern in,
  layout from ``fast.layout.block_layout``, built once per device and cached),
  ``attention_with_parts`` / ``attention_lse`` (already-built parts in) and the
  input checks (``fast.core.checks`` plus the kernel's own limits).

This is the one module to import the kernels from: it also re-exports the names
that tests and notebook 04 use (``forward``, ``interpreted``, ``device_part``,
``parts_from_masks``, ``DevicePart`` and ``merge``, the torch twin of the
in-kernel merge from ``fast.core.merge``).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from fast.core.checks import check_scale, check_tensors
from fast.core.merge import merge
from fast.kernels.launch import BlockSparseAttention, forward, interpreted
from fast.kernels.tables import DevicePart, device_part, parts_from_masks
from fast.layout import block_layout

__all__ = [
    "GPU_DTYPES", "MAX_HEAD_DIM", "DevicePart", "attention_lse", "attention_with_parts",
    "cached_layout", "clear_layout_cache", "default_block", "device_part", "forward",
    "interpreted", "merge", "parts_from_masks", "triton_sparse_attention",
]

GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128
DEFAULT_BLOCK_GPU = 64
DEFAULT_BLOCK_INTERPRETER = 32


# ----------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------

def _check_inputs(q, k, v) -> None:
    """The shared q, k, v check with the kernel's dtypes, then the kernel's limits.
    Non-finite values are left to ``fast.sparse_attention``, which checks them once:
    here the check would make every call wait for the GPU."""
    check_tensors(q, k, v, dtypes=GPU_DTYPES, finite=False)
    d = q.shape[-1]
    if d > MAX_HEAD_DIM:
        raise ValueError(
            f"head dimension d must be at most {MAX_HEAD_DIM} for the Triton kernel, got d={d} "
            "(d that is not a power of two is padded inside the kernel)"
        )
    _check_runnable(q)


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


def _prepare(q, k, v, parts, scale, block_size: int):
    """Checks, parts on q's device, the scale, contiguous q, k, v. Reads only host
    values (shapes and each part's ``top``): it never waits for the GPU."""
    _check_inputs(q, k, v)
    parts = [p if isinstance(p, DevicePart) else device_part(p, block_size, q.device)
             for p in parts]
    n_heads, n = q.shape[1], q.shape[2]
    for p in parts:
        if p.n_heads not in (1, n_heads):
            raise ValueError(f"layout part {p.name!r} has {p.n_heads} heads; q has {n_heads} "
                             f"(a part serves 1 head, shared, or all of them)")
        if p.top >= n:
            raise ValueError(f"layout part {p.name!r} reads position {p.top}, but n = {n}: it "
                             f"was built for a longer sequence")
    scale = check_scale(scale, q.shape[-1])
    q, k, v = (t.contiguous() for t in (q, k, v))
    return q, k, v, parts, scale


# ----------------------------------------------------------------------------
# Already-built parts in
# ----------------------------------------------------------------------------

def attention_with_parts(q, k, v, parts, *, scale=None, block_size: int) -> torch.Tensor:
    """Run the kernels on already-built layout parts (``LayoutPart``-like objects or
    ``DevicePart``); q, k, v (B, H, n, d). Used by the wrapper and by the tests."""
    q, k, v, parts, scale = _prepare(q, k, v, parts, scale, block_size)
    return BlockSparseAttention.apply(q, k, v, parts, scale, block_size)


def attention_lse(q, k, v, parts, *, scale=None, block_size: int):
    """Forward only, returning (out, lse) in float32 (for tests and the notebook)."""
    q, k, v, parts, scale = _prepare(q, k, v, parts, scale, block_size)
    return forward(q, k, v, parts, scale, block_size)


# ----------------------------------------------------------------------------
# Layouts: built by fast.layout, cached per (pattern, n, H, combine, layer, params, block, device)
# ----------------------------------------------------------------------------

_LAYOUTS: OrderedDict = OrderedDict()   # key -> (device parts, layout), least recently used first
MAX_CACHED_LAYOUTS = 16


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
    ``order="natural"`` (one part, natural token order) is for comparisons only.

    The cache keeps the ``MAX_CACHED_LAYOUTS`` most recently used layouts (their
    tables stay on the device: the fixed pattern's at n = 2**20, H = 8 take 4 GiB);
    ``clear_layout_cache`` empties it. Interleaved layers r and r + 2 share one
    entry (they read the same part), other combine modes one for every layer."""
    layer_key = layer % 2 if combine == "interleaved" else 0
    key = (pattern, n, n_heads, combine, layer_key,
           tuple(sorted((k, _hashable(v)) for k, v in params.items())), block, str(device),
           order)
    hit = _LAYOUTS.get(key)
    if hit is None:
        lay = block_layout(pattern, n, n_heads=n_heads, combine=combine, layer=layer_key,
                           block_size=block, order=order, **params)
        hit = ([device_part(p, block, device) for p in lay.parts], lay)
        _LAYOUTS[key] = hit
        while len(_LAYOUTS) > MAX_CACHED_LAYOUTS:
            _LAYOUTS.popitem(last=False)
    _LAYOUTS.move_to_end(key)
    return hit


def clear_layout_cache() -> None:
    """Forget every cached layout (and free its device tables)."""
    _LAYOUTS.clear()


def default_block(device) -> int:
    return DEFAULT_BLOCK_INTERPRETER if torch.device(device).type == "cpu" else DEFAULT_BLOCK_GPU


# ----------------------------------------------------------------------------
# The public wrapper
# ----------------------------------------------------------------------------

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
    _check_inputs(q, k, v)
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
