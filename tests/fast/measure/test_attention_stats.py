"""Tests of fast.measure.attention_stats: the Figure 2 summaries of learned attention
(Child et al., 2019, sec. 3)."""

import numpy as np
import pytest

from fast.measure.attention_stats import (
    CONCENTRATED,
    MOST,
    SPREAD,
    concentration,
    coordinates,
    data_dependence,
    head_statistics,
    image_entropy,
    label_head,
    measured_heads,
    pattern_mass,
    region_masks,
    region_mass,
    split_start,
    uniform_weights,
)
from reference.patterns import strided, union


def test_coordinates_raster_order_with_channels():
    rows, cols, ch = coordinates((2, 4, 3))
    assert (rows[19], cols[19], ch[19]) == (1, 2, 1)   # 1*12 + 2*3 + 1


def test_regions_are_disjoint_and_cover_the_causal_past():
    shape = (5, 7, 2)
    n = 70
    queries = [0, 13, 40, 69]
    m = region_masks(shape, queries, window=1)
    assert m.shape == (4, 4, n)
    assert (m.sum(0) <= 1).all()
    causal = np.arange(n)[None, :] <= np.array(queries)[:, None]
    assert np.array_equal(m.any(0), causal)


@pytest.mark.parametrize("key,region",
                         [((3, 0), 1), ((0, 3), 2), ((2, 2), 0), ((0, 0), 3), ((3, 3), 0)])
def test_one_hot_weight_lands_in_its_region(key, region):
    shape = (6, 6, 1)
    q = 3 * 6 + 3
    w = np.zeros((1, 36))
    w[0, key[0] * 6 + key[1]] = 1.0
    mass = region_mass(w, shape, [q], window=1)
    expected = np.zeros(4)
    expected[region] = 1.0
    assert np.allclose(mass, expected)


def test_concentration_uniform_and_one_hot():
    n, queries = 50, np.arange(1, 50)
    ent, top = concentration(uniform_weights(n, queries), queries, k=4)
    assert np.isclose(ent, 1.0)
    assert 0.0 < top < 1.0
    one_hot = np.zeros((49, n))
    one_hot[np.arange(49), queries // 2] = 1.0
    ent, top = concentration(one_hot, queries, k=1)
    assert np.isclose(ent, 0.0) and np.isclose(top, 1.0)


def test_pattern_mass_of_uniform_is_fraction_of_readable_positions():
    n, l = 37, 6
    mask = union(*strided(n, l))
    queries = np.arange(n)
    got = pattern_mass(uniform_weights(n, queries), mask, queries)
    expected = np.mean([mask[i, : i + 1].sum() / (i + 1) for i in range(n)])
    assert np.isclose(got, expected)


def test_batched_leading_axes_and_bad_input():
    w = np.stack([uniform_weights(36, [20, 30])] * 3)[None]          # (1, 3, 2, 36)
    assert region_mass(w, (6, 6, 1), [20, 30]).shape == (1, 3, 4)
    with pytest.raises(ValueError, match="n_query"):
        region_mass(w, (6, 6, 1), [20])
    with pytest.raises(ValueError, match="image_shape"):
        region_masks((6, 6), [1])


def test_label_head_rules():
    """The rule of the module docstring, in order; the cases of the former classify_layer
    keep their meaning (a row-and-column head, a concentrated head, a spread head)."""
    assert label_head(0.0, [0.8, 0.1, 0.05, 0.05], 0.3) == "local"
    assert label_head(0.0, [0.1, 0.3, 0.3, 0.3], 0.5) == "row+column"
    assert label_head(0.0, [0.1, 0.05, 0.05, 0.8], 0.3) == "concentrated"
    assert label_head(0.0, [0.1, 0.05, 0.05, 0.8], 0.9) == "global"
    assert label_head(0.0, [0.1, 0.05, 0.05, 0.8], 0.65) == "mixed"
    assert label_head(0.6, [0.8, 0.1, 0.05, 0.05], 0.3) == "start sink"      # sink first
    assert label_head(0.0, [0.1, 0.6, 0.0, 0.3], 0.3) == "row"
    assert label_head(0.0, [0.1, 0.0, 0.6, 0.3], 0.3) == "column"
    assert label_head(MOST - 1e-9, [MOST, 0, 0, 1 - MOST], SPREAD) == "local"   # thresholds
    assert label_head(0.0, [0.2, 0.1, 0.1, 0.6], CONCENTRATED) == "concentrated"
    with pytest.raises(ValueError, match="shares"):
        label_head(0.0, [0.5, 0.5], 0.5)


def _one_hot_maps(shape, key_of):
    """(n, n) position-space weights of a head that reads key position key_of(p) from p."""
    n = int(np.prod(shape))
    w = np.zeros((n, n))
    for p in range(n):
        w[p, key_of(p)] = 1.0
    return w


def test_head_statistics_of_known_heads():
    shape = (8, 8, 1)
    n, width = 64, 8
    q = np.arange(24, 64)                                  # rows 3..7
    # position p predicts pixel p; key position j holds pixel j - 1 (key 0: start token)
    heads = {
        "local": _one_hot_maps(shape, lambda p: p),                          # pixel p - 1
        "column": _one_hot_maps(shape, lambda p: max(p - 3 * width + 1, 0)),  # 3 rows up
        "start sink": _one_hot_maps(shape, lambda p: 0),
    }
    uni = uniform_weights(n, np.arange(n))
    maps = np.stack([h[q] for h in heads.values()] + [uni[q]])              # (4, Q, n)
    s = head_statistics(maps, shape, q, window=2)
    assert s["labels"] == ["local", "column", "start sink", "global"]
    assert np.allclose(s["start"], [0, 0, 1, np.mean(1 / (q + 1))])
    assert np.allclose(s["mass"].sum(-1) + s["start"], 1.0)
    assert np.allclose(s["image_entropy"][:2], 0.0) and np.isclose(s["image_entropy"][3], 1.0)
    pix, start = split_start(maps)
    assert np.allclose(pix.sum(-1) + start, 1.0) and np.allclose(pix[..., -1], 0.0)


def test_entropy_inside_a_pattern_and_data_dependence():
    n, l = 48, 8
    mask = union(*strided(n, l))
    q = np.arange(16, n)
    inside = uniform_weights(n, q, mask)                    # uniform over the pattern
    assert np.allclose(inside.sum(-1), 1.0) and not (inside[:, ~mask[q].any(0)] > 0).any()
    ent, _ = concentration(inside, q, mask=mask)
    assert np.isclose(ent, 1.0)
    pix, _ = split_start(inside)
    assert np.isclose(image_entropy(pix, q, mask), 1.0)
    assert image_entropy(pix, q) < 0.8                      # against every earlier pixel
    same = np.stack([inside] * 3)                           # (B=3, Q, n): one pattern
    assert np.isclose(data_dependence(same), 0.0)
    disjoint = np.zeros((2, 1, 4))
    disjoint[0, 0, 0] = disjoint[1, 0, 3] = 1.0
    assert np.isclose(data_dependence(disjoint), 0.5)       # 1 - 1/B
    with pytest.raises(ValueError, match="B >= 2"):
        data_dependence(np.ones((1, 1, 4)))


def test_a_layers_statistics_leave_its_start_sinks_out_unless_all_are_sinks():
    assert measured_heads(["local", "start sink", "global", "start sink"]) == [0, 2]
    assert measured_heads(["start sink"] * 3) == [0, 1, 2]
    assert measured_heads(["row", "column"]) == [0, 1]
