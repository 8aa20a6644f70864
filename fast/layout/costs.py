"""What a layout costs in tiles: the ideal speed-up over dense causal attention, and FLOPs.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for the
blocks it computes. A block-sparse kernel computes the tiles of the layout's
parts (``fast.layout.block_layout``); dense causal FlashAttention computes
nb (nb + 1) / 2 tiles per head, nb = ceil(n / block). Their ratio,

    ideal = (dense causal tiles per head) / (the layout's tiles per head)
          = 1 / BlockLayout.causal_density,

is what a kernel running every tile at the dense kernel's speed would reach: the
benchmarks report measured speed-ups as a share of it (docs/design.md, sec. 7).
A tile costs 2 matmuls of 2 B^2 d FLOPs forward (q k^T and p v) and 5 backward
(q k^T recomputed, dO v^T, p^T dO, ds k, ds^T q).

``params`` are the pattern's parameters (stride, c, window, ...), optionally with
"combine" and "layer" (default "merged", 0). Each layout is built once per
(pattern, n, heads, parameters, block, order) and only its counts are kept.
"""

from __future__ import annotations

import functools

from fast.layout.blocks import block_layout

DEFAULT_BLOCK = 64     # the Triton kernels' block: the tile the ideal is counted in


def layout_tiles(pattern: str, n: int, n_heads: int, params: dict,
                 block_size: int = DEFAULT_BLOCK, order: str = "structured") -> float:
    """Tiles computed by the layout's parts, averaged over heads."""
    return _counts(pattern, n, n_heads, _key(params), block_size, order)[0]


def ideal_speedup(pattern: str, n: int, n_heads: int, params: dict,
                  block_size: int = DEFAULT_BLOCK, order: str = "structured") -> float:
    """Dense causal tile work / the layout's tile work (both at ``block_size``)."""
    return 1.0 / _counts(pattern, n, n_heads, _key(params), block_size, order)[1]


def tile_flops(pattern: str, B: int, n: int, n_heads: int, d: int, params: dict,
               block_size: int = DEFAULT_BLOCK, backward: bool = False,
               order: str = "structured") -> float:
    """FLOPs of the computed tiles for a batch of B (forward, or forward + backward)."""
    tiles = layout_tiles(pattern, n, n_heads, params, block_size, order) * n_heads * B
    per_tile = 2 * 2 * block_size * block_size * d
    return tiles * per_tile * (1 + 2.5 if backward else 1)


def _key(params: dict) -> tuple:
    """``params`` as a hashable key (lists and ranges as tuples), each value with its
    type, so that a value equal to a valid one (True == 1, 64.0 == 64) never finds the
    valid one's entry and skips the checks ``block_layout`` makes."""
    return tuple(sorted((k, type(v).__name__, tuple(v) if isinstance(v, (list, tuple, range))
                         else v) for k, v in params.items()))


@functools.lru_cache(maxsize=None, typed=True)     # typed: n, block_size as above
def _counts(pattern, n, n_heads, params_key, block_size, order) -> tuple[float, float]:
    """(tiles per head, causal density) of one layout."""
    p = {k: v for k, _, v in params_key}
    combine, layer = p.pop("combine", "merged"), p.pop("layer", 0)
    lay = block_layout(pattern, n, n_heads=n_heads, combine=combine, layer=layer,
                       block_size=block_size, order=order, **p)
    return sum(part.n_blocks_computed for part in lay.parts) / n_heads, lay.causal_density
