"""Table 2 at CPU scale: dense vs fixed vs strided, same model, same budget, several seeds.

Child et al., 2019, section 7.1 and Table 2: the same network trained with
dense, fixed and strided attention on Enwik8 (text) and CIFAR-10 (images);
held-out bits and time per iteration. Here, on a 2-core CPU:

* text   -- the bytes of Python's standard library (``fast.data`` "stdlib"),
            n = 512, grid width l = 32, fixed summary c = 8;
* images -- 16x16 greyscale crops of the bundled photographs ("grey16"),
            n = 256, l = 16 = one image row, c = 4;

every cell a 4-layer, d = 64, 4-head model (merged heads), trained by
``fast.transformer.training.train.train`` with the same steps, batch, learning rate and
schedule, once per seed (``--seeds``, default 3: seeds 0, 1, 2 draw different
initial weights and batches). Each run uses one intra-op thread, in its own
process (``fast.measure.child``), ``--jobs`` runs at a time (default: 2, or the
core count if lower), so its numbers do not depend on how many cores the
machine has. Every run trains ``STEPS`` steps of 8 text windows of 512 bytes, or of 16
images of 256 pixels: 1,966,080 bytes or pixels per run (docs/design.md, section 11, says
what that costs and what the budget of ``make figures`` holds).

Every step of every cell costs the same arithmetic as its pattern needs, and no more: the
strided and fixed patterns and, for these narrow heads, dense attention too run through the
project's CPU window kernel (``fast.backends.structured.dense_window``): the paper compares
the patterns on the same kernels. ``python -m fast table2 --profile`` measures where a
step's time goes (``profile``), what the dense kernel choice is worth, and what compiling
the step would give.

Held-out bits at the end, on validation and test, drawn by one rule
(``fast.data.images``; stdlib files by hash): every test and validation image;
for text, ``TEXT_EVAL_WINDOWS`` windows of n bytes evenly spread over each split
(``Dataset.eval_items``; the number of windows in the split is recorded beside), with
the standard error of that mean over the items (``held_out``: how far another sample
could move it; the same items for every pattern, so differences between patterns are
paired). During training each run evaluates 32 text windows (64 images) every sixth of the
run, for the learning curves only.

Every run records the code that trained it (``fast.experiments.provenance``: a hash of
the sources, the commit), its kernels and a digest of its weights, and logs its training
loss every ``LOG_EVERY`` steps; ``replay`` retrains the first ``REPLAY_STEPS`` of seed 0
of a cell in a child with the same pins, and
tests/fast/experiments/test_committed_results.py compares its losses bit for bit with the
committed history: the committed numbers are the code's, or the test says which cell moved.

Time per iteration is measured on the same runs: the median of their steps
after the first (``time_per_iter``), with one thread each and ``--jobs`` runs
sharing the machine. At n = 256-512 attention is a small part of a step, so the
time of the *same architecture* at the paper's lengths, n = 3072 (images) and
n = 12288 (text), is measured too (``time_paper_lengths``): untrained weights (time
does not depend on them), batch 1, one thread, alone.

    python -m fast table2 [--quick] [--force] [--seeds 3] [--jobs 2] [--iters 480]
                          [--only text/full,...]
    python -m fast table2 --drift     # seed 0 of every cell again: on 2 threads, and on an
                                      # AVX-512 host with its own kernels (reproducibility)
    python -m fast table2 --profile   # where a step's time goes (figures/data/table2_profile.json)

Results go to figures/data/table2.json (written after each run; a run already
there is skipped unless --force, so the script resumes). The seed-0 weights of
every cell are kept (fp16, model only, about 0.5 MB each) in figures/data/models/
as {modality}_{pattern}.pt: notebook 06 reads the image ones (Figure 2 for
trained sparse models) and notebook 09 samples from them.

With ``--out X.json`` every output follows X: the JSON is X.json, the kept weights go to
models/ beside it and the PNGs beside it (``out_paths``), so a run elsewhere never replaces
the committed models. ``python -m fast table3`` and ``python -m fast samples`` take no
folder: they read the kept models of figures/data/models/ (table3 --quick:
runs/quick/models/) only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from fast.backends import structured
from fast.core.schema import Map, Optional
from fast.data import Dataset, load
from fast.experiments.cache import read_cache, resumable
from fast.experiments.paths import DATA, FIGURES, QUICK
from fast.experiments.provenance import code_version, write_result
from fast.experiments.reproducible import avx512_env, child_env, kernels, weights_digest
from fast.measure.bench import machine_info
from fast.measure.child import run_child
from fast.measure.dense_kernels import dense_times
from fast.measure.step_profile import profile_step, step_seconds
from fast.plots import table2 as plot_table2
from fast.plots.style import PATTERN_ORDER
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.checkpoint import save_weights
from fast.transformer.training.loss import LN2, loss_fn
from fast.transformer.training.train import train

MODALITIES = ("text", "image")
TEXT_EVAL_WINDOWS = 256          # text windows per held-out split, evenly spread
STEPS = 480                      # training steps of every run (--iters overrides):
                                 # 1,966,080 tokens per text run and per image run
LOG_EVERY = 4                    # a run logs its training loss every LOG_EVERY steps
REPLAY_STEPS = 2 * LOG_EVERY     # steps the reproduction check retrains (``replay``): two
                                 # logged losses, the second after the first updates
WIDTH = 64                       # d: 3 seeds x 6 cells of STEPS steps must fit make figures'
                                 # share of 2 cores (fast.commands.figures.STEPS)

# The paper's Table 2 (bits, seconds per iteration on their GPUs).
PAPER = {
    "text": {"full": (1.00, 1.31), "fixed": (0.99, 0.55), "strided": (1.13, 0.35),
             "dataset": "Enwik8 (bits per byte)", "n": 12288},
    "image": {"full": (2.82, 0.54), "fixed": (2.85, 0.47), "strided": (2.80, 0.38),
              "dataset": "CIFAR-10 (bits per dim)", "n": 3072},
}


# What table2.json holds, as far as its readers use it (``fast.core.schema``): resuming
# (``CACHE``), the figures and ``python -m fast results`` (``fast.experiments.results``).
RUN = {"val_bits": float, "test_bits": float, "time_per_iter": float, "steps": int,
       "model_cfg": {"n_ctx": int}, "evals": [{"step": int, "val": float}]}
TIMING_ROW = {"modality": str, "pattern": str, "n": int, "time_per_iter": float}
CACHE = {"runs": Optional(Map(Map(RUN))), "timing": Optional([TIMING_ROW]),
         "drift": Optional(Map({"test_bits": float}))}


def run_configs(modality: str, pattern: str, quick: bool, iters: int | None = None,
                seed: int = 0, output_init: str = "normal") -> tuple[ModelConfig, TrainConfig]:
    """The model and training configuration of one Table 2 cell and seed (``output_init``:
    W_out drawn, the default, or "zero" as sec. 6 says)."""
    if modality not in MODALITIES or pattern not in PATTERN_ORDER:
        raise ValueError(f"modality must be one of {MODALITIES} and pattern one of "
                         f"{PATTERN_ORDER}, got {modality!r}, {pattern!r}")
    iters = iters or (24 if quick else STEPS)
    # the backend named, not "auto": auto follows crossovers measured on one machine
    # (fast.backends.crossovers, re-measured now and then), and another backend sums in
    # another order
    # (fast.experiments.reproducible)
    common = dict(d_model=WIDTH, n_heads=4, n_layers=2 if quick else 4, pattern=pattern,
                  combine="merged", output_init=output_init, attention_backend="structured")
    # images learn faster at a higher peak rate (3e-3 beat 1e-3 on grey16)
    schedule = dict(max_iters=iters, warmup_iters=max(2, iters // 10), precision="fp32",
                    eval_interval=max(1, iters // 6), eval_batches=4, eval_splits=("val",),
                    log_interval=LOG_EVERY, seed=seed, save_checkpoint=False,
                    cpu_threads=1, out_dir=f"runs/table2/{modality}_{pattern}_{seed}")
    if modality == "text":
        model = ModelConfig(vocab_size=256, n_ctx=512, stride=32, embedding="text",
                            c=8 if pattern == "fixed" else None, **common)
        tcfg = TrainConfig(dataset="stdlib", data_max_bytes=4_000_000, batch_size=8, lr=1e-3,
                           **schedule)
    else:
        model = ModelConfig(vocab_size=256, n_ctx=256, stride=16, embedding="image",
                            image_shape=(16, 16, 1), c=4 if pattern == "fixed" else None, **common)
        tcfg = TrainConfig(dataset="grey16", batch_size=16, lr=3e-3, **schedule)
    return model, tcfg


def timing_configs(modality: str, pattern: str, quick: bool) -> tuple[ModelConfig, TrainConfig]:
    """The Table 2 architecture of ``modality`` at the paper's length (n = 3072 for images,
    32x32x3 with l = 96 = one row; n = 12288 for text, l = 128), c = 32, batch 1."""
    model, _ = run_configs(modality, pattern, quick)
    n = PAPER[modality]["n"] // (4 if quick else 1)
    image = modality == "image"
    side = 16 if quick else 32
    model = ModelConfig(**{**asdict(model), "n_ctx": n, "stride": 3 * side if image else 128,
                           "c": (16 if quick else 32) if pattern == "fixed" else None,
                           "image_shape": (side, side, 3) if image else None})
    # the dataset name only passes the config's check (``random_bytes`` is handed to train());
    # the final evaluation reads one window of it, outside the timed steps
    tcfg = TrainConfig(dataset="grey16" if image else "stdlib", batch_size=1, max_iters=4,
                       warmup_iters=1, precision="fp32",
                       eval_interval=0, eval_batches=1, eval_splits=("train",), log_interval=1,
                       save_checkpoint=False, cpu_threads=1, out_dir="runs/table2/timing")
    return model, tcfg


def random_bytes(model_cfg: ModelConfig) -> Dataset:
    """Seeded random bytes shaped for ``model_cfg``: the time of a step does not depend on
    the values it reads, and the paper's lengths need no data of that shape."""
    rng = np.random.default_rng(0)
    n = model_cfg.n_ctx
    if model_cfg.embedding == "image":
        return Dataset("random bytes", "image", 256, {"train": rng.integers(
            0, 256, (8, n), dtype=np.uint8)}, tuple(model_cfg.image_shape))
    return Dataset("random bytes", "text", 256,
                   {"train": rng.integers(0, 256, 8 * n, dtype=np.uint8)})



def out_paths(quick: bool, out: Path | None = None) -> tuple[Path, Path, Path]:
    """(JSON, kept-models folder, figures folder) of a full or a --quick run, or of a run
    written to ``out`` (--out): every output follows it, the weights in models/ beside the
    JSON and the PNGs beside the JSON, so that a run elsewhere never replaces the kept
    models that table3 and samples read."""
    if out is not None:
        out = Path(out)
        return out, out.parent / "models", out.parent
    if quick:
        return QUICK / "table2.json", QUICK / "models", QUICK / "figures"
    return DATA / "table2.json", DATA / "models", FIGURES


@functools.lru_cache(maxsize=2)
def dataset(modality: str):
    """The data of a modality (loaded once per process)."""
    return load("stdlib", max_bytes=4_000_000) if modality == "text" else load("grey16")


@torch.no_grad()
def held_out(model, modality: str, split: str) -> dict:
    """A held-out split's bits: every image, or TEXT_EVAL_WINDOWS evenly spread text windows
    (``Dataset.eval_items``). {"bits": the mean over every predicted position, "se": the
    standard error of that mean over the items (each item's mean bits; how far another
    sample of items could move it), "items": items read, "count": items in the split}.
    The model is left in eval mode."""
    ds = dataset(modality)
    n = model.cfg.n_ctx
    batch = 16
    cap = None if modality == "image" else TEXT_EVAL_WINDOWS // batch
    model.eval()
    per_item = []
    for x, y in ds.eval_batches(split, batch, n, cap):
        nats = loss_fn(model(x), y, reduction="none").view(y.shape)          # (B, n)
        per_item += (nats.double().mean(1) / LN2).tolist()
    bits = np.asarray(per_item)
    return {"bits": float(bits.mean()), "se": float(bits.std(ddof=1) / np.sqrt(len(bits))),
            "items": len(bits), "count": ds.eval_count(split, n)}


def run_one(spec: dict) -> dict:
    """Train one cell with one seed (in a child process); returns its record.

    spec: {"key": "text/full", "seed": 0, "quick": bool, "iters": int | None,
    "keep": path or None (where to save the weights), "threads": int (default 1),
    "output_init": "normal" (default) or "zero"}.
    """
    modality, pattern = spec["key"].split("/")
    model_cfg, train_cfg = run_configs(modality, pattern, spec["quick"], spec.get("iters"),
                                       spec["seed"], spec.get("output_init", "normal"))
    train_cfg.cpu_threads = spec.get("threads", 1)
    t0, c0 = time.perf_counter(), time.process_time()
    rec = train(model_cfg, train_cfg, progress=False, dataset=dataset(modality))
    train_cpu = time.process_time() - c0
    model = rec["model"].eval()
    val, test = held_out(model, modality, "val"), held_out(model, modality, "test")
    if spec.get("keep"):
        save_weights(spec["keep"], model)
    steps = rec["iter_times"][1:] or rec["iter_times"]
    return {
        "seed": spec["seed"], "model_cfg": asdict(model_cfg), "train_cfg": asdict(train_cfg),
        "history": rec["history"], "evals": rec["evals"],
        "val_bits": val["bits"], "test_bits": test["bits"],
        "val_se": val["se"], "test_se": test["se"],
        "eval_items": {"val": [val["items"], val["count"]],
                       "test": [test["items"], test["count"]]},
        "time_per_iter": statistics.median(steps), "n_params": rec["n_params"],
        "steps": rec["step"], "tokens": rec["step"] * train_cfg.batch_size * model_cfg.n_ctx,
        "threads": train_cfg.cpu_threads,
        "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
        "train_cpu_s": train_cpu, "unit": rec["unit"], "weights_sha256": weights_digest(model),
        "kernels": kernels(), "code": code_version(),
    }


def replay(spec: dict) -> dict:
    """The child's side of the reproduction check: the first ``spec["steps"]`` steps of
    seed 0 of every cell of ``spec["keys"]``, trained exactly as ``run_one`` trains them
    (the same configuration, ``spec["iters"]`` or ``STEPS`` long, stopped early:
    ``TrainConfig.stop_iter`` keeps the schedule of the whole run). Returns {key: the
    training losses logged on the way (``history["loss"]``)}: the same floats, bit for
    bit, as the committed run logged at those steps, or the code no longer reproduces it
    (tests/fast/experiments/test_committed_results.py)."""
    out = {}
    for key in spec["keys"]:
        modality, pattern = key.split("/")
        model_cfg, train_cfg = run_configs(modality, pattern, spec.get("quick", False),
                                           spec.get("iters"), 0)
        train_cfg = replace(train_cfg, stop_iter=spec["steps"])
        rec = train(model_cfg, train_cfg, progress=False, dataset=dataset(modality))
        out[key] = rec["history"]["loss"]
    return out


def time_paper_lengths(quick: bool) -> list[dict]:
    """Time per training step of every pattern at the paper's lengths (``timing_configs``),
    on random bytes (``random_bytes``), one thread, nothing else of ours running."""
    rows = []
    for modality in MODALITIES:
        for pattern in PATTERN_ORDER:
            model_cfg, train_cfg = timing_configs(modality, pattern, quick)
            rec = train(model_cfg, train_cfg, progress=False, dataset=random_bytes(model_cfg))
            rows.append({"modality": modality, "n": model_cfg.n_ctx, "pattern": pattern,
                         "layers": model_cfg.n_layers, "d": model_cfg.d_model,
                         "heads": model_cfg.n_heads, "stride": model_cfg.stride,
                         "c": model_cfg.c, "batch": 1, "threads": 1,
                         "time_per_iter": statistics.median(rec["iter_times"][1:]),
                         "iter_times": rec["iter_times"]})
            print(f"table2: timing n={model_cfg.n_ctx} {pattern}: "
                  f"{rows[-1]['time_per_iter']:.3f} s/iter", flush=True)
    return rows


PROFILE_STEPS, PROFILE_WARMUP, PROFILE_BATCHES = 6, 2, (8, 16, 32)


@contextlib.contextmanager
def dense_through_sdpa():
    """Dense attention through PyTorch's fused kernel, as before ``fast.backends.structured.
    dense_window`` sent Table 2's dense cells through the window kernel: the profile's
    "before" of that choice (nothing else uses it)."""
    width = structured.DENSE_WINDOW_WIDTH
    structured.DENSE_WINDOW_WIDTH = 0
    try:
        yield
    finally:
        structured.DENSE_WINDOW_WIDTH = width


def profile_one(spec: dict) -> dict:
    """The child's side of ``profile``: ``fast.measure.step_profile.profile_step`` of one
    cell (spec: {"key", "quick", "compiled"}), on one thread; for a dense cell also its step
    with the attention through SDPA against the window kernel, in turns
    (``step_profile.step_seconds``: "dense_attention")."""
    modality, pattern = spec["key"].split("/")
    model_cfg, train_cfg = run_configs(modality, pattern, spec["quick"])
    torch.set_num_threads(1)
    steps = 2 if spec["quick"] else PROFILE_STEPS
    warmup = 1 if spec["quick"] else PROFILE_WARMUP
    out = {**profile_step(model_cfg, train_cfg, dataset(modality), steps=steps, warmup=warmup,
                          batches=(4, 8) if spec["quick"] else PROFILE_BATCHES,
                          compiled=spec.get("compiled", False)),
           "batch": train_cfg.batch_size, "n": model_cfg.n_ctx, "kernels": kernels()}
    if pattern == "full":
        out["dense_attention"] = step_seconds(
            {"window": model_cfg, "sdpa": (model_cfg, dense_through_sdpa)}, train_cfg,
            dataset(modality), steps=steps, warmup=warmup)
    return out


def dense_kernels_one(spec: dict) -> list[dict]:
    """The child's side of ``profile``'s "dense_kernels": ``fast.measure.dense_kernels.
    dense_times`` on one thread (spec: {"rounds"})."""
    torch.set_num_threads(1)
    return dense_times(rounds=spec["rounds"])


def profile(*, quick: bool = False, out: Path | None = None) -> dict:
    """Where the time of a training step of every cell goes (``profile_one`` in a child
    with one thread and the pinned kernels, one cell after the other, nothing else of ours
    running; the compiled step too unless ``quick``), and dense attention's two kernels
    (``dense_kernels_one``); written to ``out``, by default table2_profile.json beside
    table2.json. Returns its data."""
    out = Path(out) if out else out_paths(quick)[0].with_name("table2_profile.json")
    cells = {}
    for key in cell_keys():
        result = run_child("fast.experiments.table2:profile_one",
                           {"key": key, "quick": quick, "compiled": not quick},
                           env=child_env(1))
        if "error" in result:
            raise RuntimeError(f"table2: profile {key} {result['error']}\n{result['output']}")
        cells[key] = result["result"]
        step = sum(cells[key]["phases"].values())
        print(f"table2: profile {key}: {step * 1e3:.0f} ms CPU per step", flush=True)
        if cells[key]["kernels"]["host_avx512"] and "ATEN_CPU_CAPABILITY" in child_env(1):
            # what pinning the AVX2 kernels costs on this AVX-512 host
            free = run_child("fast.experiments.table2:profile_one",
                             {"key": key, "quick": quick},
                             env=avx512_env(1))
            if "error" in free:
                raise RuntimeError(f"table2: profile {key} {free['error']}\n{free['output']}")
            cells[key]["host_kernels"] = {k: free["result"][k] for k in ("phases", "kernels")}
    dense = run_child("fast.experiments.table2:dense_kernels_one",
                      {"rounds": 2 if quick else 3}, env=child_env(1))
    if "error" in dense:
        raise RuntimeError(f"table2: profile dense_kernels {dense['error']}\n{dense['output']}")
    first = next(iter(cells.values()))
    data = {"quick": quick, "cells": cells, "dense_kernels": dense["result"], "conditions": {
        "machine": machine_info("cpu")["cpu"] + f", {os.cpu_count()} cores",
        "torch": torch.__version__, "threads": 1, "kernels": first["kernels"],
        "steps": 2 if quick else PROFILE_STEPS, "warmup": 1 if quick else PROFILE_WARMUP,
        "batches": list((4, 8) if quick else PROFILE_BATCHES),
        "clock": "CPU seconds of the child process (time.process_time)"}}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, data)
    return data


def cell_keys() -> list[str]:
    return [f"{m}/{p}" for m in MODALITIES for p in PATTERN_ORDER]


def summarise(runs: dict) -> dict:
    """Per cell: mean and standard deviation (over seeds) of the held-out bits and the time."""
    out = {}
    for key, by_seed in runs.items():
        recs = list(by_seed.values())
        cell = {"seeds": len(recs)}
        for field in ("val_bits", "test_bits", "time_per_iter"):
            values = [r[field] for r in recs]
            cell[field] = statistics.fmean(values)
            cell[field + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out[key] = cell
    return out


def run(*, quick: bool = False, force: bool = False, only: list[str] = (), seeds: int = 3,
        jobs: int = 2, out: Path | None = None, iters: int | None = None,
        drift: bool = False, output_init: str = "normal") -> dict:
    """Train what is missing (every cell x seed, or ``only`` those cells; ``drift``: seed 0
    of each again on 2 threads), the timing runs, and draw the figures; the JSON is
    rewritten after every run. Returns its data. Every output follows ``out`` when given
    (``out_paths``). ValueError when ``out`` holds results of the other size (``quick``) and
    ``force`` is not given. ``output_init="zero"`` (sec. 6's
    W_out = 0) writes to table2_zero_output.json beside table2.json unless ``out`` says
    otherwise, keeps no weights and draws no figures: the measurement behind the default."""
    keys, only = cell_keys() + ["timing"], list(only)
    variant = output_init != "normal"
    named = out is not None
    out, models, figdir = out_paths(quick, out)
    if variant and not named:
        out = out.with_name("table2_zero_output.json")
    data = resumable(out, quick, force, CACHE)
    data.update({"quick": quick, "paper": PAPER, "torch": torch.__version__,
                 "output_init": output_init,
                 "python": platform.python_version(), "jobs": jobs,
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, CPU only",
                 "data": {m: dataset(m).fingerprint() for m in MODALITIES},
                 "text_eval_windows": TEXT_EVAL_WINDOWS})
    data.setdefault("runs", {})
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = []
    for key in [k for k in (only or keys) if k != "timing"]:
        if drift:   # seed 0 again: on 2 threads; on an AVX-512 host, also with its kernels
            twin = {"key": key, "seed": 0, "quick": quick, "iters": iters, "keep": None,
                    "output_init": output_init}
            for field, spec in (("drift", {**twin, "threads": 2}),
                                ("drift_kernels", {**twin, "host_kernels": True})):
                if key in data.get(field, {}):
                    print(f"table2: {field} of {key} already measured, kept", flush=True)
                elif field == "drift" or (kernels()["host_avx512"]
                                          and "ATEN_CPU_CAPABILITY" in child_env(1)):
                    todo.append(spec)
            continue
        for seed in range(seeds):
            if str(seed) in data["runs"].get(key, {}) and not force and not only:
                continue
            keep = models / f"{key.replace('/', '_')}.pt" if seed == 0 and not variant else None
            todo.append({"key": key, "seed": seed, "quick": quick, "iters": iters,
                         "keep": str(keep) if keep else None, "output_init": output_init})
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_child, "fast.experiments.table2:run_one", spec,
                               env=(avx512_env if spec.get("host_kernels") else child_env)(
                                   spec.get("threads", 1))): spec
                   for spec in todo}
        for done, future in enumerate(as_completed(futures), 1):
            spec, result = futures[future], future.result()
            if "error" in result:
                raise RuntimeError(f"table2: {spec['key']} seed {spec['seed']} "
                                   f"{result['error']}\n{result['output']}")
            r = result["result"]
            if drift:               # the same run, another summation order
                field = "drift_kernels" if spec.get("host_kernels") else "drift"
                data.setdefault(field, {})[spec["key"]] = {
                    k: r[k] for k in ("val_bits", "test_bits", "threads", "seed",
                                      "weights_sha256", "kernels")}
            else:
                data["runs"].setdefault(spec["key"], {})[str(spec["seed"])] = r
            data["summary"] = summarise(data["runs"])
            write_result(out, data)
            print(f"table2: [{done}/{len(todo)}, {time.perf_counter() - t0:.0f} s] "
                  f"{spec['key']} seed {spec['seed']}: test {r['test_bits']:.3f} {r['unit']}, "
                  f"{r['time_per_iter']:.3f} s/iter, {r['wall_s']:.0f} s", flush=True)
    if variant:
        return data
    if "timing" in (only or keys) and not drift and ("timing" not in data or force
                                                          or only):
        data["timing"] = time_paper_lengths(quick)
        write_result(out, data)
    for path in plot_table2.make_all(data, figdir, gpu_record(out)):
        print(f"table2: wrote {path}")
    return data


def gpu_record(out: Path) -> dict | None:
    """The GPU's time per iteration at the paper's shapes (``python -m fast train-time``:
    gpu_iteration_time.json beside table2.json), drawn beside the CPU's; None when absent."""
    return read_cache(Path(out).with_name("gpu_iteration_time.json"),
                      advice="run python -m fast train-time on a GPU to rewrite it")
