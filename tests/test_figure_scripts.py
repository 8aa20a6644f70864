"""Tests of the figure scripts' logic (not their training): Table 2 configs,
the Figure 2 summaries, make_figures' command lines, and that every plot draws
from plain data into a file."""

import dataclasses
import sys

import numpy as np
import pytest

from fast.__main__ import COMMANDS
from fast.experiments import learned_attention as LA
from fast.experiments.make_figures import STEPS, command
from fast.experiments.table2 import run_configs, timing_configs
from fast.plots import attention as plot_attention
from fast.plots import style


@pytest.mark.parametrize("modality", ["text", "image"])
def test_table2_cells_differ_only_in_the_pattern(modality):
    base_m, base_t = run_configs(modality, "full", quick=False)
    for pattern in ("fixed", "strided"):
        m, t = run_configs(modality, pattern, quick=False)
        diff = {f.name for f in dataclasses.fields(m)
                if getattr(m, f.name) != getattr(base_m, f.name)}
        assert diff <= {"pattern", "c"}, diff
        tdiff = {f.name for f in dataclasses.fields(t)
                 if getattr(t, f.name) != getattr(base_t, f.name)}
        assert tdiff == {"out_dir"}, tdiff
    with pytest.raises(ValueError, match="modality"):
        run_configs("audio", "full", quick=False)


def test_timing_configs_are_the_paper_lengths():
    for n in (3072, 12288):
        m, t = timing_configs(n, "fixed", layers=2)
        assert m.n_ctx == n and t.batch_size == 1 and m.c == 32 and m.stride in (96, 128)


def test_to_pixels_shifts_by_the_start_token():
    w = np.array([[0.5, 0.25, 0.25, 0.0]])
    pix, start = LA.to_pixels(w)
    assert np.allclose(pix, [[0.25, 0.25, 0.0, 0.0]]) and np.allclose(start, [0.5])


def test_layer_summary_sees_column_attention_inside_the_strided_pattern():
    h, w, _ = LA.SHAPE
    n = h * w
    maps = np.zeros((1, 1, 1, n, n))
    for p in range(n):
        # position p predicts pixel p; pixel p - w (just above) is key position p - w + 1
        maps[0, 0, 0, p, p - w + 1 if p >= w else 0] = 1.0
    s = LA.layer_summary(maps)
    col = s["regions"].index("column")
    local = s["regions"].index("local")
    # the pixel just above is inside the 3x3 local window, so 'local' takes it
    assert np.isclose(s["layer_mass"][0][local], 1.0)
    assert np.isclose(s["in_strided"][0][0], 1.0)
    assert s["labels"] == ["local"]
    # two rows up: the column, outside the window
    maps2 = np.zeros_like(maps)
    for p in range(n):
        maps2[0, 0, 0, p, p - 2 * w + 1 if p >= 2 * w else 0] = 1.0
    s2 = LA.layer_summary(maps2)
    assert np.isclose(s2["layer_mass"][0][col], 1.0)
    assert s2["labels"] == ["row/column"]


def test_make_figures_commands():
    assert set(STEPS) >= {"bench", "memory", "experiments", "learned_attention"}
    fresh = command("memory", quick=False, resume=False)
    assert fresh == [sys.executable, "-m", "fast", "memory", "--force"]
    assert command("experiments", quick=False, resume=False)[3] == "table2"
    assert command("learned_attention", quick=False, resume=False)[3] == "fig2"
    assert command("bench", quick=False, resume=False) == [sys.executable, "-m", "fast", "bench"]
    assert all(fast_command in COMMANDS for fast_command, _, _ in STEPS.values())
    assert "--force" not in command("experiments", quick=False, resume=True)
    assert "--quick" in command("learned_attention", quick=True, resume=False)
    assert command("bench", quick=True, resume=False) is None


def test_style_names_colours_and_save(tmp_path):
    assert style.display_name("full") == "dense" and style.display_name("strided") == "strided"
    assert style.color("full") == style.color("dense")
    assert len({style.color(p) for p in style.PATTERN_ORDER}) == len(style.PATTERN_ORDER)
    fig, ax = style.plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = style.save(fig, tmp_path / "sub" / "line.png")
    assert path.stat().st_size > 1000
    assert not style.plt.fignum_exists(fig.number)          # saved and closed


def test_fig2_figures_draw_from_plain_data(tmp_path):
    h, w, c = LA.SHAPE
    n = h * w * c
    maps = np.tril(np.ones((1, 2, n, n)))                  # uniform causal attention (L, H, n, n)
    maps /= maps.sum(-1, keepdims=True)
    summary = LA.layer_summary(maps[:, None])              # (L, B=1, H, n, n)
    summary["query_pixels"] = [list(p) for p in LA.QUERY_PIXELS]
    image = np.arange(n, dtype=np.uint8)
    paths = plot_attention.make_all(maps, image, summary, LA.SHAPE, tmp_path)
    assert [p.name for p in paths] == ["fig2_learned_attention.png", "fig2_layers.png",
                                       "attention_mass.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert LA.pixel_position(1, 2) == (1 * w + 2) * c
    with pytest.raises(ValueError, match="pixel"):
        LA.pixel_position(h, 0)
