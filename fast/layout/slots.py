"""Slot orders as index arithmetic: which sequence position each slot of a part holds.

Child et al., 2019, sec. 5.5: "attention with a stride of k can be computed by
transposing the matrix and computing a local window. Fixed attention positions can
be aggregated and computed in blocks" (here the matrix transposed is the sequence
folded into an (n/l, l) grid). A layout part (``fast.layout.LayoutPart``) lists
the position of every slot (``q_pos`` / ``k_pos``); the orders of the strided and
fixed patterns are also one formula each,

    position(h, s) = (s mod P) X + (s div P) Y + offset[h],   real if < limit,

    natural            P = slots, X = 1, Y = 0   (slot s holds position s)
    transposed by p    P = R_pad, X = p, Y = 1   (the (rows, p) grid column by column,
                                                  every column padded to R_pad slots)
    gathered summary   P = c,     X = 1, Y = l   (head h: positions lo_h .. lo_h + c - 1
                                                  of every block of l, in order)

so a kernel can compute a block's positions instead of loading them
(``fast.kernels.triton_kernels``). ``SlotMap.positions`` is the one place that
evaluates the formula: the layouts build their ``q_pos`` / ``k_pos`` from it, so the
listed positions and the formula cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fast.layout.lut import move, per_head


@dataclass(frozen=True, eq=False)
class SlotMap:
    """position(h, s) = (s mod period) x + (s div period) y + offset[h], real if < limit."""
    period: int            # P >= 1
    x: int
    y: int
    offset: torch.Tensor   # (H,) int64
    limit: int             # n: positions >= limit are padding
    slots: int             # M: slots per head

    def positions(self, heads: int | None = None) -> torch.Tensor:
        """(H, M) int64: the position of every slot, -1 for padding (the first ``heads``
        heads only, if given)."""
        s = torch.arange(self.slots)
        pos = (s % self.period) * self.x + (s // self.period) * self.y           # (M,)
        offset = self.offset.cpu().to(torch.long)[:heads]                       # (H,)
        pos = pos[None, :] + offset[:, None]                                    # (H, M)
        return torch.where(pos < self.limit, pos, -1)

    def expand(self, inverse: torch.Tensor) -> SlotMap:
        """Rows of the distinct head behaviours -> one per head (``fast.layout.lut.per_head``)."""
        return SlotMap(self.period, self.x, self.y, per_head(self.offset, inverse),
                       self.limit, self.slots)

    def to(self, device) -> SlotMap:
        """The same map with its per-head offsets on ``device`` as int32 (a view of one
        row stays a view of one row)."""
        return SlotMap(self.period, self.x, self.y, move(self.offset, device), self.limit,
                       self.slots)


def natural(n: int, block: int, n_heads: int) -> SlotMap:
    """Natural order, padded to a multiple of the block: ceil(n / B) B slots."""
    slots = -(-n // block) * block
    return SlotMap(max(slots, 1), 1, 0, torch.zeros(n_heads, dtype=torch.long), n, slots)


def transposed(n: int, period: int, block: int, n_heads: int) -> SlotMap:
    """The (rows, period) grid read column by column: position i sits at slot
    (i mod p) R_pad + i div p, every column padded to R_pad = ceil(ceil(n/p)/B) B slots so
    that no block straddles two columns; only the min(p, n) columns that hold a
    position are kept."""
    rows = -(-n // period)
    r_pad = -(-rows // block) * block
    return SlotMap(r_pad, period, 1, torch.zeros(n_heads, dtype=torch.long), n,
                   min(period, n) * r_pad)


def gathered(n: int, stride: int, width: int, lo: torch.Tensor, slots: int) -> SlotMap:
    """Head h's positions lo[h] .. lo[h] + width - 1 of every block of ``stride``, in
    order (the fixed pattern's summaries), over ``slots`` slots."""
    return SlotMap(width, 1, stride, lo.to(torch.long), n, slots)
