"""The generation benchmark, the sample figures and the sample statistics.

Child et al., 2019, section 7 (samples, completions of held-out images) and
section 4.3 (what a step of a factorized head reads). Timings are not tested
(they are measured by ``python -m fast generate``); what is tested is the
arithmetic the benchmark rests on, that its quick run writes complete JSON and
a figure, and that the sample figures and statistics say what they claim.
"""

from __future__ import annotations

import json
import math

import matplotlib.image
import numpy as np
import pytest
import torch

from fast.commands import generate as generate_command
from fast.experiments import generation as experiment
from fast.experiments import samples as drawing
from fast.measure import generation as gen
from fast.measure import samples as stats
from fast.plots import samples as plot_samples
from fast.transformer.config import ModelConfig
from fast.transformer.network.checkpoint import save_weights
from fast.transformer.network.model import SparseTransformer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rerun_total_sums_the_interpolated_steps():
    ts, seconds = [1, 11, 101], [0.5, 1.5, 10.5]          # step time 0.4 + 0.1 t
    assert gen.rerun_total(ts, seconds, 101) == pytest.approx(sum(0.4 + 0.1 * t
                                                                  for t in range(1, 102)))
    with pytest.raises(ValueError, match="must span"):
        gen.rerun_total([2, 50], [1.0, 2.0], 50)


def test_window_rate_takes_the_median_step():
    ends, rates = gen.window_rate([0.1, 0.1, 5.0, 0.2, 0.2, 0.2, 0.3], window=3)
    assert ends == [3, 6] and rates == pytest.approx([10.0, 5.0])


def test_decode_timeline_keeps_the_fastest_repetition(monkeypatch):
    """Whole samples are repeated like the re-run steps, and the fastest one counts."""
    totals = iter([3.0, 2.0, 4.0])
    monkeypatch.setattr(gen, "_timeline", lambda *a: {"total_s": next(totals), "seconds": []})
    out = gen.decode_timeline(None, "sparse", repeats=3)
    assert out["total_s"] == 2.0 and out["totals_s"] == [3.0, 2.0, 4.0]
    plans = [plan for _, plan in experiment.model_configs(quick=False).values()]
    assert [plan["repeats"] for plan in plans] == [3, 1]       # photos32, enwik8


def test_engine_steps_alternate_the_engines():
    cfg = ModelConfig(vocab_size=16, n_ctx=40, d_model=16, n_heads=2, n_layers=1,
                      pattern="fixed", stride=8, c=2)
    model = SparseTransformer(cfg).eval()
    out = gen.engine_steps(model, "sparse", 10, 12, rounds=3)
    assert set(out) == {"numba", "torch"} and all(len(s) == 12 for s in out.values())
    assert gen.keys_read(cfg, 9) == 4      # own block 8, 9 and two summaries of block 0


def test_median_run_keeps_the_middle_speedup_and_lists_every_run():
    def record(sparse, rerun):
        return {"sparse": {"total_s": sparse, "total_cpu_s": sparse},
                "rerun": {"total_s_estimated": rerun, "total_cpu_s_estimated": 2 * rerun}}
    runs = [record(2.0, 140.0), record(3.0, 120.0), record(2.5, 150.0)]   # 70x, 40x, 60x
    middle = experiment.median_run(runs)
    assert experiment.speedup(middle) == (60.0, 120.0)
    assert [r["speedup"] for r in middle["runs"]] == [70.0, 40.0, 60.0]   # in run order
    assert experiment.median_run(runs[:2])["sparse"]["total_s"] == 3.0  # the lower middle


def test_a_quick_run_claims_no_goal():
    """--quick records "met" as None and prints n/a whatever it measured; a real run says
    met or NOT MET by the goal (synthetic records, every goal missed)."""
    models = {"photos32": {"n": 3072, "rerun": {"total_s_estimated": 2.0,
                                                "total_cpu_s_estimated": 2.0},
                           "sparse": {"total_s": 1.0, "total_cpu_s": 1.0}},
              "enwik8": {"n": 12288, "sparse": {"total_s": 900.0, "tokens_per_s": [1.0]},
                         "dense": {"tokens_per_s": [1.0]}}}
    assert [t["met"] for t in experiment.targets(models, quick=False)] == [False] * 3
    quick = experiment.targets(models, quick=True)
    assert [t["met"] for t in quick] == [None] * 3
    assert [generate_command.verdict(t["met"]) for t in quick] == ["n/a (--quick)"] * 3
    assert generate_command.verdict(False) == "NOT MET" and generate_command.verdict(True) \
        == "met"


def test_pattern_costs_of_a_fixed_model():
    cfg = ModelConfig(vocab_size=16, n_ctx=100, d_model=16, n_heads=2, n_layers=2,
                      pattern="fixed", stride=10, c=5)
    cost = gen.pattern_costs(cfg)
    # t = 99: the own block (10 keys), the summaries of 9 earlier blocks (45)
    assert cost["keys_read"] == 55 and cost["dense_keys"] == 100
    per_row = 2 * (8 + 8) * 4                               # heads x (dk + dv) x float32
    assert cost["dense_bytes"] == 2 * 100 * per_row         # two layers
    assert cost["sparse_bytes"] == 2 * (10 * 5 + 10) * per_row


@pytest.mark.slow
def test_quick_benchmark_writes_json_and_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "QUICK", tmp_path)
    assert generate_command.main(["--quick"]) == 0
    data = json.loads((tmp_path / "generation.json").read_text())
    assert (tmp_path / "figures" / "generation.png").is_file()
    assert set(data["models"]) == {"photos32", "enwik8"} and data["quick"]
    for m in data["models"].values():
        for kind in ("sparse", "dense", "rerun"):
            assert len(m[kind]["t"]) == len(m[kind]["tokens_per_s"]) > 0
            assert all(r > 0 and math.isfinite(r) for r in m[kind]["tokens_per_s"])
        assert m["rerun"]["total_s_estimated"] > 0 and m["sparse"]["total_s"] > 0
        assert m["sparse"]["total_s"] == min(m["sparse"]["totals_s"])
        assert m["cache_bytes"]["sparse"][-1] <= m["cache_bytes"]["dense"][-1]
        assert m["sparse"]["engine"] == m["dense"]["engine"] == "numba"    # float32, CPU
        assert sum(m["sparse"]["steps"].values()) == m["n"] - 1 and m["sparse"]["steps"]["numba"]
        assert set(m["warm_up_s"]) == {"sparse", "dense"}
    assert data["machine"]["first_step_s"] > 0
    photos = data["models"]["photos32"]                     # and once on the PyTorch step
    assert photos["sparse_torch"]["engine"] == "torch" and photos["sparse_torch"]["total_s"] > 0
    assert "sparse_torch" not in data["models"]["enwik8"]
    engines = data["models"]["enwik8"]["engines"]           # the crossover, each engine alone
    assert len(engines["t"]) == len(engines["keys_per_head"]) == len(engines["numba"]) \
        == len(engines["torch"]) == 5 and "engines" not in photos
    assert all(r > 0 for r in engines["numba"] + engines["torch"])
    assert engines["keys_per_head"] == sorted(engines["keys_per_head"])  # fixed: grows with t
    enwik = data["models"]["enwik8"]                        # fixed: the sparse cache is smaller
    assert enwik["cache_bytes"]["sparse"][-1] < enwik["cache_bytes"]["dense"][-1] / 2
    assert [t["goal"] for t in data["targets"]] == [">= 50x", "minutes", ">= 2x"]
    assert len(data["targets"][0]["runs"]) == 1                          # --quick: one run


# ----------------------------------------------------------------------------
# The sample figures.
# ----------------------------------------------------------------------------

@pytest.fixture
def kept(tmp_path):
    """Two kept image models (random weights) and one text model, as table2 keeps them (the
    text model of table2's context, 512 bytes)."""
    for i, pattern in enumerate(("full", "strided")):
        torch.manual_seed(i)
        model = SparseTransformer(ModelConfig(
            vocab_size=256, n_ctx=256, d_model=16, n_heads=2, n_layers=1, pattern=pattern,
            stride=16, embedding="image", image_shape=(16, 16, 1)))
        save_weights(tmp_path / f"image_{pattern}.pt", model)
    text = SparseTransformer(ModelConfig(vocab_size=256, n_ctx=512, d_model=16, n_heads=2,
                                         n_layers=1, pattern="fixed", stride=8, c=2))
    save_weights(tmp_path / "text_fixed.pt", text)
    return tmp_path


@pytest.mark.slow
def test_kept_models_and_sample_figures(kept, tmp_path):
    assert list(drawing.kept_models("image", kept)) == ["full", "strided"]
    assert drawing.missing("image", kept) == ["fixed"]
    assert drawing.missing("text", kept) == ["full", "strided"]
    with pytest.raises(FileNotFoundError, match="no kept image models in .*python -m fast table2"):
        drawing.kept_models("image", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="modality must be"):
        drawing.kept_models("audio", kept)
    figdir = tmp_path / "figs"
    paths = drawing.make_figures(figdir, folder=kept)
    assert [p.name for p in paths] == ["samples_images.png", "samples_completions.png"]
    grid = matplotlib.image.imread(paths[1])
    assert grid.shape[0] > 250 and grid.shape[1] > 600            # big enough to see
    texts = drawing.draw_text(drawing.kept_models("text", kept), length=40, num=2)
    assert all(t.startswith(drawing.PROMPT.decode()) for t in texts["fixed"])


def test_text_samples_fit_each_models_context(monkeypatch):
    """By default each text sample is ``TEXT_LENGTH`` bytes, or the model's whole context
    where that is shorter; a length given is passed on as it is (``sample`` refuses one the
    context cannot hold)."""
    asked = []
    monkeypatch.setattr(drawing, "sample", lambda model, num, length, **kw: asked.append(
        length) or torch.zeros(num, length, dtype=torch.long))
    models = {p: SparseTransformer(ModelConfig(vocab_size=256, n_ctx=n, d_model=16, n_heads=2,
                                               n_layers=1, pattern="full"))
              for p, n in (("short", 64), ("long", 512))}
    drawing.draw_text(models)
    drawing.draw_text(models, length=40)
    assert asked == [64, drawing.TEXT_LENGTH, 40, 40]


def test_sample_plots_check_their_input(tmp_path):
    seqs = np.zeros((6, 16), dtype=np.int64)
    with pytest.raises(ValueError, match="do not fill rows of cols=4"):
        plot_samples.plot_samples({"x": seqs}, (4, 4, 1), 256, tmp_path / "a.png", cols=4)
    with pytest.raises(ValueError, match="at least one model"):
        plot_samples.plot_samples({}, (4, 4, 1), 256, tmp_path / "a.png")
    bad = seqs.copy()
    bad[0, 0] = 9                                                 # the prompt changed
    with pytest.raises(ValueError, match="start with the 8 given tokens"):
        plot_samples.plot_completions(seqs, {"x": bad}, 8, (4, 4, 1), 256, tmp_path / "b.png")


# ----------------------------------------------------------------------------
# The sample statistics.
# ----------------------------------------------------------------------------

def test_image_statistics():
    rng = np.random.default_rng(0)
    level = rng.integers(0, 256, size=(40, 1))
    flat = np.repeat(level, 16, axis=1)                           # 40 flat 4x4 images
    noisy = np.clip(flat + rng.integers(-30, 31, size=flat.shape), 0, 255)
    shuffled = np.concatenate([flat[:, :8], rng.permutation(flat[:, 8:])], axis=1)
    assert stats.brightness_agreement(flat[:, :], 8) == pytest.approx(1.0)
    assert abs(stats.brightness_agreement(shuffled, 8)) < 0.5
    assert stats.roughness(flat, (4, 4, 1), 8) == 0.0
    assert stats.roughness(noisy, (4, 4, 1), 8) > 10


def test_text_statistics():
    code = b"def f(x):\n    if x:\n        return x\n    return None\n"
    prof = stats.text_profile([code])
    assert prof["printable"] == 1.0 and prof["indented"] == 0.75
    assert prof["keywords_per_kb"] == pytest.approx(1000 * 5 / len(code))   # def if return x2 None
    noise = stats.unigram_bytes(np.frombuffer(code * 10, dtype=np.uint8), 200, 2)
    assert len(noise) == 2 and all(len(t) == 200 and set(t) <= set(code) for t in noise)
    assert stats.longest_shared(b"xxhello worldyy", b"zhello worlz") == len(b"hello worl")
