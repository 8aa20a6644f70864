"""Block-sparse layouts of the Sparse Transformer patterns, for block-sparse kernels.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers", sec. 4.3
(strided and fixed patterns), sec. 5.1 (merged / multi-head / interleaved heads) and
sec. 5.5 (kernels: "attention with a stride of k can be computed by transposing the
matrix and computing a local window. Fixed attention positions can be aggregated
and computed in blocks"; here the matrix transposed is the sequence folded into an
(n/l, l) grid, and nothing above the diagonal is computed). Patterns, combine modes
and off-by-ones are exactly those of ``reference.patterns.head_masks``: parameters
are checked by ``reference.params.check_params`` and what each head reads comes
from ``reference.heads.head_roles`` (as the table of ``fast.layout.heads``);
Longformer and BigBird: every head reads the same mask.

A layout is a list of DISJOINT parts whose union is the pattern. Each part has its
own token order (q_pos / k_pos: the position held by each slot), and for that order
the list of non-empty (query block, key block) tiles, with an exact token mask for
every tile that is not full (causal inside diagonal blocks, padding never allowed).

    order="natural":    one part, natural order (what FlexAttention sees; strided
                        and fixed touch almost every causal block at block 128),
                        derived from the pattern registry's rules for every pattern
                        (``fast.layout.natural``).
    order="structured": strided -> "local" (natural) + "column" (transposed by l);
                        fixed -> "block" (natural) + "summary" (keys gathered);
                        full -> "full"; longformer -> "window" (natural, or
                        transposed by the dilation) + "global_keys" +
                        "global_queries"; bigbird -> those + "random"; a
                        pattern without a structured layout (one added to the
                        registry since) -> its natural-order part.

Building a layout never forms an n x n mask (at n = 2**20 it would take 1 TiB):
candidate tiles come from closed forms on block ranges (``fast.layout.parts``; for the
natural order, from where the registry says each term's pairs lie), and token rules are
evaluated only on candidate tiles (``fast.layout.tiles``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fast import patterns
from fast.layout import parts as lp
from fast.layout.heads import head_table
from fast.layout.lut import Ranges, move, one_row, per_head
from fast.layout.natural import natural
from fast.layout.slots import SlotMap
from fast.layout.tiles import build_part
from reference.heads import head_roles
from reference.params import check_int
from reference.patterns import bigbird_random_keys

ORDERS = ("structured", "natural")


@dataclass(frozen=True)
class PartFacts:
    """What a launcher branches on, as host ints (read once, never from a device)."""
    tiles: int      # non-empty (query block, key block) tiles, summed over heads
    top: int        # the highest position any slot holds (-1: none)
    q_real: int     # real (non-padding) query slots of the head with fewest
    k_real: int     # the same for key slots
    q_same: bool    # every head holds the same query positions (one row serves them all)
    k_same: bool


@dataclass(repr=False)
class LayoutPart:
    """One part of a layout: a token order and its non-empty tiles.

    Tables are per head; "slot" means a position in this part's token order. The
    look-up tables live in ``kv_lut`` / ``q_lut`` (``fast.layout.lut``: listed, or
    contiguous ranges); the properties ``kv_index`` ... ``q_mask`` give them listed,
    on the CPU (tests, FlexAttention). ``to(device)`` moves the part where a kernel
    runs it; ``facts`` holds, as host ints, what a launcher branches on.
    """
    name: str                  # "local", "column", "block", "summary", "full", ...
    block_size: int            # B: slots per block
    q_pos: torch.Tensor        # (H, Mq): position held by each query slot, -1 = padding
    k_pos: torch.Tensor        # (H, Mk): same for key slots; Mq, Mk multiples of B
    kv_count: torch.Tensor     # (H, NQB) int32: non-empty key blocks of each query block
    kv_lut: object             # (H, NQB, MAXK) key-block indices, ascending, and their token
                               # mask index (-1 = full block)
    q_count: torch.Tensor      # (H, NKB) int32: the transpose: query blocks of each key block
    q_lut: object              # (H, NKB, MAXQ): query-block indices, ascending, and masks
    token_masks: torch.Tensor  # (NM, B, B) bool: deduplicated masks of the partial tiles
    q_map: SlotMap | None = None   # q_pos as a formula (``fast.layout.slots``), if it is one
    k_map: SlotMap | None = None
    _cache: dict = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        """Every head behaves alike: the per-head tensors are views of one row."""
        return one_row(self.q_pos)

    @property
    def device(self) -> torch.device:
        return self.q_pos.device

    def tables(self, device=None, first_head: bool = False) -> tuple[torch.Tensor, ...]:
        """(kv_index, kv_mask, q_index, q_mask), contiguous int32 on ``device`` (None: the
        part's), kept once written; ``first_head``: head 0's rows only (enough for a
        ``shared`` part)."""
        return (*self.kv_lut.on(device, first_head), *self.q_lut.on(device, first_head))

    def ranges(self, first_head: bool = False) -> tuple[Ranges | None, Ranges | None]:
        """The range form of the forward and transposed tables on the part's device
        (``fast.layout.lut.Ranges``; None for a table whose rows are not ranges)."""
        return (self.kv_lut.ranges(self.kv_count, first_head),
                self.q_lut.ranges(self.q_count, first_head))

    kv_index = property(lambda self: self.tables("cpu")[0], doc="(H, NQB, MAXK) int32, CPU")
    kv_mask = property(lambda self: self.tables("cpu")[1], doc="(H, NQB, MAXK) int32, -1 = full")
    q_index = property(lambda self: self.tables("cpu")[2], doc="(H, NKB, MAXQ) int32, CPU")
    q_mask = property(lambda self: self.tables("cpu")[3], doc="(H, NKB, MAXQ) int32, -1 = full")

    @property
    def facts(self) -> PartFacts:
        """Tile count, highest position and real slots, as host ints; computed once (by
        ``to`` before a part leaves the host), after checking that the part is well formed:
        shapes agree with the block size, slot maps agree with the positions they stand
        for, and no position is held by two slots of one head (kernels add into rows by
        position)."""
        if "facts" not in self._cache:
            self._cache["facts"] = _facts(self)
        return self._cache["facts"]

    @property
    def n_blocks_computed(self) -> int:
        """Tiles computed, summed over heads."""
        return self.facts.tiles

    def to(self, device) -> LayoutPart:
        """This part on ``device``: positions, counts and listed tables as int32, token
        masks as bool; per-head tensors that are views of one row (``shared``) stay views of
        one row there, and a ``RangeLUT`` stays ranges (listed tables are written on the
        device only when a kernel asks for them, ``tables``). ``facts`` is computed here,
        on the host, and carried over. A part already moved to ``device`` is returned as
        it is."""
        device = torch.device(device)
        if self._cache.get("moved") == str(device):
            return self
        facts = self.facts
        moved = LayoutPart(
            self.name, self.block_size, move(self.q_pos, device), move(self.k_pos, device),
            move(self.kv_count, device), self.kv_lut.to(device), move(self.q_count, device),
            self.q_lut.to(device), self.token_masks.to(device=device, dtype=torch.bool),
            None if self.q_map is None else self.q_map.to(device),
            None if self.k_map is None else self.k_map.to(device))
        moved._cache.update(facts=facts, moved=str(device))
        return moved

    def __repr__(self) -> str:
        nh, mq = self.q_pos.shape
        return (f"LayoutPart({self.name!r}, H={nh}, B={self.block_size}, slots q/k="
                f"{mq}/{self.k_pos.shape[1]}, tiles={self.n_blocks_computed}, "
                f"partial masks={self.token_masks.shape[0]})")

    def allowed_pairs(self) -> torch.Tensor:
        """Allowed (query, key) pairs per head: int64 (H,)."""
        b = self.block_size
        per_mask = self.token_masks.reshape(-1, b * b).sum(1)
        per_mask = torch.cat([per_mask, per_mask.new_full((1,), b * b)])  # -1: full tile
        valid = torch.arange(self.kv_mask.shape[-1]) < self.kv_count[..., None].long()
        counts = per_mask[self.kv_mask.long()]  # (H, NQB, MAXK)
        return (counts * valid).sum((1, 2))

    def to_dense(self, n: int) -> torch.Tensor:
        """bool (H, n, n): the pairs of this part, at their positions. Tests only."""
        b, n_heads = self.block_size, self.q_pos.shape[0]
        out = torch.zeros(n_heads, n, n, dtype=torch.bool)
        valid = torch.arange(self.kv_index.shape[-1]) < self.kv_count[..., None].long()
        h, qb, slot = torch.nonzero(valid, as_tuple=True)
        kb, m = self.kv_index[h, qb, slot].long(), self.kv_mask[h, qb, slot].long()
        tiles = torch.ones(h.shape[0], b, b, dtype=torch.bool)
        tiles[m >= 0] = self.token_masks[m[m >= 0]]
        qp = self.q_pos.view(n_heads, -1, b)[h, qb]  # (P, B)
        kp = self.k_pos.view(n_heads, -1, b)[h, kb]  # (P, B)
        t, x, y = torch.nonzero(tiles, as_tuple=True)
        i, j = qp[t, x], kp[t, y]
        if (i < 0).any() or (j < 0).any():
            raise AssertionError(f"part {self.name!r} allows a padding slot")
        out[h[t], i, j] = True
        return out


@dataclass(repr=False)
class BlockLayout:
    """A pattern as disjoint block-sparse parts (see the module docstring)."""
    n: int
    n_heads: int
    block_size: int
    pattern: str
    params: dict
    parts: list[LayoutPart] = field(default_factory=list)

    @property
    def n_blocks(self) -> int:
        """Blocks of the natural order: ceil(n / B)."""
        return -(-self.n // self.block_size)

    @property
    def density(self) -> float:
        """Tiles computed (all parts, averaged over heads) / n_blocks^2 (the dense grid)."""
        return sum(p.n_blocks_computed for p in self.parts) / self.n_heads / self.n_blocks ** 2

    @property
    def causal_density(self) -> float:
        """Tiles computed / n_blocks (n_blocks + 1) / 2 (what dense causal flash computes)."""
        nb = self.n_blocks
        return sum(p.n_blocks_computed for p in self.parts) / self.n_heads / (nb * (nb + 1) / 2)

    @property
    def token_density(self) -> float:
        """Allowed (i, j) pairs (averaged over heads) / n (n + 1) / 2."""
        pairs = sum(int(p.allowed_pairs().sum()) for p in self.parts)
        return pairs / self.n_heads / (self.n * (self.n + 1) / 2)

    def __repr__(self) -> str:
        parts = ", ".join(f"{p.name}: {p.n_blocks_computed} tiles" for p in self.parts)
        return (f"BlockLayout({self.pattern!r}, n={self.n}, H={self.n_heads}, "
                f"B={self.block_size}, params={self.params}, parts=[{parts}], "
                f"density={self.density:.4f}, causal_density={self.causal_density:.4f})")

    def to_dense(self) -> torch.Tensor:
        """bool (H, n, n): union of the parts at their positions. Tests only (small n)."""
        out = torch.zeros(self.n_heads, self.n, self.n, dtype=torch.bool)
        for p in self.parts:
            out |= p.to_dense(self.n)
        return out


def block_layout(pattern: str, n: int, n_heads: int = 1, combine: str = "merged",
                 layer: int = 0, *, block_size: int = 64, order: str = "structured",
                 **params) -> BlockLayout:
    """The block-sparse layout of ``pattern`` for every head of layer ``layer``.

    pattern, params: any registered pattern (``fast.patterns``): "full"; "strided"
        (stride); "fixed" (stride, c); "longformer" (window, dilation=1,
        global_tokens=()); "bigbird" (window, n_random, n_global, seed=0); and the
        patterns added since (``reference.params.PARAMS``).
    n_heads, combine, layer: exactly as ``reference.patterns.head_masks``: head h
        reads the parts of its ``reference.heads.HeadRole`` (merged: every part;
        multihead: A(h mod p); interleaved: layer r reads A(r mod p); a fixed head
        of summary rank r reads sub-block r mod l/c). Longformer and BigBird: every
        head reads the same mask; combine and layer are checked and have no effect.
    block_size: B, slots per block (any integer >= 1; n need not be a multiple).
    order: "structured" (several disjoint parts, each in its own token order, so
        that each is truly block-sparse, for the patterns that have them: those of
        ``STRUCTURED``; any other pattern has its natural-order part here too) or
        "natural" (one part, natural order, derived from the registry's rules:
        ``fast.layout.natural``).

    Structured parts: strided -> "local" (natural order, 0 <= i-j < l) and
    "column" (slot of i = (i mod l) * R_pad + i // l, R_pad = ceil(ceil(n/l)/B)*B;
    the diagonal j == i is in "local" for heads that read both); fixed -> "block"
    (natural, causal inside each l-block) and "summary" (queries natural, keys
    gathered: head h's summary positions in order; a query in l-block b reads the
    summaries of l-blocks < b, and its own block's too when it reads no "block"
    part); full -> "full"; longformer -> "window" ("natural" order for dilation 1,
    transposed by the dilation otherwise), "global_keys" (queries natural, keys
    the gathered global tokens), "global_queries" (queries the gathered global
    tokens, keys natural); bigbird -> those and "random" (natural order).
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    entry = patterns.get(pattern)
    params = entry.check(n, n_heads, combine, layer, params)
    n, n_heads = int(n), int(n_heads)
    block_size = check_int("block_size", block_size, 1)
    if order == "natural" or pattern not in STRUCTURED:
        heads = entry.heads(n_heads, combine, layer, params)
        table, inverse = _distinct(heads.table())
        first = torch.full((table.shape[0],), n_heads).scatter_reduce_(
            0, inverse, torch.arange(n_heads), "amin")                  # a head of each row
        plan = natural(pattern, n, block_size, heads.select(first), params)
        plans = [(plan, inverse)]
    else:
        roles = head_roles(pattern, n_heads, combine, layer,
                           stride=params.get("stride"), c=params.get("c"))
        plans = STRUCTURED[pattern](n, block_size, head_table(pattern, roles), params)
    parts = [_expand(LayoutPart(**(
        p if isinstance(p, dict)   # already built (the fixed summary)
        else build_part(p.name, p.q_pos, p.k_pos, block_size, p.cand, p.rule, p.tile_key,
                        p.pairs, p.q_map, p.k_map))), inverse)
        for p, inverse in plans]
    return BlockLayout(n, n_heads, block_size, pattern, params, parts)


# ----------------------------------------------------------------------------
# Distinct head behaviours: each part is built once per distinct row of the
# columns of the head table it depends on, then copied to every head.
# ----------------------------------------------------------------------------

def _distinct(table: torch.Tensor, cols: list[int] | None = None):
    """Distinct rows of ``table[:, cols]`` (all columns if None) and each head's row."""
    sub = table if cols is None else table[:, cols]
    uniq, inverse = torch.unique(sub, dim=0, return_inverse=True)
    if uniq.shape[0] == sub.shape[0]:   # all distinct: keep the head order
        return sub, torch.arange(sub.shape[0])
    return uniq, inverse


def _expand(part: LayoutPart, inverse: torch.Tensor) -> LayoutPart:
    """Per-head tensors of the distinct head behaviours -> every head (views of one row
    when every head behaves alike: ``LayoutPart.shared``)."""
    if torch.equal(inverse, torch.arange(inverse.shape[0])):
        return part
    for name in ("q_pos", "k_pos", "kv_count", "q_count"):
        setattr(part, name, per_head(getattr(part, name), inverse))
    part.kv_lut, part.q_lut = part.kv_lut.expand(inverse), part.q_lut.expand(inverse)
    part.q_map, part.k_map = (None if m is None else m.expand(inverse)
                              for m in (part.q_map, part.k_map))
    part._cache.clear()
    return part


# ----------------------------------------------------------------------------
# The structured layouts, one builder per pattern that has one: [(a part's plan (or
# the built fixed summary), the head -> distinct-row map of that part)].
# ----------------------------------------------------------------------------

def _full(n, block, table, params):
    one = torch.zeros(table.shape[0], dtype=torch.long)                 # every head alike
    zero, big = torch.zeros(1, dtype=torch.long), torch.full((1,), lp.BIG)
    return [(lp.band("full", n, block, 1, zero, big, torch.ones(1, dtype=torch.bool)), one)]


def _strided(n, block, table, params):
    l = params["stride"]
    (lt, li), (ct, ci) = _distinct(table, [0]), _distinct(table, [1, 2])
    local = lp.band("local", n, block, 1, torch.zeros(len(lt), dtype=torch.long),
                    torch.full((len(lt),), l), lt[:, 0].bool())
    column = lp.band("column", n, block, l, ct[:, 1], torch.full((len(ct),), lp.BIG),
                     ct[:, 0].bool())
    return [(local, li), (column, ci)]


def _fixed(n, block, table, params):
    l = params["stride"]
    (bt, bi), (st, si) = _distinct(table, [0]), _distinct(table, [1, 2, 3, 4])
    return [(lp.fixed_block(n, block, l, bt[:, 0].bool()), bi),
            (lp.fixed_summary(n, block, l, st[:, 1], st[:, 2], st[:, 3].bool(),
                              st[:, 0].bool()), si)]


def _neighbour(n, block, table, params, glob, keys):
    """Longformer / BigBird: window + global tokens (+ random keys); every head alike."""
    one = torch.zeros(table.shape[0], dtype=torch.long)
    nh = 1
    window, dilation = params["window"], params.get("dilation", 1)
    in_window = lp.window_rule(window, dilation)
    is_global = torch.zeros(n, dtype=torch.bool)
    is_global[glob] = True
    plans = [lp.band("window", n, block, dilation, torch.zeros(nh, dtype=torch.long),
                     torch.full((nh,), window), torch.ones(nh, dtype=torch.bool))]
    if glob.numel():
        reach = (window - 1) * dilation + 1  # the window reads only i - j < reach
        plans += [lp.global_keys(n, block, nh, glob, is_global, in_window, reach),
                  lp.global_queries(n, block, nh, glob, is_global, in_window)]
    if keys is not None:
        plans.append(lp.bigbird_random(n, block, nh, keys, is_global, in_window))
    return [(p, one) for p in plans]


def _longformer(n, block, table, params):
    glob = torch.tensor(params["global_tokens"], dtype=torch.long)
    return _neighbour(n, block, table, params, glob, None)


def _bigbird(n, block, table, params):
    keys = torch.from_numpy(np.asarray(bigbird_random_keys(
        n, params["n_random"], params["seed"]), dtype=np.int64))  # (n, n_random), -1 padded
    glob = torch.arange(params["n_global"])
    return _neighbour(n, block, table, params, glob, keys)


# The patterns with a structured layout, and its builder.
STRUCTURED = {"full": _full, "strided": _strided, "fixed": _fixed,
              "longformer": _longformer, "bigbird": _bigbird}

__all__ = ["BlockLayout", "LayoutPart", "block_layout", "ORDERS", "STRUCTURED"]


def _facts(part: LayoutPart) -> PartFacts:
    """``LayoutPart.facts``: checks, then the host ints (see there). Works on the distinct
    rows only (a part's positions are often one row for every head)."""
    q_pos, k_pos = part.q_pos.cpu(), part.k_pos.cpu()                    # (H, Mq), (H, Mk)
    kv_count, q_count = part.kv_count.cpu(), part.q_count.cpu()          # (H, NQB), (H, NKB)
    b = part.block_size
    if (q_pos.shape[-1] != kv_count.shape[-1] * b or k_pos.shape[-1] != q_count.shape[-1] * b
            or len({q_pos.shape[0], k_pos.shape[0], kv_count.shape[0], q_count.shape[0]}) > 1):
        raise ValueError(f"layout part {part.name!r}: slots q/k {tuple(q_pos.shape)} / "
                         f"{tuple(k_pos.shape)} do not fit {kv_count.shape[-1]} query and "
                         f"{q_count.shape[-1]} key blocks of block_size {b}")
    facts = {}
    for side, pos, slot_map in (("q", q_pos, part.q_map), ("k", k_pos, part.k_map)):
        same = one_row(pos) or bool((pos == pos[:1]).all())
        rows = pos[:1] if same else pos                                   # distinct rows
        if slot_map is not None:
            # every head's row equal but the map's offsets not: the map must give that one
            # row to every head (it does where every slot is padding, -1, as in a summary
            # part of a sequence shorter than its first summary)
            heads = pos.shape[0] if same and not bool((slot_map.offset == slot_map.offset[0])
                                                      .all()) else rows.shape[0]
            want = slot_map.positions(heads)
            if not torch.equal(want, rows.long().expand(heads, -1)):
                raise ValueError(f"layout part {part.name!r}: {side}_pos disagrees with its "
                                 "slot map")
        else:   # a slot map holds each position once by construction
            srt = rows.sort(dim=1).values
            if bool(((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any()):
                raise ValueError(f"layout part {part.name!r}: {side}_pos holds a position "
                                 "twice in one head; every position may own one slot")
        facts.update({f"{side}_same": same, f"{side}_real": int((rows >= 0).sum(1).min()),
                      f"{side}_top": int(rows.max()) if rows.numel() else -1})
    count = kv_count[:1] if one_row(kv_count) else kv_count
    tiles = int(count.long().sum()) * (kv_count.shape[0] if one_row(kv_count) else 1)
    return PartFacts(tiles=tiles, top=max(facts.pop("q_top"), facts.pop("k_top")), **facts)
