"""Which keys row t reads: row t of every head's mask, in two forms.

Child et al., 2019, section 4.2 (eq. 2-4: output i attends to the set S_i),
section 4.3 (the strided and fixed patterns) and section 5.1 (eq. 5-8: merged,
multi-head and interleaved heads). Generating token t + 1 computes one new row of
attention per head, and so does ``fast.sparse_attention`` for one query against a
longer key tensor (its one-query step, ``fast.backends.one_query``): head h of layer r
reads exactly row t of
``reference.patterns.head_masks(pattern, n, H, combine, r, **params)[h]``. Both
forms below start from the head roles of ``reference.heads.head_roles`` (the
contract); nothing here re-derives which head reads which part.

* ``row_mask`` -- the generic form: row t of every head's mask as a bool
  (H, t + 1) tensor, the pattern registry's rule at query t (``fast.patterns``,
  through ``fast.backends.masks``), for every registered pattern. A cache that keeps
  every key reads all t + 1 of them and masks the rest (the dense cache of
  ``fast.transformer.decoding.kv_cache``): exact for any pattern, but a step costs O(t).

* ``head_groups`` and ``step_pieces`` -- the sparse form. For the paper's patterns
  (``LAID_OUT``: full, strided, fixed) heads that read the same parts form a group
  (all heads for "merged" and "interleaved"; even and odd heads for "multihead"),
  and a group's keys at step t are one or two pieces of the store laid out for it
  (``STORES``):

    parts            store     rows read at step t (s = t mod l, b = t // l)
    full             all       [0, t]
    local            ring      [0, min(t, l - 1)]          slot j mod l holds j
    column           all       s, s + l, ..., t            (a strided slice)
    local + column   all       t-l+1, ..., t and s, s + l, ..., t - l: gathered
                               into one piece by an index shared by all blocks
    block            ring      [0, s]                      the own block up to t
    summary          summary   [0, b c), and [b c, b c + c) with the rows each
                               head has not yet written (lo + r > s) masked
    block + summary  joint     [0, l + b c) of the ring followed by the
                               summaries, the ring's slots s+1..l-1 (still
                               holding the previous block) masked

  where the summary rows keep, per head, only the c positions of its own
  summary sub-block [lo, hi) of every block (row (j // l) c + (j mod l - lo)
  holds j). When a head reads two parts, the column leaves out j > t - l and
  the summaries leave out the own block, so every key is read once. A step reads
  l + t / l keys (strided) or about l + t c / l (fixed) instead of t + 1, and a
  fixed cache keeps O(n c / l + l) keys instead of n: summaries are the only keys
  a later query of another block can read. Any other pattern is one group that keeps
  every key ("all") and reads, at step t, the keys its row of the mask holds (``Rows``:
  the generic form, gathered): O(t) index arithmetic, but only those keys attended.

Both readers of the sparse form take the same pieces: a key/value cache
(``fast.transformer.decoding.kv_cache``) reads them from its stores, and the one-query
step of ``fast.sparse_attention`` (``fast.backends.one_query``) reads the same rows from a
tensor that holds every position, through ``store_positions`` (which position each
row of a store holds: the inverse of where a cache writes position j). So which keys
a step reads is said once, here, for both.

The tests check both forms against ``reference.patterns.head_masks`` row by row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from fast import patterns
from fast.backends.masks import checked_masks
from reference.heads import head_roles

# What each store keeps: "all" every position (B, H, n, d); "ring" l slots, slot
# j mod l; "summary" c rows per block of length l, the head's own sub-block;
# "joint" a ring of l slots followed by the summary rows.
STORES = ("all", "ring", "summary", "joint")


# ----------------------------------------------------------------------------
# The generic form: row t of every head's mask.
# ----------------------------------------------------------------------------

def row_mask(pattern: str, n: int, n_heads: int, combine: str, layer: int, t: int, *,
             device=None, **params) -> torch.Tensor:
    """Row t < n of every head's mask: bool (n_heads, t + 1); [h, j] is True where
    head h of layer ``layer`` reads key j at query t, as in
    ``reference.patterns.head_masks(pattern, n, n_heads, combine, layer, **params)``:
    the registry's rule at query t and keys 0..t (``fast.backends.masks``)."""
    entry = patterns.get(pattern)
    params = entry.check(n, n_heads, combine, layer, params)
    if not 0 <= t < n:
        raise ValueError(f"row t must lie in [0, n={n}), got t={t}")
    keys = torch.arange(t + 1, device=device)
    return checked_masks(entry, n, n_heads, combine, layer, keys[t:], keys,
                         params)[:, 0]                                 # (H, t + 1)


@dataclass(frozen=True)
class Rows:
    """Where a group of heads finds its keys when no store is laid out for its pattern:
    row t of their masks (``row_mask``), at the sequence length n its parameters were
    checked at. Hashable, so that the layers whose heads read alike share a step's reads
    (``layer`` is the pattern's ``layer_key``)."""
    pattern: str
    n: int
    n_heads: int
    combine: str
    layer: int
    params: tuple

    def at(self, t: int, device) -> torch.Tensor:
        """Row t of every head's mask: bool (n_heads, t + 1) on ``device``."""
        return row_mask(self.pattern, self.n, self.n_heads, self.combine, self.layer, t,
                        device=device, **dict(self.params))


# ----------------------------------------------------------------------------
# The sparse form: head groups and the pieces of their stores read at step t.
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """Heads of a layer that read the same parts.

    heads:     a slice of the layer's heads (so q[:, heads] is a view);
    parts:     the parts every head of the group reads (``reference.heads.PARTS``; for a
               group read through ``rows``, those some head of it reads);
    summaries: fixed only: each head's summary sub-block [lo, hi), in group order;
    rows:      a pattern without laid-out stores (not in ``LAID_OUT``): its heads' rows
               of the mask, from which a step reads the keys some head reads.
    """
    heads: slice
    parts: tuple[str, ...]
    summaries: tuple[tuple[int, int], ...] = ()
    rows: Rows | None = None

    def store(self) -> str:
        """The store this group keeps (``STORES``)."""
        if self.rows is not None or "full" in self.parts or "column" in self.parts:
            return "all"
        if "summary" in self.parts:
            return "joint" if "block" in self.parts else "summary"
        return "ring"

    @property
    def key(self) -> tuple:
        """What the group's reads depend on besides the step: groups with one key read
        alike (the layers of one model share a step's reads by it)."""
        return self.parts, self.summaries, self.rows

    @property
    def may_read_nothing(self) -> bool:
        """Whether a head may read no key at some step: a fixed head that reads only the
        summaries, before its first one; any head of a pattern read through ``rows``."""
        return self.parts == ("summary",) or self.rows is not None


# The patterns whose groups keep the stores of ``STORES`` laid out for them (the table of
# the module docstring); every other pattern's group keeps every key ("all") and reads the
# keys its row holds.
LAID_OUT = ("full", "strided", "fixed")


def may_read_nothing(pattern: str, combine: str) -> bool:
    """Whether some head of a layer may read no key at some row: a fixed head that reads
    only the summaries (multi-head and interleaved layers), before its first one; any
    pattern not in ``LAID_OUT``, whose rows are not known in closed form here."""
    return (pattern == "fixed" and combine != "merged") or pattern not in LAID_OUT


def head_groups(pattern: str, n_heads: int, combine: str, layer: int, *, n: int | None = None,
                **params) -> tuple[Group, ...]:
    """The heads of layer ``layer`` grouped by the parts they read (``head_roles``).

    For the patterns of ``LAID_OUT``: one group for "merged" and "interleaved" (and for
    full); for "multihead" the even heads (A(1)) and the odd heads (A(2)), as the slices
    0::2 and 1::2. Any other pattern: one group of every head, reading the rows of its
    mask at sequence length n (the n its parameters are checked at)."""
    if pattern not in LAID_OUT:
        entry = patterns.get(pattern)
        if n is None:
            raise ValueError(f"pattern {pattern!r} is read through its rows of the mask, at "
                             f"the sequence length n its parameters hold for; got n=None")
        checked = entry.check(n, n_heads, combine, layer, params)
        roles = head_roles(pattern, n_heads, combine, layer, stride=checked.get("stride"),
                           c=checked.get("c"))
        parts = tuple(p for p in entry.part_names if any(r.reads(p) for r in roles))
        rows = Rows(pattern, n, n_heads, combine, entry.layer_key(combine, layer),
                    tuple(sorted(checked.items())))
        return (Group(slice(0, n_heads), parts, (), rows),)
    roles = head_roles(pattern, n_heads, combine, layer,
                       stride=params.get("stride"), c=params.get("c"))
    groups = []
    for heads in (slice(0, n_heads, 2), slice(1, n_heads, 2)) if combine == "multihead" \
            and pattern != "full" else (slice(0, n_heads),):
        members = roles[heads]
        if not members:
            continue
        parts = members[0].parts
        if any(r.parts != parts for r in members):
            raise AssertionError(f"heads {heads} of one group read different parts")
        summaries = tuple(r.summary for r in members) if "summary" in parts else ()
        groups.append(Group(heads, parts, summaries))
    return tuple(groups)


def summary_mask(group: Group, c: int, s: int) -> torch.Tensor:
    """Which rows of the current block's summary piece each head of a summary-only
    group reads at residue s = t mod l: bool (Hg, 1, c); row r holds position
    b l + lo + r, read once written (lo + r <= s)."""
    lo = torch.tensor([lo for lo, _ in group.summaries])[:, None, None]   # (Hg, 1, 1)
    return lo + torch.arange(c)[None, None, :] <= s                      # (Hg, 1, c)


@functools.lru_cache(maxsize=8)
def local_and_column(t: int, l: int, device: str = "cpu") -> torch.Tensor:
    """Positions a merged strided head reads at step t: t-l+1..t, then the column
    s, s + l, ..., t - l. A LongTensor, built once per step for all blocks."""
    first = max(0, t - l + 1)
    column = np.arange(t % l, max(first, t % l), l)                     # j <= t - l
    return torch.from_numpy(np.concatenate([np.arange(first, t + 1), column])).to(device)


def step_pieces(group: Group, t: int, stride: int | None, c: int | None,
                device="cpu") -> list[tuple]:
    """The pieces group ``group`` reads at step t from its store: a list of
    (rows, drop) where rows is a slice of the store's rows or a LongTensor of
    them, and drop says which rows no head reads: None, a slice (for every
    head), or ``("summary", s)`` (``summary_mask`` at residue s, per head).
    Pieces are disjoint. A group read through ``rows``: one piece, the positions some
    head of the group reads, with (Hg, 1, m) True where a head does not."""
    if group.rows is not None:
        # found on the host whatever the device: positions, not values (a GPU's nonzero
        # would wait for the device; "meta" tensors have no values to look at)
        row = group.rows.at(t, "cpu")[group.heads]                       # (Hg, t + 1)
        pos = torch.nonzero(row.any(0)).squeeze(1)                       # (m,)
        if not pos.numel():
            return []
        read = row[:, pos]                                               # (Hg, m)
        drop = None if bool(read.all()) else (~read[:, None, :]).to(device)
        return [(pos.to(device), drop)]
    parts = group.parts
    if parts == ("full",):
        return [(slice(0, t + 1), None)]
    l = stride
    s, b = t % l, t // l
    if parts == ("local",):
        return [(slice(0, min(t + 1, l)), None)]
    if parts == ("column",):
        return [(slice(s, t + 1, l), None)]
    if parts == ("local", "column"):
        return [(local_and_column(t, l, device if isinstance(device, str) else str(device)),
                 None)]
    if parts == ("block",):
        return [(slice(0, s + 1), None)]
    if parts == ("block", "summary"):                # joint: ring, then earlier summaries
        return [(slice(0, l + b * c), slice(s + 1, l) if s + 1 < l else None)]
    if parts == ("summary",):
        pieces = [(slice(0, b * c), None)] if b else []
        lows = [lo for lo, _ in group.summaries]
        if s >= min(lows):                           # some head has written rows of block b
            full = s >= max(lows) + c - 1
            pieces.append((slice(b * c, b * c + c), None if full else ("summary", s)))
        return pieces
    raise AssertionError(f"no pieces for parts {parts}")


def store_positions(group: Group, rows, t: int, stride: int | None, c: int | None,
                    device="cpu"):
    """The sequence positions held by the rows ``rows`` (a slice or a LongTensor, as
    ``step_pieces`` gives them) of ``group``'s store at step t: what those rows are when
    every position is kept (a key tensor (B, H, n, d)). The layouts of ``STORES``:

    * "all"      row j holds position j: ``rows`` itself (a slice stays a slice);
    * "ring"     slot r holds the latest j <= t with j mod l == r, t - ((t - r) mod l);
    * "summary"  row R holds (R // c) l + lo + R mod c for the head whose sub-block
                 starts at lo: one row of positions per head of the group;
    * "joint"    the ring's l slots, then the summary rows.

    A row that holds no position yet (a ring slot before position 0, a summary the
    head has not reached by step t) gives a position in [0, t] all the same: ``step_pieces``
    drops every such row, and the position is only ever gathered, never read.

    Returns a slice, a LongTensor (m,) (the same positions for every head) or (Hg, m)
    (one row per head of the group, in group order)."""
    store = group.store()
    if store == "all":
        return rows
    if isinstance(rows, slice):
        rows = torch.arange(rows.start or 0, rows.stop, rows.step or 1, device=device)
    rows = rows.to(device)
    if store == "ring":
        return (t - (t - rows) % stride).clamp_(min=0)                   # (m,) in [0, t]
    lo = torch.tensor([a for a, _ in group.summaries], device=device)[:, None]  # (Hg, 1)
    first = stride if store == "joint" else 0                            # rows of the ring
    ring = (t - (t - rows) % stride).clamp_(min=0)
    summary = ((rows - first) // c) * stride + lo + (rows - first) % c   # (Hg, m)
    return torch.where(rows < first, ring, summary.clamp_(max=t))        # (Hg, m) in [0, t]
