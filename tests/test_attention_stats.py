"""Tests of fast.measure.attention_stats: the Figure 2 summaries of learned attention
(Child et al., 2019, sec. 3)."""

import numpy as np
import pytest

from fast.measure.attention_stats import (
    classify_layer,
    concentration,
    coordinates,
    pattern_mass,
    region_masks,
    region_mass,
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


def test_classify_layer_rules():
    uni = np.array([0.05, 0.05, 0.05, 0.85])
    assert classify_layer([0.8, 0.1, 0.05, 0.05], 0.9, uni) == "local"
    assert classify_layer([0.1, 0.3, 0.3, 0.3], 0.5, uni) == "row/column"
    assert classify_layer([0.1, 0.05, 0.05, 0.8], 0.9, uni) == "sparse"
    assert classify_layer([0.1, 0.05, 0.05, 0.8], 0.2, uni) == "global"
