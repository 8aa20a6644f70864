"""Prefix parts: query i reads the first K(i) key slots of its head.

Child et al., 2019, sec. 4.3 and 5.5 ("Fixed attention positions can be aggregated
and computed in blocks"): with the fixed pattern's summary keys gathered in order
(``fast.layout.parts.fixed_summary``), query i of head h reads exactly the key
slots [0, K_h(i)), where K_h(i), the number of summary positions it may read, is
a closed form that never decreases with i. Everything about the part follows from
K evaluated per query block, never per tile:

* query block qb (first position f, last real position g) reads the key blocks
  [0, ceil(K(g) / B)); the first floor(K(f) / B) of them are full (none when the
  block holds padding rows);
* the others, the *edge* tiles (one or two per query block when B <= l), get
  their token masks from per-row thresholds ``y < K(f + x) - kb B``; tiles whose
  thresholds provably agree (the same head, f mod ``period``, K(f) - kb B) share
  one evaluation, and equal masks are stored once;
* key block kb is read by every query block from the first with
  ceil(K(g) / B) > kb to the last, so both look-up tables are ranges
  (``fast.layout.lut.RangeLUT``), written on the device that runs the kernel.

At n = 2**20 (l = 256, c = 32, H = 8, block 64) the summary part holds 134 M tiles,
too many to list on the host (listed, each of its two tables holds 8 x 16384 x 2048
index and mask entries: 2 GiB). Here the host work is O(H n / B) plus the edge tiles.
"""

from __future__ import annotations

from typing import Callable

import torch

from fast.layout import slots
from fast.layout.lut import RangeLUT
from fast.layout.slots import SlotMap
from fast.layout.tiles import expand_ranges

# K: (heads (...), positions (...)) -> int64 (...), the number of key slots read.
Reads = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def prefix_part(name: str, n: int, k_pos: torch.Tensor, block: int, reads: Reads,
                period: int | None = None, k_map: SlotMap | None = None) -> dict:
    """The fields of a ``LayoutPart`` whose query slots are in natural order and whose
    query i of head h reads the key slots [0, reads(h, i)).

    k_pos: (H, Mk) key slot positions, real slots first (-1 = padding after them).
    reads must never decrease with i and never pass a head's real key slots.
    period: if given, K_h(f + x) - K_h(f) depends only on (h, f mod period) for
    0 <= x < B (then tiles are keyed by it and evaluated once per key).
    k_map: ``k_pos`` as a formula (``fast.layout.slots``), if it is one.
    """
    n_heads, mk = k_pos.shape
    n_qb = -(-n // block)
    n_kb = mk // block
    q_map = slots.natural(n, block, n_heads)
    q_pos = q_map.positions()                                            # (H, Mq)
    heads = torch.arange(n_heads)[:, None]                               # (H, 1)
    first = torch.arange(n_qb) * block                                   # f of each block
    last = (first + block - 1).clamp(max=n - 1)                          # g
    k_first, k_last = reads(heads, first[None]), reads(heads, last[None])  # (H, NQB)
    _check(name, k_pos, k_first, k_last)
    count = -(-k_last // block)                                          # (H, NQB)
    padded = (last - first + 1 < block)[None]                            # the last block
    n_full = torch.where(padded, 0, k_first // block).minimum(count)

    # Edge tiles: key blocks [n_full, count) of every query block.
    h, qb, kb = expand_ranges(heads.expand(-1, n_qb).reshape(-1),
                              torch.arange(n_qb).repeat(n_heads),
                              n_full.reshape(-1), count.reshape(-1) - 1)
    f = first[qb]
    key = torch.full_like(h, -1)
    if period is not None:   # equal keys, equal masks: (f mod period, K(f) - kb B, head)
        shift = k_first[h, qb] - kb * block + block * n_qb                # >= 0
        key = ((f % period) * (2 * block * n_qb + 1) + shift) * n_heads + h
        key = torch.where(padded[0, qb], -1, key)
    rep, of_edge = _representatives(key)
    x = torch.arange(block)
    rows = f[rep, None] + x                                              # (R, B) positions
    thresholds = (reads(h[rep, None], rows.clamp(max=n - 1)) - (kb[rep] * block)[:, None])
    thresholds = torch.where(rows < n, thresholds.clamp(0, block), 0)    # (R, B)
    masks, mid_rep = torch.unique(thresholds, dim=0, return_inverse=True)
    token_masks = x[None, None, :] < masks[:, :, None]                   # (M, B, B) bool
    mid = mid_rep[of_edge]

    width = max(1, int(count.max()) if count.numel() else 1)
    kv = RangeLUT(torch.zeros_like(count), width, (h, qb, kb, mid))
    kbs = torch.arange(n_kb).expand(n_heads, n_kb).contiguous()
    q_first = torch.searchsorted(count.contiguous(), kbs, right=True)    # (H, NKB)
    q_count = n_qb - q_first
    q_width = max(1, int(q_count.max()) if q_count.numel() else 1)
    q = RangeLUT(q_first, q_width, (h, kb, qb - q_first[h, kb], mid))
    return dict(name=name, block_size=block, q_pos=q_pos, k_pos=k_pos,
                kv_count=count.to(torch.int32), kv_lut=kv,
                q_count=q_count.to(torch.int32), q_lut=q, token_masks=token_masks,
                q_map=q_map, k_map=k_map)


def _check(name, k_pos, k_first, k_last) -> None:
    """Real key slots come first; K never decreases and never passes them."""
    real = (k_pos >= 0).sum(1)                                           # (H,)
    if bool((k_pos[:, :-1] < 0).logical_and(k_pos[:, 1:] >= 0).any()):
        raise ValueError(f"part {name!r}: a real key slot follows a padding slot")
    if bool((k_last.amax(1, keepdim=True) > real[:, None]).any()) or bool((k_first < 0).any()):
        raise ValueError(f"part {name!r}: a query reads past its head's real key slots")
    if bool((k_last < k_first).any()) or bool((k_first[:, 1:] < k_last[:, :-1]).any()):
        raise ValueError(f"part {name!r}: K(i) decreases with i")


def _representatives(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One edge tile per distinct key (-1: no key, its own), and each tile's
    representative among them: (rep indices (R,), index into rep of each tile)."""
    keyed = key >= 0
    uniq, inv = torch.unique(key[keyed], return_inverse=True)
    first = torch.full((uniq.shape[0],), key.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.nonzero(keyed).squeeze(1), "amin")
    own = torch.nonzero(~keyed).squeeze(1)
    of_edge = torch.empty_like(key)
    of_edge[keyed] = inv
    of_edge[own] = torch.arange(uniq.shape[0], uniq.shape[0] + own.shape[0])
    return torch.cat([first, own]), of_edge
