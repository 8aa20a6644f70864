"""Smoke test of the benchmark: the library (fast.measure.bench) and ``python -m fast bench``
(fast.experiments.bench), at tiny n.

Child et al., 2019, Table 2: the benchmark compares sparse and dense attention.
Timings are not checked (noisy, shared machine); the structure, the slope fit,
the ratio summary, the fresh-process measurement and the figure are.
"""

from __future__ import annotations

import json
import math

from fast.experiments import bench as bench_cli
from fast.measure import bench


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


def test_quick_run_writes_json_and_figure(tmp_path):
    assert bench_cli.main(["--inline", "--n-min", "128", "--n-max", "256", "--no-flex",
                           "--target", "0.01", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "data" / "bench_cpu.json").read_text())
    assert data["machine"]["torch"] and data["config"]["ns"] == [128, 256]
    got = {(r["contender"], r["pattern"], r["n"]) for r in data["results"]}
    for n in (128, 256):
        assert ("dense", None, n) in got
        for pattern in bench.PATTERN_PARAMS:
            for name in ("naive", "flex", "structured"):
                assert (name, pattern, n) in got
    for r in data["results"]:
        if r["contender"] == "flex":
            assert "skipped" in r
        else:
            assert r["fwd_s"] > 0 and r["fb_s"] > 0 and len(r["fwd_s_all"]) >= 1
    assert (tmp_path / "bench_cpu.png").stat().st_size > 10_000


def test_one_point_in_a_fresh_process():
    spec = {"name": "structured", "pattern": "strided", "n": 256, "device": "cpu",
            "dtype_name": "float32", "target": 0.01, "backward": True}
    r = bench_cli.measure_point(spec, inline=False, timeout=300)
    assert "skipped" not in r, r
    assert r["fwd_s"] > 0 and r["fb_s"] > 0 and r["peak_fwd_bytes"] is not None
