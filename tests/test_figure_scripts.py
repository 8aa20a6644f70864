"""Tests of the figure scripts' logic (not their training): Table 2 configs,
the Figure 2 summaries, and make_figures' command lines."""

import dataclasses

import numpy as np
import pytest

from fast.experiments import learned_attention as LA
from fast.experiments.table2 import run_configs, timing_configs
from fast.experiments.make_figures import STEPS, command


@pytest.mark.parametrize("modality", ["text", "image"])
def test_table2_cells_differ_only_in_the_pattern(modality):
    base_m, base_t = run_configs(modality, "full", quick=False)
    for pattern in ("fixed", "strided"):
        m, t = run_configs(modality, pattern, quick=False)
        diff = {f.name for f in dataclasses.fields(m) if getattr(m, f.name) != getattr(base_m, f.name)}
        assert diff <= {"pattern", "c"}, diff
        tdiff = {f.name for f in dataclasses.fields(t) if getattr(t, f.name) != getattr(base_t, f.name)}
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
    assert fresh[-2:] == ["fast.experiments.memory_report", "--force"]
    assert "--force" not in command("experiments", quick=False, resume=True)
    assert "--quick" in command("learned_attention", quick=True, resume=False)
    assert command("bench", quick=True, resume=False) is None
