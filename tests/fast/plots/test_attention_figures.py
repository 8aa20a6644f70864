"""The Figure 2 panels of trained sparse models (``fast.plots.attention``) draw what each
head reads and count each key once.

Child et al., 2019, Figure 2 (sec. 4.1) draws learned attention; our sparse models'
panels grey the positions outside the pattern (``draw_heads``) and stack the start
token's and each part's mass (``draw_parts``).
"""

from __future__ import annotations

import numpy as np
import pytest

from fast.experiments import learned_attention as LA
from fast.measure.attention_stats import pixel_position
from fast.plots import attention as plot_attention


def _uniform_maps(readable: np.ndarray) -> np.ndarray:
    """(L=1, H, n, n): every head uniform over its own readable positions."""
    return (readable / readable.sum(-1, keepdims=True))[None]


def test_draw_heads_greys_each_heads_own_pattern(tmp_path, monkeypatch):
    n, heads = 256, 4
    readable = LA.readable_masks("fixed", n, heads)                  # (H, n, n)
    maps = _uniform_maps(readable)
    query = pixel_position(*LA.QUERY_PIXELS[0], LA.SHAPE)
    drawn = []
    real = plot_attention.attention_image

    def spy(w, q, shape, mask=None):
        drawn.append(mask)
        return real(w, q, shape, mask)

    monkeypatch.setattr(plot_attention, "attention_image", spy)
    labels = [["h"] * heads]
    plot_attention.draw_heads(maps, np.zeros(n), query, LA.SHAPE, labels, tmp_path / "f.png",
                              pattern="fixed", readable=readable)
    assert len(drawn) == heads
    for h in range(heads):
        assert np.array_equal(drawn[h], readable[h, query]), f"head {h} drawn with another mask"
    # greys exactly the pixels outside head h's own pattern (key j = pixel j - 1)
    rgb = plot_attention.attention_image(maps[0, 3, query], query, LA.SHAPE, readable[3, query])
    grey = np.all(rgb == plot_attention.OUTSIDE, -1).reshape(-1)
    before = np.arange(n - 1) < query
    assert np.array_equal(grey[:n - 1][before], ~readable[3, query, 1:][before])


def test_draw_heads_refuses_one_mask_for_every_head(tmp_path):
    n, heads = 256, 4
    readable = LA.readable_masks("fixed", n, heads)
    query = pixel_position(*LA.QUERY_PIXELS[0], LA.SHAPE)
    with pytest.raises(ValueError, match="one mask per head"):
        plot_attention.draw_heads(_uniform_maps(readable), np.zeros(n), query, LA.SHAPE,
                                  [["h"] * heads], tmp_path / "f.png", pattern="fixed",
                                  readable=readable[0])


def test_draw_parts_refuses_shares_that_count_a_key_twice(tmp_path):
    good = {"start": [[0.1, 0.2]], "part_mass": [[[0.6, 0.3], [0.5, 0.3]]],
            "parts": ["a", "b"], "labels": [["x", "x"]],
            "uniform": {"start": 0.0, "part_mass": [0.6, 0.4]}}
    assert plot_attention.draw_parts({"fixed": good}, tmp_path / "ok.png").exists()
    bad = dict(good, part_mass=[[[0.6, 0.4], [0.5, 0.3]]])           # head 0: 1.1
    with pytest.raises(ValueError, match="sum to 1"):
        plot_attention.draw_parts({"fixed": bad}, tmp_path / "bad.png")


def test_per_head_marks_start_sinks_apart_and_leaves_them_out_of_the_mean():
    # beats_uniform leaves a layer's start sinks out of its statistics; the figure must too
    values = np.array([[0.6, 0.8, 0.4, 0.7], [0.5, 0.5, 0.5, 0.5]])       # (L, H)
    labels = [["local", "mixed", "start sink", "global"], ["start sink"] * 4]  # 1: all sinks
    fig, ax = plot_attention.plt.subplots()
    plot_attention._per_head(ax, values, 1.0, "uniform", labels)
    lines = {line.get_label(): line for line in ax.get_lines()}
    mean = lines["heads (dots), mean (line)"]
    assert np.allclose(mean.get_ydata(), [0.7, 0.5])       # layer 0 without its sink; layer 1 all
    marked = lines["start sink (left out of the mean)"]
    assert marked.get_xdata().tolist() == [0] and marked.get_ydata().tolist() == [0.4]
    plot_attention.plt.close(fig)


def test_draw_parts_legends_sit_below_the_bars(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plot_attention.style, "save",
                        lambda fig, path, **kw: figures.append(fig) or path)
    s = {"start": [[0.1, 0.2]], "part_mass": [[[0.6, 0.3], [0.5, 0.3]]], "parts": ["a", "b"],
         "labels": [["x", "x"]], "uniform": {"start": 0.0, "part_mass": [0.6, 0.4]}}
    plot_attention.draw_parts({"strided": s, "fixed": s}, tmp_path / "f.png")
    fig = figures[0]
    fig.canvas.draw()
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent()
        assert legend.y1 <= ax.get_window_extent().y0            # wholly under the axes
        assert 0.0 in ax.get_yticks()
    plot_attention.plt.close(fig)


def test_draw_parts_says_its_layer_label_is_the_heads_most_common(tmp_path, monkeypatch):
    # one label per layer stands for several heads' labels, often a plurality or a tie, not a
    # majority: the tick must say it is the most common one; a tie goes to the first in head order
    figures = []
    monkeypatch.setattr(plot_attention.style, "save",
                        lambda fig, path, **kw: figures.append(fig) or path)
    s = {"start": [[0.1] * 4] * 2, "part_mass": [[[0.6, 0.3]] * 4] * 2,
         "parts": ["a", "b"],
         "labels": [["global", "mixed", "global", "local"], ["mixed", "global", "global", "mixed"]],
         "uniform": {"start": 0.0, "part_mass": [0.6, 0.4]}}
    plot_attention.draw_parts({"strided": s}, tmp_path / "f.png")
    (ax,) = figures[0].axes
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[:2] == ["0\nmost\ncommon:\nglobal", "1\nmost\ncommon:\nmixed"]
    plot_attention.plt.close(figures[0])


def test_draw_mass_draws_the_share_of_pixel_mass_inside_each_pattern(tmp_path, monkeypatch):
    # the sparse-pattern panel draws what notebook 06's section 5 measures: the share of
    # the pixel mass inside each pattern, start token left out, not all of the mass
    figures = []
    monkeypatch.setattr(plot_attention.style, "save",
                        lambda fig, path, **kw: figures.append(fig) or path)
    L, H = 2, 2
    s = {"mass": [[[0.1, 0.1, 0.1, 0.2]] * H] * L, "start": [[0.5] * H] * L,
         "regions": ["local", "row", "column", "elsewhere"], "window": 2,
         "layers": [{"local_x": 1.0, "rowcol_x": 1.0}] * L,
         "image_entropy": [[0.6] * H] * L, "data_dependence": [[0.2] * H] * L,
         "labels": [["mixed"] * H] * L,
         "in_strided": [[0.2, 0.2]] * L, "in_fixed": [[0.1, 0.1]] * L,
         "share_in_strided": [[0.4, 0.4]] * L, "share_in_fixed": [[0.2, 0.2]] * L,
         "uniform": {"mass": [0.1, 0.05, 0.05, 0.8], "start": 0.0, "in_strided": 0.15,
                     "in_fixed": 0.25, "share_in_strided": 0.17, "share_in_fixed": 0.29}}
    plot_attention.draw_mass(s, tmp_path / "f.png")
    ax = figures[0].axes[4]                                          # bottom middle
    drawn = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
    assert np.allclose(drawn["inside strided"], 0.4) and np.allclose(drawn["inside fixed"], 0.2)
    assert np.allclose(drawn["uniform, strided"], 0.17)
    assert "pixel" in ax.get_ylabel()
    plot_attention.plt.close(figures[0])
