"""The natural-order layout part of any registered pattern, derived from its rules.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers", sec. 5.5: a
block-sparse kernel computes only the (query block, key block) tiles its pattern touches
("Fixed attention positions can be aggregated and computed in blocks"). In natural token
order -- what FlexAttention's BlockMask and a plain block-sparse kernel walk -- one part
holds every pair of the pattern. It is derived from the pattern registry
(``fast.patterns``), never from an n x n mask:

* candidate tiles come from where each term of a part read by some head lies:
  ``Periodic`` -> the causal tiles within its reach of the diagonal (every causal tile
  when it has no reach); ``Lines`` -> the row and the column of each of its positions;
  ``Pairs`` -> the tiles holding its pairs, which are scattered into them;
* the pattern's rule (the registry's, with its heads and causality) is evaluated only
  inside candidate tiles (``fast.layout.tiles.build_part``), and when every term is
  ``Periodic`` once per tile key: a tile's mask then depends only on its block offset
  and the phase of its first query in the pattern's period (the least common multiple
  of its terms'); a head that reads every earlier pair (``fast.patterns.every``: full
  attention) has every tile below the diagonal full, unevaluated.

Heads with equal roles are built once (``fast.layout.blocks``); the part's per-head
tables cover the distinct heads given here.
"""

from __future__ import annotations

import math

import torch

from fast import patterns
from fast.layout import slots
from fast.layout.parts import Plan, natural_slots
from fast.layout.tiles import expand_ranges
from fast.patterns import Heads, Lines, Pairs, Periodic


def _rows(heads: torch.Tensor, n_rows: int):
    """(h, row) for each head in ``heads`` (int64) and every row: each (len(heads) n_rows,)."""
    return heads.repeat_interleave(n_rows), torch.arange(n_rows).repeat(heads.shape[0])


def _near_diagonal(heads: torch.Tensor, n_b: int, block: int, reach: int | None):
    """(h, qb, kb) of the causal tiles that hold a pair with i - j < reach (all causal
    tiles for reach None): kb from floor((qb B - (reach - 1)) / B) to qb."""
    h, qb = _rows(heads, n_b)
    lo = torch.zeros_like(qb) if reach is None else torch.div(
        (qb * block - (reach - 1)).clamp(min=0), block, rounding_mode="floor")
    return expand_ranges(h, qb, lo, qb)


def _lines(heads: torch.Tensor, n_b: int, block: int, positions: torch.Tensor):
    """The causal tiles in the row and the column of every position: [(h, qb, kb), ...]."""
    gb = torch.unique(torch.div(positions, block, rounding_mode="floor"))
    h, g = heads.repeat_interleave(gb.shape[0]), gb.repeat(heads.shape[0])
    col = expand_ranges(h, g, g, torch.full_like(g, n_b - 1))            # (h, kb=g, qb >= g)
    row = expand_ranges(h, g, torch.zeros_like(g), g)                   # (h, qb=g, kb <= g)
    return [(col[0], col[2], col[1]), row]


def _pairs(heads: torch.Tensor, i: torch.Tensor, j: torch.Tensor):
    """(h, i, j) of every pair for each head in ``heads``."""
    return heads.repeat_interleave(i.shape[0]), i.repeat(heads.shape[0]), j.repeat(heads.shape[0])


def natural(pattern: str, n: int, block: int, heads: Heads, params: dict) -> Plan:
    """The natural-order part of ``pattern`` (parameters checked) for the heads ``heads``:
    its slots, candidate tiles, rule and tile key (module docstring), as a ``Plan`` for
    ``fast.layout.tiles.build_part``."""
    entry = patterns.get(pattern)
    terms = entry.terms(n, params)
    n_heads = len(heads.roles)
    n_b = -(-n // block)
    cands, pairs, every, periods = [], [], False, []
    below = torch.zeros(n_heads, dtype=torch.bool)   # heads whose tiles below the diagonal
    for part, part_terms in terms.items():           # are full: they read every pair
        active = torch.nonzero(heads.reads[part]).squeeze(1)             # heads reading it
        if not active.numel():
            continue
        for term in part_terms:
            if term.rule is patterns.every:
                below |= heads.reads[part]
            where = term.where
            if isinstance(where, Periodic):
                periods.append(where.period)
                if where.reach is None and active.numel() == n_heads:
                    every = True                      # every causal tile of every head
                else:
                    cands.append(_near_diagonal(active, n_b, block, where.reach))
            elif isinstance(where, Lines):
                periods.append(None)
                cands += _lines(active, n_b, block, where.positions)
            elif isinstance(where, Pairs):
                periods.append(None)
                h, i, j = _pairs(active, where.i, where.j)
                pairs.append((h, i, j))
                cands.append((h, torch.div(i, block, rounding_mode="floor"),
                              torch.div(j, block, rounding_mode="floor")))
            else:
                raise TypeError(f"pattern {pattern!r}, part {part!r}: a term lies where "
                                f"Periodic, Lines or Pairs says, got {where!r}")
    pos = natural_slots(n, block, n_heads)
    if every:
        h, qb = _rows(torch.arange(n_heads), n_b)
        h, qb, kb = expand_ranges(h, qb, torch.zeros_like(h), qb)
    else:
        flat = torch.unique(torch.cat([(hh * n_b + q) * n_b + k for hh, q, k in cands]
                                      or [torch.zeros(0, dtype=torch.long)]))
        h, qb, kb = flat // (n_b * n_b), (flat // n_b) % n_b, flat % n_b
    key = None
    if None not in periods:
        period = math.lcm(*periods)

        def key(h, qb, kb):   # one mask per block offset and phase of q_lo in the period
            return ((qb - kb) * period + (qb * block) % period) * n_heads + h
    pairs = tuple(torch.cat(x) for x in zip(*pairs)) if pairs else None
    rule = entry.rule(n, params, heads, without=Pairs)      # the pairs are scattered in
    order = slots.natural(n, block, n_heads)
    return Plan("natural", pos, pos, (h, qb, kb, (kb < qb) & below[h]), rule, key, pairs,
                order, order)
