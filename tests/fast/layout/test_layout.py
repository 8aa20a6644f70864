"""Tests of fast.layout: block-sparse layouts against reference.patterns.

Child et al., 2019, sec. 4.3 and 5.1 (patterns, combine modes), sec. 5.5 (the
transposed / gathered kernels): exact causal diagonal blocks, the real density,
and no n x n mask on the way to a layout.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fast.layout import BlockLayout, block_layout
from reference import patterns as ref

# (n, n_heads, block_size, params): n not a multiple of the block or the stride,
# n < block, one head and several.
CORE_CASES = [
    ("full", 37, 1, 8, {}),
    ("full", 13, 4, 16, {}),
    ("strided", 37, 1, 8, dict(stride=5)),
    ("strided", 50, 4, 16, dict(stride=7)),
    ("strided", 64, 4, 16, dict(stride=16)),
    ("strided", 11, 2, 16, dict(stride=4)),      # n < block
    ("strided", 30, 1, 8, dict(stride=40)),      # stride > n
    ("strided", 20, 1, 4, dict(stride=1)),
    ("fixed", 37, 1, 8, dict(stride=8, c=3)),
    ("fixed", 70, 4, 16, dict(stride=8, c=2)),   # 4 heads, distinct sub-blocks
    ("fixed", 45, 4, 8, dict(stride=12, c=4)),
    ("fixed", 10, 2, 16, dict(stride=6, c=3)),   # n < block
    ("fixed", 33, 1, 32, dict(stride=8, c=8)),
]
COMBINE_LAYER = [("merged", 0), ("multihead", 0), ("interleaved", 0), ("interleaved", 1)]

NEIGHBOUR_CASES = [
    ("longformer", 37, 1, 8, dict(window=3)),
    ("longformer", 50, 4, 16, dict(window=5, dilation=3, global_tokens=(0, 9, 31))),
    ("longformer", 29, 2, 8, dict(window=2, dilation=9, global_tokens=(28,))),
    ("bigbird", 37, 1, 8, dict(window=3, n_random=2, n_global=2, seed=1)),
    ("bigbird", 61, 4, 16, dict(window=4, n_random=3, n_global=0, seed=0)),
    ("bigbird", 12, 2, 16, dict(window=2, n_random=1, n_global=12, seed=3)),
]


def neighbour_mask(pattern: str, n: int, n_heads: int, params: dict) -> np.ndarray:
    """The reference mask of Longformer / BigBird for every head: (H, n, n)."""
    if pattern == "longformer":
        m = ref.longformer(n, params["window"], params.get("dilation", 1),
                           params.get("global_tokens", ()))
    else:
        m = ref.bigbird(n, params["window"], params["n_random"], params["n_global"],
                        params.get("seed", 0))
    return np.broadcast_to(m, (n_heads, n, n))


def nonempty_blocks(mask: np.ndarray, block: int) -> int:
    """Non-empty BxB blocks of a (H, n, n) mask (padded with False), summed over heads."""
    h, n, _ = mask.shape
    nb = -(-n // block)
    pad = np.zeros((h, nb * block, nb * block), dtype=bool)
    pad[:, :n, :n] = mask
    return int(pad.reshape(h, nb, block, nb, block).any((2, 4)).sum())


def tiles(name, count, index, mask, transpose) -> set:
    """The (head, query block, key block, mask index) tiles of one table; indices ascending."""
    out = set()
    for h in range(count.shape[0]):
        for r in range(count.shape[1]):
            c = int(count[h, r])
            idx = index[h, r, :c].tolist()
            assert idx == sorted(set(idx)), (name, "indices not ascending")
            for x, m in zip(idx, mask[h, r, :c].tolist()):
                out.add((h, x, r, m) if transpose else (h, r, x, m))
    return out


def listed(ranges, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables a range form (``fast.layout.lut.Ranges``) stands for, read as a kernel
    reads it: column start + t; mask listed for the first ``lead`` and last ``trail``
    entries of a row, -1 (full) between. (H, R, max count) each."""
    start, lead, trail, off = (x[..., None] for x in ranges.rows.long().unbind(-1))
    t = torch.arange(max(1, int(count.max()) if count.numel() else 1))
    first_trail = count.long()[..., None] - trail
    e = torch.where(t < lead, off + t, torch.where(t >= first_trail, off + lead + t - first_trail,
                                                   -1))
    e = torch.where(t < count.long()[..., None], e, -1)   # entries past the count: not read
    mask = torch.where(e >= 0, ranges.ends.long()[e.clamp(min=0)], -1)
    return start + t, mask


def check_ranges(part) -> None:
    """The range form of a part's tables, where it has one, lists the same tiles."""
    for first_head in (False, True):
        for r, count, index, mask in zip(part.ranges(first_head),
                                         (part.kv_count, part.q_count),
                                         (part.kv_index, part.q_index),
                                         (part.kv_mask, part.q_mask)):
            if r is None:
                continue
            heads = 1 if first_head else count.shape[0]
            count = count[:heads]
            got_index, got_mask = listed(r, count)
            t = torch.arange(got_index.shape[-1])
            valid = t < count[..., None]                                     # (H, R, W)
            assert torch.equal(got_index[valid], index[:heads, :, :t.shape[0]].long()[valid])
            assert torch.equal(got_mask[valid], mask[:heads, :, :t.shape[0]].long()[valid])


def check_tables(layout: BlockLayout) -> None:
    """kv tables and q tables describe the same tiles; indices ascending; masks exact;
    their range form (where a part has one) the same tiles again."""
    b = layout.block_size
    for part in layout.parts:
        check_ranges(part)
        nh, mq = part.q_pos.shape
        assert mq % b == 0 and part.k_pos.shape[1] % b == 0, part.name
        assert part.kv_count.shape == (nh, mq // b)
        assert part.q_count.shape == (nh, part.k_pos.shape[1] // b)
        kv = tiles(part.name, part.kv_count, part.kv_index, part.kv_mask, False)
        qt = tiles(part.name, part.q_count, part.q_index, part.q_mask, True)
        assert kv == qt, part.name
        assert len(kv) == part.n_blocks_computed
        nm = part.token_masks.shape[0]
        used = {m for (_, _, _, m) in kv if m >= 0}
        assert used == set(range(nm)), (part.name, "unused or missing token masks")
        flat = part.token_masks.reshape(nm, b * b)
        assert bool(flat.any(1).all()) and not bool(flat.all(1).any()), "partial masks only"
        # Padding slots are never allowed; full tiles hold no padding.
        qv = (part.q_pos >= 0).view(nh, -1, b)
        kvv = (part.k_pos >= 0).view(nh, -1, b)
        for (h, qb, kb, m) in kv:
            allowed = torch.ones(b, b, dtype=torch.bool) if m < 0 else part.token_masks[m]
            pad = ~(qv[h, qb][:, None] & kvv[h, kb][None, :])
            assert not bool((allowed & pad).any()), (part.name, "padding allowed")


def check_layout(layout: BlockLayout, want: np.ndarray, order: str) -> None:
    n, nh, b = layout.n, layout.n_heads, layout.block_size
    dense = [p.to_dense(n).numpy() for p in layout.parts]
    assert (np.sum(dense, 0) <= 1).all(), "parts overlap"
    np.testing.assert_array_equal(layout.to_dense().numpy(), want)
    check_tables(layout)
    assert layout.token_density == pytest.approx(want.sum() / nh / (n * (n + 1) / 2))
    nb = -(-n // b)
    if order == "natural":
        assert len(layout.parts) == 1
        assert layout.parts[0].n_blocks_computed == nonempty_blocks(want, b)
        assert layout.density == pytest.approx(nonempty_blocks(want, b) / nh / nb ** 2)
    assert layout.causal_density == pytest.approx(layout.density * nb / ((nb + 1) / 2))


@pytest.mark.parametrize("order", ["structured", "natural"])
@pytest.mark.parametrize("combine,layer", COMBINE_LAYER)
@pytest.mark.parametrize("pattern,n,n_heads,block,params", CORE_CASES)
def test_core_patterns_match_reference(pattern, n, n_heads, block, params, combine, layer, order):
    layout = block_layout(pattern, n, n_heads, combine, layer, block_size=block,
                          order=order, **params)
    want = ref.head_masks(pattern, n, n_heads, combine, layer, **params)
    check_layout(layout, want, order)


@pytest.mark.parametrize("order", ["structured", "natural"])
@pytest.mark.parametrize("combine,layer", COMBINE_LAYER)
@pytest.mark.parametrize("pattern,n,n_heads,block,params", NEIGHBOUR_CASES)
def test_neighbour_patterns_match_reference(pattern, n, n_heads, block, params, combine, layer,
                                            order):
    """Every head reads the one mask, whatever combine and layer say."""
    layout = block_layout(pattern, n, n_heads, combine, layer, block_size=block, order=order,
                          **params)
    check_layout(layout, neighbour_mask(pattern, n, n_heads, params), order)
    np.testing.assert_array_equal(layout.to_dense().numpy(),
                                  ref.head_masks(pattern, n, n_heads, combine, layer, **params))
    if order == "structured":
        assert any(p.name == "window" for p in layout.parts)
        slots = torch.arange(-(-n // block) * block)
        natural = torch.where(slots < n, slots, -1)
        assert any(p.q_pos.shape[1] == natural.shape[0] and bool((p.q_pos == natural).all())
                   for p in layout.parts), "no natural-order part"


@st.composite
def any_layout_case(draw):
    """Any pattern with small random parameters, n, heads, block, combine, layer, order."""
    pattern = draw(st.sampled_from(["full", "strided", "fixed", "longformer", "bigbird"]))
    n = draw(st.integers(1, 70))
    if pattern == "strided":
        params = dict(stride=draw(st.integers(1, 20)))
    elif pattern == "fixed":
        stride = draw(st.integers(1, 20))
        params = dict(stride=stride, c=draw(st.sampled_from(
            [d for d in range(1, stride + 1) if stride % d == 0])))
    elif pattern == "longformer":
        params = dict(window=draw(st.integers(1, 9)), dilation=draw(st.integers(1, 6)),
                      global_tokens=tuple(draw(st.sets(st.integers(0, n - 1), max_size=3))))
    elif pattern == "bigbird":
        params = dict(window=draw(st.integers(1, 9)), n_random=draw(st.integers(0, 4)),
                      n_global=draw(st.integers(0, min(n, 3))), seed=draw(st.integers(0, 9)))
    else:
        params = {}
    return (pattern, n, draw(st.integers(1, 5)), draw(st.sampled_from([1, 3, 4, 8, 16, 32])),
            draw(st.sampled_from(ref.COMBINES)), draw(st.integers(0, 3)),
            draw(st.sampled_from(["structured", "natural"])), params)


@pytest.mark.slow
@given(any_layout_case())
def test_random_cases_match_reference(case):
    pattern, n, n_heads, block, combine, layer, order, params = case
    layout = block_layout(pattern, n, n_heads, combine, layer, block_size=block, order=order,
                          **params)
    want = ref.head_masks(pattern, n, n_heads, combine, layer, **params)
    if pattern in ("longformer", "bigbird"):  # every head reads the one mask
        np.testing.assert_array_equal(want, neighbour_mask(pattern, n, n_heads, params))
    check_layout(layout, want, order)


def test_structured_strided_order_and_block_counts():
    """The column part uses slot (i mod l) * R_pad + i // l and holds exactly the
    non-empty blocks of the reference column mask in that order."""
    n, l, b, nh = 45, 7, 4, 1
    layout = block_layout("strided", n, nh, block_size=b, stride=l)
    local, column = layout.parts
    assert (local.name, column.name) == ("local", "column")
    rows = -(-n // l)                      # ceil(n / l)
    r_pad = -(-rows // b) * b              # rounded up to a multiple of B
    i = np.arange(n)
    slot = (i % l) * r_pad + i // l
    np.testing.assert_array_equal(column.q_pos[0, slot].numpy(), i)
    assert int((column.q_pos >= 0).sum()) == n
    ref_local, ref_column = ref.strided(n, l)
    ref_column = ref_column & ~np.eye(n, dtype=bool)   # the diagonal is in "local"
    moved = np.zeros((column.q_pos.shape[1],) * 2, dtype=bool)
    moved[np.ix_(slot, slot)] = ref_column
    assert column.n_blocks_computed == nonempty_blocks(moved[None], b)
    assert local.n_blocks_computed == nonempty_blocks(ref_local[None], b)


def test_fixed_summary_keys_are_gathered_per_head():
    """Summary keys: head h's sub-block (summary_rank) of every l-block, in order."""
    n, l, c, b, nh = 53, 8, 2, 4, 4
    layout = block_layout("fixed", n, nh, "merged", block_size=b, stride=l, c=c)
    block, summary = layout.parts
    assert (block.name, summary.name) == ("block", "summary")
    for h in range(nh):
        lo, hi = ref.summary_range(l, c, ref.summary_rank(h, "merged"))
        want = [j for j in range(n) if lo <= j % l < hi]
        got = summary.k_pos[h][summary.k_pos[h] >= 0].tolist()
        assert got == want
        assert summary.k_pos.shape[1] % b == 0


@pytest.mark.slow
def test_strided_structured_is_truly_sparse():
    """At l = 128 every natural 128-block is touched, so the natural layout only
    skips the causal half; the transposed one does not."""
    n, l = 16384, 128
    natural = block_layout("strided", n, 1, block_size=128, order="natural", stride=l)
    structured = block_layout("strided", n, 1, block_size=64, stride=l)
    print(f"strided n={n} l={l}: natural B=128 density {natural.density:.4f} "
          f"(causal {natural.causal_density:.3f}); structured B=64 density "
          f"{structured.density:.4f} (causal {structured.causal_density:.4f}); "
          f"token density {structured.token_density:.4f}")
    assert natural.causal_density == 1.0
    assert natural.density > 0.49
    assert structured.density < natural.density / 10
    assert structured.token_density == pytest.approx(natural.token_density)


@pytest.mark.slow
def test_huge_layout_builds_without_dense_mask():
    """n = 2**20: an n x n bool mask would be 1 TiB, so this only finishes
    because candidates and token masks come from closed forms on tiles."""
    n, l, b = 2 ** 20, 128, 64
    t0 = time.perf_counter()
    layout = block_layout("strided", n, 1, block_size=b, stride=l)
    seconds = time.perf_counter() - t0
    print(f"strided n=2**20 structured layout: {seconds:.1f} s, density {layout.density:.5f}")
    local, column = layout.parts
    nb = n // b
    # local: the diagonal tile and two earlier ones per query block (first ones fewer);
    # column: a causal triangle of R/B row blocks inside each of the l columns.
    rb = n // l // b
    assert local.n_blocks_computed == 3 * nb - 3
    assert column.n_blocks_computed == l * rb * (rb + 1) // 2
    assert seconds < 60


def test_fixed_tables_at_2_20_are_megabytes():
    """n = 2**20 (B = 1, H = 8, l = 256, c = 32, block 64): the tables the range-table
    variant reads of the fixed pattern take megabytes, where listed tables would take
    gigabytes (their size counted from the tile counts, not built). Also prints the
    host's part of a first call on this CPU: the build, and the tables written."""
    from fast.kernels.triton_attention import layout_cost
    n, heads, b = 2 ** 20, 8, 64
    for combine in ("merged", "multihead"):
        cost = layout_cost("fixed", n, heads, dict(stride=256, c=32), "ranges", combine=combine,
                           block=b)
        lay = block_layout("fixed", n, heads, combine, block_size=b, stride=256, c=32)
        listed_bytes = 0
        for p in lay.parts:   # (H, rows, widest row) index and mask, int32, both tables
            for count in (p.kv_count, p.q_count):
                rows = count[:1] if p.shared else count
                listed_bytes += 2 * 4 * rows.numel() * int(rows.max())
        print(f"fixed {combine} n=2**20: build {cost['build_s']:.2f} s, tables "
              f"{cost['tables_s']:.2f} s, {cost['table_bytes'] / 2**20:.1f} MiB "
              f"(listed: {listed_bytes / 2**30:.1f} GiB)")
        assert cost["table_bytes"] < 64 * 2**20
        assert listed_bytes > 2 ** 30


def test_diagonal_blocks_are_causal():
    """A block never sees all of itself: the diagonal tile of "full" is strictly causal."""
    layout = block_layout("full", 64, 1, block_size=16)
    part = layout.parts[0]
    last = part.kv_count[0].long() - 1                   # the diagonal is each row's last tile
    assert part.kv_index[0, torch.arange(4), last].tolist() == [0, 1, 2, 3]
    diag = part.kv_mask[0, torch.arange(4), last]
    assert bool((diag >= 0).all())
    np.testing.assert_array_equal(part.token_masks[diag[0]].numpy(),
                                  np.tril(np.ones((16, 16), bool)))


@pytest.mark.parametrize("kwargs,match", [
    (dict(pattern="dense", n=8), "pattern must be one of"),
    (dict(pattern="strided", n=8), "needs the parameter 'stride'"),
    (dict(pattern="strided", n=8, stride=0), "stride l must be"),
    (dict(pattern="fixed", n=8, stride=4, c=5), "at most the stride"),
    (dict(pattern="fixed", n=8, n_heads=2, stride=6, c=4), "multiple of c"),
    (dict(pattern="full", n=0), "sequence length n"),
    (dict(pattern="full", n=8, combine="sum"), "combine must be"),
    (dict(pattern="full", n=8, block_size=0), "block_size must be"),
    (dict(pattern="full", n=8, order="random"), "order must be"),
    (dict(pattern="full", n=8, stride=3), "unexpected"),
    (dict(pattern="longformer", n=8, window=2, global_tokens=(9,)), "global token"),
    (dict(pattern="bigbird", n=8, window=2, n_random=1, n_global=9), "n_global"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        block_layout(**kwargs)


def test_costs_cache_never_lets_an_invalid_argument_through():
    """Layout costs are cached; an argument equal to a valid one (True == 1, 64.0 == 64)
    is still refused after the valid one was cached, not answered from its entry."""
    from fast.layout.costs import layout_tiles
    assert layout_tiles("strided", 64, 1, {"stride": 1}, block_size=1) > 0
    assert layout_tiles("strided", 64, 1, {"stride": 8}) > 0
    for n, params, block in ((64.0, {"stride": 8}, 64), (64, {"stride": True}, 1),
                             (64, {"stride": 1}, True)):
        with pytest.raises(ValueError, match="must be an integer"):
            layout_tiles("strided", n, 1, params, block_size=block)
