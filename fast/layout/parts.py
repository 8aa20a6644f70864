"""The part kinds of a block layout: slot orders, candidate tiles, token rules.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers", sec. 4.3
(strided and fixed patterns) and sec. 5.5 ("attention with a stride of k can be
computed by transposing the matrix and computing a local window. Fixed attention
positions can be aggregated and computed in blocks"; the matrix transposed here is
the sequence folded into an (n/l, l) grid). Definitions and off-by-ones as
in ``reference/patterns.py`` (strided local 0 <= i - j < l, exactly l positions;
fixed summaries the c positions l-c..l-1 of each block, or a head's sub-block).

Each function below is one part kind. It returns a ``Plan``: the position held by
every query and key slot (its token order), the candidate tiles enumerated by
interval arithmetic on block ranges (never an n x n mask), which candidates are
certainly full, the exact token rule on positions, and optionally a tile key
(tiles with one key have one mask). ``fast.layout.tiles.build_part`` turns a plan
into tables. The fixed summary, where query i reads the first K(i) gathered key
slots, is built at once by ``fast.layout.prefix.prefix_part`` without listing
its tiles. Per-head behaviour comes from small per-head tensors indexed by h.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fast.layout import slots
from fast.layout.prefix import prefix_part
from fast.layout.slots import SlotMap
from fast.layout.tiles import Rule, TileKey, expand_ranges

BIG = 1 << 40  # "no upper bound" on a band's rows back


class Plan(NamedTuple):
    name: str
    q_pos: torch.Tensor   # (H, Mq) position of each query slot, -1 = padding
    k_pos: torch.Tensor   # (H, Mk)
    cand: tuple           # (h, qb, kb, full), each (P,)
    rule: Rule
    tile_key: TileKey | None
    pairs: tuple | None = None  # (h, i, j): explicit allowed pairs OR-ed into the rule
    q_map: SlotMap | None = None  # q_pos as a formula (``fast.layout.slots``), if it is one
    k_map: SlotMap | None = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fdiv(a: torch.Tensor, b) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="floor")


# ----------------------------------------------------------------------------
# Slot orders.
# ----------------------------------------------------------------------------

def natural_slots(n: int, block: int, n_heads: int) -> torch.Tensor:
    """Natural order, padded to a multiple of the block: (H, ceil(n/B)*B)
    (``fast.layout.slots.natural``)."""
    return slots.natural(n, block, n_heads).positions()


def gathered_slots(lists: list[torch.Tensor], block: int) -> torch.Tensor:
    """Per-head sorted position lists, padded with -1 to a common multiple of B."""
    m = max(1, _cdiv(max(len(x) for x in lists), block)) * block
    out = torch.full((len(lists), m), -1, dtype=torch.long)
    for h, x in enumerate(lists):
        out[h, : len(x)] = x
    return out


def _block_last(pos: torch.Tensor, block: int) -> torch.Tensor:
    """Largest position in every block of slots: (H, NB); -1 for an empty block."""
    return pos.view(pos.shape[0], -1, block).amax(-1)


def _block_first(pos: torch.Tensor, block: int) -> torch.Tensor:
    """Smallest valid position in every block of slots: (H, NB); BIG if empty."""
    p = pos.view(pos.shape[0], -1, block)
    return torch.where(p >= 0, p, BIG).amin(-1)


def _grid(active: torch.Tensor, n_rows: int):
    """(h, row) for every active head and every row: each (A * n_rows,)."""
    heads = torch.nonzero(active).squeeze(1)
    rows = torch.arange(n_rows)
    return heads.repeat_interleave(n_rows), rows.repeat(heads.shape[0])


# ----------------------------------------------------------------------------
# Band: i - j = r * p with lo[h] <= r < hi[h], in the order transposed by p.
# Strided "local" (p = 1, r < l), strided "column" (p = l), full (p = 1, no
# upper bound), Longformer's (dilated) window (p = dilation, r < window).
# ----------------------------------------------------------------------------

def band_rule(period: int, lo: torch.Tensor, hi: torch.Tensor) -> Rule:
    def rule(h, i, j):
        back = i - j
        r = _fdiv(back, period)
        return (back >= 0) & (back % period == 0) & (r >= lo[h]) & (r < hi[h])
    return rule


def band(name: str, n: int, block: int, period: int, lo: torch.Tensor, hi: torch.Tensor,
         active: torch.Tensor) -> Plan:
    """Every head reads rows r in [lo[h], hi[h]) back in its own column of the
    transposed grid. Candidate key blocks of a query block: a contiguous range of
    row blocks of the same column; a tile is full when all its row offsets fit."""
    n_heads = active.shape[0]
    order = slots.transposed(n, period, block, n_heads)   # every column padded to R_pad
    pos = order.positions()                               # (H, min(p, n) R_pad)
    rb = _cdiv(_cdiv(n, period), block)           # row blocks per column
    h, qb = _grid(active, min(period, n) * rb)
    col, rq = qb // rb, qb % rb
    k_lo = _fdiv((rq * block - hi[h] + 1).clamp(min=0), block)
    k_hi = _fdiv(rq * block + block - 1 - lo[h], block)
    h, qb, kb = expand_ranges(h, qb, col * rb + k_lo, col * rb + k_hi)
    d = qb - kb                                   # row-block offset, same column
    full = (d * block - (block - 1) >= lo[h]) & (d * block + block - 1 < hi[h])

    def tile_key(h, qb, kb):  # a tile's mask depends only on its row-block offset
        return (qb - kb) * n_heads + h

    return Plan(name, pos, pos, (h, qb, kb, full), band_rule(period, lo, hi), tile_key,
                q_map=order, k_map=order)


# ----------------------------------------------------------------------------
# Fixed pattern: "block" (causal inside each block of l) and "summary".
# ----------------------------------------------------------------------------

def fixed_block_rule(stride: int) -> Rule:
    def rule(h, i, j):
        return (j <= i) & (_fdiv(j, stride) == _fdiv(i, stride))
    return rule


def fixed_block(n: int, block: int, stride: int, active: torch.Tensor) -> Plan:
    """A(1) of fixed, natural order: key blocks from the start of the query
    block's first l-block up to the diagonal."""
    n_heads = active.shape[0]
    order = slots.natural(n, block, n_heads)
    pos = order.positions()
    h, qb = _grid(active, pos.shape[1] // block)
    q_lo, q_hi = qb * block, (qb * block + block - 1).clamp(max=n - 1)
    h, qb, kb = expand_ranges(h, qb, _fdiv(_fdiv(q_lo, stride) * stride, block),
                              _fdiv(q_hi, block))
    q_lo, k_lo = qb * block, kb * block
    full = (k_lo + block - 1 <= q_lo) & (k_lo >= _fdiv(q_lo + block - 1, stride) * stride)

    def tile_key(h, qb, kb):  # depends on the block offset and the phase of q_lo in l
        return ((qb - kb) * stride + (qb * block) % stride) * n_heads + h

    return Plan("block", pos, pos, (h, qb, kb, full), fixed_block_rule(stride), tile_key,
                q_map=order, k_map=order)


def summary_rule(stride: int, lo: torch.Tensor, hi: torch.Tensor, strict: torch.Tensor) -> Rule:
    """(j mod l) in [lo[h], hi[h]), j <= i; strict heads only earlier l-blocks
    (the query's own block is then read by the "block" part)."""
    def rule(h, i, j):
        phase = j % stride
        earlier = _fdiv(j, stride) < _fdiv(i, stride)
        return (j <= i) & (phase >= lo[h]) & (phase < hi[h]) & (earlier | ~strict[h])
    return rule


def fixed_summary(n: int, block: int, stride: int, lo: torch.Tensor, hi: torch.Tensor,
                  strict: torch.Tensor, active: torch.Tensor) -> dict:
    """A(2) of fixed: queries in natural order, keys GATHERED per head (the
    positions of its summary sub-block [lo, hi) of every l-block, in order), so
    query i reads the key slots [0, K(i)), in closed form

        K(i) = floor(i / l) c + (0 if strict else clip(i mod l - lo + 1, 0, c))

    (c = hi - lo; strict heads leave their own l-block to the "block" part).
    Returns the built part (``fast.layout.prefix.prefix_part``: no tile is listed
    on the host), not a plan."""
    width = hi - lo                                                       # (H,) = c
    if bool((width != width[0]).any()):
        raise ValueError(f"fixed summaries of one width c per layout, got widths {width.tolist()}")
    c = int(width[0])
    every = slots.gathered(n, stride, c, lo, _cdiv(n, stride) * c).positions()  # (H, U)
    real = int((every >= 0).sum(1).max())                                 # most real slots
    order = slots.gathered(n, stride, c, lo, max(1, _cdiv(real, block)) * block)
    k_pos = order.positions()                                              # (H, Mk)

    def reads(h, i):
        own = (i % stride - lo[h] + 1).clamp(min=0).minimum(width[h])
        k = (i // stride) * width[h] + torch.where(strict[h], 0, own)
        return torch.where(active[h], k, 0)
    return prefix_part("summary", n, k_pos, block, reads, period=stride, k_map=order)


# ----------------------------------------------------------------------------
# Neighbours (Longformer, BigBird): global tokens and BigBird's random keys.
# Every head reads the same mask; the window is a ``band``.
# ----------------------------------------------------------------------------

def window_rule(window: int, dilation: int) -> Rule:
    lo, hi = torch.zeros(1, dtype=torch.long), torch.full((1,), window, dtype=torch.long)
    band_r = band_rule(dilation, lo, hi)
    return lambda h, i, j: band_r(torch.zeros_like(h), i, j)


def global_keys(n: int, block: int, n_heads: int, glob: torch.Tensor, is_global: torch.Tensor,
                in_window: Rule, reach: int) -> Plan:
    """Every query (natural order) reads the gathered global tokens g <= i that
    its window does not already read (the window reads only i - j < reach)."""
    q_pos = natural_slots(n, block, n_heads)
    k_pos = gathered_slots([glob] * n_heads, block)
    h, qb = _grid(torch.ones(n_heads, dtype=torch.bool), q_pos.shape[1] // block)
    q_hi = (qb * block + block - 1).clamp(max=n - 1)
    n_keys = torch.searchsorted(glob, q_hi, right=True)
    h, qb, kb = expand_ranges(h, qb, torch.zeros_like(h), _fdiv(n_keys + block - 1, block) - 1)
    k_last = _block_last(k_pos, block)[h, kb]
    full = qb * block - k_last >= reach  # every pair causal and outside the window

    def rule(h, i, j):
        return (j <= i) & is_global[j] & ~in_window(h, i, j)
    return Plan("global_keys", q_pos, k_pos, (h, qb, kb, full), rule, None,
                q_map=slots.natural(n, block, n_heads))


def global_queries(n: int, block: int, n_heads: int, glob: torch.Tensor, is_global: torch.Tensor,
                   in_window: Rule) -> Plan:
    """The gathered global tokens read every earlier non-global position that
    their window does not already read (global keys are in ``global_keys``)."""
    q_pos = gathered_slots([glob] * n_heads, block)
    k_pos = natural_slots(n, block, n_heads)
    h, qb = _grid(torch.ones(n_heads, dtype=torch.bool), q_pos.shape[1] // block)
    q_last = _block_last(q_pos, block)[h, qb]
    h, qb, kb = expand_ranges(h, qb, torch.zeros_like(h), _fdiv(q_last, block))
    full = torch.zeros_like(h, dtype=torch.bool)

    def rule(h, i, j):
        return is_global[i] & (j <= i) & ~is_global[j] & ~in_window(h, i, j)
    return Plan("global_queries", q_pos, k_pos, (h, qb, kb, full), rule, None,
                k_map=slots.natural(n, block, n_heads))


def bigbird_random(n: int, block: int, n_heads: int, keys: torch.Tensor,
                   is_global: torch.Tensor, in_window: Rule) -> Plan:
    """BigBird's random keys not already read by the window or a global token;
    natural order. Its pairs are the (n, n_random) table itself: they are
    scattered into their tiles (the rule alone allows nothing)."""
    pos = natural_slots(n, block, n_heads)
    i, j = random_pairs(keys)
    keep = ~in_window(torch.zeros_like(i), i, j) & ~is_global[i] & ~is_global[j]
    i, j = i[keep], j[keep]
    pairs = _block_pairs(i, j, block)
    h = torch.arange(n_heads).repeat_interleave(pairs.shape[0])
    cand = (h, pairs[:, 0].repeat(n_heads), pairs[:, 1].repeat(n_heads),
            torch.zeros_like(h, dtype=torch.bool))

    def nothing(h, i, j):
        return torch.zeros((), dtype=torch.bool).expand(torch.broadcast_shapes(i.shape, j.shape))
    order = slots.natural(n, block, n_heads)
    return Plan("random", pos, pos, cand, nothing, None, per_head_pairs(i, j, n_heads),
                order, order)


def random_pairs(keys: torch.Tensor):
    """The (i, j) pairs of the random-key table keys (n, n_random), -1 padded."""
    rows = torch.arange(keys.shape[0])[:, None].expand_as(keys)
    ok = keys >= 0
    return rows[ok], keys[ok]


def per_head_pairs(i: torch.Tensor, j: torch.Tensor, n_heads: int):
    """(h, i, j) for every head."""
    h = torch.arange(n_heads).repeat_interleave(i.shape[0])
    return h, i.repeat(n_heads), j.repeat(n_heads)


def _block_pairs(i: torch.Tensor, j: torch.Tensor, block: int) -> torch.Tensor:
    """Distinct (query block, key block) pairs holding the pairs (i, j): (P, 2)."""
    pairs = torch.stack([i // block, j // block], 1)
    return torch.unique(pairs, dim=0) if pairs.numel() else pairs.view(0, 2)
