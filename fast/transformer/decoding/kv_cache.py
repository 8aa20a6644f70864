"""Key/value caches for decoding one token at a time: dense (every key) and sparse.

Child et al., 2019, section 4.3 (the strided and fixed patterns), section 5.1
(eq. 5-8: how heads combine) and section 5.6 (query-key products in float32
when sampling: float16 can overflow). One cache per residual block holds the
keys and values of the positions decoded so far, after projection; a step
appends position t and computes row t of attention for every head.

* ``DenseCache`` keeps every key, reads all t + 1 of them and masks the row with
  ``fast.backends.reads.row_mask``: exact for any pattern, O(t) per step
  and O(n) memory. It is the baseline the sparse cache is measured against.
* ``SparseCache`` keeps only what a later query can still read and reads only
  what row t allows (``fast.backends.reads.head_groups`` and ``step_pieces``): the
  strided pattern keeps every key (its column reaches back to position 0) but
  reads l + t / l of them; the fixed pattern keeps each head's own summaries and
  the current block, O(n c / l + l) keys, and reads s + 1 + t c / l.

A store holds a position's key and value side by side, (B, heads, rows, dk + dv):
one copy appends both, one slice reads both. Stores keep the dtype keys and
values arrive in (float16 under float16 autocast); q.k, the softmax and the
weighted sum run in float32 (float64 for a float64 model;
``fast.core.precision.acc_dtype``). A row that reads nothing outputs 0
(``reference.attention``); a NaN from anything else (a float16 overflow) is not
hidden. ``nbytes`` reports the memory the cache holds: its
stores are allocated for ``capacity`` positions on the first write, so the
number is the cache's full size for a sample of that length.

Grouped key/value heads (``kv_heads`` < n_heads, grouped-query attention): a store
keeps one head per key/value head, shared by n_heads / kv_heads consecutive query
heads (query head h reads key/value head h // share, as ``repeat_interleave`` and
SDPA's ``enable_gqa`` pair them); the query heads of one key/value head are the rows
of one product. A key/value head must keep the union of what its query heads read:
the dense cache keeps every key, so it serves any pattern; the sparse cache keeps one
set per head, so it serves grouped heads where the query heads sharing a key/value
head read the same keys, and refuses the others (``SparseCache._check_shared_reads``).

These classes are the mechanism, unchecked, the position passed by the caller
(the decoder's two engines write and read the same stores). The public face that
checks its input and tracks the position is ``SparseKVCache``
(``fast.transformer.decoding.sparse_kv_cache``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fast import patterns
from fast.backends.one_query import attend_pieces
from fast.backends.reads import (
    head_groups,
    may_read_nothing,
    row_mask,
    step_pieces,
    summary_mask,
)
from fast.core.precision import acc_dtype
from reference.heads import head_roles

CACHES = ("sparse", "dense")


class LayerCache:
    """What both caches share: lazily allocated stores, their size in bytes, and
    attention of one query row over a list of pieces."""

    def __init__(self, capacity: int, n_heads: int, key_width: int, pattern: str, combine: str,
                 layer: int, params: dict, qk_fp32: bool = True, kv_heads: int | None = None):
        self.capacity, self.n_heads, self.dk = capacity, n_heads, key_width
        self.pattern, self.combine, self.layer, self.params = pattern, combine, layer, params
        self.qk_fp32 = qk_fp32          # False only to show why the rule exists (float16)
        self.kv_heads = n_heads if kv_heads is None else kv_heads
        self.share = n_heads // self.kv_heads   # query heads per key/value head (grouped)
        self.stores: dict = {}          # name -> keys and values (B, Hg, rows, dk + dv)

    def nbytes(self) -> int:
        """Bytes held by the stored keys and values."""
        return sum(kv.nbytes for kv in self.stores.values())

    # -- views into the stores, and what pickling keeps ----------------------
    VIEWS: tuple[str, ...] = ()         # attributes that are views into ``stores``

    def _make_views(self) -> None:
        """Set the ``VIEWS`` attributes from the stores (allocated or not yet)."""

    def __getstate__(self) -> dict:
        """The state without the views: pickle writes a view as a tensor of its own, so
        an unpickled cache would append to its stores and read stale copies.
        ``__setstate__`` makes the views again (deepcopy goes through both too)."""
        return {k: v for k, v in self.__dict__.items() if k not in self.VIEWS}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._make_views()

    def plan_groups(self) -> list[tuple]:
        """For ``fast.transformer.decoding.cpu_step``: per group of heads, (the heads as a list,
        the key of their store in ``stores``, a signature: caches whose groups share
        one read alike at every step, so a step works out their ``plan`` once)."""
        raise NotImplementedError

    def plan(self, g: int, t: int, shared: dict) -> tuple:
        """Group g at step t as ``fast.transformer.decoding.cpu_kernel`` takes it: (writes, rows,
        keep) -- writes (Hg, 2) int64, the store rows that receive position t's key and
        value (-1: none); rows (m,) int64, the store rows read; keep (Hg, m) bool,
        which of those each head reads, or None for all of them. ``shared`` is the
        step's dict, as for ``attend``."""
        raise NotImplementedError

    def _one_head_per_key(self) -> None:
        """The compiled step's plans map query head h to store head h."""
        if self.share != 1:
            raise ValueError(f"the compiled CPU step serves one key/value head per query head, "
                             f"got kv_heads={self.kv_heads} for n_heads={self.n_heads}")

    def _empty(self, kv: torch.Tensor, heads: int, rows: int) -> torch.Tensor:
        return kv.new_zeros(kv.shape[0], heads, rows, kv.shape[-1])     # (B, Hg, rows, dk+dv)

    def _views(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A store (B, Hg, rows, dk + dv) seen as keys^T (B Hg, dk, rows) and values
        (B Hg, rows, dv): views, so that a piece is one slice of each."""
        B, Hg, rows, w = buf.shape
        flat = buf.view(B * Hg, rows, w)
        return flat[..., :self.dk].transpose(1, 2), flat[..., self.dk:]

    def _attend(self, q: torch.Tensor, scale: float, pieces: list,
                empty_rows: bool) -> torch.Tensor | None:
        """softmax(scale q K^T) V over the concatenated pieces [(K^T, V, drop)]
        (``fast.backends.one_query.attend_pieces``, which sparse_attention's one-query step
        uses too): q (B, Hg, 1, dk), K^T (B Hk, dk, m), V (B Hk, m, dv) with Hk = Hg /
        share key/value heads. Returns (B, Hg, 1, dv) in float32 (float64 for float64;
        the keys' dtype if not ``qk_fp32``), or None when there is no piece."""
        if not pieces:
            return None
        dtype = acc_dtype(q.dtype) if self.qk_fp32 else pieces[0][0].dtype
        return attend_pieces(q, scale, pieces, self.share, empty_rows, dtype)


class DenseCache(LayerCache):
    """Every key and value of the layer; a step reads all t + 1 and masks the row."""

    VIEWS = ("kt", "v")

    def _make_views(self) -> None:
        if self.stores:
            self.kt, self.v = self._views(self.stores["all"])

    def append(self, t: int, kv: torch.Tensor) -> None:
        """Store position t: kv (B, H, 1, dk + dv), the key then the value."""
        self.extend(kv, start=t)

    def extend(self, kv: torch.Tensor, start: int = 0) -> None:
        """Store positions start.. start+p-1 at once: kv (B, H, p, dk + dv)."""
        if not self.stores:
            self.stores["all"] = self._empty(kv, self.kv_heads, self.capacity)
            self._make_views()
        self.stores["all"].narrow(2, start, kv.shape[2]).copy_(kv)

    def _drop(self, t: int, masks: dict | None) -> torch.Tensor | None:
        """Row t of every head's mask, negated: (H, 1, t + 1) True where a head does
        not read; None for full. ``masks`` shares it between the blocks of a step."""
        if self.pattern == "full":
            return None
        key = (patterns.get(self.pattern).layer_key(self.combine, self.layer), t)
        masks = {} if masks is None else masks
        if key not in masks:
            rows = row_mask(self.pattern, self.capacity, self.n_heads, self.combine,
                            self.layer, t, device=self.v.device, **self.params)
            masks[key] = ~rows[:, None, :]                               # (H, 1, t + 1)
        return masks[key]

    def pieces(self, t: int, masks: dict | None = None) -> list[tuple[slice, list]]:
        """[(heads, [(K^T, V, drop)])]: one group, keys 0..t, row t of every head's mask."""
        return [(slice(0, self.n_heads), [(self.kt.narrow(2, 0, t + 1),
                                           self.v.narrow(1, 0, t + 1), self._drop(t, masks))])]

    def plan_groups(self) -> list[tuple]:
        """[(heads, store, signature)]: every head reads the one store "all", and
        layers whose masks agree share a signature (``LayerCache.plan_groups``)."""
        self._one_head_per_key()
        mask = patterns.get(self.pattern).layer_key(self.combine, self.layer)
        return [(list(range(self.n_heads)), "all", ("dense", self.pattern, mask))]

    def plan(self, g: int, t: int, shared: dict) -> tuple:
        """Step t for the CPU kernel (``LayerCache.plan``; g is 0: this cache has one
        group): write row t, read rows 0..t and keep row t of each head's mask -- O(t),
        as this cache's steps are."""
        drop = self._drop(t, shared)
        keep = None if drop is None else (~drop[:, 0]).cpu().numpy()     # (H, t + 1)
        writes = np.full((self.n_heads, 2), -1, dtype=np.int64)
        writes[:, 0] = t
        return writes, np.arange(t + 1), keep

    def attend(self, q: torch.Tensor, t: int, scale: float,
               masks: dict | None = None) -> torch.Tensor:
        """Row t of attention: q (B, H, 1, dk) -> (B, H, 1, dv). ``masks`` shares
        the row masks of step t between the blocks of one step."""
        (_, pieces), = self.pieces(t, masks)
        empty_rows = may_read_nothing(self.pattern, self.combine)
        return self._attend(q, scale, pieces, empty_rows)


class SparseCache(LayerCache):
    """Only the keys row t can read, grouped by head (``fast.backends.reads.head_groups``):
    one store per group (``Group.store``), read in the pieces of ``step_pieces``."""

    VIEWS = ("views",)

    def _make_views(self) -> None:
        self.views = {g: (store.view(-1, *store.shape[2:]), *self._views(store))
                      for g, store in self.stores.items()}       # (B Hg, rows, w), K^T, V

    def __init__(self, capacity: int, n_heads: int, key_width: int, pattern: str, combine: str,
                 layer: int, params: dict, qk_fp32: bool = True, kv_heads: int | None = None):
        super().__init__(capacity, n_heads, key_width, pattern, combine, layer, params, qk_fp32,
                         kv_heads)
        self.groups = head_groups(pattern, n_heads, combine, layer, n=capacity, **params)
        self.l, self.c = params.get("stride"), params.get("c")
        if self.share > 1 and all(g.rows is None for g in self.groups):
            self._check_shared_reads()           # a group read by rows keeps every key
        self.whole = len(self.groups) == 1                    # one group: every head
        self.writes = [self._summary_writes(g) for g in self.groups]
        self.drops = [{} for _ in self.groups]                # residue -> ~summary_mask
        self.views: dict = {}                  # group -> (flat, K^T, V) views: _make_views
        self.kinds = [g.store() for g in self.groups]         # each group's store
        self.empty = [g.may_read_nothing for g in self.groups]
        self.device = "cpu"                                   # the stores' (set on allocation)

    def _check_shared_reads(self) -> None:
        """Grouped keys and values (kv_heads < n_heads): a key/value head keeps what its
        query heads read, so they must read the same keys (one store serves them):
        true for "full", for strided "merged" and "interleaved", and for a fixed layer
        whose heads read only the block; not where the heads sharing a key/value head
        read different parts ("multihead") or different summary sub-blocks (fixed)."""
        roles = head_roles(self.pattern, self.n_heads, self.combine, self.layer,
                           stride=self.l, c=self.c)
        reads = [(r.parts, r.summary if "summary" in r.parts else None) for r in roles]
        for first in range(0, self.n_heads, self.share):
            heads = range(first, first + self.share)
            if any(reads[h] != reads[first] for h in heads):
                raise ValueError(
                    f"kv_heads={self.kv_heads} shares each key/value head between "
                    f"{self.share} query heads, but query heads {list(heads)} of layer "
                    f"{self.layer} read different keys (pattern {self.pattern!r}, combine "
                    f"{self.combine!r}: {[reads[h] for h in heads]}); the sparse cache shares "
                    f"a key/value head only between heads that read alike. Use "
                    f"kv_heads=n_heads={self.n_heads}, or mode='dense' (every key kept)")

    def _store_summaries(self, group) -> tuple:
        """The summary sub-block [lo, hi) of each head of the group's store: one per
        key/value head (its query heads read the same one: ``_check_shared_reads``)."""
        return group.summaries[::self.share]

    def _summary_writes(self, group) -> list:
        """For each residue s = t mod l: (store heads of the group whose summary
        sub-block holds s, as an index tensor or None for all of them, row offset
        s - lo), or None when no head's sub-block holds s."""
        if group.store() not in ("summary", "joint"):
            return []
        writes, summaries = [], self._store_summaries(group)
        for s in range(self.l):
            hs = [i for i, (lo, hi) in enumerate(summaries) if lo <= s < hi]
            lo = summaries[hs[0]][0] if hs else 0
            idx = None if len(hs) == len(summaries) else torch.tensor(hs)
            writes.append((idx, s - lo) if hs else None)
        return writes

    def _allocate(self, kv: torch.Tensor) -> None:
        summaries = math.ceil(self.capacity / (self.l or 1)) * (self.c or 0)
        rows = {"all": self.capacity, "ring": self.l, "summary": summaries,
                "joint": (self.l or 0) + summaries}
        for g, group in enumerate(self.groups):
            heads = len(range(self.n_heads)[group.heads]) // self.share
            self.stores[g] = self._empty(kv, heads, rows[group.store()])
        self._make_views()
        self.device = str(kv.device)

    def _summary_row(self, g: int, t: int):
        """(heads or None, row) of the summary store where position t goes, or None."""
        write = self.writes[g][t % self.l]
        if write is None:
            return None
        offset = self.l if self.kinds[g] == "joint" else 0              # after the ring
        return write[0], offset + (t // self.l) * self.c + write[1]

    def append(self, t: int, kv: torch.Tensor) -> None:
        """Store position t: kv (B, H, 1, dk + dv), the key then the value."""
        if not self.stores:
            self._allocate(kv)
        for g, group in enumerate(self.groups):
            kvg, buf, store = (kv if self.whole else kv[:, group.heads]), self.stores[g], \
                self.kinds[g]
            if store == "all":
                buf.select(2, t).copy_(kvg.select(2, 0))
                continue
            if store != "summary":
                buf.select(2, t % self.l).copy_(kvg.select(2, 0))
            where = self._summary_row(g, t) if store in ("summary", "joint") else None
            if where is not None:
                idx, row = where
                if idx is None:
                    buf.select(2, row).copy_(kvg.select(2, 0))
                else:
                    buf[:, :, row].index_copy_(1, idx.to(buf.device), kvg[:, idx, 0])

    def extend(self, kv: torch.Tensor) -> None:
        """Store positions 0..p-1 at once (the prompt): kv (B, H, p, dk + dv)."""
        if not self.stores:
            self._allocate(kv)
        p, l, device = kv.shape[2], self.l, kv.device
        for g, group in enumerate(self.groups):
            kvg, buf, store = (kv if self.whole else kv[:, group.heads]), self.stores[g], \
                self.kinds[g]
            if store == "all":
                buf[:, :, :p].copy_(kvg)
            elif store in ("ring", "joint"):           # the last l positions, slot j mod l
                pos = torch.arange(max(0, p - l), p, device=device)
                buf[:, :, pos % l] = kvg[:, :, pos]
            if store in ("summary", "joint"):          # each head's own summary positions
                offset, summaries = l if store == "joint" else 0, self._store_summaries(group)
                for lo in sorted({lo for lo, _ in summaries}):
                    heads = torch.tensor([i for i, (a, _) in enumerate(summaries)
                                          if a == lo], device=device)[:, None]
                    pos = torch.arange(p, device=device)
                    pos = pos[(pos % l >= lo) & (pos % l < lo + self.c)]
                    rows = offset + (pos // l) * self.c + pos % l - lo
                    buf[:, heads, rows[None, :]] = kvg[:, heads, pos[None, :]]

    def _reads(self, g: int, t: int, shared: dict) -> list[tuple]:
        """Group g's ``step_pieces`` at step t, a summary drop as its (Hg, 1, c) mask on
        the stores' device. Blocks whose groups read alike share one list through
        ``shared`` (the step's dict), so a step works out its reads once, not per block."""
        group = self.groups[g]
        key = ("reads", group.key, self.l, self.c, t)
        if key not in shared:
            reads = []
            for rows, drop in step_pieces(group, t, self.l, self.c, self.device):
                if isinstance(drop, tuple):                      # (Hg, 1, c), per residue
                    if drop[1] not in self.drops[g]:
                        self.drops[g][drop[1]] = ~summary_mask(group, self.c,
                                                               drop[1]).to(self.device)
                    drop = self.drops[g][drop[1]]
                reads.append((rows, drop))
            shared[key] = reads
        return shared[key]

    def plan_groups(self) -> list[tuple]:
        """[(heads, store, signature)] per group (``LayerCache.plan_groups``)."""
        self._one_head_per_key()
        return [(list(range(self.n_heads))[group.heads], g,
                 ("sparse", group.key, self.kinds[g]))
                for g, group in enumerate(self.groups)]

    def plan(self, g: int, t: int, shared: dict) -> tuple:
        """Group g at step t for the CPU kernel (``LayerCache.plan``): position t goes
        where ``append`` puts it, and the rows read are ``step_pieces``'."""
        group, store = self.groups[g], self.kinds[g]
        key = ("plan", group.key, store, t)
        if key not in shared:
            heads = len(range(self.n_heads)[group.heads])
            writes = np.full((heads, 2), -1, dtype=np.int64)
            if store != "summary":
                writes[:, 0] = t if store == "all" else t % self.l
            where = self._summary_row(g, t) if store in ("summary", "joint") else None
            if where is not None:
                writes[slice(None) if where[0] is None else where[0].numpy(), 1] = where[1]
            rows, keep = [], []
            for piece, drop in self._reads(g, t, shared):
                piece = np.arange(piece.start, piece.stop, piece.step or 1) \
                    if isinstance(piece, slice) else piece.cpu().numpy()
                flags = None                                             # every head reads
                if isinstance(drop, slice):
                    flags = np.ones((heads, len(piece)), dtype=bool)
                    flags[:, drop] = False
                elif drop is not None:                                   # (Hg, 1, c)
                    flags = ~drop[:, 0].cpu().numpy()
                rows.append(piece)
                keep.append(flags)
            if any(f is not None for f in keep):
                keep = np.concatenate([np.ones((heads, len(r)), dtype=bool) if f is None else f
                                       for r, f in zip(rows, keep)], axis=1)    # (Hg, m)
            else:
                keep = None
            rows = rows[0] if len(rows) == 1 else \
                np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
            shared[key] = writes, rows.astype(np.int64, copy=False), keep
        return shared[key]

    def pieces(self, t: int, masks: dict | None = None) -> list[tuple[slice, list]]:
        """[(heads, [(K^T, V, drop)])] per group: the keys row t reads (``step_pieces``);
        K^T (B Hg, dk, m), V (B Hg, m, dv), drop as ``LayerCache._attend`` takes it.
        ``masks`` shares the step's reads between the blocks of one step."""
        masks = {} if masks is None else masks
        out = []
        for g, group in enumerate(self.groups):
            flat, kt, v = self.views[g]
            pieces = []
            for rows, drop in self._reads(g, t, masks):
                if isinstance(rows, torch.Tensor):               # gathered into one piece
                    kv = flat.index_select(1, rows)                  # (B Hg, m, dk + dv)
                    pieces.append((kv[..., :self.dk].transpose(1, 2), kv[..., self.dk:], drop))
                else:
                    pieces.append((kt[..., rows], v[:, rows], drop))
            out.append((group.heads, pieces))
        return out

    def attend(self, q: torch.Tensor, t: int, scale: float,
               masks: dict | None = None) -> torch.Tensor:
        """Row t of attention: q (B, H, 1, dk) -> (B, H, 1, dv). ``masks`` shares
        the reads of step t between the blocks of one step."""
        groups = self.pieces(t, masks)
        if self.whole:
            out = self._attend(q, scale, groups[0][1], self.empty[0])
            if out is not None:
                return out
        B, H = q.shape[:2]
        dv = self.stores[0].shape[-1] - self.dk
        out = q.new_zeros(B, H, 1, dv, dtype=acc_dtype(q.dtype))
        for (heads, pieces), empty_rows in zip(groups, self.empty):
            part = self._attend(q[:, heads], scale, pieces, empty_rows)
            if part is not None:
                out[:, heads] = part
        return out


def layer_cache(kind: str, capacity: int, n_heads: int, key_width: int, pattern: str,
                combine: str, layer: int, params: dict, qk_fp32: bool = True,
                kv_heads: int | None = None) -> LayerCache:
    """A ``DenseCache`` or ``SparseCache`` (``kind`` in ``CACHES``) for one block whose
    heads have keys of ``key_width`` (values follow them in the stores); ``kv_heads``
    key/value heads (None: one per query head), each shared by n_heads / kv_heads
    consecutive query heads."""
    if kind not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {kind!r}")
    cls = SparseCache if kind == "sparse" else DenseCache
    return cls(capacity, n_heads, key_width, pattern, combine, layer, params, qk_fp32, kv_heads)
