"""From candidate block pairs to block-sparse tables (helpers of ``fast.layout``).

Child et al., 2019, "Generating Long Sequences with Sparse Transformers", sec. 5.5:
a sparse pattern is computed as dense blocks ("Fixed attention positions can be
aggregated and computed in blocks"). Two mistakes are common in block-sparse implementations:
blocks that are not causal inside the diagonal block, and masks of size n x n built
on the way to a block layout. Neither happens here:

* a part kind (``fast.layout.parts``) enumerates *candidate* tiles
  (query block, key block) from closed forms and says which ones are certainly full;
* ``build_part`` evaluates the exact token rule only on the other candidate tiles,
  (block_size x block_size each, from the slot positions q_pos / k_pos), in chunks,
  drops the empty ones, deduplicates the partial masks, and writes the kv tables
  and their transpose (the q tables a dK/dV kernel walks).

A tile key (optional) says which candidate tiles must have identical masks, e.g. a
band's tile depends only on the block offset; then one tile per key is evaluated.
"""

from __future__ import annotations

from typing import Callable

import torch

from fast.layout.lut import DenseLUT

# A token rule: (head (P,1,1), query position (P,B,1), key position (P,1,B)) -> bool (P,B,B).
# Positions given to it are clamped to >= 0; padding slots are masked out afterwards.
Rule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# A tile key: (head (P,), query block (P,), key block (P,)) -> int64 (P,), -1 = no key.
TileKey = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

_CHUNK_ELEMS = 1 << 23  # tile elements evaluated at once (about 8 M bools per step)


def expand_ranges(h: torch.Tensor, qb: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    """Pairs (h, qb, kb) for every kb in the inclusive range [lo, hi] of each row (P,)."""
    count = (hi - lo + 1).clamp(min=0)
    h = torch.repeat_interleave(h, count)
    qb_rep = torch.repeat_interleave(qb, count)
    lo_rep = torch.repeat_interleave(lo, count)
    start = torch.cumsum(count, 0) - count
    offset = torch.arange(int(count.sum())) - torch.repeat_interleave(start, count)
    return h, qb_rep, lo_rep + offset


def _pack(tiles: torch.Tensor) -> torch.Tensor:
    """Bool (P, B, B) -> uint8 (P, ceil(B*B/8)) bit-packed rows (for deduplication)."""
    p = tiles.shape[0]
    flat = tiles.reshape(p, -1)
    pad = (-flat.shape[1]) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(p, pad)], 1)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
    return (flat.view(p, -1, 8).to(torch.uint8) * weights).sum(-1, dtype=torch.uint8)


def _unpack(packed: torch.Tensor, block: int) -> torch.Tensor:
    """uint8 (M, W) -> bool (M, B, B), inverse of ``_pack``."""
    bits = (packed[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1  # (M, W, 8)
    bits = bits.reshape(packed.shape[0], packed.shape[1] * 8)  # (M, 8W)
    return bits[:, : block * block].bool().reshape(-1, block, block)


def _slot_of(pos: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of a slot order: (H, n) slot holding each position (-1 if none)."""
    out = torch.full((pos.shape[0], n), -1, dtype=torch.long)
    h, s = torch.nonzero(pos >= 0, as_tuple=True)
    out[h, pos[h, s]] = s
    return out


def _scatter_pairs(tile, hs, qs, ks, pairs, n_qb, n_kb, block):
    """OR the explicit pairs (h, q slot, k slot) that fall in the chunk's tiles into ``tile``."""
    ph, pq, pk = pairs
    chunk_ids = (hs * n_qb + qs) * n_kb + ks
    order = torch.argsort(chunk_ids)
    ids = (ph * n_qb + pq // block) * n_kb + pk // block
    at = torch.searchsorted(chunk_ids[order], ids).clamp(max=order.shape[0] - 1)
    hit = chunk_ids[order][at] == ids
    t = order[at[hit]]
    tile[t, pq[hit] % block, pk[hit] % block] = True


def _evaluate(q_pos, k_pos, block, rule, h, qb, kb, pairs=None):
    """Exact masks of the tiles (h, qb, kb), P of them, in chunks; ``pairs``:
    optional explicit allowed (h, q slot, k slot) OR-ed in.

    Returns any (P,), all (P,) and bit-packed masks (P, W)."""
    n_heads = q_pos.shape[0]
    qt = q_pos.view(n_heads, -1, block)  # (H, NQB, B)
    kt = k_pos.view(n_heads, -1, block)  # (H, NKB, B)
    step = max(1, _CHUNK_ELEMS // (block * block))
    anys, alls, packs = [], [], []
    for s in range(0, h.shape[0], step):
        hs, qs, ks = h[s:s + step], qb[s:s + step], kb[s:s + step]
        qp = qt[hs, qs][:, :, None]  # (P, B, 1)
        kp = kt[hs, ks][:, None, :]  # (P, 1, B)
        tile = rule(hs[:, None, None], qp.clamp(min=0), kp.clamp(min=0))  # (P, B, B)
        tile = tile.expand(hs.shape[0], block, block).clone()
        if pairs is not None and pairs[0].numel():
            _scatter_pairs(tile, hs, qs, ks, pairs, qt.shape[1], kt.shape[1], block)
        tile = tile & (qp >= 0) & (kp >= 0)  # padding slots never allowed
        flat = tile.view(tile.shape[0], -1)
        anys.append(flat.any(1))
        alls.append(flat.all(1))
        packs.append(_pack(tile))
    width = (block * block + 7) // 8
    if not anys:
        empty = torch.zeros(0, dtype=torch.bool)
        return empty, empty, torch.zeros(0, width, dtype=torch.uint8)
    return torch.cat(anys), torch.cat(alls), torch.cat(packs)


def tables(h, row, col, midx, n_heads, n_rows):
    """Per-(head, row) lists of cols, ascending: count (H, R), index and mask (H, R, MAXK).

    Padding entries: index 0, mask -1 (never read: a kernel stops at count)."""
    key = (h * n_rows + row) * (int(col.max()) + 1 if col.numel() else 1) + col
    if key.numel() > 1 and not bool((key[1:] >= key[:-1]).all()):  # often built in order
        order = torch.argsort(key)
        h, row, col, midx = h[order], row[order], col[order], midx[order]
    group = h * n_rows + row
    count = torch.bincount(group, minlength=n_heads * n_rows)
    maxk = max(1, int(count.max()) if count.numel() else 1)
    start = torch.cumsum(count, 0) - count
    slot = torch.arange(group.shape[0]) - start[group]
    index = torch.zeros(n_heads * n_rows, maxk, dtype=torch.int32)
    mask = torch.full((n_heads * n_rows, maxk), -1, dtype=torch.int32)
    index[group, slot] = col.to(torch.int32)
    mask[group, slot] = midx.to(torch.int32)
    return (count.view(n_heads, n_rows).to(torch.int32),
            index.view(n_heads, n_rows, maxk), mask.view(n_heads, n_rows, maxk))


def build_part(name: str, q_pos: torch.Tensor, k_pos: torch.Tensor, block: int,
               cand: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
               rule: Rule, tile_key: TileKey | None = None, pairs=None,
               q_map=None, k_map=None) -> dict:
    """Evaluate a part's candidate tiles; return the fields of a ``LayoutPart``.

    cand = (h, qb, kb, full): candidate tiles (P,) and whether the closed form says
    every pair of the tile is allowed (trusted only when no slot of it is padding).
    pairs = (h, i, j): explicit allowed positions OR-ed into the rule (BigBird's
    random keys: a small (n, n_random) table, cheaper scattered than compared).
    q_map, k_map: the slot orders as formulas (``fast.layout.slots``), when they are.
    """
    if pairs is not None:
        n_pos = int(max(int(q_pos.max()), int(k_pos.max()))) + 1
        ph, pi, pj = pairs
        pairs = (ph, _slot_of(q_pos, n_pos)[ph, pi], _slot_of(k_pos, n_pos)[ph, pj])
    n_heads = q_pos.shape[0]
    qvalid = (q_pos >= 0).view(n_heads, -1, block)  # (H, NQB, B)
    kvalid = (k_pos >= 0).view(n_heads, -1, block)  # (H, NKB, B)
    n_qb, n_kb = qvalid.shape[1], kvalid.shape[1]
    h, qb, kb, full = cand
    keep = qvalid.any(-1)[h, qb] & kvalid.any(-1)[h, kb]
    h, qb, kb, full = h[keep], qb[keep], kb[keep], full[keep]
    dense_ok = qvalid.all(-1)[h, qb] & kvalid.all(-1)[h, kb]
    full = full & dense_ok

    # Which tiles to evaluate: one per tile key, and every tile without one.
    maybe = torch.nonzero(~full).squeeze(1)
    key = torch.full_like(maybe, -1)
    if tile_key is not None and maybe.numel():
        key = torch.where(dense_ok[maybe], tile_key(h[maybe], qb[maybe], kb[maybe]), key)
    keyed = key >= 0
    uniq, inv = torch.unique(key[keyed], return_inverse=True)
    first = torch.full((uniq.shape[0],), maybe.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.nonzero(keyed).squeeze(1), "amin")
    unkeyed = torch.nonzero(~keyed).squeeze(1)
    evaluate = torch.cat([first, unkeyed])  # indices into maybe
    e = maybe[evaluate]
    t_any, t_all, t_pack = _evaluate(q_pos, k_pos, block, rule, h[e], qb[e], kb[e], pairs)
    # Map results back to every maybe tile: keyed tiles share their representative's.
    src = torch.empty_like(maybe)
    src[torch.nonzero(keyed).squeeze(1)] = inv
    src[unkeyed] = torch.arange(uniq.shape[0], uniq.shape[0] + unkeyed.shape[0])
    m_any = t_any[src]

    # Deduplicated masks of the partial tiles.
    partial_eval = t_any & ~t_all
    masks_packed, mask_inv = torch.unique(t_pack[partial_eval], dim=0, return_inverse=True)
    eval_midx = torch.full((evaluate.shape[0],), -1, dtype=torch.long)
    eval_midx[partial_eval] = mask_inv
    midx = torch.full_like(h, -1)
    midx[maybe] = eval_midx[src]
    alive = full.clone()
    alive[maybe] = m_any
    h, qb, kb, midx = h[alive], qb[alive], kb[alive], midx[alive]

    kv_count, kv_index, kv_mask = tables(h, qb, kb, midx, n_heads, n_qb)
    q_count, q_index, q_mask = tables(h, kb, qb, midx, n_heads, n_kb)
    return dict(name=name, block_size=block, q_pos=q_pos, k_pos=k_pos,
                kv_count=kv_count, kv_lut=DenseLUT(kv_index, kv_mask),
                q_count=q_count, q_lut=DenseLUT(q_index, q_mask),
                token_masks=_unpack(masks_packed, block), q_map=q_map, k_map=k_map)
