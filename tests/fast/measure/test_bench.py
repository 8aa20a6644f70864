"""Smoke test of the benchmark: the library (fast.measure: contenders, bench_point, bench),
the sweep (fast.experiments.bench_sweep, bench) and ``python -m fast bench``
(fast.commands.bench), at tiny n.

Child et al., 2019, Table 2: the benchmark compares sparse and dense attention.
Timings are not checked (noisy, shared machine); the structure, the slope fit,
the ratio summary, the fresh-process measurement and the figure are; and the
GPU's method (every contender in one process, first call apart, medians, the
derived speed-up / ideal / floor, the cost estimate, the time budget) run on the
CPU with a wall clock, and the CUDA figure drawn from a synthetic result.
The timing rules themselves: tests/fast/measure/test_timing.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from fast.commands import bench as bench_cli
from fast.experiments import bench as runs
from fast.experiments import bench_sweep as sweeps
from fast.kernels.variants import DEFAULT, VARIANTS
from fast.layout.costs import ideal_speedup
from fast.measure import bench, bench_point, child, contenders
from fast.measure.timing import FRESH
from fast.plots import bench as plots


def test_fitted_slope_recovers_power_law():
    ns = [1024, 2048, 4096, 8192]
    assert math.isclose(bench.fitted_slope(ns, [n ** 1.5 for n in ns]), 1.5, rel_tol=1e-9)
    assert math.isclose(bench.fitted_slope(ns, [3e-9 * n ** 2 for n in ns]), 2.0, rel_tol=1e-9)
    assert bench.fitted_slope([1024], [1.0]) is None


def test_summarize_reads_ratios():
    rows = [{"contender": "dense", "pattern": None, "n": 16384, "dtype": "float32",
             "fwd_s": 1.2, "fb_s": 4.0},
            {"contender": "structured", "pattern": "strided", "n": 16384, "dtype": "float32",
             "fwd_s": 0.1, "fb_s": 0.5, "peak_fb_bytes": 7}]
    t = bench.summarize(rows)
    assert math.isclose(t["strided_fwd_speedup_16384"], 12.0)
    assert math.isclose(t["strided_fb_speedup_16384"], 8.0)
    assert t["fixed_fwd_speedup_16384"] is None


def in_this_process(monkeypatch) -> list:
    """Run what the fresh-process method sends to ``fast.measure.child`` in this process
    instead (its spec through JSON, as a child receives it); returns the calls made.
    ``test_one_point_in_a_fresh_process`` runs a real child."""
    calls = []

    def run_child(function, spec, timeout=None, env=None):
        calls.append((function, spec))
        return {"result": child.call(function, json.loads(json.dumps(spec)))}
    monkeypatch.setattr(bench_point, "run_child", run_child)
    return calls


@pytest.mark.slow
def test_quick_run_writes_json_and_figure(tmp_path, monkeypatch):
    """The CPU sweep's fresh-process method (the child replaced by an in-process call of
    the same function): every point, flex skipped away from its n, the minimum of the
    repetitions, the backward / forward ratio, the JSON and the figure."""
    calls = in_this_process(monkeypatch)
    assert bench_cli.main(["--n-min", "128", "--n-max", "256", "--target", "0.01",
                           "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "data" / "bench_cpu.json").read_text())
    assert data["machine"]["torch"] and data["config"]["ns"] == [128, 256]
    got = {(r["contender"], r["pattern"], r["n"]) for r in data["results"]}
    for n in (128, 256):
        assert ("dense", None, n) in got
        for pattern in contenders.PATTERN_PARAMS:
            for name in ("naive", "flex", "structured"):
                assert (name, pattern, n) in got
    for r in data["results"]:
        if r["contender"] == "flex":
            assert "skipped" in r
        else:
            assert r["fwd_s"] > 0 and r["fb_s"] > 0 and len(r["fwd_s_all"]) >= 1
            assert r["fwd_s"] == min(r["fwd_s_all"]) and r["fb_s"] == min(r["fb_s_all"])
            assert r["bwd_over_fwd"] == (r["fb_s"] - r["fwd_s"]) / r["fwd_s"]
            assert len(r["fb_faults_all"]) == len(r["fb_cpu_s_all"]) == len(r["fb_s_all"])
    # one fresh process per measured point, the method's rules sent along
    assert len(calls) == sum("skipped" not in r for r in data["results"])
    assert all(spec["method"]["statistic"] == "min" for _, spec in calls)
    assert data["config"]["timing"]["process"] == "fresh"
    assert "same_process" not in data                   # its n (16384) is not in this sweep
    assert (tmp_path / "bench_cpu.png").stat().st_size > 10_000


def test_a_point_that_fails_in_this_process_is_recorded_not_raised(monkeypatch):
    """The same-process method records a failing point as the fresh one does (a kernel
    variant that does not compile on a GPU must not end the sweep)."""
    def broken(spec):
        raise RuntimeError("PassManager::run failed\nmore lines")
    monkeypatch.setattr(bench_point, "measure_spec", broken)
    spec = bench_point.spec("dense", None, {}, 1, 1, 8, "cpu", "float32", sweeps.SAME)
    assert bench_point.run(spec, sweeps.SAME) == {
        "skipped": "failed: RuntimeError: PassManager::run failed"}
    assert bench_point.run([spec, spec], sweeps.SAME)[1]["skipped"].startswith("failed: ")


@pytest.mark.slow
def test_one_point_in_a_fresh_process():
    spec = bench_point.spec("structured", "strided", {"stride": 128}, 1, 4, 256, "cpu",
                            "float32", FRESH.with_(target_s=0.01))
    r = bench_point.run(spec, FRESH, timeout=300)
    assert "skipped" not in r, r
    assert r["fwd_s"] > 0 and r["fb_s"] > 0 and r["peak_fwd_bytes"] is not None
    assert r["first_fwd_s"] > 0 and r["fb_faults_all"]


@pytest.mark.slow
def test_the_cpu_sweep_measures_its_target_n_again_in_one_process(tmp_path, monkeypatch):
    """At ``same_process_ns`` dense and the structured path are measured once more, all
    in ONE process (medians after warm-ups), and the targets hold both ratios."""
    calls = in_this_process(monkeypatch)
    sweep = sweeps.Sweep(ns=(128, 256), contenders=("dense", "structured"),
                         same_process_ns=(256, 4096), method=FRESH.with_(target_s=0.01))
    assert sweep.long_lived_ns == (256,)
    data = runs.run(sweep, log=lambda line: None)
    once = data["same_process"]
    assert [(r["contender"], r["pattern"], r["n"]) for r in once] == [
        ("dense", None, 256), ("structured", "strided", 256), ("structured", "fixed", 256)]
    assert calls[-1][0] == "fast.measure.bench_point:measure_specs"     # one process, 3 points
    assert [s["method"]["process"] for s in calls[-1][1]] == ["same"] * 3
    for r in once:
        assert r["fwd_s"] == statistics.median(r["fwd_s_all"]) and len(r["fb_s_all"]) >= 3
        assert r["bwd_over_fwd"] == (r["fb_s"] - r["fwd_s"]) / r["fwd_s"]
        assert r["fwd"]["speedup"] > 0
    t = data["targets"]["float32"]
    for key in ("strided_fwd_speedup_16384", "fixed_fb_speedup_16384",
                "strided_bwd_over_fwd_16384", "dense_bwd_over_fwd_16384"):
        assert key in t and key + "_same_process" in t
    assert "strided_fb_slope_4096_65536_same_process" not in t


# ----------------------------------------------------------------------------
# The figures: contenders named by what they are, times in milliseconds
# ----------------------------------------------------------------------------

def _drawn(monkeypatch, draw, data, tmp_path):
    """Draw ``data`` with ``draw`` and return the figure it saved."""
    saved = {}

    def save(fig, path, **kw):
        saved["fig"] = fig
        return path
    monkeypatch.setattr(plots.style, "save", save)
    draw(data, tmp_path / "figure.png")
    return saved["fig"]


def _legend_texts(fig) -> set:
    return {t.get_text().split(" (slope")[0] for ax in fig.axes if ax.get_legend()
            for t in ax.get_legend().get_texts()}


def test_cpu_figure_names_contenders_and_reads_in_ms(monkeypatch, tmp_path):
    rows = [{"contender": c, "pattern": p, "n": n, "dtype": "float32", "fwd_s": t * n,
             "fb_s": 3 * t * n}
            for n in (4096, 8192) for c, p, t in (("dense", None, 1e-6), ("naive", "strided", 2e-6),
                                                  ("flex", "strided", 1e-6),
                                                  ("structured", "strided", 1e-7))]
    data = {"results": rows, "machine": {"cpu": "test CPU", "cpu_count": 2, "torch": "x"},
            "config": {"B": 1, "H": 4, "d": 64}}
    fig = _drawn(monkeypatch, plots.plot, data, tmp_path)
    names = _legend_texts(fig)
    assert {"dense causal SDPA", "SDPA + boolean mask", "FlexAttention (BlockMask)",
            "ours, structured (C window kernel)"} <= names, names
    assert not names & {"dense", "naive", "flex", "structured"}
    assert all("milliseconds" in ax.get_ylabel() for ax in fig.axes)
    ys = [y for ax in fig.axes for line in ax.get_lines() for y in line.get_ydata()]
    assert math.isclose(max(ys), 3 * 2e-6 * 8192 * 1e3)    # seconds drawn as milliseconds


# ----------------------------------------------------------------------------
# The GPU method (same process, first call apart, medians), run on the CPU
# ----------------------------------------------------------------------------

SAME = ["--same-process", "--n-min", "64", "--n-max", "128", "--target", "0", "--min-reps", "2"]


@pytest.mark.slow
def test_same_process_sweep_on_the_cpu_writes_json_and_figure(tmp_path):
    """The CUDA code path's orchestration with a wall-clock timer: every point, its
    first call apart, medians, the derived speed-up / ideal / floor, the long sweep
    (B=1, H=8, l=256: the layout build and the first call apart; the Triton kernel
    where it runs, the interpreter on the CPU), the JSON and the figure."""
    names = ["dense", "structured"]
    if contenders.why_not("triton block-sparse", "cpu", torch.float32) is None:
        names.append("triton block-sparse")
    assert bench_cli.main(SAME + ["--out", str(tmp_path), "--contenders", *names,
                                  "--long", "--long-n-min", "128", "--long-n-max", "128"]) == 0
    data = json.loads((tmp_path / "data" / "bench_cpu_same_process.json").read_text())
    assert data["machine"]["timer"] == "perf_counter"
    assert data["config"]["ns"] == [64, 128] and data["config"]["shapes"] == [[1, 4]]
    assert data["estimate"]["measurements"] == 2 * 2 * (1 + 2 * (len(names) - 1)) + 4
    assert data["calibration"]["copy"]["bytes_per_s"] > 0
    assert data["calibration"]["sdpa_backend"]["float32"] != ""
    got = {(r["contender"], r["pattern"], r["n"]) for r in data["results"]}
    assert got == {("dense", None, n) for n in (64, 128)} | {
        (c, p, n) for c in names[1:] for p in contenders.PATTERN_PARAMS for n in (64, 128)}
    for r in data["results"]:
        assert "skipped" not in r, r
        assert r["first_fwd_s"] > 0 and r["first_fb_s"] > 0
        assert len(r["fwd_s_all"]) >= 2 and len(r["fb_s_all"]) >= 2
        assert r["fwd_s"] == statistics.median(r["fwd_s_all"])
        assert r["fb_s"] == statistics.median(r["fb_s_all"])
        for what in ("fwd", "fb"):
            d = r[what]
            assert d["ideal"] == r["ideal"] > 0
            assert d["floor_s"] == max(d["floor_bytes_s"], d["floor_work_s"])
            assert math.isclose(d["x_floor"], r[what + "_s"] / d["floor_s"])
            if r["contender"] == "dense":
                assert math.isclose(d["speedup"], 1.0)
    check_long(data)
    assert (tmp_path / "bench_cpu_same_process.png").stat().st_size > 10_000


def check_long(data: dict) -> None:
    assert data["config"]["long_ns"] == [128]
    rows = {(r["contender"], r["pattern"]): r for r in data["long"]}
    assert set(rows) == {("dense", None), ("triton block-sparse", "strided"),
                         ("triton block-sparse", "fixed")}
    assert rows["dense", None]["fwd_s"] > 0
    for pattern in ("strided", "fixed"):
        r = rows["triton block-sparse", pattern]
        if contenders.why_not("triton block-sparse", "cpu", torch.float32) is not None:
            assert "do not run" in r["skipped"]
            continue
        assert (r["B"], r["H"]) == (1, 8) and r["qkvo_bytes"] == 4 * 8 * 128 * 64 * 4
        assert r["layout_s"] > 0 and r["first_fwd_s"] > 0 and r["fb_s"] > 0
        assert r["fwd"]["ideal"] == r["ideal"]


def test_only_long_skips_the_default_sweep():
    sweep = bench_cli.sweep_from(bench_cli.parse_args(["--only-long", "--same-process"]))
    assert sweep.long_ns and sweep.ns == () and sweeps.points(sweep) == []
    sweep = bench_cli.sweep_from(bench_cli.parse_args(["--device", "cuda", "--only-long"]))
    assert sweep.long_ns == sweeps.powers(2**17, 2**20) and sweeps.points(sweep) == []


@pytest.mark.slow
def test_time_budget_records_the_points_it_skips(tmp_path):
    assert bench_cli.main(SAME + ["--out", str(tmp_path), "--contenders", "dense", "structured",
                                  "--max-minutes", "1e-9"]) == 0
    data = json.loads((tmp_path / "data" / "bench_cpu_same_process.json").read_text())
    assert data["results"] and all("--max-minutes" in r["skipped"] for r in data["results"])


def test_sweep_cost_is_estimated_from_its_size():
    sweep = bench_cli.sweep_from(bench_cli.parse_args(["--device", "cuda"]))
    small = sweeps.estimate(sweep)
    assert small["measurements"] == 2 * (len(sweeps.points(sweep))) * (1 + 2 * 5)
    bigger = sweeps.estimate(dataclasses.replace(sweep, ns=sweep.ns + (131072,),
                                                 long_ns=sweeps.powers(2**17, 2**20)))
    assert bigger["estimate_s"] > small["estimate_s"]
    assert bigger["measurements"] > small["measurements"]
    assert sweep.max_minutes == 9 and sweep.dtypes == ("float16", "bfloat16")
    assert sweep.shapes == ((1, 4), (4, 16)) and sweep.ns[0] == 1024
    assert sweep.method.process == "same" and sweep.method.statistic == "median"
    assert sweep.target_points == ((1, 16, 65536),) and sweep.long_lived_ns == ()
    assert sweep.method.cap_s == sweeps.CAP_S == 60
    given = bench_cli.sweep_from(bench_cli.parse_args(["--device", "cuda", "--points",
                                                       "4x16x16384", "2x2x64", "--cap-s", "5"]))
    assert given.target_points == ((4, 16, 16384), (2, 2, 64)) and given.method.cap_s == 5


def test_floor_and_ideal_arithmetic():
    assert bench.io_bytes(1, 2, 8, 4, torch.float16, False) == 4 * 2 * 8 * 4 * 2
    assert bench.io_bytes(1, 2, 8, 4, torch.float16, True) == 12 * 2 * 8 * 4 * 2
    d = bench.derive(0.5, 10.0, 4.0, 1000, 1000.0)         # floors: 1 s (bytes), 2.5 s (tiles)
    assert (d["speedup"], d["pct_ideal"], d["floor_s"], d["floor_by"]) == (20.0, 500.0, 2.5,
                                                                           "tiles")
    assert d["x_floor"] == 0.2
    d = bench.derive(4.0, None, 4.0, 3000, 1000.0)
    assert d["speedup"] is None and d["floor_s"] == 3.0 and d["floor_by"] == "bytes"


def _synthetic_gpu_result() -> dict:
    rows, long = [], []
    for n in (1024, 4096, 16384):
        for c, p in (("dense", None), ("flex", "strided"), ("structured", "strided"),
                     ("triton block-sparse", "strided"), ("triton block-sparse", "fixed")):
            t = 1e-9 * n * n / (1 if c == "dense" else 4)
            d = bench.derive(t, 1e-9 * n * n, 8.0, 10 ** 6, 10 ** 12)
            rows.append({"contender": c, "pattern": p, "dtype": "float16", "B": 4, "H": 16,
                         "n": n, "fwd_s": t, "fb_s": 3 * t, "first_fwd_s": 1.0, "ideal": 8.0,
                         "fwd": d, "fb": d})
    for n in (131072, 262144):
        for c, p in (("dense", None), ("triton block-sparse", "strided"),
                     ("triton block-sparse", "fixed")):
            long.append({"contender": c, "pattern": p, "dtype": "float16", "B": 1, "H": 8, "n": n,
                         "fwd_s": 1e-3, "fb_s": 3e-3, "first_fwd_s": 0.5, "layout_s": 0.1,
                         "peak_fb_over_qkvo": 1.5})
    return {"machine": {"gpu": "Test GPU 80GB", "torch": "2.x", "triton": "3.x",
                        "timer": "cuda events"},
            "config": {"dtypes": ["float16"], "shapes": [[1, 4], [4, 16]], "d": 64, "block": 64,
                       "patterns": contenders.PATTERN_PARAMS},
            "calibration": {"sdpa_backend": {"float16": "flash"}}, "results": rows, "long": long}


def test_gpu_figure_from_a_synthetic_result(monkeypatch, tmp_path):
    """The CUDA figure's structure: GPU name in the title, times, speed-up with the ideal,
    and the long sweep's row."""
    data = _synthetic_gpu_result()
    fig = _drawn(monkeypatch, plots.plot_gpu, data, tmp_path)
    assert "Test GPU 80GB" in fig.texts[0].get_text() and "B=4, H=16" in fig.texts[0].get_text()
    assert len(fig.axes) == 3 * 3
    names = _legend_texts(fig)
    assert {"ours, Triton block-sparse, fwd", "ideal (tile count)",
            "FlexAttention (BlockMask), fwd+bwd", "strided, first call"} <= names, names

def test_gpu_figure_draws_each_kind_of_ideal_as_its_own_line(monkeypatch, tmp_path):
    """The Triton rows carry the tile count's ideal, the others the keys read's: each is
    its own line, labelled, never one line zigzagging between the two."""
    data = _synthetic_gpu_result()
    for r in data["results"]:
        tiles = r["contender"].startswith("triton")
        r["ideal"], r["ideal_by"] = (8.0, "tiles") if tiles else (12.0, "pairs")
    fig = _drawn(monkeypatch, plots.plot_gpu, data, tmp_path)
    ideals = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label().startswith("ideal"):
                ideals.setdefault(line.get_label(), set()).update(line.get_ydata())
    assert ideals == {"ideal (tile count)": {8.0}, "ideal (keys read)": {12.0}}, ideals


@pytest.mark.slow
def test_gpu_figure_replots_from_its_json(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bench_cuda.json").write_text(json.dumps(_synthetic_gpu_result()))
    assert bench_cli.main(["--replot", "--device", "cuda", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench_cuda.png").stat().st_size > 10_000


@pytest.mark.parametrize("content,says", [
    (b"", "(empty)"), (b'{"machine": {', "not valid JSON"), (b"\xff\xfe{}", "not UTF-8"),
    (b"[1, 2]", "a JSON list"), (b'{"machine": {}, "config": {}, "results": [{"n": 4}]}',
                                 "'contender'"),
])
def test_replot_of_a_damaged_json_is_one_line(tmp_path, capsys, content, says):
    """--replot reads its JSON through the one cache reader: a truncated, empty, non-UTF-8
    or wrongly shaped file ends in one line naming it, exit 2, and nothing is drawn."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bench_cpu.json").write_bytes(content)
    with pytest.raises(SystemExit) as end:
        bench_cli.main(["--replot", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert "bench_cpu.json" in err and not (tmp_path / "bench_cpu.png").exists()


def test_flex_block_density_counts_partial_and_full_blocks():
    """Causal at n = 256, block 128: 3 of the 4 blocks (the diagonal ones partial, one full)."""
    mask = create_block_mask(lambda b, h, q, k: k <= q, None, 2, 256, 256, device="cpu")
    assert contenders.block_density(mask) == 0.75
    mask = create_block_mask(lambda b, h, q, k: k == q, None, 1, 300, 300, device="cpu")
    assert contenders.block_density(mask) == 3 / 9


# ----------------------------------------------------------------------------
# The contenders: what runs where, decided in one place
# ----------------------------------------------------------------------------

def test_contenders_honour_names_device_and_dtype():
    fns = contenders.build("fixed", {"stride": 8, "c": 2}, 2, "cpu", torch.float32,
                           names=["structured", "naive"])
    assert list(fns) == ["naive", "structured"]                   # in the order of NAMES
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    torch.testing.assert_close(fns["naive"](q, k, v), fns["structured"](q, k, v))
    half = [x.to(torch.bfloat16) for x in (q, k, v)]
    assert all(f(*half).dtype == torch.bfloat16 for f in fns.values())
    with pytest.raises(ValueError, match="dtype torch.float64; allowed: float32, float16"):
        contenders.build("fixed", {"stride": 8, "c": 2}, 2, "cpu", torch.float64)
    with pytest.raises(ValueError, match="allowed: dense, naive"):
        contenders.build("strided", {"stride": 8}, 2, "cpu", torch.float32, names=["nave"])
    with pytest.raises(ValueError, match="device 'tpu'; allowed: cpu, cuda"):
        contenders.why_not("dense", "tpu", torch.float32)


def test_what_runs_where():
    assert contenders.default_names("cpu") == ("dense", "naive", "flex", "structured")
    assert contenders.default_names("cuda") == ("dense", "flex", "flex flash", "structured",
                                                "triton block-sparse", "triton natural order")
    assert not contenders.has_backward("flex", "cpu") and contenders.has_backward("flex", "cuda")
    assert contenders.why_not("structured", "cpu", torch.float16) is None
    why = contenders.why_not("triton block-sparse", "cpu", torch.bfloat16)
    assert why.startswith("the Triton kernels do not run here")
    # a contender that cannot run is recorded as skipped, with the reason, not dropped
    sweep = sweeps.Sweep(ns=(64,), contenders=("dense", "triton natural order"),
                         dtypes=("bfloat16",))
    assert sweeps.skip_reason(sweep, "triton natural order", "strided", "bfloat16", 4, 64) == why


def test_mask_size_limits_the_naive_contender_by_its_heads():
    sweep = sweeps.Sweep(mask_gb=1.0, naive_n_max=8192)
    assert contenders.mask_bytes("strided", 8192, 4) == 8192 ** 2 * 5
    assert contenders.mask_bytes("fixed", 8192, 4) == 4 * 8192 ** 2 * 5
    assert sweeps.skip_reason(sweep, "naive", "strided", "float32", 4, 8192) is None
    assert "GiB > --mask-gb 1.0" in sweeps.skip_reason(sweep, "naive", "fixed", "float32", 4,
                                                        8192)


def test_a_sweep_refuses_what_it_cannot_measure():
    for bad, says in [(dict(device="tpu"), "device 'tpu'; allowed: cpu, cuda"),
                      (dict(dtypes=("float64",)), "dtypes ('float64',); allowed"),
                      (dict(ns=(256, 128)), "positive n in ascending order"),
                      (dict(contenders=()), "allowed: one or more of dense"),
                      (dict(long_ns=(2**17,)), "the long sweep runs in one process only")]:
        with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
            sweeps.Sweep(**bad)


def test_powers_are_the_range_asked_for_never_rounded_outside_it():
    assert sweeps.powers(1024, 4096) == (1024, 2048, 4096) and sweeps.powers(1, 1) == (1,)
    for lo, hi, says in [(1500, 1800, "lo=1500; allowed: a power of 2"),
                         (1024, 1000, "hi=1000; allowed: a power of 2"),
                         (0, 4, "lo=0; allowed: a power of 2"),
                         (4096, 2048, "lo=4096 > hi=2048; allowed: lo <= hi")]:
        with pytest.raises(ValueError, match=says):
            sweeps.powers(lo, hi)


@pytest.mark.parametrize("argv", [["--n-min", "2048", "--n-max", "2048"],
                                  ["--n-min", "512", "--n-max", "8192"],
                                  ["--quick", "--n-min", "2048", "--n-max", "65536"],
                                  ["--variants", "--same-process", "--n-min", "64",
                                   "--n-max", "256"]])
def test_the_sweep_measures_only_n_in_the_range_asked_for(argv):
    args = bench_cli.parse_args(argv)
    ns = bench_cli.sweep_from(args).ns
    print(argv, "->", ns)
    assert ns and all(args.n_min <= n <= args.n_max for n in ns)
    assert ns[0] == args.n_min and ns[-1] == min(args.n_max, bench_cli.QUICK_N_MAX
                                                 if args.quick else args.n_max)


@pytest.mark.parametrize("argv,says", [
    (["--n-min", "1500", "--n-max", "1800"], "argument --n-min: got '1500'; allowed: an "
     "integer in [1, 16777216] that is a power of two (the nearest: 1024, 2048)"),
    (["--n-min", "1000", "--n-max", "1000"], "argument --n-min: got '1000'; allowed: an "
     "integer in [1, 16777216] that is a power of two (the nearest: 512, 1024)"),
    (["--n-min", "2048", "--n-max", "5000"], "argument --n-max: got '5000'; allowed: an "
     "integer in [1, 16777216] that is a power of two (the nearest: 4096, 8192)"),
    (["--quick", "--n-min", "3000"], "argument --n-min: got '3000'; allowed: an integer in "
     "[1, 16777216] that is a power of two"),
    (["--same-process", "--long", "--long-n-min", "100000"], "argument --long-n-min: got "
     "'100000'; allowed: an integer in [1, 16777216] that is a power of two"),
    (["--n-min", "4096", "--n-max", "2048"], "--n-min 4096 with --n-max 2048; allowed: "
     "--n-min <= --n-max"),
    (["--points", "4x16x1000"], "argument --points: got '4x16x1000'; allowed: BxHxN with B and "
     "H in [1, 4096] and N a power of two"),
    (["--points", "4x16"], "argument --points: got '4x16'; allowed: BxHxN"),
    (["--cap-s", "0"], "argument --cap-s: got '0'; allowed: a finite number in (0.0,"),
    (["--device", "cuda", "--only-long", "--points", "1x4x4096"],
     "--points with --only-long; allowed: --points with a sweep"),
])
def test_bench_refuses_an_n_range_it_would_leave(argv, says, capsys):
    """An end of the sweep that is not a power of two is refused in one line (it was
    rounded down: --n-min 1500 --n-max 1800 measured n = 1024). Parsing only: nothing
    is measured, whatever the outcome."""
    with pytest.raises(SystemExit) as end:
        bench_cli.parse_args(argv)
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("argv,says", [
    (["--long"], "--long with the CPU's fresh process per point; allowed: --long with "
                 "--same-process or --device cuda"),
    (["--only-long"], "--only-long with the CPU's fresh process per point; allowed:"),
    (["--flex-n", "5000"], "--flex-n 5000 is not an n of the sweep; allowed: n among 1024,"),
    (["--quick", "--flex-n", "16384"], "--flex-n 16384 is not an n of the sweep; allowed: n "
                                       "among 1024, 2048, 4096"),
    (["--long-n-min", "2048", "--long-n-max", "1024", "--same-process"],
     "--long-n-min 2048 with --long-n-max 1024; allowed: --long-n-min <= --long-n-max"),
    (["--variants"], "--variants with the CPU's fresh process per point; allowed: --variants "
                     "with --same-process or --device cuda"),
    (["--variants", "fused", "--contenders", "dense", "flex", "--same-process"],
     "--variants with --contenders dense flex; allowed: --contenders with at least one of "
     "triton block-sparse, triton natural order"),
    (["--variants", "--same-process", "--long"], "--variants with --long; allowed: --variants "
                                                 "alone or --long alone"),
    (["--variants", "--same-process", "--replot"], "--variants with --replot; allowed:"),
    (["--variants", "fastest", "--same-process"], "argument --variants: got 'fastest'; "
                                                  "allowed: one of baseline, fused,"),
    (["--variants", "--same-process", "--flex-n", "1024"],
     "--flex-n 1024 is not an n of the sweep; allowed: n among 128"),
    (["--same-process", "--n-min", "128", "--n-max", "256", "--contenders", "flex"],
     "--contenders flex with no n of its --flex-n (16384) in the sweep; allowed: "
     "--flex-n with n among 128, 256"),
])
def test_bench_refuses_options_that_would_be_ignored(argv, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as end:
        bench_cli.main(argv + ["--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert not any(tmp_path.iterdir())                                    # nothing written


def test_flex_runs_when_one_of_its_n_is_in_the_sweep():
    """--contenders flex is refused only when it would be skipped at every point."""
    for argv in (["--n-min", "128", "--n-max", "256", "--flex-n", "256"],
                 ["--n-min", "8192", "--n-max", "16384"]):
        args = bench_cli.parse_args(["--same-process", "--contenders", "flex", *argv])
        assert bench_cli.sweep_from(args).contenders == ("flex",)


def test_options_change_the_sweep_they_name():
    sweep = bench_cli.sweep_from(bench_cli.parse_args([
        "--quick", "--n-min", "512", "--dtypes", "float16", "--shapes", "2x8",
        "--min-reps", "7", "--max-minutes", "3", "--dense-n-max", "1024"]))
    assert sweep.ns == (512, 1024, 2048, 4096) and sweep.dtypes == ("float16",)
    assert sweep.shapes == ((2, 8),) and sweep.max_minutes == 3 and sweep.dense_n_max == 1024
    assert sweep.contenders == ("dense", "naive", "structured")           # --quick: no flex
    assert (sweep.method.process, sweep.method.statistic) == ("fresh", "min")
    assert sweep.method.min_reps == 7 and sweep.method.target_s == 0.3
    same = bench_cli.sweep_from(bench_cli.parse_args(["--same-process", "--target", "0.5"]))
    assert (same.method.process, same.method.statistic, same.method.target_s) == (
        "same", "median", 0.5)
    assert same.file_name() == "bench_cpu_same_process" and same.long_lived_ns == ()
    assert bench_cli.sweep_from(bench_cli.parse_args([])).long_lived_ns == (16384,)


# ----------------------------------------------------------------------------
# The variant sweep: every kernel variant side by side, and which one wins where
# ----------------------------------------------------------------------------

def test_variant_sweep_defaults_are_the_gpu_targets_within_the_budget():
    sweep = bench_cli.sweep_from(bench_cli.parse_args(["--device", "cuda", "--variants"]))
    assert sweep.variants == tuple(VARIANTS) and sweep.dtypes == ("float16",)
    assert sweeps.points(sweep) == [("float16", 4, 16, 16384), ("float16", 1, 4, 16384),
                                    ("float16", 1, 16, 65536)]
    assert sweep.contenders == ("dense", "triton block-sparse", "flex") and sweep.flex_ns is None
    assert sweep.method.process == "same" and sweep.method.max_reps == 100
    assert sweep.max_minutes == 7 and sweep.file_name() == "bench_cuda_variants"
    cost = sweeps.estimate(sweep)
    runs = 2 + len(VARIANTS)                       # dense, flex and each variant
    assert cost["measurements"] == 2 * 3 * (1 + 2 * (runs - 1))
    assert cost["estimate_s"] < 8 * 60, cost                 # the budget: under 8 minutes
    assert sweep.variants_of("flex") == (None,) and sweep.variants_of("dense") == (None,)
    assert sweep.variants_of("triton natural order") == tuple(VARIANTS)
    # named variants, and points of one's own; the normal sweep's Triton rows: the default
    some = bench_cli.sweep_from(bench_cli.parse_args([
        "--device", "cuda", "--variants", "fused", "all", "fused", "--shapes", "2x8",
        "--n-min", "4096", "--n-max", "8192", "--max-minutes", "3"]))
    assert some.variants == ("fused", "all") and some.max_minutes == 3
    assert sweeps.points(some) == [("float16", 2, 8, 4096), ("float16", 2, 8, 8192)]
    normal = bench_cli.sweep_from(bench_cli.parse_args(["--device", "cuda"]))
    assert normal.variants == () and normal.variants_of("triton block-sparse") == (DEFAULT,)


@pytest.mark.slow
@pytest.mark.skipif(contenders.why_not("triton block-sparse", "cpu", torch.float32) is not None,
                    reason="the Triton kernels run on the CPU only under TRITON_INTERPRET=1")
def test_variant_sweep_on_the_cpu_times_prints_and_picks_every_variant(tmp_path, capsys):
    """``--variants --same-process``: the GPU's variant sweep with a wall clock, the
    kernels interpreted, at n = 64: every variant measured beside dense, each row's
    speed-up / % of ideal / floor, the winners per pattern and part (the fastest
    variant), the default, the JSON and the printed table; no figure."""
    names = ["baseline", "fused"]
    assert bench_cli.main(["--variants", *names, "--same-process", "--n-min", "64",
                           "--n-max", "64", "--target", "0", "--min-reps", "1",
                           "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "data" / "bench_cpu_same_process_variants.json").read_text())
    assert not (tmp_path / "bench_cpu_same_process_variants.png").exists()
    assert data["config"]["variants"] == names and set(data["config"]["variant_settings"]) == \
        set(names) and data["config"]["variant_settings"]["fused"]["fused"] is True
    assert data["estimate"]["measurements"] == 2 * (1 + 2 * (1 + len(names) + 1 - 1))
    got = [(r["contender"], r["pattern"], r.get("variant")) for r in data["results"]]
    assert got == [("dense", None, None)] + [
        (c, p, v) for p in contenders.PATTERN_PARAMS
        for c, v in [("triton block-sparse", v) for v in names] + [("flex", None)]]
    rows = {(r["pattern"], r["variant"]): r for r in data["results"] if r.get("variant")}
    for r in rows.values():
        assert r["fwd_s"] == statistics.median(r["fwd_s_all"]) and r["fb_s"] > 0
        for what in ("fwd", "fb"):
            d = r[what]
            assert math.isclose(d["speedup"], data["results"][0][what + "_s"] / r[what + "_s"])
            assert d["pct_ideal"] == 100 * d["speedup"] / r["ideal"]
            assert d["floor_s"] == max(d["floor_bytes_s"], d["floor_work_s"]) > 0
    assert all("skipped" in r for r in data["results"] if r["contender"] == "flex")
    for (_, v), r in rows.items():                  # each variant against the first one
        diff = r["agreement"]["max_rel_diff"]
        assert r["agreement"]["reference"] == "baseline"
        assert (diff == 0.0) if v == "baseline" else (0 < diff < 1e-4), r["agreement"]
    w = data["winners"]
    assert w["disagree"] == []
    assert [(e["pattern"], e["part"]) for e in w["entries"]] == [
        (p, part) for p in contenders.PATTERN_PARAMS for part in ("fwd", "fb")]
    for e in w["entries"]:
        times = {v: rows[e["pattern"], v][e["part"] + "_s"] for v in names}
        assert e["times_s"] == times and e["variant"] == min(times, key=times.get)
        assert e["runner_up"] == max(times, key=times.get)
        assert math.isclose(e["over_baseline"], times["baseline"] / e["s"])
    assert set(w["scores"]) == set(names) and w["default"] in names
    best = max(names, key=lambda v: w["scores"][v]["geomean"])
    assert w["default"] == best and math.isclose(
        w["scores"][best]["geomean"], math.prod(e["s"] / e["times_s"][best]
                                                for e in w["entries"]) ** (1 / 4))
    # the printout: every variant's row with its speed-up, % of ideal and floor; the winners
    for p in contenders.PATTERN_PARAMS:
        assert f"n=64, {p} (" in printed
    lines = [ln for ln in printed.splitlines() if ln.startswith("  triton block-sparse (")]
    assert len(lines) == 2 * len(names), lines
    for v, line in zip(names * 2, lines):
        assert f"({v})" in line and line.count("x ") >= 4 and "%" in line and (
            "(tiles)" in line or "(bytes)" in line), line
        assert line.endswith("ref" if v == "baseline" else "e-0" + line[-1]), line
    for e in w["entries"]:
        assert any(ln.split()[:7] == ["float32", "1", "4", "64", e["pattern"], e["part"],
                                      e["variant"]] for ln in printed.splitlines()), e
    assert f"default: {w['default']} -- to make it the default, set DEFAULT = " \
           f"{w['default']!r} in fast/kernels/variants.py" in printed


def test_variant_sweep_stops_at_its_budget_and_says_what_it_skipped(tmp_path, capsys):
    assert bench_cli.main(["--variants", "--same-process", "--n-min", "64", "--n-max", "64",
                           "--max-minutes", "1e-9", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "data" / "bench_cpu_same_process_variants.json").read_text())
    assert len(data["results"]) == 1 + 2 * (len(VARIANTS) + 1)
    assert all("skipped" in r for r in data["results"])
    assert all("--max-minutes 1e-09 spent" in r["skipped"] for r in data["results"]
               if r["contender"] != "flex")              # flex: not at this n on the CPU
    assert data["winners"]["entries"] == [] and data["winners"]["default"] is None
    printed = capsys.readouterr().out
    assert printed.startswith("sweep: 1 points, ") and "estimated at most" in printed
    assert "default: none (no variant was measured at every entry)" in printed


def _variant_row(variant, pattern, fwd_s, fb_s, dense=(1.0, 3.0)):
    row = {"contender": "triton block-sparse", "pattern": pattern, "dtype": "float16", "B": 4,
           "H": 16, "n": 16384, "variant": variant, "fwd_s": fwd_s, "fb_s": fb_s}
    for what, t, d in (("fwd", fwd_s, dense[0]), ("fb", fb_s, dense[1])):
        row[what] = bench.derive(t, d, 10.0, 1000, 10.0 ** 6)
    return row


def test_winners_pick_the_fastest_variant_and_a_default_measured_everywhere():
    rows = [_variant_row("baseline", "strided", 0.4, 1.2), _variant_row("fused", "strided", 0.2,
                                                                        1.5),
            _variant_row("all", "strided", 0.1, 0.9), _variant_row("baseline", "fixed", 0.5, 1.0),
            _variant_row("fused", "fixed", 0.45, 0.8),
            {**_variant_row("all", "fixed", 1, 1), "skipped": "out of memory"}]
    w = bench.winners(rows)
    assert [(e["pattern"], e["part"], e["variant"], e["runner_up"]) for e in w["entries"]] == [
        ("strided", "fwd", "all", "fused"), ("strided", "fb", "all", "baseline"),
        ("fixed", "fwd", "fused", "baseline"), ("fixed", "fb", "fused", "baseline")]
    e = w["entries"][0]
    assert (e["s"], e["over_baseline"], e["speedup"], e["pct_ideal"]) == (0.1, 4.0, 10.0, 100.0)
    assert math.isclose(e["margin"], 1.0)
    assert w["scores"]["all"] == {"wins": 2, "entries": 2, "of": 4, "geomean": 1.0}
    assert w["scores"]["fused"]["wins"] == 2 and w["scores"]["fused"]["entries"] == 4
    # "all" wins where it ran but missed an entry: the default is measured everywhere
    assert w["default"] == "fused"
    assert math.isclose(w["scores"]["fused"]["geomean"], (0.5 * 0.6 * 1 * 1) ** 0.25)
    t = bench.gpu_targets(rows)
    assert t["strided fwd B=4 H=16 n=16384"]["variant"] == "all"
    # a variant that computes something else wins nothing, and says so
    wrong = {**_variant_row("grouped", "strided", 0.01, 0.01),
             "agreement": {"reference": "baseline", "max_rel_diff": 0.5}}
    ok = {**_variant_row("index", "strided", 0.3, 1.1),
          "agreement": {"reference": "baseline", "max_rel_diff": bench.AGREE}}
    w2 = bench.winners(rows + [wrong, ok])
    assert [e["variant"] for e in w2["entries"]] == [e["variant"] for e in w["entries"]]
    assert w2["entries"][0]["times_s"]["index"] == 0.3                 # at the limit: kept
    assert w2["scores"]["grouped"] == {"wins": 0, "entries": 0, "of": 4, "geomean": None}
    assert w2["default"] == "fused"
    assert w2["disagree"] == [{"dtype": "float16", "B": 4, "H": 16, "n": 16384,
                               "pattern": "strided", "variant": "grouped",
                               "reference": "baseline", "max_rel_diff": 0.5}]
    assert t["strided fwd B=4 H=16 n=16384"]["speedup"] == 10.0
    assert t["fixed fb B=4 H=16 n=16384"]["variant"] == "fused"
    assert bench.winners([])["default"] is None


def test_one_process_table_keeps_each_dtype_and_shape_apart():
    """The report's one-process table (the CPU sweep's long-lived check) is one table per
    dtype and shape, as the fresh one: with two dtypes the bfloat16 rows are shown and
    divided by the bfloat16 dense row, not by whichever dense row comes first."""
    def row(contender, pattern, dtype, fwd):
        return {"contender": contender, "pattern": pattern, "dtype": dtype, "B": 1, "H": 4,
                "n": 16384, "fwd_s": fwd, "fb_s": 3 * fwd, "bwd_over_fwd": 2.0}

    same = [row("dense", None, "float32", 1.0), row("structured", "strided", "float32", 0.1),
            row("dense", None, "bfloat16", 8.0), row("structured", "strided", "bfloat16", 0.2)]
    data = {"config": {"device": "cpu", "dtypes": ["float32", "bfloat16"], "shapes": [[1, 4]]},
            "results": [], "same_process": same, "targets": {},
            "calibration": {"sdpa_backend": {}, "copy": {"bytes_per_s": 1e10}}}
    text = runs.report(data)
    bf16 = text.split("bfloat16, B=1, H=4: the same points in ONE process")[1]
    line = next(x for x in bf16.splitlines() if x.startswith("strided  structured fwd "))
    print(line)
    assert "200.0" in line and "40.0x" in line                  # 0.2 s, 8 s / 0.2 s
    assert "float32, B=1, H=4: the same points in ONE process" in text


def test_an_interrupted_sweep_leaves_a_record_that_says_so(monkeypatch, tmp_path, capsys):
    """The record written while a sweep runs says "complete": false (an interrupted run
    keeps what it measured, marked); the one a sweep that ended writes says true; --replot
    of the partial one says so in one line. Measuring is replaced by stand-ins."""
    monkeypatch.setattr(bench_point, "copy_bandwidth", lambda *a: {"bytes_per_s": 1e10})
    sweep = sweeps.Sweep(ns=(64,), shapes=((1, 2), (1, 4)), contenders=("dense",),
                         same_process_ns=(), method=FRESH.with_(target_s=0.0))
    saved, interrupt = [], [True]

    def point(state, dt, B, H, n):
        if saved and interrupt[0]:                   # Ctrl-C during the second shape
            raise KeyboardInterrupt
        row = {**runs._row("dense", None, dt, B, H, n), "fwd_s": 1.0, "fb_s": 3.0}
        state.emit(row)                              # as run_point gives each row
        return [row]

    monkeypatch.setattr(runs, "run_point", point)
    with pytest.raises(KeyboardInterrupt):
        runs.run(sweep, save=lambda d: saved.append(json.loads(json.dumps(d))),
                 log=lambda line: None)
    assert len(saved) == 1 and saved[0]["complete"] is False and saved[0]["results"]
    interrupt[0] = False                             # a sweep that ends
    assert runs.run(sweep, log=lambda line: None)["complete"] is True
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bench_cpu.json").write_text(json.dumps(saved[0]))
    monkeypatch.setattr(bench_cli, "draw", lambda sweep, data, png: png)
    assert bench_cli.main(["--replot", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench_cpu.json is incomplete" in err


def test_a_sweep_says_each_start_writes_every_row_and_caps_each_contender(monkeypatch):
    """In one process: a line as each measurement starts, the record given to ``save`` after
    every row (marked incomplete: the complete one is what ``run`` returns, and what
    ``measure_and_save`` writes last), and a contender past its time cap at a
    point (here 1 ns: the forward measured, the forward+backward not) is capped, said so,
    and not run at the larger n of its shape."""
    monkeypatch.setattr(bench_point, "copy_bandwidth", lambda *a: {"bytes_per_s": 1e10})
    method = sweeps.SAME.with_(target_s=0.0, min_reps=1, warmup=0, cap_s=1e-9)
    sweep = sweeps.Sweep(ns=(32, 64), contenders=("dense", "structured"), method=method,
                         same_process_ns=())
    saved, lines = [], []
    data = runs.run(sweep, save=lambda d: saved.append(json.loads(json.dumps(d))),
                    log=lines.append)
    rows = data["results"]
    assert [len(d["results"]) for d in saved] == list(range(1, len(rows) + 1))
    assert not any(d["complete"] for d in saved) and data["complete"] is True
    at = {(r["contender"], r["pattern"], r["n"]): r for r in rows}
    for key in (("dense", None, 32), ("structured", "strided", 32), ("structured", "fixed", 32)):
        r = at[key]
        assert r["fwd_s"] > 0 and "fb_s" not in r
        assert r["capped"].startswith("the forward+backward not measured: ")
        assert "past the cap of 1e-09 s" in r["capped"]
    for key in (("dense", None, 64), ("structured", "strided", 64)):
        assert at[key]["skipped"].startswith("capped at n=32 (the forward+backward not")
    started = [line for line in lines if line.endswith(" started")]
    assert len(started) == 3 and "n=    32" in started[0]
    assert any("; capped: the forward+backward not measured" in line for line in lines)
    assert "each contender capped at 1e-09 s a point" in data["config"]["timing"]["method"]
    with pytest.raises(ValueError, match="cap_s must be a finite number > 0 or None"):
        sweeps.SAME.with_(cap_s=0.0)


def test_a_cpu_row_is_held_to_the_pairs_it_reads_a_triton_row_to_its_tiles():
    # At short n the block layout of strided l = 128 has more tiles than dense causal
    # attention (its tile ideal is 0.07x at n = 256), which put a "floor" of 219 ms above
    # a structured forward measured at 96 ms; a path that computes no tiles is held to the
    # pairs the pattern reads.
    params, dense = {"stride": 128}, {"fwd_s": 0.016}
    cpu = {"contender": "structured", "pattern": "strided", "dtype": "float32", "B": 1,
           "H": 4, "n": 256, "fwd_s": 0.096}
    gpu = dict(cpu, contender="triton block-sparse")
    runs._derived(cpu, dense, params, copy_bps=8e9)
    runs._derived(gpu, dense, params, copy_bps=8e9)
    pairs = bench.keys_read_ideal("strided", 256, stride=128)
    print(f"ideal: pairs read {cpu['ideal']:.3f}x, tiles {gpu['ideal']:.3f}x")
    assert (cpu["ideal"], cpu["ideal_by"]) == (pairs, "pairs") and pairs > 1
    assert (gpu["ideal"], gpu["ideal_by"]) == (ideal_speedup("strided", 256, 4, params),
                                               "tiles")
    assert cpu["fwd"]["floor_by"] == "pairs" and cpu["fwd"]["x_floor"] > 1
    assert math.isclose(cpu["fwd"]["floor_work_s"], 0.016 / pairs)
