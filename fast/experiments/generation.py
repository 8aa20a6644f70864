"""Generation speed: the re-run sampler, a dense key/value cache and the sparse cache.

Child et al., 2019, section 4.3 (each factorized head reads about sqrt(n) keys)
and section 7 (CIFAR-10 images of 3072 bytes, Enwik8 texts of 12,288 bytes). Two
models, random weights (speed does not depend on them), batch 1, float32:

* photos32 -- the ``photos32`` preset: 32x32x3 images, n = 3072, strided l = 96
  (one image row), 2 heads merged, d = 128, 4 layers, half-size q/k and ff;
* enwik8   -- Enwik8-shaped: n = 12,288 bytes, fixed l = 128, c = 32, 8 heads
  merged as the paper's Enwik8 model; d = 128 and 4 layers (the paper: 512, 30).

For each: every step of a whole sample with the sparse cache (photos32: the
fastest of three samples, as each re-run step is the fastest of its repetitions);
one whole sample with the dense cache (photos32) or windows of steps at a few
positions (enwik8, where a whole dense sample is slow). Both caches step as
``sample`` does by default (engine "auto": the compiled CPU step of
``fast.transformer.decoding.cpu_kernel``, and the PyTorch step for steps that read more than
``AUTO_MAX_KEYS`` keys per head; each record counts the steps of each), after a
warm-up that compiles the kernel (its seconds are recorded, not counted: once
per process); photos32 is also sampled once with the sparse cache on the
PyTorch step alone, to show what the compiled step buys; and for enwik8, steps of
the sparse cache at the dense windows' positions on each engine alone, the two
alternating in six turns so that both meet the same load ("engines": the
crossover from which ``AUTO_MAX_KEYS`` is chosen). Then the re-run sampler's
step -- a forward pass over the prefix -- at a few prefix lengths, summed over t = 1..n by linear
interpolation (a whole re-run sample would take many minutes), and checked
against a re-run sample of the first tokens measured directly; the cache's bytes
for samples of growing length. All contenders are measured in the same run; the
caches with one intra-op thread (``--threads``; ``sample``'s default on the
CPU), the re-run sampler with one thread and with one per core, the faster
counting.

    python -m fast generate [--quick] [--threads N] [--runs R]     (fast.commands.generate)

writes figures/data/generation.json and figures/generation.png (--quick: tiny
models, into runs/quick/). The photos32 measurement is made ``--runs`` times (default
3): its speed-up is a ratio of two wall-clock totals, which a shared machine moves
from run to run; the median run is kept and every run's ratio listed. Targets: a
whole photos32 sample at least 50x faster with the sparse cache than re-run; the
enwik8 sample in minutes, with tokens per second near t = 12,288 at least 2x the
dense cache's.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from fast.experiments.paths import DATA, FIGURES, QUICK
from fast.experiments.provenance import write_result
from fast.measure import generation as gen
from fast.measure.bench import machine_info
from fast.plots.generation import plot_generation
from fast.transformer.config import ModelConfig, preset
from fast.transformer.decoding.sample import sample
from fast.transformer.network.model import SparseTransformer


def model_configs(quick: bool) -> dict:
    """name -> (ModelConfig, {"dense_full": whole dense sample?, "window": steps
    per measured window, "rerun_ts": prefix lengths of the re-run steps, "repeats":
    whole samples with the sparse cache, the fastest counting -- three for photos32,
    like the re-run steps' two or three repetitions; one for enwik8, whose goal is
    minutes; "torch_step": also a whole sample on the PyTorch step; "engines": windows
    of steps on each engine alone})."""
    photos = preset("photos32")[0]
    text = ModelConfig(vocab_size=256, n_ctx=12288, d_model=128, n_heads=8, n_layers=4,
                       pattern="fixed", combine="merged", stride=128, c=32, embedding="text")
    if quick:
        photos = preset("photos32", n_ctx=192, image_shape=(8, 8, 3), stride=24,
                        n_layers=2)[0]
        text = ModelConfig(vocab_size=256, n_ctx=512, d_model=32, n_heads=4, n_layers=2,
                           pattern="fixed", combine="merged", stride=32, c=8, embedding="text")
    return {
        "photos32": (photos, {"dense_full": True, "window": 16 if quick else 64,
                              "rerun_ts": sorted({1, *range(0, photos.n_ctx + 1,
                                                            photos.n_ctx // 6)} - {0}),
                              "repeats": 3, "torch_step": True, "engines": False}),
        "enwik8": (text, {"dense_full": False, "window": 16 if quick else 128,
                          "rerun_ts": [1, *(text.n_ctx * k // 12 for k in (1, 4, 8, 12))],
                          "repeats": 1, "torch_step": False, "engines": True}),
    }


def measure_model(name: str, cfg: ModelConfig, plan: dict, prefix: int) -> dict:
    """Every measurement of one model (see the module docstring)."""
    torch.manual_seed(0)
    model = SparseTransformer(cfg).eval()
    n, w = cfg.n_ctx, plan["window"]
    out = {"config": asdict(cfg), "n": n, "window": w}
    lengths = [n * k // 8 for k in range(1, 9)]
    out["cache_bytes"] = {"n": lengths, **{kind: [gen.cache_bytes(model, kind, m)
                                                  for m in lengths] for kind in ("dense",
                                                                                 "sparse")}}
    out["warm_up_s"] = {kind: gen.warm_up(model, kind) for kind in ("sparse", "dense")}
    keep = ("total_s", "total_cpu_s", "cache_bytes", "totals_s", "engine", "steps")
    print(f"{name}: sparse cache, a whole sample of {n} tokens ...", flush=True)
    sparse = gen.decode_timeline(model, "sparse", repeats=plan["repeats"])
    out["sparse"] = {k: sparse[k] for k in keep}
    out["sparse"].update(zip(("t", "tokens_per_s"), gen.window_rate(sparse["seconds"], w)))
    if plan["torch_step"]:
        print(f"{name}: sparse cache on the PyTorch step, a whole sample ...", flush=True)
        step = gen.decode_timeline(model, "sparse", engine="torch")   # shown, no target
        out["sparse_torch"] = {k: step[k] for k in keep}
        out["sparse_torch"].update(zip(("t", "tokens_per_s"),
                                       gen.window_rate(step["seconds"], w)))
    if plan["dense_full"]:
        print(f"{name}: dense cache, a whole sample ...", flush=True)
        dense = gen.decode_timeline(model, "dense")     # no target rests on its total
        out["dense"] = {k: dense[k] for k in keep}
        out["dense"].update(zip(("t", "tokens_per_s"), gen.window_rate(dense["seconds"], w)))
    else:
        points = [n * k // 8 - w for k in (1, 2, 4, 6, 8)]
        print(f"{name}: dense cache, windows of {w} steps from t = {points} ...", flush=True)
        counts: dict = {}
        rates = [1.0 / float(np.median(gen.decode_window(model, "dense", t, w, counts=counts)))
                 for t in points]
        out["dense"] = {"t": [t + w for t in points], "tokens_per_s": rates,
                        "cache_bytes": out["cache_bytes"]["dense"][-1],
                        "engine": out["sparse"]["engine"], "steps": counts}
    if plan["engines"]:
        points = [n * k // 8 - w for k in (1, 2, 4, 6, 8)]
        print(f"{name}: sparse cache on each engine, {w} steps from t = {points}, the engines "
              f"alternating ...", flush=True)
        steps = [gen.engine_steps(model, "sparse", t, w) for t in points]
        out["engines"] = {"t": [t + w for t in points],
                          "keys_per_head": [gen.keys_read(cfg, t + w - 1) for t in points],
                          **{engine: [1.0 / float(np.median(s[engine])) for s in steps]
                             for engine in ("numba", "torch")}}
    print(f"{name}: re-run sampler at t = {plan['rerun_ts']} ...", flush=True)
    counts = sorted({1, torch.get_num_threads(), os.cpu_count() or 1})
    steps = [gen.rerun_seconds(model, t, repeats=2 if t > n // 3 else 3, threads=counts)
             for t in plan["rerun_ts"]]
    image = cfg.embedding == "image"                 # a text sample starts from one byte
    start = time.perf_counter()
    sample(model, 1, length=prefix, cache=False, prompt=None if image else [10],
           generator=torch.Generator().manual_seed(0), threads=torch.get_num_threads())
    measured = time.perf_counter() - start
    wall, cpu = [s["wall"] for s in steps], [s["cpu"] for s in steps]
    out["rerun"] = {"t": plan["rerun_ts"], "seconds": wall, "cpu_seconds": cpu,
                    "threads": counts, "tokens_per_s": [1.0 / s for s in wall],
                    "total_s_estimated": gen.rerun_total(plan["rerun_ts"], wall, n),
                    "total_cpu_s_estimated": gen.rerun_total(plan["rerun_ts"], cpu, n),
                    "prefix": {"tokens": prefix, "measured_s": measured,
                               "estimated_s": gen.rerun_total(plan["rerun_ts"], wall,
                                                              prefix - (not image))}}
    return out


def speedup(m: dict) -> tuple[float, float]:
    """(wall, CPU-seconds) ratio of the re-run sampler's whole-sample estimate to the
    sparse cache's whole sample, for one model's record."""
    return (m["rerun"]["total_s_estimated"] / m["sparse"]["total_s"],
            m["rerun"]["total_cpu_s_estimated"] / m["sparse"]["total_cpu_s"])


def median_run(records: list[dict]) -> dict:
    """Of several records of one model, the one with the median speed-up (the lower
    middle for an even count), with every run's numbers under "runs"."""
    ranked = sorted(records, key=lambda m: speedup(m)[0])
    middle = dict(ranked[(len(ranked) - 1) // 2])
    middle["runs"] = [{"speedup": speedup(m)[0], "cpu_ratio": speedup(m)[1],
                       "sparse_total_s": m["sparse"]["total_s"],
                       "sparse_torch_total_s": m.get("sparse_torch", {}).get("total_s"),
                       "rerun_total_s_estimated": m["rerun"]["total_s_estimated"]}
                      for m in records]
    return middle


def targets(models: dict, quick: bool) -> list[dict]:
    """The goals of this benchmark, with what was measured (wall clock; the ratio of
    CPU seconds beside it says how much of a wall-clock ratio a busy machine moved).
    The photos32 speed-up is the median of its runs; every run's is listed. "met" is
    whether the goal was met, or None for a ``quick`` run: its small models and short
    samples cannot meet or miss the goals of the real sizes."""
    p, e = models["photos32"], models["enwik8"]
    wall, cpu = speedup(p)
    ratio = e["sparse"]["tokens_per_s"][-1] / e["dense"]["tokens_per_s"][-1]
    return [
        {"what": f"photos32, whole {p['n']}-token sample: re-run (estimated) / sparse cache",
         "goal": ">= 50x", "measured": wall, "cpu_ratio": cpu,
         "runs": [r["speedup"] for r in p.get("runs", [])],
         "met": None if quick else wall >= 50},
        {"what": f"enwik8, whole {e['n']}-byte sample with the sparse cache",
         "goal": "minutes", "measured": e["sparse"]["total_s"], "unit": "s",
         "met": None if quick else e["sparse"]["total_s"] < 600},
        {"what": f"enwik8, tokens/s near t = {e['n']}: sparse / dense cache", "goal": ">= 2x",
         "measured": ratio, "met": None if quick else ratio >= 2},
    ]


def run(quick: bool, threads: int = 1, runs: int = 1) -> dict:
    """Measure both models with ``threads`` intra-op threads (restored after); photos32,
    whose goal is a ratio of two wall-clock totals, ``runs`` times, the median kept."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        info = machine_info("cpu")
        info["load_average"] = os.getloadavg()
        info["numba"] = importlib.metadata.version("numba") \
            if importlib.util.find_spec("numba") else None
        records = {name: [measure_model(name, cfg, plan, prefix=16 if quick else 64)
                          for _ in range(runs if name == "photos32" else 1)]
                   for name, (cfg, plan) in model_configs(quick).items()}
        # the process's first compiled step: compiling it, or loading Numba's disk cache
        info["first_step_s"] = records["photos32"][0]["warm_up_s"]["sparse"]
        models = {name: median_run(record) for name, record in records.items()}
        info["wall_s"] = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    return {"machine": info, "quick": quick, "models": models,
            "targets": targets(models, quick)}


def outputs(quick: bool) -> tuple[Path, Path]:
    """Where a run's JSON and figure go: figures/data/generation.json and
    figures/generation.png (--quick: under runs/quick/)."""
    out, figures = (QUICK, QUICK / "figures") if quick else (DATA, FIGURES)
    return out / "generation.json", figures / "generation.png"


def write(data: dict, quick: bool) -> tuple[str, str]:
    """Write the JSON and the figure of a ``run``: (JSON path, PNG path)."""
    json_path, png = outputs(quick)
    return write_result(json_path, data, indent=1), str(plot_generation(data, png))
