"""Tests of reference/patterns.py: the masks of sec. 4.2-4.3 and 5.1 against closed forms.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers":
section 4.3 (strided and fixed patterns, Fig. 3), section 4.2 (any j <= i reaches
i in at most p + 1 hops), section 5.1 (merged, multi-head and interleaved heads),
and the two neighbours the benchmarks compare with (Longformer, BigBird), causal.

Every count below is an independent closed form of the row index i (it never
looks at the mask it checks), and the sizes are odd on purpose: n not a multiple
of l, c not dividing l, and so on.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import patterns
from reference.counts import keys_per_query

# (n, l, c) with n not a multiple of l, n < l, n == l, c == l, c == 1, c not dividing l.
SIZES = [(1, 1, 1), (5, 8, 3), (8, 8, 8), (36, 6, 2), (37, 6, 4), (50, 7, 3), (64, 8, 8),
         (97, 10, 1)]


# ----------------------------------------------------------------------------
# Closed forms of the number of keys each row reads (i = 0..n-1).
# ----------------------------------------------------------------------------

def summary_count(i: np.ndarray, l: int, lo: int, hi: int) -> np.ndarray:
    """#{j <= i : lo <= j mod l < hi}: (i+1)//l whole blocks give hi-lo each,
    and the partial block [0, (i+1) mod l) gives its overlap with [lo, hi)."""
    whole, rest = divmod(i + 1, l)
    return whole * (hi - lo) + np.clip(rest - lo, 0, hi - lo)


def test_full_reads_i_plus_one():
    for n in (1, 2, 17, 64):
        m = patterns.full(n)
        i = np.arange(n)
        assert m.dtype == np.bool_ and m.shape == (n, n)
        np.testing.assert_array_equal(m.sum(1), i + 1)


@pytest.mark.parametrize("n,l,c", SIZES)
def test_strided_counts(n, l, c):
    local, column = patterns.strided(n, l)
    i = np.arange(n)
    np.testing.assert_array_equal(local.sum(1), np.minimum(i + 1, l))
    np.testing.assert_array_equal(column.sum(1), i // l + 1)
    # local and column share only i itself, so the merged head reads
    # min(i+1, l) + floor(i/l) positions.
    np.testing.assert_array_equal(patterns.union(local, column).sum(1), np.minimum(i + 1,
                                                                                   l) + i // l)


@pytest.mark.parametrize("n,l,c", SIZES)
def test_fixed_counts(n, l, c):
    block, summary = patterns.fixed(n, l, c)
    i = np.arange(n)
    np.testing.assert_array_equal(block.sum(1), i % l + 1)
    np.testing.assert_array_equal(summary.sum(1), summary_count(i, l, l - c, l))
    # every earlier block gives its c summaries, the own block all of i's prefix
    np.testing.assert_array_equal(patterns.union(block, summary).sum(1), i % l + 1 + (i // l) * c)


@pytest.mark.parametrize("l,c", [(6, 2), (8, 2), (12, 3), (12, 4), (5, 5), (7, 1)])
def test_fixed_summary_sub_blocks(l, c):
    n = 3 * l + 2
    i = np.arange(n)
    per_block = l // c
    seen = np.zeros(n, dtype=int)  # how many heads read column j (at row n-1)
    for head in range(2 * per_block):
        lo, hi = patterns.summary_range(l, c, head)
        k = head % per_block
        assert (lo, hi) == (l - (k + 1) * c, l - k * c)
        _, summary = patterns.fixed(n, l, c, head)
        np.testing.assert_array_equal(summary.sum(1), summary_count(i, l, lo, hi))
        if head < per_block:
            seen += summary[-1]
    # the first l/c heads read distinct sub-blocks that tile every complete block
    assert np.all(seen[: (n // l) * l] == 1)
    # head 0 is the single-head pattern: the last c positions of each block
    assert patterns.summary_range(l, c, 0) == (l - c, l)


@pytest.mark.parametrize("n,l,c", SIZES)
def test_causal(n, l, c):
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    masks = [patterns.full(n), *patterns.strided(n, l), *patterns.fixed(n, l, c)]
    masks += [patterns.longformer(n, 3, 2, [0, n - 1]), patterns.bigbird(n, 2, 3, 1, seed=5)]
    for combine in patterns.COMBINES:
        for pattern, params in [("full", {}), ("strided", {"stride": l}),
                                ("fixed", {"stride": l, "c": c})]:
            masks += list(patterns.head_masks(pattern, n, 1, combine, **params))
    for m in masks:
        assert not np.any(m & upper)
        assert m.dtype == np.bool_


# ----------------------------------------------------------------------------
# Section 4.2: every j <= i reaches i in at most two hops (A(1) then A(2), or
# A(2) then A(1)); one hop or zero hops (j == i) count too.
# ----------------------------------------------------------------------------

def reach_two_hops(a1: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """R[i, j]: j -> k -> i with the two hops in different heads, or j -> i directly.
    Output k reads j (a[k, j]) and then output i reads k; as matrices that is a @ b."""
    a1i, a2i = a1.astype(np.int64), a2.astype(np.int64)
    return (a2i @ a1i > 0) | (a1i @ a2i > 0) | a1 | a2 | np.eye(len(a1), dtype=bool)


@pytest.mark.parametrize("n,l,c", SIZES + [(30, 4, 3), (45, 9, 2), (16, 1, 1)])
def test_two_hop_connectivity(n, l, c):
    lower = np.tril(np.ones((n, n), dtype=bool))
    for a1, a2 in (patterns.strided(n, l), patterns.fixed(n, l, c)):
        reach = reach_two_hops(a1, a2)
        np.testing.assert_array_equal(reach, lower)  # all of j <= i, nothing above


def test_two_hops_are_needed():
    """One head alone does not connect everything: the factorization matters."""
    n, l, c = 20, 4, 1
    lower = np.tril(np.ones((n, n), dtype=bool))
    for a1, a2 in (patterns.strided(n, l), patterns.fixed(n, l, c)):
        assert not np.array_equal(a1 | a2, lower)
        one = a1.astype(np.int64)
        assert not np.array_equal((one @ one > 0) | a1, lower)  # A(1) twice is not enough


# ----------------------------------------------------------------------------
# Section 5.1: merged, multihead and interleaved.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("n,l,c", [(37, 6, 2), (20, 4, 4), (29, 8, 2)])
def test_combine_modes(n, l, c):
    H = 5
    cases = [("strided", {"stride": l}, lambda h: patterns.strided(n, l)),
             ("fixed", {"stride": l, "c": c}, lambda r: patterns.fixed(n, l, c, r))]
    for pattern, params, parts in cases:
        merged = patterns.head_masks(pattern, n, H, "merged", **params)
        multi = patterns.head_masks(pattern, n, H, "multihead", **params)
        assert merged.shape == multi.shape == (H, n, n)
        for h in range(H):
            np.testing.assert_array_equal(merged[h], patterns.union(*parts(h)))
            # multihead: even heads read A(1), odd heads A(2) (its summary rank h // 2)
            np.testing.assert_array_equal(multi[h], parts(h // 2)[h % 2])
        for layer in range(4):
            inter = patterns.head_masks(pattern, n, H, "interleaved", layer=layer, **params)
            for h in range(H):
                np.testing.assert_array_equal(inter[h], parts(h)[layer % 2])
            # layers of the same parity are identical, of different parity not
            other = patterns.head_masks(pattern, n, H, "interleaved", layer=layer + 1, **params)
            again = patterns.head_masks(pattern, n, H, "interleaved", layer=layer + 2, **params)
            np.testing.assert_array_equal(inter, again)
            assert not np.array_equal(inter, other)


def test_full_identical_in_all_modes():
    n, H = 23, 3
    want = np.broadcast_to(patterns.full(n), (H, n, n))
    for combine in patterns.COMBINES:
        for layer in (0, 1):
            np.testing.assert_array_equal(patterns.head_masks("full", n, H, combine, layer), want)


@pytest.mark.parametrize("combine", patterns.COMBINES)
def test_fixed_heads_read_distinct_sub_blocks(combine):
    n, l, c, H = 40, 8, 2, 8
    per_block = l // c
    layer = 1  # interleaved: layer 1 reads A(2), the summaries
    masks = patterns.head_masks("fixed", n, H, combine, layer=layer, stride=l, c=c)
    readers = [h for h in range(H) if combine != "multihead" or h % 2 == 1]
    block, _ = patterns.fixed(n, l, c)
    # the summary part of each reading head, as the set of (j mod l) it reads
    summaries = []
    for h in readers:
        s = masks[h] & ~block if combine == "merged" else masks[h]
        cols = np.unique(np.nonzero(s)[1] % l)
        summaries.append(tuple(cols))
        r = patterns.summary_rank(h, combine)
        assert r == (h // 2 if combine == "multihead" else h)
        lo, hi = patterns.summary_range(l, c, r)
        assert summaries[-1] == tuple(range(lo, hi))
    # the first l/c summary readers read pairwise distinct sub-blocks, then it repeats
    first = summaries[:per_block]
    assert len(set(first)) == len(first)
    for r in range(per_block, len(summaries)):
        assert summaries[r] == summaries[r - per_block]


def test_fixed_several_heads_need_c_dividing_l():
    n, l, c = 20, 6, 4
    for combine in ("merged", "interleaved"):
        patterns.head_masks("fixed", n, 1, combine, stride=l, c=c)  # one head: fine
        with pytest.raises(ValueError, match="multiple of c"):
            patterns.head_masks("fixed", n, 2, combine, stride=l, c=c)
    # multihead: heads 0 and 1 are one block head and one summary head, so a
    # second summary head (and so the error) comes only with 3 heads
    patterns.head_masks("fixed", n, 2, "multihead", stride=l, c=c)
    with pytest.raises(ValueError, match="multiple of c"):
        patterns.head_masks("fixed", n, 3, "multihead", stride=l, c=c)
    with pytest.raises(ValueError, match="multiple of c"):
        patterns.fixed(n, l, c, head=1)


# ----------------------------------------------------------------------------
# Neighbours: Longformer and BigBird, causal.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("n,w,r", [(1, 1, 1), (30, 4, 1), (31, 3, 2), (40, 5, 3), (9, 20, 2)])
def test_longformer_window_and_dilation(n, w, r):
    m = patterns.longformer(n, w, r)
    i = np.arange(n)
    np.testing.assert_array_equal(m.sum(1), np.minimum(w, i // r + 1))
    back = i[:, None] - i[None, :]
    assert np.all(back[m] % r == 0) and np.all(back[m] < w * r) and np.all(back[m] >= 0)
    assert np.all(np.diag(m))


def test_longformer_global_tokens():
    n, w, r, g = 30, 3, 2, [0, 7, 7, 19]
    m = patterns.longformer(n, w, r, g)
    base = patterns.longformer(n, w, r)
    for t in set(g):
        np.testing.assert_array_equal(m[t, : t + 1], True)      # reads all j <= t
        np.testing.assert_array_equal(m[t:, t], True)           # read by all i >= t
        assert not m[t, t + 1:].any() and not m[:t, t].any()    # still causal
    other = np.setdiff1d(np.arange(n), g)
    keep = np.ix_(other, other)
    np.testing.assert_array_equal(m[keep], base[keep])  # the rest is the window
    with pytest.raises(ValueError, match="global token"):
        patterns.longformer(n, w, r, [n])
    with pytest.raises(ValueError, match="window"):
        patterns.longformer(n, 0)
    with pytest.raises(ValueError, match="dilation"):
        patterns.longformer(n, 2, 0)


def test_bigbird_random_keys():
    n, k = 50, 4
    keys = patterns.bigbird_random_keys(n, k, seed=3)
    assert keys.shape == (n, k)
    np.testing.assert_array_equal(keys, patterns.bigbird_random_keys(n, k, seed=3))  # deterministic
    assert not np.array_equal(keys, patterns.bigbird_random_keys(n, k, seed=4))     # seeded
    for i in range(n):
        row = keys[i][keys[i] >= 0]
        assert len(row) == min(k, i + 1)                 # all of [0, i] when i + 1 <= k
        assert len(set(row.tolist())) == len(row)        # distinct
        assert np.all(row <= i) and np.all(row >= 0)     # causal
        assert np.all(keys[i][len(row):] == -1)          # padding after the keys
    # roughly uniform over earlier positions: late rows do reach back far
    assert keys[n // 2:].min() < n // 4
    assert patterns.bigbird_random_keys(5, 0).shape == (5, 0)


def test_bigbird_mask():
    n, w, k, g, seed = 41, 3, 2, 2, 9
    m = patterns.bigbird(n, w, k, g, seed=seed)
    keys = patterns.bigbird_random_keys(n, k, seed)
    want = patterns.longformer(n, w, 1, range(g))
    for i in range(n):
        want[i, keys[i][keys[i] >= 0]] = True
    np.testing.assert_array_equal(m, want)
    np.testing.assert_array_equal(m, patterns.bigbird(n, w, k, g, seed=seed))
    assert not np.any(np.triu(m, 1))
    i = np.arange(n)
    assert np.all(m.sum(1) <= np.minimum(i + 1, w + k + g))
    assert np.all(m.sum(1) >= np.minimum(i + 1, w))
    with pytest.raises(ValueError, match="n_global"):
        patterns.bigbird(n, w, k, n + 1)
    with pytest.raises(ValueError, match="n_random"):
        patterns.bigbird(n, w, -1, 0)


# ----------------------------------------------------------------------------
# Random sizes (hypothesis): closed forms hold for every (n, l, c).
# ----------------------------------------------------------------------------

@settings(max_examples=60)  # cheap (< 1 s); more than the suite's default 25
@given(n=st.integers(1, 40), l=st.integers(1, 12), c=st.integers(1, 12), head=st.integers(0, 5))
def test_closed_forms_random(n, l, c, head):
    c = min(c, l)
    if head > 0 and l % c:
        c = 1
    i = np.arange(n)
    local, column = patterns.strided(n, l)
    np.testing.assert_array_equal(local.sum(1), np.minimum(i + 1, l))
    np.testing.assert_array_equal(column.sum(1), i // l + 1)
    block, summary = patterns.fixed(n, l, c, head)
    lo, hi = patterns.summary_range(l, c, head)
    np.testing.assert_array_equal(block.sum(1), i % l + 1)
    np.testing.assert_array_equal(summary.sum(1), summary_count(i, l, lo, hi))
    if head == 0:
        lower = np.tril(np.ones((n, n), dtype=bool))
        np.testing.assert_array_equal(reach_two_hops(local, column), lower)
        np.testing.assert_array_equal(reach_two_hops(block, summary), lower)


# ----------------------------------------------------------------------------
# Bad input: a ValueError that says what was given.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda: patterns.full(0), "n must be an integer >= 1"),
    (lambda: patterns.full(3.0), "n must be an integer >= 1"),
    (lambda: patterns.full(True), "n must be an integer >= 1"),
    (lambda: patterns.strided(8, 0), "stride l must be an integer >= 1, got 0"),
    (lambda: patterns.strided(8, -2), "stride"),
    (lambda: patterns.fixed(8, 4, 0), "summary width c must be an integer >= 1, got 0"),
    (lambda: patterns.fixed(8, 4, 5), "c=5 > l=4"),
    (lambda: patterns.fixed(8, 6, 4, head=1), "l=6, c=4"),
    (lambda: patterns.fixed(8, 4, 2, head=-1), "head index"),
    (lambda: patterns.union(), "at least one mask"),
    (lambda: patterns.union(patterns.full(3), patterns.full(4)), "one shape"),
    (lambda: patterns.head_masks("dense", 8, 1), "pattern must be one of"),
    (lambda: patterns.head_masks("full", 8, 1, "sum"), "combine must be one of"),
    (lambda: patterns.head_masks("full", 8, 0), "n_heads"),
    (lambda: patterns.head_masks("full", 8, 1, layer=-1), "layer"),
    (lambda: patterns.head_masks("full", 0, 1), "n must be"),
    (lambda: patterns.head_masks("strided", 8, 1), "needs the parameter 'stride'"),
    (lambda: patterns.head_masks("fixed", 8, 1, stride=4), "needs the parameter 'c'"),
    (lambda: patterns.head_masks("fixed", 8, 1, stride=4, c=8), "c=8 > l=4"),
    (lambda: patterns.head_masks("full", 8, 1, stride=4), "unexpected \\['stride'\\]"),
    (lambda: patterns.head_masks("strided", 8, 1, stride=4, c=2), "unexpected \\['c'\\]"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ----------------------------------------------------------------------------
# reference.counts.keys_per_query: the closed forms the notebooks plot at
# large n, checked against the masks.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("n,l,c", SIZES)
def test_keys_per_query_matches_masks(n, l, c):
    np.testing.assert_array_equal(keys_per_query("full", n), patterns.full(n).sum(1))
    for pattern, kw in (("strided", {"stride": l}), ("fixed", {"stride": l, "c": c})):
        heads = range(3) if pattern == "fixed" and l % c == 0 else [0]
        for head in heads:
            a1, a2 = patterns.factorized(pattern, n, head, **kw)
            for part, mask in (("A1", a1), ("A2", a2), ("merged", a1 | a2)):
                got = keys_per_query(pattern, n, part, head=head, **kw)
                np.testing.assert_array_equal(got, mask.sum(1))
    with pytest.raises(ValueError, match="part must be one of"):
        keys_per_query("full", n, "A3")
    with pytest.raises(ValueError, match="needs the parameter 'c'"):
        keys_per_query("fixed", n, stride=l)


@pytest.mark.parametrize("part", ["A1", "A2"])
def test_keys_per_query_full_has_no_parts(part):
    # full is one part; part="A2" used to return i + 1 as if it had a second head
    with pytest.raises(ValueError, match=f"pattern 'full' has one part .* got part='{part}' "
                                         r"\(allowed: 'merged'"):
        keys_per_query("full", 5, part)


@pytest.mark.parametrize("call,pattern,given", [
    (lambda h: keys_per_query("strided", 9, "A2", stride=2, head=h), "strided", 7),
    (lambda h: keys_per_query("full", 9, head=h), "full", 1),
    (lambda h: patterns.factorized("strided", 9, h, stride=2), "strided", 7),
    (lambda h: patterns.factorized("strided", 9, h, stride=2), "strided", -1),
    (lambda h: patterns.factorized("strided", 9, h, stride=2), "strided", 0.0),
    (lambda h: patterns.factorized("full", 9, h), "full", True),
    (lambda h: patterns.factorized("longformer", 9, h, window=3), "longformer", 1),
    (lambda h: patterns.factorized("bigbird", 9, h, window=3, n_random=1, n_global=1), "bigbird",
     2),
])
def test_head_is_refused_where_every_head_reads_the_same_keys(call, pattern, given):
    # the head (summary rank) used to be accepted and ignored outside "fixed"
    with pytest.raises(ValueError, match=f"head \\(a summary rank\\) must be 0 for pattern "
                                         f"'{pattern}'.* got head={given!r} \\(allowed: 0"):
        call(given)
    call(0)  # the default stays accepted


def test_fixed_ranks_past_the_sub_blocks_wrap():
    # fixed's heads read distinct sub-blocks, and rank r reads sub-block r mod (l / c),
    # so any rank >= 0 means something there (reference.heads.summary_range)
    n, l, c = 29, 6, 2
    for rank in range(7):
        got = keys_per_query("fixed", n, "A2", stride=l, c=c, head=rank)
        np.testing.assert_array_equal(got, keys_per_query("fixed", n, "A2", stride=l, c=c,
                                                          head=rank % (l // c)))
        np.testing.assert_array_equal(got, patterns.factorized("fixed", n, rank, stride=l,
                                                               c=c)[1].sum(1))


def test_longformer_rejects_non_integer_global_tokens():
    with pytest.raises(ValueError, match="must be integers"):
        patterns.longformer(8, 2, 1, [1.5])


def test_longformer_rejects_a_non_iterable_global_tokens():
    with pytest.raises(ValueError, match="iterable"):
        patterns.longformer(8, 2, 1, 5)
