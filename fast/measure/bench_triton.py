"""GPU benchmark pieces for the block-sparse Triton kernel: contenders, ideal speed-up, FLOPs.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for the
blocks it computes. Here the "ideal speedup" of a layout over dense causal
FlashAttention is that ratio of block work,

    ideal = (dense causal tiles: nb (nb + 1) / 2 per head) / (tiles in the layout's parts),

nb = ceil(n / block), averaged over heads; a kernel that ran every tile at the
dense kernel's speed would reach it. ``python -m fast bench --device cuda``
(``fast.measure.bench_gpu``, with dense SDPA, FlexAttention and the structured
PyTorch path as peers) takes its Triton contenders from ``contenders`` and
reports the measured speed-up as a % of ``ideal_speedup`` and the TFLOP/s of the
tiles computed (``flops``). Triton is an optional dependency: it is imported only
when a kernel is built.
"""

from __future__ import annotations

import functools

import torch

from fast.layout import block_layout

DEFAULT_BLOCK = 64


def _params(pattern: str, params: dict) -> dict:
    """Split the pattern parameters into (combine, layer, the rest)."""
    p = dict(params)
    return dict(combine=p.pop("combine", "merged"), layer=p.pop("layer", 0), params=p)


def contenders(pattern: str, params: dict, dtype: torch.dtype,
               block_size: int = DEFAULT_BLOCK) -> dict:
    """Triton contenders for one pattern: {name: fn(q, k, v) -> out}, q (B, H, n, d).

    params: the pattern's parameters (stride, c, window, ...), optionally with
    "combine" and "layer". ``dtype`` is the dtype the caller will pass (the kernel
    takes float32/float16/bfloat16 on CUDA); it is checked here so a bad one fails
    before timing starts.
    """
    # optional dependency: the kernel module needs Triton
    from fast.kernels.triton_attention import GPU_DTYPES, triton_sparse_attention
    if dtype not in GPU_DTYPES:
        raise ValueError(f"dtype must be one of {GPU_DTYPES}, got {dtype}")
    sp = _params(pattern, params)

    def make(order):
        def fn(q, k, v):
            return triton_sparse_attention(q, k, v, pattern, combine=sp["combine"],
                                           layer=sp["layer"], block_size=block_size,
                                           order=order, **sp["params"])
        return fn

    out = {"triton block-sparse": make("structured")}
    if pattern != "full":
        # the same kernel on the one-part natural-order layout: what a block-sparse
        # kernel without the transposition / gathering runs (in natural order the strided
        # and fixed patterns touch almost every causal tile; docs/design.md, sec. 5.5)
        out["triton natural order"] = make("natural")
    return out


def layout_blocks(pattern: str, n: int, n_heads: int, params: dict,
                  block_size: int = DEFAULT_BLOCK, order: str = "structured") -> float:
    """Tiles computed by the layout's parts, averaged over heads."""
    key = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple, range)) else v)
                       for k, v in params.items()))
    return _layout_blocks(pattern, n, n_heads, key, block_size, order)


@functools.lru_cache(maxsize=None)
def _layout_blocks(pattern, n, n_heads, params_key, block_size, order) -> float:
    sp = _params(pattern, dict(params_key))
    lay = block_layout(pattern, n, n_heads=n_heads, combine=sp["combine"], layer=sp["layer"],
                       block_size=block_size, order=order, **sp["params"])
    return sum(int(p.kv_count.sum()) for p in lay.parts) / n_heads


def ideal_speedup(pattern: str, n: int, n_heads: int, params: dict,
                  block_size: int = DEFAULT_BLOCK, order: str = "structured") -> float:
    """Dense causal tile work / the layout's tile work (both at ``block_size``)."""
    nb = -(-n // block_size)
    return (nb * (nb + 1) / 2) / layout_blocks(pattern, n, n_heads, params, block_size, order)


def flops(pattern: str, B: int, n: int, n_heads: int, d: int, params: dict,
          block_size: int = DEFAULT_BLOCK, backward: bool = False,
          order: str = "structured") -> float:
    """FLOPs of the computed tiles: 2 matmuls of 2 B^2 d each per tile forward
    (q k^T and p v), 5 backward (recomputed q k^T, dO v^T, p^T dO, ds k, ds^T q)."""
    tiles = layout_blocks(pattern, n, n_heads, params, block_size, order) * n_heads * B
    per_tile = 2 * 2 * block_size * block_size * d
    return tiles * per_tile * (1 + 2.5 if backward else 1)
