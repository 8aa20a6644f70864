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

``expand(inverse)`` copies the rows of distinct head behaviours to every head
(``fast.layout.blocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DenseLUT:
    """Explicit tables: index and mask, (H, R, MAXK)."""
    index: torch.Tensor
    mask: torch.Tensor

    def on(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, mask) as contiguous int32 on ``device`` (None: where they are)."""
        device = self.index.device if device is None else device
        return (self.index.to(device=device, dtype=torch.int32).contiguous(),
                self.mask.to(device=device, dtype=torch.int32).contiguous())

    def expand(self, inverse: torch.Tensor) -> DenseLUT:
        return DenseLUT(self.index[inverse].contiguous(), self.mask[inverse].contiguous())


@dataclass
class RangeLUT:
    """Row (h, r) lists the columns ``start[h, r] .. start[h, r] + count[h, r] - 1``;
    every tile is full except the ``partial`` ones: (h, r, t, mask index), each (P,).
    ``width`` is MAXK (>= 1). Entries past a row's count hold ``start + t`` (never read)."""
    start: torch.Tensor            # (H, R) int64
    width: int
    partial: tuple                 # (h, r, t, mid), each (P,) int64

    def on(self, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(index, mask) as contiguous int32 on ``device``, written there: O(H R MAXK)
        device work, O(H R + P) host-to-device copies."""
        device = self.start.device if device is None else torch.device(device)
        start = self.start.to(device=device, dtype=torch.int32)
        cols = torch.arange(self.width, device=device, dtype=torch.int32)
        index = (start[..., None] + cols).contiguous()                   # (H, R, MAXK)
        mask = torch.full(index.shape, -1, dtype=torch.int32, device=device)
        h, r, t, mid = (x.to(device) for x in self.partial)
        mask[h, r, t] = mid.to(torch.int32)
        return index, mask

    def expand(self, inverse: torch.Tensor) -> RangeLUT:
        h, r, t, mid = self.partial
        heads, which = torch.nonzero(inverse[:, None] == h[None, :], as_tuple=True)  # (H, P)
        return RangeLUT(self.start[inverse].contiguous(), self.width,
                        (heads, r[which], t[which], mid[which]))
