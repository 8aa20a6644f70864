"""A layout part's look-up tables (LUTs): listed explicitly, or as contiguous ranges.

Child et al., 2019, sec. 5.5: a block-sparse kernel walks, for every query block,
the key blocks its pattern touches (and the dK/dV kernel the transpose). A LUT
holds, per (head, row), the ascending column indices and the token mask of each
tile (-1 = full tile, else an index into the part's ``token_masks``), padded to a
common width MAXK; a kernel reads entries ``t < count[h, row]`` only.

Two stored forms, one interface:

* ``DenseLUT``  -- the tables themselves (any tile set; built by
  ``fast.layout.tiles.tables``).
* ``RangeLUT``  -- rows whose tiles are one contiguous range of columns
  ``start[h, row] + t``, full except a few listed partial tiles. The fixed
  pattern's summary part at n = 2**20 (l = 256, c = 32, H = 8, block 64) holds 134 M
  tiles: listed, each of its two tables holds 8 x 16384 x 2048 int32 indices and as
  many masks (2 GiB); as ranges it is a few (H, R) tensors and the partial tiles.

and two forms a kernel reads:

* ``on(device)`` -- the listed tables, int32 (H, R, MAXK), written on ``device``
  (a ``RangeLUT`` writes them there directly, from its ranges);
* ``ranges(count)`` -- ``Ranges``: per row its start, how many leading and trailing
  entries are listed (the middle ones are full tiles) and where its listed masks
  begin in one flat ``ends`` table. A kernel computes column ``start + t`` instead of
  loading it, and loads a mask only at a row's ends: O(H R) int32 plus the partial
  tiles, megabytes where the listed tables are gigabytes. ``None`` when some row's
  columns are not contiguous (BigBird's random keys): such a part keeps listed tables.

``expand(inverse)`` gives every head the rows of its distinct head behaviour
(``fast.layout.blocks``): copies, or, when every head behaves alike, views of one
row (stride 0), and then ``first_head=True`` forms that one row only (a kernel
serves every head from a one-head table). ``to(device)`` moves the stored form;
the kernel forms are computed once per (device, first_head) and kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def per_head(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Rows of the distinct head behaviours -> one per head: ``x[inverse]``, or a view of
    row 0 (stride 0, no copy) when every head has behaviour 0."""
    if bool((inverse == 0).all()):
        return x[:1].expand(inverse.shape[0], *x.shape[1:])
    return x[inverse].contiguous()


def one_row(x: torch.Tensor) -> bool:
    """Whether ``x`` (H, ...) is H views of one row (``per_head`` of a single behaviour)."""
    return x.dim() >= 1 and x.shape[0] > 1 and x.stride(0) == 0


def move(x: torch.Tensor, device, dtype=torch.int32) -> torch.Tensor:
    """``x`` on ``device`` as ``dtype``, contiguous; views of one row stay views of one row."""
    if one_row(x):
        return x[:1].to(device=device, dtype=dtype).contiguous().expand(x.shape)
    return x.to(device=device, dtype=dtype).contiguous()


@dataclass
class Ranges:
    """The range form of a LUT, as a kernel reads it.

    Row (h, r) lists columns start + t, t < count[h, r]; its first ``lead`` and last
    ``trail`` entries have their token-mask index listed in ``ends`` from ``offset`` on
    (leading ones first); every entry between them is a full tile (mask -1)."""
    rows: torch.Tensor   # (H, R, 4) int32: start, lead, trail, offset
    ends: torch.Tensor   # (E,) int32, E >= 1: the listed entries' token-mask indices

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.rows, self.ends))

    def to(self, device) -> Ranges:
        return Ranges(self.rows.to(device), self.ends.to(device))


def _ranges(start, count, lead, trail, listed_mids) -> Ranges:
    """Assemble ``Ranges`` from per-row (H, R) start, count, lead, trail and the listed
    entries' masks in row-major, ascending-t order."""
    n_listed = (lead + trail).reshape(-1)
    offset = (torch.cumsum(n_listed, 0) - n_listed).view(start.shape)
    rows = torch.stack([start, lead, trail, offset], -1).to(torch.int32).contiguous()
    ends = listed_mids.to(torch.int32)
    if ends.numel() == 0:
        ends = torch.full((1,), -1, dtype=torch.int32)
    return Ranges(rows, ends.contiguous())


@dataclass
class DenseLUT:
    """Explicit tables: index and mask, (H, R, MAXK)."""
    index: torch.Tensor
    mask: torch.Tensor
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def on(self, device=None, first_head: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, mask) as contiguous int32 on ``device`` (None: where they are);
        ``first_head``: head 0's rows only, (1, R, MAXK)."""
        device = self.index.device if device is None else torch.device(device)
        key = ("on", str(device), first_head)
        if key not in self._memo:
            index, mask = (self.index[:1], self.mask[:1]) if first_head else (self.index,
                                                                               self.mask)
            self._memo[key] = (index.to(device=device, dtype=torch.int32).contiguous(),
                               mask.to(device=device, dtype=torch.int32).contiguous())
        return self._memo[key]

    def ranges(self, count: torch.Tensor, first_head: bool = False) -> Ranges | None:
        """The range form (``Ranges``) of these tables on their device, or None when a row's
        columns are not contiguous or a partial tile sits between two full ones.
        ``count``: (H, R) entries per row."""
        key = ("ranges", first_head)
        if key not in self._memo:
            src = self._memo.get("source", self)
            index, mask, count = src.index, src.mask, count.cpu()
            if first_head:
                index, mask, count = index[:1], mask[:1], count[:1]
            got = _dense_ranges(index.long(), mask.long(), count.long())
            self._memo[key] = None if got is None else got.to(self.index.device)
        return self._memo[key]

    def expand(self, inverse: torch.Tensor) -> DenseLUT:
        return DenseLUT(per_head(self.index, inverse), per_head(self.mask, inverse))

    def to(self, device) -> DenseLUT:
        """The tables on ``device`` as int32; the kernel forms are derived from this (host)
        copy when first asked for."""
        moved = DenseLUT(move(self.index, device), move(self.mask, device))
        moved._memo["source"] = self._memo.get("source", self)
        return moved


def _dense_ranges(index, mask, count) -> Ranges | None:
    """``Ranges`` of listed tables (H, R, W) on the host, or None (see ``DenseLUT.ranges``)."""
    w = index.shape[-1]
    t = torch.arange(w)
    valid = t < count[..., None]                                         # (H, R, W)
    start = torch.where(count > 0, index[..., 0], 0)                     # (H, R)
    if not bool(((index == start[..., None] + t) | ~valid).all()):
        return None
    partial = valid & (mask >= 0)
    full = valid & ~partial
    any_full = full.any(-1)
    first_full = torch.where(any_full, full.int().argmax(-1), count)
    last_full = torch.where(any_full, w - 1 - full.flip(-1).int().argmax(-1), count - 1)
    lead, trail = first_full, count - 1 - last_full
    listed = valid & ((t < lead[..., None]) | (t >= (count - trail)[..., None]))
    if bool((partial & ~listed).any()):
        return None
    return _ranges(start, count, lead, trail, mask[listed])


@dataclass
class RangeLUT:
    """Row (h, r) lists the columns ``start[h, r] .. start[h, r] + count[h, r] - 1``;
    every tile is full except the ``partial`` ones: (h, r, t, mask index), each (P,).
    ``width`` is MAXK (>= 1). Entries past a row's count hold ``start + t`` (never read)."""
    start: torch.Tensor            # (H, R) int64
    width: int
    partial: tuple                 # (h, r, t, mid), each (P,) int64
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    def _head0(self, first_head: bool):
        start, (h, r, t, mid) = self.start, self.partial
        if first_head:
            keep = h == 0
            start, h, r, t, mid = start[:1], h[keep], r[keep], t[keep], mid[keep]
        return start, h, r, t, mid

    def on(self, device=None, first_head: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, mask) as contiguous int32 on ``device``, written there: O(H R MAXK)
        device work, O(H R + P) host-to-device copies. ``first_head``: head 0 only."""
        device = self.start.device if device is None else torch.device(device)
        key = ("on", str(device), first_head)
        if key not in self._memo:
            start, h, r, t, mid = self._head0(first_head)
            start = start.to(device=device, dtype=torch.int32)
            cols = torch.arange(self.width, device=device, dtype=torch.int32)
            index = (start[..., None] + cols).contiguous()                   # (H, R, MAXK)
            mask = torch.full(index.shape, -1, dtype=torch.int32, device=device)
            h, r, t, mid = (x.to(device=device, dtype=torch.long) for x in (h, r, t, mid))
            mask[h, r, t] = mid.to(torch.int32)
            self._memo[key] = (index, mask)
        return self._memo[key]

    def ranges(self, count: torch.Tensor, first_head: bool = False) -> Ranges | None:
        """The range form (``Ranges``) on this table's device; None when a row's partial
        tiles are not all at its ends. ``count``: (H, R) entries per row."""
        key = ("ranges", first_head)
        if key not in self._memo:
            src = self._memo.get("source", self)
            start, h, r, t, mid = src._head0(first_head)
            count = count.cpu()[:1] if first_head else count.cpu()
            got = _partial_ranges(start.long(), count.long(), h, r, t, mid)
            self._memo[key] = None if got is None else got.to(self.start.device)
        return self._memo[key]

    def expand(self, inverse: torch.Tensor) -> RangeLUT:
        h, r, t, mid = self.partial
        heads, which = torch.nonzero(inverse[:, None] == h[None, :], as_tuple=True)  # (H, P)
        return RangeLUT(per_head(self.start, inverse), self.width,
                        (heads, r[which], t[which], mid[which]))

    def to(self, device) -> RangeLUT:
        """The ranges and partial tiles on ``device`` (the listed tables are written there
        only if a kernel asks for them, ``on``)."""
        moved = RangeLUT(move(self.start, device), self.width,
                         tuple(x.to(device) for x in self.partial))
        moved._memo["source"] = self._memo.get("source", self)
        return moved


def _partial_ranges(start, count, h, r, t, mid) -> Ranges | None:
    """``Ranges`` from a row range and its partial tiles, on the host, without listing
    the full ones: a row's partial tiles must be its first few entries, its last few,
    or both."""
    h, r, t, mid = (x.cpu().long() for x in (h, r, t, mid))
    n_rows = start.shape[-1]
    row = h * n_rows + r                                                 # (P,)
    order = torch.argsort(row * (int(count.max()) + 1 if count.numel() else 1) + t)
    row, t, mid = row[order], t[order], mid[order]
    n_part = torch.bincount(row, minlength=start.numel())                # per row
    first = torch.cumsum(n_part, 0) - n_part
    rank = torch.arange(row.shape[0]) - first[row]
    flat_count = count.reshape(-1)
    leading = t == rank
    trailing = t == flat_count[row] - n_part[row] + rank
    if not bool((leading | trailing).all()):
        return None
    lead = torch.bincount(row[leading], minlength=start.numel())
    trail = n_part - lead
    return _ranges(start, count, lead.view(start.shape), trail.view(start.shape), mid)
