"""The kernels' look-up tables on the run device, from a layout or from dense masks.

Child et al., 2019, section 5.5: a block-sparse kernel walks, for every query
block, only the key blocks its pattern touches. A layout part
(``fast.layout.LayoutPart``) lists them per head: ``q_pos`` / ``k_pos`` (the
sequence position of every query / key slot, -1 = padding), the forward table
(``kv_count``, ``kv_index``, ``kv_mask``: per query block, its key blocks and
their token mask, -1 = full block), the transposed table for the dK/dV kernel
(``q_count``, ``q_index``, ``q_mask``) and the deduplicated ``token_masks`` of
partial blocks.

``device_part`` puts one part on the device as contiguous int32 tensors (a
``fast.layout.LayoutPart`` writes its range tables there directly) and computes,
once and on the host, what the launchers need as plain numbers (the tile count
and the highest position read), so that no forward or backward call waits for
the GPU to read them back. ``parts_from_masks`` builds natural-order
parts from dense masks (tests, teaching, small custom masks). Nothing here needs
Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fast.layout import LayoutPart
from fast.layout.tiles import tables


@dataclass
class DevicePart:
    """One layout part's tables as contiguous int32 tensors on the run device."""
    name: str
    q_pos: torch.Tensor        # (HL, Mq)
    k_pos: torch.Tensor        # (HL, Mk)
    kv_count: torch.Tensor     # (HL, NQB)
    kv_index: torch.Tensor     # (HL, NQB, MAXK)
    kv_mask: torch.Tensor      # (HL, NQB, MAXK)
    q_count: torch.Tensor      # (HL, NKB)
    q_index: torch.Tensor      # (HL, NKB, MAXQ)
    q_mask: torch.Tensor       # (HL, NKB, MAXQ)
    token_masks: torch.Tensor  # (max(NM, 1), BLOCK, BLOCK) int8
    blocks: int                # number of (query block, key block) pairs over its HL heads
    top: int                   # the highest position any slot holds (-1: none)

    @property
    def n_heads(self) -> int:
        return self.q_pos.shape[0]


def _host(x) -> torch.Tensor:
    return torch.as_tensor(x).cpu()


def _int32(x, device) -> torch.Tensor:
    return torch.as_tensor(x).to(device=device, dtype=torch.int32).contiguous()


def _table(index, mask, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, mask) as int32 (H, R, MAXK); an empty table (MAXK = 0) gets one unused column."""
    index, mask = _int32(index, device), _int32(mask, device)
    if index.shape[-1] == 0:
        index = torch.zeros(*index.shape[:-1], 1, dtype=torch.int32, device=device)
        mask = torch.full_like(index, -1)
    return index, mask


def _check_slots(part, q_pos, k_pos) -> None:
    """Kernels of one part add into rows by position: each position may own one slot
    per head. (Layouts of ``fast.layout`` hold this by construction and are not
    re-checked: at n = 2**20 the sort costs about a second.)"""
    for field, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
        srt = pos.sort(dim=1).values
        if ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any():
            raise ValueError(f"layout part {getattr(part, 'name', '?')!r}: {field} holds a "
                             "position twice in one head; every position may own one slot")


def device_part(part, block: int, device) -> DevicePart:
    """Copy a ``LayoutPart`` (or anything with its fields) to ``device`` as int32.

    A ``LayoutPart`` writes its look-up tables on ``device`` itself
    (``LayoutPart.tables``: range tables never pass through the host), and one whose
    heads all behave alike (``shared``) becomes a one-head part (HL = 1: the kernels
    serve every head from it). Anything else is copied field by field and checked
    for positions held twice."""
    built = isinstance(part, LayoutPart)
    one = built and part.shared
    fields = {name: getattr(part, name)[:1] if one else getattr(part, name)
              for name in ("q_pos", "k_pos", "kv_count", "q_count")}
    q_pos, k_pos = _host(fields["q_pos"]), _host(fields["k_pos"])       # (HL, Mq), (HL, Mk)
    if not built:
        _check_slots(part, q_pos, k_pos)
    name = getattr(part, "name", "?")
    part_block = getattr(part, "block_size", block)
    kv_count = _host(fields["kv_count"])                                 # (HL, NQB)
    n_qb, n_kb = kv_count.shape[-1], _host(fields["q_count"]).shape[-1]
    if part_block != block or q_pos.shape[-1] != n_qb * block or k_pos.shape[-1] != n_kb * block:
        raise ValueError(f"layout part {name!r} was built for another block size "
                         f"({part_block}; {n_qb} query blocks over "
                         f"{q_pos.shape[-1]} slots) than block_size={block}")
    if built:
        kv_index, kv_mask, q_index, q_mask = part.tables(device, first_head=one)
    else:
        kv_index, kv_mask = part.kv_index, part.kv_mask
        q_index, q_mask = part.q_index, part.q_mask
    kv_index, kv_mask = _table(kv_index, kv_mask, device)
    q_index, q_mask = _table(q_index, q_mask, device)
    tm = torch.as_tensor(part.token_masks).reshape(-1, block, block)    # (NM, BLOCK, BLOCK)
    tm = tm.to(device=device, dtype=torch.int8).contiguous()
    if tm.shape[0] == 0:
        tm = torch.zeros(1, block, block, dtype=torch.int8, device=device)
    top = max((int(pos.max()) for pos in (q_pos, k_pos) if pos.numel()), default=-1)
    return DevicePart(
        name=str(getattr(part, "name", "part")),
        q_pos=_int32(q_pos, device), k_pos=_int32(k_pos, device),
        kv_count=_int32(kv_count, device), kv_index=kv_index, kv_mask=kv_mask,
        q_count=_int32(fields["q_count"], device), q_index=q_index, q_mask=q_mask,
        token_masks=tm, blocks=int(kv_count.sum()), top=top,
    )


@dataclass
class MaskPart:
    """A layout part in natural order built from a dense mask (``parts_from_masks``);
    it has the fields of ``fast.layout.LayoutPart`` that the kernels read."""
    name: str
    q_pos: torch.Tensor
    k_pos: torch.Tensor
    kv_count: torch.Tensor
    kv_index: torch.Tensor
    kv_mask: torch.Tensor
    q_count: torch.Tensor
    q_index: torch.Tensor
    q_mask: torch.Tensor
    token_masks: torch.Tensor


def parts_from_masks(masks, block: int, names=None) -> list[MaskPart]:
    """Natural-order layout parts from dense bool masks, one part per mask.

    masks: a list of (H, n, n) bool arrays/tensors (True = query i reads key j),
    pairwise disjoint (their union is what the attention reads). O(H n^2) work and
    memory: for tests, teaching and small custom masks, not for the fast path
    (``fast.layout`` builds the real layouts from closed forms).
    """
    parts = []
    for p, m in enumerate(masks):
        m = (m if torch.is_tensor(m) else torch.from_numpy(np.array(m, dtype=bool))).bool().cpu()
        if m.dim() == 2:
            m = m[None]
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
        kv = tables(h, qb, kb, mid, hh, nb)
        qt = tables(h, kb, qb, mid, hh, nb)
        name = names[p] if names is not None else f"mask{p}"
        parts.append(MaskPart(name, pos.expand(hh, size).clone(), pos.expand(hh, size).clone(),
                              *kv, *qt, token))
    return parts
