"""Tests of reference/heads.py: which part(s) each head reads, and head_masks built from it.

Child et al., 2019, sec. 5.1 (eq. 5-8): merged heads read A(1) | A(2) (eq. 7),
multi-head h reads A(h mod 2) (eq. 8), interleaved layer r reads A(r mod 2)
(eq. 6); sec. 4.3: fixed summary heads read distinct sub-blocks, rank h (merged,
interleaved) or h // 2 (multihead), sub-block k = rank mod (l / c) at positions
[l - (k+1) c, l - k c) of each block. full, longformer and bigbird: every head
reads the one mask. The expectations below are written from that table, not
from the roles they check.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reference import patterns
from reference.heads import PARTS, HeadRole, head_roles, summary_range

# odd n (not a multiple of l), 1 and several heads, c dividing l or not (one summary rank)
CASES = [
    ("full", 23, 3, {}),
    ("strided", 23, 5, {"stride": 4}),
    ("strided", 1, 2, {"stride": 3}),
    ("fixed", 29, 5, {"stride": 6, "c": 2}),
    ("fixed", 17, 1, {"stride": 5, "c": 2}),
    ("longformer", 25, 3, {"window": 3, "dilation": 2, "global_tokens": (0, 11)}),
    ("bigbird", 27, 2, {"window": 3, "n_random": 2, "n_global": 1, "seed": 4}),
]


def expected_parts(pattern: str, h: int, combine: str, layer: int) -> tuple[str, ...]:
    """The parts head h reads, from the table of sec. 5.1."""
    a = PARTS[pattern]
    if len(a) == 1 or combine == "merged":
        return a
    return (a[h % 2],) if combine == "multihead" else (a[layer % 2],)


def part_mask(pattern, name, n, rank, params) -> np.ndarray:
    """One named part as a mask, from the functions of reference.patterns."""
    if pattern == "full":
        return patterns.full(n)
    if pattern == "longformer":
        return patterns.longformer(n, **params)
    if pattern == "bigbird":
        return patterns.bigbird(n, **params)
    if pattern == "strided":
        return patterns.strided(n, params["stride"])[("local", "column").index(name)]
    return patterns.fixed(n, params["stride"], params["c"], rank)[("block", "summary").index(name)]


@pytest.mark.parametrize("combine", patterns.COMBINES)
@pytest.mark.parametrize("pattern,n,n_heads,params", CASES)
def test_roles_follow_the_table(pattern, n, n_heads, params, combine):
    for layer in (0, 1, 2, 3):
        roles = head_roles(pattern, n_heads, combine, layer, stride=params.get("stride"),
                           c=params.get("c"))
        assert len(roles) == n_heads
        for h, role in enumerate(roles):
            assert isinstance(role, HeadRole) and role.head == h
            assert role.parts == expected_parts(pattern, h, combine, layer)
            for name in PARTS[pattern]:
                assert role.reads(name) == (name in role.parts)
            if pattern != "fixed":
                assert role.rank is None and role.summary is None
                continue
            l, c = params["stride"], params["c"]
            rank = h // 2 if combine == "multihead" else h
            k = rank % (l // c)
            assert role.rank == rank
            assert role.summary == (l - (k + 1) * c, l - k * c) == summary_range(l, c, rank)


def test_roles_are_frozen_and_need_fixed_parameters():
    role = head_roles("strided", 1, stride=4)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        role.parts = ("column",)
    with pytest.raises(ValueError, match="needs the parameters stride and c"):
        head_roles("fixed", 2, stride=4)
    with pytest.raises(ValueError, match="multiple of c"):
        head_roles("fixed", 2, "merged", stride=6, c=4)
    with pytest.raises(ValueError, match="pattern must be one of"):
        head_roles("dense", 1)
    with pytest.raises(ValueError, match="n_heads must be"):
        head_roles("full", 0)
    with pytest.raises(ValueError, match="layer must be"):
        head_roles("full", 1, "interleaved", -1)


def test_single_part_patterns_ignore_combine_and_layer():
    for pattern in ("full", "longformer", "bigbird"):
        for combine in patterns.COMBINES:
            for layer in (0, 1):
                roles = head_roles(pattern, 4, combine, layer)
                assert all(r.parts == (pattern,) for r in roles)


@pytest.mark.parametrize("combine", patterns.COMBINES)
@pytest.mark.parametrize("pattern,n,n_heads,params", CASES)
def test_head_masks_are_the_union_the_table_names(pattern, n, n_heads, params, combine):
    for layer in (0, 1):
        masks = patterns.head_masks(pattern, n, n_heads, combine, layer, **params)
        assert masks.shape == (n_heads, n, n) and masks.dtype == np.bool_
        for h in range(n_heads):
            rank = h // 2 if combine == "multihead" else h
            want = np.zeros((n, n), dtype=bool)
            for name in expected_parts(pattern, h, combine, layer):
                want |= part_mask(pattern, name, n, rank, params)
            np.testing.assert_array_equal(masks[h], want, err_msg=f"{pattern} {combine} h={h}")


@pytest.mark.parametrize("pattern,n,n_heads,params", CASES)
def test_factorized_names_every_part(pattern, n, n_heads, params):
    parts = patterns.factorized(pattern, n, **params)
    assert len(parts) == len(PARTS[pattern])
    for name, mask in zip(PARTS[pattern], parts):
        np.testing.assert_array_equal(mask, part_mask(pattern, name, n, 0, params))


def test_neighbours_read_one_mask_in_every_head():
    n = 31
    lf = patterns.longformer(n, 4, 3, [2, 30])
    bb = patterns.bigbird(n, 2, 3, 2, seed=7)
    for combine in patterns.COMBINES:
        for layer in (0, 1):
            got = patterns.head_masks("longformer", n, 3, combine, layer, window=4, dilation=3,
                               global_tokens=[30, 2])
            np.testing.assert_array_equal(got, np.broadcast_to(lf, (3, n, n)))
            got = patterns.head_masks("bigbird", n, 2, combine, layer, window=2, n_random=3,
                               n_global=2, seed=7)
            np.testing.assert_array_equal(got, np.broadcast_to(bb, (2, n, n)))
    with pytest.raises(ValueError, match="needs the parameter 'window'"):
        patterns.head_masks("longformer", n, 1)
