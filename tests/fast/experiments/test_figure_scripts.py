"""Tests of the figure scripts' logic (not their training): Table 2 configs and
summaries, the Figure 2 summaries, make_figures' command lines, and that every
plot draws from plain data into a file."""

import dataclasses
import json
import sys

import numpy as np
import pytest
import torch

from fast.backends import auto
from fast.commands import fig2 as fig2_command
from fast.commands import figures as make_figures
from fast.commands import memory as memory_command
from fast.commands import table2 as table2_command
from fast.commands.figures import STEPS, command
from fast.commands.registry import COMMANDS
from fast.experiments import learned_attention as LA
from fast.experiments import memory_report
from fast.experiments import table2 as T2
from fast.experiments.table2 import run_configs, timing_configs
from fast.measure.attention_stats import pixel_position, split_start
from fast.plots import attention as plot_attention
from fast.plots import memory as plot_memory
from fast.plots import style
from fast.plots import table2 as plot_table2
from fast.transformer.network.model import SparseTransformer
from reference import patterns


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


@pytest.mark.parametrize("modality", ["text", "image"])
@pytest.mark.parametrize("pattern", ["fixed", "strided"])
def test_table2_runs_do_not_follow_autos_measured_record(modality, pattern, monkeypatch):
    """A Table 2 model computes the same logits, bit for bit, whatever auto's crossover
    record says (``make bench`` rewrites it): the runs name their backend."""
    model_cfg, _ = run_configs(modality, pattern, quick=True)
    torch.manual_seed(0)
    model = SparseTransformer(model_cfg)
    x = torch.randint(0, model_cfg.vocab_size, (2, model_cfg.n_ctx - 1))
    with torch.no_grad():
        logits = {prefer: None for prefer in (False, True)}
        for prefer in logits:
            monkeypatch.setattr(auto, "prefer_naive", lambda *a, p=prefer, **k: p)
            logits[prefer] = model(x)
    assert torch.equal(logits[False], logits[True])


def test_seeds_differ_only_in_the_seed():
    m0, t0 = run_configs("image", "strided", quick=False, seed=0)
    m1, t1 = run_configs("image", "strided", quick=False, seed=1)
    assert m0 == m1 and t1.seed == 1 and t0.cpu_threads == t1.cpu_threads == 1
    tdiff = {f.name for f in dataclasses.fields(t0) if getattr(t0, f.name) != getattr(t1, f.name)}
    assert tdiff == {"seed", "out_dir"}


def test_timing_configs_are_the_paper_lengths():
    for modality, n, stride in (("image", 3072, 96), ("text", 12288, 128)):
        m, t = timing_configs(modality, "fixed", quick=False)
        assert m.n_ctx == n and m.stride == stride and t.batch_size == 1 and m.c == 32
        base, _ = run_configs(modality, "fixed", quick=False)
        same = ("d_model", "n_heads", "n_layers", "combine", "embedding", "pattern")
        assert all(getattr(m, f) == getattr(base, f) for f in same)   # the Table 2 architecture
        data = T2.random_bytes(m)
        data.check_length(m.n_ctx)                                     # shaped for the model


def test_table2_summary_is_mean_and_std_over_seeds():
    runs = {"text/full": {str(s): {"val_bits": 2.0 + s, "test_bits": 1.0 + s,
                                   "time_per_iter": 0.5} for s in range(3)}}
    cell = T2.summarise(runs)["text/full"]
    assert cell["seeds"] == 3 and cell["test_bits"] == 2.0 and cell["test_bits_std"] == 1.0
    assert cell["time_per_iter_std"] == 0.0


def test_split_start_shifts_by_the_start_token():
    w = np.array([[0.5, 0.25, 0.25, 0.0]])
    pix, start = split_start(w)
    assert np.allclose(pix, [[0.25, 0.25, 0.0, 0.0]]) and np.allclose(start, [0.5])


def _one_key(offset):
    """maps (L=1, B=2, H=1, n, n): position p reads key position p - offset (else key 0)."""
    h, w, _ = LA.SHAPE
    n = h * w
    maps = np.zeros((1, 2, 1, n, n))
    for p in range(n):
        maps[0, :, 0, p, p - offset if p >= offset else 0] = 1.0
    return maps


def test_summary_sees_local_and_column_attention_and_the_patterns_hold():
    _, w, _ = LA.SHAPE
    # position p predicts pixel p; pixel p - w (just above) is key position p - w + 1
    s = LA.summarise(_one_key(w - 1))
    local, col = s["regions"].index("local"), s["regions"].index("column")
    # the pixel just above is inside the local window, so 'local' takes it
    assert np.isclose(s["shares"][0][0][local], 1.0)
    assert np.isclose(s["in_strided"][0][0], 1.0)          # the band holds the last l positions
    assert s["labels"] == [["local"]]
    assert np.isclose(s["data_dependence"][0][0], 0.0)     # the same for both images
    # three rows up: the column, outside the window (WINDOW = 2)
    s2 = LA.summarise(_one_key(3 * w - 1))
    assert np.isclose(s2["shares"][0][0][col], 1.0)
    assert s2["labels"] == [["column"]]
    # with the start token in front, the strided column part holds pixels i - 1 - k l (the left
    # neighbour's column), so a head that reads straight up is outside the strided pattern
    assert np.isclose(s2["in_strided"][0][0], 0.0)
    assert np.isclose(s["uniform"]["image_entropy"], 1.0)
    rows = LA.beats_uniform(s2)
    assert rows[0]["rowcol_x"] > 5 and rows[0]["labels"] == ["column"]


def test_share_inside_a_pattern_leaves_the_start_token_out():
    # half of every row on the start token, half on the pixel just above: all of the pixel
    # mass lies inside the strided band, but only about half of all the mass does
    _, w, _ = LA.SHAPE
    maps = 0.5 * _one_key(w - 1)
    maps[..., 0] += 0.5
    s = LA.summarise(maps)
    assert np.isclose(s["share_in_strided"][0][0], 1.0)
    assert s["in_strided"][0][0] < 0.6
    # uniform attention puts 1 / (i + 1) on each of keys 0..i; its share: the mean mass on
    # pixels inside the pattern over the mean mass on pixels (as the region shares)
    q = LA.query_positions()
    inside = np.logical_or(*LA.pattern_masks("strided", w * w))[q][:, 1:] & (
        np.arange(1, w * w) <= q[:, None])
    assert np.isclose(s["uniform"]["share_in_strided"],
                      np.sum(inside.sum(-1) / (q + 1)) / np.sum(q / (q + 1)))


def test_summary_of_a_sparse_model_splits_the_pattern_in_parts():
    n = 256
    a1, a2 = LA.pattern_masks("strided", n)
    assert not (a1 & a2).any()
    assert np.array_equal(a1 | a2, patterns.union(*patterns.strided(n, LA.STRIDE)))
    s = LA.summarise(_one_key(LA.STRIDE), pattern="strided")   # key p - 16: the column part
    assert np.allclose(s["part_mass"][0][0], [0.0, 1.0])
    # the start token (key 0) is counted once, as "start", never inside a part
    assert len(s["uniform"]["part_mass"]) == 2
    assert np.isclose(s["uniform"]["start"] + sum(s["uniform"]["part_mass"]), 1)
    assert s["labels"] == [["local"]]       # pixel p - 17: one row up, one column left


def test_fixed_heads_are_measured_against_their_own_summary_blocks():
    """Head h of a merged fixed layer reads the summary sub-block of rank h
    (reference.heads); uniform attention inside each head's own pattern puts all its
    mass on that head's two parts, and the parts match reference.patterns.head_masks."""
    n, heads = 256, 4
    own = patterns.head_masks("fixed", n, heads, "merged", stride=LA.STRIDE, c=LA.SUMMARY)
    maps = np.zeros((1, 2, heads, n, n))                         # two images, the same maps
    for h in range(heads):
        parts = LA.pattern_masks("fixed", n, h)
        assert np.array_equal(parts[0] | parts[1], own[h])
        maps[0, :, h] = own[h] / own[h].sum(1, keepdims=True)
    assert not np.array_equal(own[0], own[1])                    # the summaries differ
    s = LA.summarise(maps, pattern="fixed")
    # every head: the start token and both parts hold all its mass, each key counted once
    total = np.asarray(s["start"]) + np.sum(s["part_mass"], -1)
    print("start + parts per head:", total.round(4).tolist())
    assert np.allclose(total, 1.0)
    assert np.allclose(s["part_mass"][0], [s["uniform"]["part_mass"]] * heads, atol=0.02)


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_the_start_token_is_in_no_part_so_start_and_parts_sum_to_one(pattern):
    """Key 0 (the start token) lies inside the strided band and column, and inside the
    summary sub-block of fixed head 3 (rank 3 of l / c = 4 reads positions 0..3 of each
    block); counted there and as "start" too, the shares summed to more than 1. Weights
    all on key 0 wherever a head may read it: all "start", no part."""
    n, heads = 256, 4
    readable = LA.readable_masks(pattern, n, heads)                  # (H, n, n)
    maps = np.zeros((1, 2, heads, n, n))                             # two images, the same
    for h in range(heads):
        w = readable[h] / readable[h].sum(1, keepdims=True)          # uniform in the pattern
        on_start = readable[h][:, 0]
        w[on_start] = 0.0
        w[on_start, 0] = 1.0                                         # all on the start token
        maps[0, :, h] = w
    s = LA.summarise(maps, pattern=pattern)
    start, parts = np.asarray(s["start"]), np.asarray(s["part_mass"])
    total = start + parts.sum(-1)
    print(pattern, "start", start.round(3).tolist(), "start + parts", total.round(4).tolist())
    assert np.allclose(total, 1.0)
    assert (start > 0).any()                                         # key 0 is read somewhere
    for h in range(heads):
        a1, a2 = LA.part_masks(pattern, n, h)
        assert not a1[:, 0].any() and not a2[:, 0].any()
        assert np.array_equal(a1 | a2 | (readable[h] & (np.arange(n) == 0)), readable[h])
    assert np.isclose(s["uniform"]["start"] + sum(s["uniform"]["part_mass"]), 1.0)


def test_fixed_heads_read_their_own_masks_in_the_figure():
    """Each fixed head reads its own summary sub-block, so the figure's grey (outside the
    pattern) is per head: one mask for every head drew head 0's for all four."""
    n, heads = 256, 4
    readable = LA.readable_masks("fixed", n, heads)
    for h in range(heads):
        assert np.array_equal(readable[h], patterns.union(*LA.pattern_masks("fixed", n, h)))
    query = pixel_position(*LA.QUERY_PIXELS[0], LA.SHAPE)
    assert len({readable[h, query].tobytes() for h in range(heads)}) == heads


def test_make_figures_commands():
    assert set(STEPS) >= {"bench", "memory", "experiments", "learned_attention"}
    fresh = command("memory", quick=False, resume=False)
    assert fresh == [sys.executable, "-m", "fast", "memory", "--force"]
    assert command("experiments", quick=False, resume=False)[3] == "table2"
    assert command("learned_attention", quick=False, resume=False)[3] == "fig2"
    assert command("bench", quick=False, resume=False) == [sys.executable, "-m", "fast", "bench"]
    assert all(fast_command.split()[0] in COMMANDS for fast_command, _, _, _ in STEPS.values())
    # the long Fig. 2 run is redrawn from its kept weights: make figures never retrains it
    assert command("learned_attention_long", quick=False, resume=False)[3:] == ["fig2", "--long"]
    # ... and so are the models of Fig. 2 against depth
    assert command("learned_attention_depth", quick=False, resume=False)[3:] == ["fig2",
                                                                                "--depth"]
    # Table 3 reads Table 2's kept text models, and is recomputed from scratch
    assert command("table3", quick=False, resume=False)[3:] == ["table3", "--force"]
    assert "--force" not in command("experiments", quick=False, resume=True)
    assert "--quick" in command("learned_attention", quick=True, resume=False)
    assert command("bench", quick=True, resume=False) is None
    # the samples are drawn from Table 2's kept models, after Table 2; decoding speed last
    order = list(STEPS)
    assert order.index("experiments") < order.index("learned_attention") < order.index("samples")
    assert order.index("experiments") < order.index("table3")
    assert command("samples", quick=False, resume=True)[3:] == ["samples"]
    assert command("samples", quick=True, resume=False) is None      # no quick version
    assert command("generate", quick=True, resume=False)[3:] == ["generate", "--quick"]
    assert command("generate", quick=False, resume=False)[3:] == ["generate"]   # no --force
    # the whole of make figures (these steps and about 3 min of notebooks) under 45 minutes
    assert sum(minutes for _, _, minutes, _ in STEPS.values()) + 3 < 45


def test_make_figures_refuses_an_unknown_step_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        make_figures.main(["--only", "bench,tabel2"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'tabel2'" in err[0] and "experiments" in err[0]


def test_style_names_colours_and_save(tmp_path):
    assert style.display_name("full") == "dense" and style.display_name("strided") == "strided"
    assert style.color("full") == style.color("dense")
    assert len({style.color(p) for p in style.PATTERN_ORDER}) == len(style.PATTERN_ORDER)
    fig, ax = style.plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = style.save(fig, tmp_path / "sub" / "line.png")
    assert path.stat().st_size > 1000
    assert not style.plt.fignum_exists(fig.number)          # saved and closed


@pytest.mark.slow
def test_fig2_figures_draw_from_plain_data(tmp_path):
    h, w, c = LA.SHAPE
    n = h * w * c
    maps = np.tril(np.ones((1, 2, 2, n, n)))       # uniform causal attention (L, B, H, n, n)
    maps /= maps.sum(-1, keepdims=True)
    result = {"query_pixels": [list(p) for p in LA.QUERY_PIXELS], "models": {}}
    drawn, readable = {}, {}
    for pattern in ("full", "strided", "fixed"):
        mask = None if pattern == "full" else LA.readable_masks(pattern, n, 2)   # (H, n, n)
        m = maps if mask is None else np.where(mask[None, None], maps, 0)
        m = m / m.sum(-1, keepdims=True)
        s = LA.summarise(m, pattern)
        s["layers"] = LA.beats_uniform(s)
        result["models"][pattern] = s
        drawn[pattern] = m[:, 0]
        if mask is not None:
            readable[pattern] = mask
    image = np.arange(n, dtype=np.uint8)
    paths = plot_attention.make_all(drawn, image, result, LA.SHAPE, tmp_path, readable)
    assert [p.name for p in paths] == ["fig2_learned_attention.png", "fig2_layers.png",
                                       "attention_mass.png", "fig2_strided.png", "fig2_fixed.png",
                                       "attention_parts.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert pixel_position(1, 2, LA.SHAPE) == (1 * w + 2) * c
    with pytest.raises(ValueError, match="pixel"):
        pixel_position(h, 0, LA.SHAPE)


def test_table2_figures_draw_from_plain_data(tmp_path):
    runs = {}
    evals = [{"step": 2, "val": 4.0}, {"step": 4, "val": 3.5}]
    for m in ("text", "image"):
        for k, p in enumerate(style.PATTERN_ORDER):
            runs[f"{m}/{p}"] = {str(s): {"test_bits": 3 + 0.1 * k + 0.01 * s, "val_bits": 3.5,
                                         "time_per_iter": 0.5 + 0.1 * k, "steps": 4,
                                         "model_cfg": {"n_ctx": 256},
                                         "evals": evals}
                                for s in range(3)}
    data = {"runs": runs, "summary": T2.summarise(runs), "paper": T2.PAPER,
            "timing": [{"modality": m, "pattern": p, "n": 64, "time_per_iter": 1.0}
                       for m in ("text", "image") for p in style.PATTERN_ORDER]}
    paths = plot_table2.make_all(data, tmp_path)
    assert [p.name for p in paths] == ["table2_bits.png", "table2_curves.png", "table2_timing.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


@pytest.mark.slow
def test_fig2_long_run_is_kept_and_redrawn_from_its_weights(tmp_path, monkeypatch, capsys):
    """``fig2 --long`` keeps its weights in models/, records the machine, draws only the
    dense model's figures with a _long suffix, and a second call redraws from the kept
    weights instead of training again (what ``make figures`` does)."""
    monkeypatch.setattr(LA, "QUICK", tmp_path)
    weights, summary, models, figdir = LA.paths(quick=True, long=True)
    assert weights == tmp_path / "models" / "fig2_dense_long.pt"
    assert LA.paths(quick=False, long=True)[0].name == "fig2_dense_long.pt"
    assert fig2_command.main(["--long", "--quick", "--threads", "1"]) == 0
    record = json.loads(summary.read_text())
    assert weights.exists() and record["train"]["threads"] == 1
    assert record["train"]["machine"]["cpu_count"] >= 1
    assert set(record["models"]) == {"full"}                 # the sparse models are not redrawn
    assert sorted(p.name for p in figdir.iterdir()) == [
        "attention_mass_long.png", "fig2_layers_long.png", "fig2_learned_attention_long.png"]
    capsys.readouterr()
    stamp = weights.stat().st_mtime_ns
    assert fig2_command.main(["--long", "--quick"]) == 0
    assert "using cached" in capsys.readouterr().out and weights.stat().st_mtime_ns == stamp


def test_fig2_depth_models_are_kept_measured_and_redrawn(tmp_path, monkeypatch, capsys):
    """``fig2 --depth``: one dense model per depth, trained in children with the kernels
    pinned, kept in models/; every layer of each gets its row and column lifts and every
    head a label; a second call redraws from the kept weights without training."""
    monkeypatch.setattr(LA, "QUICK", tmp_path)
    assert fig2_command.main(["--depth", "--quick", "--jobs", "2"]) == 0
    data = json.loads((tmp_path / "learned_attention_depth.json").read_text())
    assert sorted(data["models"]) == sorted(map(str, LA.QUICK_DEPTHS)) == sorted(data["train"])
    for depth in LA.QUICK_DEPTHS:
        s, train = data["models"][str(depth)], data["train"][str(depth)]
        assert train["model_cfg"]["n_layers"] == depth and train["threads"] == 1
        assert train["model_cfg"]["d_model"] == LA.DEPTH_WIDTH
        assert train["kernels"]["aten_cpu_capability"] != "AVX512"     # pinned to AVX2
        assert len(s["layers"]) == len(s["labels"]) == depth
        assert all({"row_x", "column_x", "rowcol_heads"} <= set(r) for r in s["layers"])
        assert (tmp_path / "models" / f"fig2_dense_depth{depth}.pt").exists()
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figures == ["fig2_depth.png"] + [f"fig2_learned_attention_depth{d}.png"
                                            for d in LA.QUICK_DEPTHS]
    capsys.readouterr()
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "models").iterdir()}
    assert fig2_command.main(["--depth", "--quick"]) == 0
    assert "training" not in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "models").iterdir()} == stamps
    with pytest.raises(SystemExit):
        fig2_command.main(["--depth", "--long"])


def test_row_and_column_lifts_are_measured_against_uniform():
    """A head that reads the pixel three rows up (the column, outside the local window)
    has a column lift far above 1 and is listed as a row/column head; a local head not."""
    s = LA.summarise(_one_key(3 * LA.SHAPE[1] - 1))
    row = LA.beats_uniform(s)[0]
    assert row["column_x"] > 5 and row["row_x"] == 0 and row["rowcol_heads"] == [0]
    local = LA.beats_uniform(LA.summarise(_one_key(LA.SHAPE[1] - 1)))[0]
    assert local["rowcol_heads"] == [] and local["local_x"] > 5
    deep = np.concatenate([_one_key(3 * LA.SHAPE[1] - 1)] * 5)          # 5 layers
    chunked = LA.summarise_layers(deep, chunk=2)
    whole = LA.summarise(deep)
    assert chunked["labels"] == whole["labels"] and np.allclose(chunked["shares"],
                                                                whole["shares"])


def test_a_layers_verdict_leaves_out_its_start_sinks():
    """A start sink (most of its mass on the start token) whose small pixel remainder sits on
    the pixel above the query would make its layer look local and concentrated; the layer's
    statistics come from its other head, uniform attention, and name the sink apart."""
    _, w, _ = LA.SHAPE
    sink = 0.3 * _one_key(w - 1)                     # 0.3 on the pixel above ...
    sink[..., 0] += 0.7                              # ... and 0.7 on the start token
    n = sink.shape[-1]
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    maps = np.concatenate([sink, np.broadcast_to(uniform, sink.shape)], axis=2)   # H = 2
    s = LA.summarise(maps)
    assert s["labels"] == [["start sink", "global"]]
    row = LA.beats_uniform(s)[0]
    assert row["sink_heads"] == [0] and row["heads"] == [1]
    assert np.isclose(row["local_x"], 1.0) and np.isclose(row["min_entropy"], 1.0)
    assert row["local_head"] == row["entropy_head"] == 1
    assert np.isclose(row["max_start"], 0.7)          # the start mass is every head's


def test_table2_profile_and_output_init_options(capsys):
    """``table2 --profile`` measures and trains nothing, so it refuses training options in
    one line; ``--output-init`` takes the config's two values only."""
    with pytest.raises(SystemExit) as end:
        table2_command.main(["--profile", "--drift"])
    assert end.value.code == 2 and "--profile with --drift" in capsys.readouterr().err
    with pytest.raises(SystemExit) as end:
        table2_command.main(["--output-init", "zeros"])
    assert end.value.code == 2 and "'zeros'" in capsys.readouterr().err
    m, _ = run_configs("text", "full", quick=False, output_init="zero")
    assert m.output_init == "zero" and run_configs("text", "full", quick=False)[0].output_init \
        == "normal"


def test_table2_every_output_follows_out(tmp_path, monkeypatch):
    """``table2 --out X.json``: the kept weights go to models/ beside X and the PNGs beside
    X, never into figures/ (whose models table3 and samples read). Training, data and
    plots are replaced by stand-ins recording where they were told to write."""
    specs, drawn = [], []

    def fake_child(target, spec, env=None):
        specs.append(spec)
        return {"result": {"val_bits": 3.0, "test_bits": 3.0, "time_per_iter": 0.1,
                           "unit": "bits", "wall_s": 1.0}}

    class FakeData:
        def fingerprint(self):
            return {}

    monkeypatch.setattr(T2, "run_child", fake_child)
    monkeypatch.setattr(T2, "dataset", lambda modality: FakeData())
    monkeypatch.setattr(plot_table2, "make_all",
                        lambda data, figdir, gpu=None: drawn.append(figdir) or [])
    out = tmp_path / "elsewhere" / "t2.json"
    T2.run(only=["text/full"], seeds=1, jobs=1, out=out)
    assert [s["keep"] for s in specs] == [str(out.parent / "models" / "text_full.pt")]
    assert drawn == [out.parent] and out.exists()
    assert T2.out_paths(False)[1] == T2.DATA / "models"       # no --out: the kept models
    monkeypatch.setattr(T2, "run_child", lambda target, spec, env=None: {"result": {
        "phases": {"forward": 0.1}, "kernels": {"host_avx512": False}}})
    monkeypatch.setattr(T2, "cell_keys", lambda: ["text/full"])
    T2.profile(out=tmp_path / "profile.json")                  # --profile --out
    assert (tmp_path / "profile.json").exists()


def test_memory_figures_follow_out(tmp_path, monkeypatch):
    """``memory --out X.json --steps figures`` draws beside X, never into figures/ (the
    drawing is replaced by a stand-in recording its folder)."""
    drawn = []
    monkeypatch.setattr(plot_memory, "make_all", lambda data, figdir: drawn.append(figdir) or [])
    out = tmp_path / "elsewhere" / "mem.json"
    assert memory_command.main(["--out", str(out), "--steps", "figures"]) == 0
    assert drawn == [out.parent] and out.exists()
    assert memory_report.out_paths(False) == (memory_report.CACHE, memory_report.FIGURES)


def test_memory_without_out_draws_into_figures_not_beside_its_json(monkeypatch):
    """Plain ``memory`` writes figures/data/memory.json and draws into figures/: the command
    hands ``run`` no --out of its own making (which would put the PNGs beside the JSON)."""
    calls = []
    monkeypatch.setattr(memory_report, "run", lambda **kw: calls.append(kw) or {})
    assert memory_command.main(["--steps", "figures"]) == 0
    assert calls == [{"steps": ["figures"], "quick": False, "force": False, "out": None}]


def test_memory_big_is_kept_unless_forced(tmp_path, monkeypatch):
    """``memory --big`` measures the 128-layer step into its own JSON, stamped with the
    code, and keeps that record on the next call (make figures' call) unless --force."""
    measured = []
    monkeypatch.setattr(memory_report, "step_big",
                        lambda quick: measured.append(quick) or {"layers": 2, "n": 8})
    out = tmp_path / "big.json"
    assert memory_command.main(["--big", "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert first["big"]["layers"] == 2 and "sources_sha256" in first["code"]
    assert memory_command.main(["--big", "--out", str(out)]) == 0 and len(measured) == 1
    assert memory_command.main(["--big", "--force", "--out", str(out)]) == 0
    assert len(measured) == 2
