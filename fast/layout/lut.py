"""A layout part's look-up tables (LUTs): listed explicitly, or as contiguous ranges.

Child et al., 2019, sec. 5.5: a block-sparse kernel walks, for every query block,
the key blocks its pattern touches (and the dK/dV kernel the transpose). A LUT
holds, per (head, row), the ascending column indices and the token mask of each
tile (-1 = full tile, else an index into the part's ``token_masks``), padded to a
common width MAXK; a kernel reads entries ``t < count[h, row]`` only.

Two forms, one interface (``on(device) -> (index, mask)``, int32 (H, R, MAXK)):

* ``DenseLUT``  -- the tables themselves (any tile set; built by
  ``fast.layout.tiles.tables``).
* ``RangeLUT``  -- rows whose tiles are one contiguous range of columns
  ``start[h, row] + t``, full except a few listed partial tiles. The fixed
  pattern's summary part at n = 2**20 (l = 256, H = 8, block 64) holds 134 M tiles
  (4 GiB of int32 tables, built on the host in minutes); as ranges it is a few
  (H, R) tensors and the partial tiles, and the tables are written directly on
  the device that runs the kernel (``fast.kernels.tables.device_part``).

``expand(inverse)`` gives every head the rows of its distinct head behaviour
(``fast.layout.blocks``): copies, or, when every head behaves alike, views of one
row (stride 0), and then ``on(device, first_head=True)`` writes that one row only
(a kernel serves every head from a one-head table).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DenseLUT:
    """Explicit tables: index and mask, (H, R, MAXK)."""
    index: torch.Tensor
    mask: torch.Tensor

    def on(self, device=None, first_head: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, mask) as contiguous int32 on ``device`` (None: where they are);
        ``first_head``: head 0's rows only, (1, R, MAXK)."""
        device = self.index.device if device is None else device
        index, mask = (self.index[:1], self.mask[:1]) if first_head else (self.index, self.mask)
        return (index.to(device=device, dtype=torch.int32).contiguous(),
                mask.to(device=device, dtype=torch.int32).contiguous())

    def expand(self, inverse: torch.Tensor) -> DenseLUT:
        return DenseLUT(per_head(self.index, inverse), per_head(self.mask, inverse))


@dataclass
class RangeLUT:
    """Row (h, r) lists the columns ``start[h, r] .. start[h, r] + count[h, r] - 1``;
    every tile is full except the ``partial`` ones: (h, r, t, mask index), each (P,).
    ``width`` is MAXK (>= 1). Entries past a row's count hold ``start + t`` (never read)."""
    start: torch.Tensor            # (H, R) int64
    width: int
    partial: tuple                 # (h, r, t, mid), each (P,) int64

    def on(self, device=None, first_head: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, mask) as contiguous int32 on ``device``, written there: O(H R MAXK)
        device work, O(H R + P) host-to-device copies. ``first_head``: head 0 only."""
        device = self.start.device if device is None else torch.device(device)
        start, (h, r, t, mid) = self.start, self.partial
        if first_head:
            start, keep = start[:1], h == 0
            h, r, t, mid = h[keep], r[keep], t[keep], mid[keep]
        start = start.to(device=device, dtype=torch.int32)
        cols = torch.arange(self.width, device=device, dtype=torch.int32)
        index = (start[..., None] + cols).contiguous()                   # (H, R, MAXK)
        mask = torch.full(index.shape, -1, dtype=torch.int32, device=device)
        h, r, t, mid = (x.to(device) for x in (h, r, t, mid))
        mask[h, r, t] = mid.to(torch.int32)
        return index, mask

    def expand(self, inverse: torch.Tensor) -> RangeLUT:
        h, r, t, mid = self.partial
        heads, which = torch.nonzero(inverse[:, None] == h[None, :], as_tuple=True)  # (H, P)
        return RangeLUT(per_head(self.start, inverse), self.width,
                        (heads, r[which], t[which], mid[which]))


def per_head(x: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Rows of the distinct head behaviours -> one per head: ``x[inverse]``, or a view of
    row 0 (stride 0, no copy) when every head has behaviour 0."""
    if bool((inverse == 0).all()):
        return x[:1].expand(inverse.shape[0], *x.shape[1:])
    return x[inverse].contiguous()
