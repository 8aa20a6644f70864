"""Natural-order layout parts from dense masks: any small mask as block-sparse tables.

Child et al., 2019, section 5.5: a block-sparse kernel walks, for every query
block, only the key blocks its pattern touches. ``fast.layout.block_layout`` builds
the patterns' parts from closed forms without an n x n mask; ``parts_from_masks``
builds a ``fast.layout.LayoutPart`` in natural order from any dense bool mask
instead (tests, teaching, small custom masks): O(H n^2) work and memory.
"""

from __future__ import annotations

import numpy as np
import torch

from fast.layout.blocks import LayoutPart
from fast.layout.lut import DenseLUT
from fast.layout.tiles import tables


def parts_from_masks(masks, block: int, names=None) -> list[LayoutPart]:
    """Natural-order layout parts from dense bool masks, one part per mask.

    masks: a list of (H, n, n) bool arrays/tensors (True = query i reads key j),
    pairwise disjoint (their union is what the attention reads; a pair in two masks
    is refused, naming it). Positions are listed (no slot map): a part is checked
    like any other when it is moved to a device (``LayoutPart.to``).
    """
    parts, union = [], None
    for p, m in enumerate(masks):
        m = (m if torch.is_tensor(m) else torch.from_numpy(np.array(m, dtype=bool))).bool().cpu()
        if m.dim() == 2:
            m = m[None]
        name = names[p] if names is not None else f"mask{p}"
        both = None if union is None or union.shape[1:] != m.shape[1:] else union & m
        if both is not None and bool(both.any()):                      # (H, n, n)
            h, i, j = (int(x) for x in torch.nonzero(both)[0])
            raise ValueError(f"the masks must be pairwise disjoint (the attention reads their "
                             f"union, and a pair in two parts would be read twice); {name} and "
                             f"an earlier mask both hold head {h}, query {i}, key {j}")
        union = m if both is None else union | m
        hh, n, _ = m.shape
        nb = -(-n // block)
        size = nb * block
        pad = torch.zeros(hh, size, size, dtype=torch.bool)
        pad[:, :n, :n] = m
        tiles = pad.view(hh, nb, block, nb, block).permute(0, 1, 3, 2, 4)  # (H, NQB, NKB, B, B)
        pos = torch.full((size,), -1, dtype=torch.long)
        pos[:n] = torch.arange(n)
        valid = (pos >= 0).view(nb, block)
        pair_ok = valid[:, None, :, None] & valid[None, :, None, :]       # (NQB, NKB, B, B)
        t_any = tiles.flatten(-2).any(-1)                                  # (H, NQB, NKB)
        t_full = (tiles | ~pair_ok).flatten(-2).all(-1) & t_any
        h, qb, kb = torch.nonzero(t_any, as_tuple=True)
        full = t_full[h, qb, kb]
        mid = torch.full_like(h, -1)
        part_idx = torch.nonzero(~full).squeeze(1)
        token = torch.zeros(0, block, block, dtype=torch.bool)
        if part_idx.numel():
            sel = tiles[h[part_idx], qb[part_idx], kb[part_idx]]             # (P, B, B)
            token, inv = torch.unique(sel.flatten(1), dim=0, return_inverse=True)
            token = token.view(-1, block, block)
            mid[part_idx] = inv
        kv_count, kv_index, kv_mask = tables(h, qb, kb, mid, hh, nb)
        q_count, q_index, q_mask = tables(h, kb, qb, mid, hh, nb)
        parts.append(LayoutPart(name, block, pos.expand(hh, size).clone(),
                                pos.expand(hh, size).clone(), kv_count,
                                DenseLUT(kv_index, kv_mask), q_count, DenseLUT(q_index, q_mask),
                                token))
    return parts
