"""Boolean attention masks in PyTorch, derived from the pattern registry (for the naive path).

Child et al., 2019, section 4 (eq. 2-4: S_i as a mask), section 4.3 (the patterns) and
section 5.1 (eq. 5-8: merged, multi-head and interleaved heads). A mask here is the
registry's rule (``fast.patterns``: each part of a pattern as closed forms on positions)
evaluated on index grids on the target device (no NumPy (n, n) grid, no copy from the
host): the torch twin of ``reference.patterns.head_masks``, with its 0-indexed decisions.

Masks are built from the positions of the queries and of the keys (``position_masks``):
a query row need not be position i of an (n, n) grid, so the same closed forms give the
last n_q rows of the pattern at n_k keys (queries aligned to the end) and the masks of a
padded batch, whose sequences start at their own offsets (``fast.backends.padding``).
The registry's rules compare a quantity of the row with one of the column -- i mod l
with j mod l, floor(i / l) with floor(j / l), j with i - l -- so on a column of query
positions and a row of key positions no integer (n_q, n_k) grid is ever made: a mask
costs one byte per pair, and the guard of the naive path (``fast.backends.naive``)
counts that. A term's mask is made once per layer and shared by the heads that read it.

Which parts each head reads comes from ``reference.heads.head_roles``, through the
registry; nothing here re-derives it.

These masks are O(n_q n_k) memory: they serve the obviously-correct "naive" backend
and the tests, never the structured fast path.
"""

from __future__ import annotations

import functools

import torch

from fast import patterns
from fast.patterns import Head
from reference.heads import head_roles


def _pairs(qpos: torch.Tensor, kpos: torch.Tensor):
    """Query positions (..., n_q) and key positions (..., n_k) as a column (..., n_q, 1)
    and a row (..., 1, n_k): every rule broadcasts the two."""
    return qpos[..., :, None], kpos[..., None, :]


def position_masks(pattern: str, n: int, n_heads: int, combine: str, layer: int,
                   qpos: torch.Tensor, kpos: torch.Tensor, **params) -> torch.Tensor:
    """Which keys each head's queries read: bool (..., n_heads, n_q, n_k) for queries at
    positions ``qpos`` (..., n_q) and keys at positions ``kpos`` (..., n_k) of a sequence
    of n positions (the pattern's parameters are checked at n), equal to
    ``reference.patterns.head_masks(pattern, n, n_heads, combine, layer)[h][qpos, kpos]``
    wherever both positions lie in [0, n). Head h reads the union of the parts its
    ``reference.heads.HeadRole`` names. When every head reads the same mask the result
    is that mask expanded over heads (a view, not n_heads copies)."""
    entry = patterns.get(pattern)
    return checked_masks(entry, n, n_heads, combine, layer, qpos, kpos,
                         entry.check(n, n_heads, combine, layer, params))


def checked_masks(entry: patterns.Pattern, n: int, n_heads: int, combine: str, layer: int,
                  qpos: torch.Tensor, kpos: torch.Tensor, params: dict) -> torch.Tensor:
    """``position_masks`` of the registered pattern ``entry``, ``params`` already checked
    (``Pattern.check``): for a caller that has checked them (a decoding step's row)."""
    roles = head_roles(entry.name, n_heads, combine, layer, stride=params.get("stride"),
                       c=params.get("c"))
    i, j = _pairs(qpos, kpos)
    if "meta" in (i.device.type, j.device.type):   # shapes only: a pattern's tables (global
        lead = torch.broadcast_shapes(i.shape, j.shape)     # tokens, random keys) hold values
        return torch.empty(*lead[:-2], n_heads, *lead[-2:], dtype=torch.bool, device="meta")
    terms = entry.terms(n, params, qpos.device)
    causal = j <= i
    term_masks: dict = {}  # (part, term, the head's numbers if the term reads them) -> mask
    read_by: dict = {}     # (parts read, the head's numbers) -> the head's mask
    keys = []              # each head's
    for role in roles:
        values = entry.values(role)
        key = (role.parts, tuple(sorted(values.items())))
        keys.append(key)
        if key in read_by:
            continue
        head = Head(**values)
        masks = []
        for part in role.parts:
            for t, term in enumerate(terms[part]):
                at = (part, t, key[1] if term.per_head else None)
                if at not in term_masks:
                    term_masks[at] = term.rule(i, j, head) if term.per_head else term.rule(i, j)
                masks.append(term_masks[at])
        every = any(term.rule is patterns.every for part in role.parts for term in terms[part])
        read_by[key] = causal if every else causal & functools.reduce(torch.logical_or, masks)
    first = next(iter(read_by.values()))                                  # (..., n_q, n_k)
    if len(read_by) == 1:
        return first.unsqueeze(-3).expand(*first.shape[:-2], n_heads, *first.shape[-2:])
    out = first.new_empty(*first.shape[:-2], n_heads, *first.shape[-2:])
    for h, key in enumerate(keys):
        out[..., h, :, :] = read_by[key]
    return out


def head_masks(pattern: str, n: int, n_heads: int, combine: str = "merged", layer: int = 0,
               device=None, **params) -> torch.Tensor:
    """Which positions each head reads: bool (n_heads, n, n), equal to
    ``reference.patterns.head_masks`` (``position_masks`` over positions 0..n-1 on both
    sides). Parameters are checked first (a few integer comparisons)."""
    patterns.get(pattern).check(n, n_heads, combine, layer, params)
    pos = torch.arange(n, device=device)
    return position_masks(pattern, n, n_heads, combine, layer, pos, pos, **params)
