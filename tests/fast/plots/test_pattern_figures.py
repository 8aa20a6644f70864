"""Tests of the figures of notebooks 01-03 (fast/plots/patterns.py, fast/plots/transposition.py):
what each head reads under the three ways of combining heads (Child et al., 2019, sec. 5.1),
keys per query and the cost of a strided head against n (sec. 4.2)."""

import numpy as np
import pytest

from fast.plots import patterns as pp
from fast.plots.style import plt
from fast.plots.transposition import plot_cost
from reference import patterns as reference_patterns
from reference.heads import PARTS, head_roles
from reference.params import COMBINES


@pytest.mark.parametrize("pattern,params", [("strided", {"stride": 5}),
                                            ("fixed", {"stride": 6, "c": 2}),
                                            ("fixed", {"stride": 7, "c": 3})])
@pytest.mark.parametrize("combine", COMBINES)
def test_head_parts_are_what_head_masks_reads(pattern, params, combine):
    n = 23
    H = 5 if params["stride"] % params.get("c", 1) == 0 else 1   # several summary heads need c | l
    for layer in (0, 1):
        masks = reference_patterns.head_masks(pattern, n, H, combine, layer, **params)
        for role in head_roles(pattern, H, combine, layer, stride=params["stride"],
                               c=params.get("c")):
            a1, a2 = pp.head_parts(pattern, n, role, **params)
            assert np.array_equal(masks[role.head], a1 | a2)
            assert a1.any() == role.reads(PARTS[pattern][0])
            assert a2.any() == role.reads(PARTS[pattern][1])


def test_combine_modes_figure_names_each_heads_summary_sub_block():
    fig = pp.plot_combine_modes("fixed", 24, 4, stride=6, c=2)
    titles = [ax.get_title() for ax in fig.axes]
    # merged: l / c = 3 sub-blocks for 4 heads, so head 3 shares head 0's
    assert titles[:4] == [f"head {h}: block + summary {h % 3}" for h in range(4)]
    # multihead: only the odd heads read summaries, ranks h // 2 = 0, 1
    assert titles[4:8] == ["head 0: block", "head 1: summary 0", "head 2: block",
                           "head 3: summary 1"]
    assert "merged, multi-head and interleaved" in fig._suptitle.get_text()
    plt.close(fig)


def test_keys_per_query_figure_draws_every_curve_in_both_panels():
    ns = 2 ** np.arange(6, 10)
    curves = {}
    for label, kw in (("full", {}), ("strided l=sqrt(n)", None), ("fixed l=128, c=32",
                                                                  {"stride": 128, "c": 32})):
        pattern = label.split()[0]
        rows = [pp.keys_per_query(pattern, n, **(kw if kw is not None
                                                  else {"stride": int(round(np.sqrt(n)))}))
                for n in ns]
        curves[label] = (np.array([r.mean() for r in rows]), np.array([r.max() for r in rows]))
    fig = pp.plot_keys_per_query(ns, curves)
    left, right = fig.axes
    for ax in (left, right):
        labels = [line.get_label() for line in ax.get_lines()]
        assert set(curves) <= set(labels)
    # right panel: pairs per head / n^1.5, flat for l = sqrt(n)
    strided = next(line for line in right.get_lines() if line.get_label() == "strided l=sqrt(n)")
    ys = strided.get_ydata()
    assert ys.max() / ys.min() < 1.1
    # the ratio can be read off the log axis: a labelled tick at 1.5, where l = sqrt(n) sits,
    # and at least three labelled ticks inside the drawn range (not a lone "10")
    fig.canvas.draw()
    lo, hi = right.get_ylim()
    labelled = {float(t.get_text()): t.get_position()[1] for t in right.get_yticklabels()
                if t.get_text() and lo <= t.get_position()[1] <= hi}
    print("labelled ticks of the right panel:", sorted(labelled), "inside", (lo, hi))
    assert 1.5 in labelled and len(labelled) >= 3
    plt.close(fig)


def test_cost_figure_fits_the_slope_of_each_series():
    ns = 2 ** np.arange(10, 15)
    fig = plot_cost(ns, {"a": ns ** 1.5, "b": 3.0 * ns}, {"a": 1e-9 * ns ** 2})
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert "a (slope 1.50)" in labels and "b (slope 1.00)" in labels and "a (slope 2.00)" in labels
    plt.close(fig)


def test_figure3_legend_says_what_the_full_panels_colour_means():
    # panel (a), full attention, has no head A(1), yet is drawn in A(1)'s colour: the legend
    # must name that colour "read" for (a)
    fig = pp.figure3()
    (legend,) = fig.legends
    for patch, text in zip(legend.get_patches(), legend.get_texts()):
        if np.allclose(patch.get_facecolor()[:3], pp._rgb(pp.A1_COLOUR)):
            assert "A(1)" in text.get_text() and "read" in text.get_text()
            break
    else:
        raise AssertionError("figure 3's legend has no entry for head A(1)'s colour")
    plt.close(fig)


@pytest.mark.parametrize("n,step", [(16, 1), (24, 4), (36, 4), (64, 8), (256, 32)])
def test_connectivity_matrix_numbers_queries_and_keys(n, step):
    # notebooks 00 and 01 ask the reader to find a query's row and the keys it reads: the
    # axes label positions, every one up to n = 16, else at most 10 labels an axis
    a1, a2 = reference_patterns.strided(n, 4)
    fig, ax = plt.subplots()
    pp.draw_connectivity(ax, a1, a2)
    fig.canvas.draw()
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        texts = [t.get_text() for t in labels]
        assert texts == [str(p) for p in range(0, n, step)]
        assert len(texts) <= (n if n <= 16 else 10)
    plt.close(fig)


def test_query_grid_numbers_every_position():
    # the "rows of l" panels: each cell shows its position, the query's in white on dark blue
    n, width, query = 16, 4, 10
    a1, a2 = reference_patterns.strided(n, width)
    fig, ax = plt.subplots()
    pp.draw_query(ax, a1[query], a2[query], query, width)
    numbers = {t.get_text(): t for t in ax.texts}
    assert sorted(numbers, key=int) == [str(p) for p in range(n)]
    assert numbers[str(query)].get_color() == "white"      # read by both heads: mid blue
    assert numbers[str(query + 1)].get_color() == "black"  # future: grey
    plt.close(fig)


def test_small_head_panels_label_fewer_positions():
    # the combine-modes figure's panels are small: at most 8 labels an axis, even at n = 16
    fig = pp.plot_combine_modes("strided", 16, 2, stride=4)
    fig.canvas.draw()
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(p) for p in range(0, 16, 2)]
        assert [t.get_text() for t in ax.get_yticklabels()] == [str(p) for p in range(0, 16, 2)]
    plt.close(fig)
