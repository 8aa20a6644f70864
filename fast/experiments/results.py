"""The README's result tables, written from the JSON that the figure scripts wrote.

Child et al., 2019: the attention speed targets (sec. 4.4 and 5.5, ``python -m
fast bench``), recomputation memory (sec. 5.4 and the blog's table, ``python -m
fast memory``), Table 2 (``python -m fast table2``) and where its training step's time
goes (``python -m fast table2 --profile``), Table 3 (``python -m fast table3``) and
Figure 2's per-layer statistics (``python -m fast fig2``), also against depth
(``python -m fast fig2 --depth``); and the GPU's records, each with its provenance (the
GPU, torch, Triton, the commit and the date it measured): the kernel variants at the
target point (figures/data/gpu_variants_h200.json, the first GPU run's numbers), the
benchmark (``python -m fast bench --device cuda``) and Table 2's time per iteration
(``python -m fast train-time``). ``gpu_results`` loads those three in one call (what
notebook 04 prints). Every number in the
README's "Results" section is written by ``report``, so it can be checked
against a fresh ``python -m fast figures``:

    python -m fast results            # markdown, from figures/data/*.json (fast.commands.results)

Every file is read through ``fast.experiments.cache.read_cache`` with the shape its
section uses (``SHAPES``; for table2.json, the keys of ``fast.experiments.table2``):
a damaged, empty or wrongly shaped file is one ``CacheError`` naming the file and the
place that does not fit, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fast.core.schema import Map, Number, OneOf, Optional, ShapeError, Tuple, check
from fast.experiments.bench import incomplete
from fast.experiments.cache import CacheError, read_cache
from fast.experiments.gpu_iteration_time import FLOOR, PAPER_S
from fast.experiments.paths import DATA
from fast.experiments.table2 import TIMING_ROW
from fast.experiments.table3 import standard_error, steps
from fast.measure.bench import gpu_targets
from fast.plots.style import PATTERN_ORDER, display_name

GIB = 2.0 ** 30
CELLS = [f"{m}/{p}" for m in ("text", "image") for p in PATTERN_ORDER]
MACHINE = {"cpu": str, "cpu_count": int, "torch": str}
TARGETS = ("strided_fwd_speedup_16384", "strided_fb_speedup_16384", "fixed_fwd_speedup_16384",
           "fixed_fb_speedup_16384", "strided_fwd_slope_4096_65536",
           "strided_fb_slope_4096_65536", "strided_fb_peak_bytes_65536")
T2_RUN = {"test_bits": float, "steps": int, "model_cfg": {"n_ctx": int}}
KEPT_T2 = "table2_160_steps.json"   # Table 2 when W_out = 0 was measured: kept, not rewritten
ZERO = "table2_zero_output.json"       # the W_out = 0 runs (``table2 --output-init zero``)
FIG2_TRAIN = {"model_cfg": {"n_layers": int, "d_model": int, "n_heads": int}, "steps": int,
              "test_bits": float, "machine": Optional(MACHINE)}
FIG2_LAYER = {k: float for k in ("local_x", "rowcol_x", "min_entropy", "max_start",
                                 "max_data_dependence")} | {"layer": int, "labels": [str]}
# The file each section reads, and what it reads from it (``fast.core.schema``).
SHAPES = {
    "bench_cpu.json": {"machine": MACHINE, "targets": {"float32": {k: float for k in TARGETS}}},
    "memory.json": {"depth": {"n": int, "rows": [{"layers": int, "recompute": bool,
                                                  "saved_bytes": Number(lo=0)}]}},
    "memory_big.json": {"big": {"layers": int, "n": int, "step": {"n_params": float},
                                "measured_peak_with": float, "machine_total_bytes": float,
                                "per_layer_without": float, "estimated_peak_without": float}},
    "table2.json": {"summary": {c: {"seeds": int, "test_bits": float, "test_bits_std": float,
                                    "time_per_iter": float} for c in CELLS},
                    "paper": {m: {p: Tuple(float, float) for p in PATTERN_ORDER}
                              for m in ("text", "image")},
                    "runs": {c: Map(T2_RUN) for c in CELLS}, "machine": str, "torch": str,
                    "text_eval_windows": int, "timing": Optional([TIMING_ROW]),
                    "drift": Optional(Map({"test_bits": float}))},
    "learned_attention.json": {"models": {"full": {"window": float, "layers": [FIG2_LAYER]}},
                               "train": FIG2_TRAIN, "images": str},
    ZERO: {"runs": Map(Map({"test_bits": float, "steps": int}))},
    "table2_profile.json": {
        "conditions": {"machine": str, "torch": str, "threads": int, "steps": int,
                       "warmup": int, "batches": [int],
                       "kernels": {"aten_cpu_capability": str}},
        "cells": Map({"phases": Map(float), "op_shares": {k: float for k in
                                                         ("attention", "matmul", "other")},
                      "op_calls": float, "dispatch_s": float, "eval_item_s": float,
                      "per_token_s": [float],
                      "compiled": Optional({"step_s": float, "eager_step_s": float,
                                            "compile_s": float}),
                      "dense_attention": Optional({"window": float, "sdpa": float})}),
        "dense_kernels": Optional([{k: Number(lo=0) for k in (
            "n", "d", "sdpa_fwd_s", "window_fwd_s", "sdpa_fb_s", "window_fb_s")}])},
    "table3.json": {"machine": str, "torch": str, "stretches": int, "stretch": int,
                    "dataset": str, "split": str, "paper": Map(float),
                    "models": Map({"n": int, "contexts": Map(
                        {"m": int, "fraction": float, "bits": float,
                         "paper_tokens": OneOf(int, None)})})},
    "learned_attention_depth.json": {
        "images": Optional(str),
        "train": Map({"test_bits": float, "steps": int, "machine": MACHINE,
                      "model_cfg": {"d_model": int, "n_heads": int},
                      "train_cfg": {"batch_size": int}}),
        "models": Optional(Map({"labels": [[str]], "layers": [
            {"layer": int, "row_x": float, "column_x": float, "rowcol_heads": [int]}]}))},
    "make_figures.json": Map(object),
}
SHAPES["learned_attention_long.json"] = SHAPES["learned_attention.json"]
# The GPU's records (present after a GPU run; never asked for by ``make figures``)
PROVENANCE = {"gpu": str, "torch": str, "triton": str, "commit": str, "date": str}
NUM = OneOf(float, None)
GPU_SHAPES = {
    "gpu_variants_h200.json": {
        "provenance": PROVENANCE,
        "point": {"B": int, "H": int, "n": int, "d": int, "dtype": str,
                  "patterns": Map(Map(int))},
        "harnesses": Map({"command": str}),
        "rows": [{"harness": str, "contender": str, "variant": OneOf(str, None),
                  "pattern": OneOf(str, None), "fwd_ms": float, "fb_ms": NUM}],
        "ideal": Map(float), "floor_ms": Map(Map(float)),
        "tests": {"passed": int, "failed": int, "variant_tests_passed": int,
                  "seconds": float, "failed_names": [str]}},
    "bench_cuda.json": {
        "provenance": Optional(PROVENANCE),
        "machine": {"gpu": str, "torch": str, "triton": OneOf(str, None)},
        "config": {"shapes": [[int]], "dtypes": [str], "default_variant": Optional(str),
                   "flex_peer": Optional(str)},
        "results": [{"contender": str, "pattern": OneOf(str, None), "dtype": str, "B": int,
                     "H": int, "n": int, "fwd_s": Optional(float), "fb_s": Optional(float)}]},
    "gpu_iteration_time.json": {
        "provenance": Optional(PROVENANCE),
        "machine": {"gpu": str, "torch": str},
        "config": {"batch": int, "warm": int, "steps": int},
        "rows": [{"shape": str, "pattern": str, "s_per_iter": float, "n": int, "d": int,
                  "heads": int, "layers": int, "syncs_per_step": OneOf(int, None)}]},
}
SHAPES.update(GPU_SHAPES)


def bench_section(bench: dict) -> list[str]:
    """The CPU targets: each speed-up beside its goal, the same point measured again in one
    long-lived process, the ideal that reading fewer keys allows and the ceiling of the
    pairs the CPU kernel computes (when the file has it); the time slope, the
    peak memory, and the backward / forward time of each contender."""
    m, t = bench["machine"], bench["targets"]["float32"]
    x = lambda v, f=".1f": "-" if v is None else f"{v:{f}}x"
    out = [f"Attention, `python -m fast bench` ({m['cpu']}, {m['cpu_count']} cores, torch "
           f"{m['torch']}; B=1, H=4, d=64, float32; a fresh process per point, times the "
           f"minimum over repetitions; the same n = 16384 points again in one long-lived "
           f"process, the median; the ideal: the (query, key) pairs dense causal attention "
           f"reads over those the pattern reads; the kernel ceiling: the pairs the CPU "
           f"flash kernel computes for dense attention over those the CPU kernels compute "
           f"for the pattern's pieces (the strided band and column, the fixed own block and "
           f"summaries: the project's window kernel), `fast.measure.kernel_pairs`):", "",
           "| target | goal | measured | one process | ideal (keys read) | kernel ceiling |",
           "|---|---|---|---|---|---|"]
    for pattern, label, goals, f in (("strided", "strided l=128", (">= 25x", ">= 18x"), ".1f"),
                                     ("fixed", "fixed l=128 c=32", (">= 3.5x", ">= 3.5x"),
                                      ".2f")):
        ideal = x(t.get(f"{pattern}_ideal_16384"), f)
        ceiling = x(t.get(f"{pattern}_kernel_ceiling_16384"), f)
        for what, name, goal in (("fwd", "forward", goals[0]),
                                 ("fb", "forward+backward", goals[1])):
            key = f"{pattern}_{what}_speedup_16384"
            out.append(f"| {label}, n=16384, {name} vs dense causal SDPA | {goal} | "
                       f"{x(t[key], f)} | {x(t.get(key + '_same_process'), f)} | {ideal} | "
                       f"{ceiling} |")
    slope = t.get("strided_keys_slope_4096_65536")
    keys_slope = "-" if slope is None else f"{slope:.2f}"
    out += [f"| strided time slope, n = 4096..65536 (fwd / fwd+bwd) | <= 1.35 (fwd+bwd) | "
            f"{t['strided_fwd_slope_4096_65536']:.2f} / {t['strided_fb_slope_4096_65536']:.2f} "
            f"| - | {keys_slope} (keys read, l fixed at 128) | - |",
            f"| strided forward+backward peak memory, n=65536 | < 2 GB ({2e9 / GIB:.2f} GiB) | "
            f"{t['strided_fb_peak_bytes_65536'] / GIB:.2f} GiB | - | - | - |"]
    ratios = [(name, t.get(f"{key}_bwd_over_fwd_16384"))
              for name, key in (("dense", "dense"), ("strided", "strided"), ("fixed", "fixed"))]
    if any(r is not None for _, r in ratios):
        out += ["", "Backward time over forward time at n = 16384 (a flash-style backward "
                    "recomputes the probabilities once: about 2.5x): "
                + ", ".join(f"{name} {r:.2f}" for name, r in ratios if r is not None) + "."]
    return out


def memory_section(mem: dict) -> list[str]:
    rows = {(r["layers"], r["recompute"]): r["saved_bytes"] for r in mem["depth"]["rows"]}
    deepest = max((layers for layers, _ in rows), default=None)
    if deepest is None or {(deepest, False), (deepest, True)} - set(rows) or not rows[
            (deepest, True)]:
        raise ShapeError(f"['depth']['rows'] holds no pair of runs of the deepest model "
                         f"({deepest} layers) with and without recomputation")
    kept, recomputed = rows[(deepest, False)], rows[(deepest, True)]
    return [
        "Recomputation, `python -m fast memory` (d=256, 4 heads, strided, float32, batch 1):",
        "",
        f"- {deepest} layers at n={mem['depth']['n']}: bytes saved for backward "
        f"{kept / GIB:.2f} GiB without recomputation, {recomputed / GIB:.3f} GiB with it: "
        f"**{kept / recomputed:.1f}x** less (goal >= 10x).",
    ]


def memory_big_section(record: dict) -> list[str]:
    big = record["big"]
    return [
        "At the paper's scale, `python -m fast memory --big` (the same model, deeper and longer):",
        "",
        f"- {big['layers']} layers at n={big['n']} ({big['step']['n_params'] / 1e6:.0f}M "
        f"parameters): a training step with recomputation peaks at "
        f"{big['measured_peak_with'] / GIB:.1f} GiB on this "
        f"{big['machine_total_bytes'] / GIB:.1f} GiB machine; without it, the measured "
        f"{big['per_layer_without'] / 2**20:.1f} MiB per layer would need about "
        f"{big['estimated_peak_without'] / GIB:.0f} GiB.",
    ]


def _ranking(cells: dict, modality: str, field: str) -> list[str]:
    return sorted(PATTERN_ORDER, key=lambda p: cells[f"{modality}/{p}"][field])


def _pair(runs: dict, modality: str, better: str, worse: str) -> str:
    """How sure an order is: the mean of the per-seed differences (same seed: same initial
    weights and batches), and in how many seeds the order holds."""
    a, b = runs[f"{modality}/{better}"], runs[f"{modality}/{worse}"]
    seeds = sorted(set(a) & set(b))
    diffs = [b[s]["test_bits"] - a[s]["test_bits"] for s in seeds]
    held = sum(d > 0 for d in diffs)
    sure = ("consistent in every seed" if held == len(diffs) > 1
            else "within the spread over seeds")
    return (f"{display_name(better)} below {display_name(worse)} by "
            f"{sum(diffs) / len(diffs):.3f} on average, in {held} of {len(diffs)} seeds "
            f"({sure})")


def table2_orderings(t2: dict) -> list[str]:
    """Per modality: our ordering by mean test bits, the paper's, and how sure each step is."""
    cells, paper, out = t2["summary"], t2["paper"], []
    for modality, name in (("text", "text"), ("image", "images")):
        ours = _ranking(cells, modality, "test_bits")
        theirs = sorted(PATTERN_ORDER, key=lambda p: paper[modality][p][0])
        named = " < ".join(map(display_name, theirs))
        verdict = "the paper's order" if ours == theirs else f"paper: {named}"
        pairs = "; ".join(_pair(t2["runs"], modality, a, b) for a, b in zip(ours, ours[1:]))
        out.append(f"- Ordering on {name}, lowest bits first: "
                   f"{' < '.join(map(display_name, ours))} ({verdict}). {pairs}.")
    return out


def paired(runs: dict, modality: str, lower: str, higher: str) -> list[float]:
    """Per seed both cells ran (same seed: same initial weights of the shared layers and the
    same batches), ``higher``'s test bits minus ``lower``'s: positive where ``lower`` is
    below, in the order of the seeds."""
    a, b = runs[f"{modality}/{lower}"], runs[f"{modality}/{higher}"]
    return [b[s]["test_bits"] - a[s]["test_bits"] for s in sorted(set(a) & set(b), key=int)]


def verdict(diffs: list[float]) -> str:
    """Whether an order whose per-seed margins are ``diffs`` holds: in every seed, in none
    (reversed in every seed), or in some only (not settled)."""
    held = sum(d > 0 for d in diffs)
    if held == len(diffs) > 1:
        return f"holds in all {len(diffs)} seeds"
    if held == 0 and len(diffs) > 1:
        return f"reversed in all {len(diffs)} seeds"
    return f"holds in {held} of {len(diffs)} seeds only (not settled)"


def paper_orderings(t2: dict) -> list[str]:
    """The paper's Table 2 orderings restated at this scale: per modality, each adjacent
    pair of the paper's order, the per-seed margins (paired), their mean and standard
    deviation over seeds, and whether the order holds in every seed; beside it the
    held-out estimate's own sampling error (the largest standard error of a cell's test
    bits over its windows or images, when the runs record it)."""
    out = []
    for modality, name in (("text", "text"), ("image", "images")):
        paper = t2["paper"][modality]
        order = sorted(PATTERN_ORDER, key=lambda p: paper[p][0])
        parts = []
        for lower, higher in zip(order, order[1:]):
            diffs = paired(t2["runs"], modality, lower, higher)
            std = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else 0.0
            parts.append(f"{display_name(lower)} < {display_name(higher)} "
                         f"(paper {paper[lower][0]:.2f} < {paper[higher][0]:.2f}) "
                         f"{verdict(diffs)}, {display_name(higher)} - {display_name(lower)} = "
                         f"{np.mean(diffs):+.3f} ± {std:.3f} (mean ± std over seeds; per seed "
                         + ", ".join(f"{d:+.3f}" for d in diffs) + ")")
        ses = [r["test_se"] for p in PATTERN_ORDER
               for r in t2["runs"][f"{modality}/{p}"].values() if "test_se" in r]
        sampling = (f"; a cell's test bits carry a sampling error of at most {max(ses):.3f} "
                    f"(one standard error over its held-out items, the same items for every "
                    f"pattern)" if ses else "")
        out.append(f"- The paper's order on {name}, "
                   f"{' < '.join(map(display_name, order))}: " + "; ".join(parts)
                   + sampling + ".")
    return out


def tokens_line(t2: dict) -> str:
    """How much every run trained: steps x batch x positions, per seed and cell."""
    parts = []
    for modality, what in (("text", "bytes"), ("image", "pixels")):
        run = next(iter(t2["runs"][f"{modality}/full"].values()))
        batch = run.get("train_cfg", {}).get("batch_size")
        if batch is None:
            continue
        n = run["model_cfg"]["n_ctx"]
        parts.append(f"{modality}: {run['steps']} steps of {batch} x {n} = "
                     f"{run['steps'] * batch * n:,} {what} per seed")
    return ("Each cell and seed trained on " + "; ".join(parts) + ".") if parts else ""


def cost_line(t2: dict) -> str:
    """What the runs cost in CPU seconds (each run's child process, training and held-out
    evaluation), and the wall time that makes on an idle machine running ``jobs`` of them
    at a time, plus the timing runs at the paper's lengths (one at a time): the budget of
    ``make figures``' Table 2 step, from what was measured (a shared machine inflates CPU
    seconds too: compare runs measured alike)."""
    runs = [r for by_seed in t2["runs"].values() for r in by_seed.values()]
    if not runs or any("cpu_s" not in r for r in runs):
        return ""
    cpu = sum(r["cpu_s"] for r in runs)
    train = sum(r.get("train_cpu_s", 0.0) for r in runs)
    steps = sum(r["steps"] for r in runs)
    timing = sum(sum(r.get("iter_times", [])) for r in t2.get("timing", []))
    jobs = t2.get("jobs", 2)
    per_step = (f", {1e3 * train / steps:.0f} ms of training per step on average"
                if train else "")
    return (f"The {len(runs)} runs took {cpu:,.0f} CPU seconds{per_step}; {jobs} at a time that "
            f"is about {(cpu / jobs + timing) / 60:.1f} minutes of an idle {jobs}-core "
            f"machine with the timing runs ({timing:.0f} s).")


def gpu_timing(gpu: dict | None) -> list[str]:
    """Table 2's time column measured on a GPU (figures/data/gpu_iteration_time.json, written
    by ``python -m fast train-time`` on a GPU machine, docs/gpu.md): per shape, each
    pattern's seconds per iteration relative to dense beside the paper's, and any other row
    (the attention-free floor, pattern "none") relative to dense too; or that it is
    missing."""
    if gpu is None:
        return ["- GPU: no measurement yet (figures/data/gpu_iteration_time.json is missing; "
                "`python -m fast train-time` on a GPU writes it, docs/gpu.md)."]
    check(gpu, {"machine": Map(object), "rows": [{"shape": str, "pattern": str,
                                                   "s_per_iter": Number(lo=0)}]})
    out = []
    device = gpu["machine"].get("device") or gpu["machine"].get("gpu") or "GPU"
    for shape in dict.fromkeys(r["shape"] for r in gpu["rows"]):
        rows = {r["pattern"]: r for r in gpu["rows"] if r["shape"] == shape}
        if "full" not in rows:
            continue
        dense, paper_dense = rows["full"]["s_per_iter"], rows["full"].get("paper_s_per_iter")
        parts = []
        for pattern, r in rows.items():
            paper = r.get("paper_s_per_iter")
            rel = r["s_per_iter"] / dense
            label = (display_name(pattern) if pattern in PATTERN_ORDER
                     else "no attention (the floor)" if pattern == "none" else pattern)
            parts.append(f"{label} "
                         f"{r['s_per_iter'] * 1e3:.1f} ms ({rel:.2f}x"
                         + (f"; paper {paper / paper_dense:.2f}x" if paper and paper_dense
                            else "") + ")")
        first = next(iter(rows.values()))
        out.append(f"- GPU ({device}), {shape} shape (n = {first.get('n', '?')}, batch "
                   f"{first.get('batch', '?')}): " + ", ".join(parts) + ".")
    return out


def timing_statements(t2: dict) -> list[str]:
    """Per modality, at the paper's length: each sparse pattern's step time relative to
    dense, beside the paper's ratio, and whether it is faster than dense as in the paper."""
    timing = {(r["modality"], r["pattern"]): r for r in t2.get("timing", [])}
    out = []
    for modality in ("text", "image"):
        if (modality, "full") not in timing:
            continue
        dense = timing[(modality, "full")]["time_per_iter"]
        paper = t2["paper"][modality]
        parts = []
        for p in ("fixed", "strided"):
            ours, theirs = timing[(modality, p)]["time_per_iter"] / dense, \
                paper[p][1] / paper["full"][1]
            parts.append(f"{display_name(p)} {ours:.2f}x (paper {theirs:.2f}x)")
        faster = all(timing[(modality, p)]["time_per_iter"] < dense for p in ("fixed", "strided"))
        out.append(f"- Step time at n = {timing[(modality, 'full')]['n']} ({modality}), relative "
                   f"to dense: {', '.join(parts)}: "
                   + ("both sparse patterns faster than dense, as in the paper."
                      if faster else "not both faster than dense, unlike the paper."))
    return out


def table2_section(t2: dict) -> list[str]:
    """Table 2: the bits (mean ± std over seeds, the paper's beside), the orderings and how
    sure each is, the time per iteration and what it says."""
    for key, runs in t2["runs"].items():
        if not runs:
            raise ShapeError(f"['runs'][{key!r}] holds no run")
    modalities = {r["modality"] for r in t2.get("timing", [])}
    have = {(r["modality"], r["pattern"]) for r in t2.get("timing", [])}
    missing = sorted(f"{m}/{p}" for m in modalities for p in PATTERN_ORDER if (m, p) not in have)
    if missing or any(r["time_per_iter"] <= 0 for r in t2.get("timing", [])):
        raise ShapeError(f"['timing'] lacks the rows {missing} or holds a time <= 0")
    tokens = " ".join(x for x in (tokens_line(t2), cost_line(t2)) if x)
    return (table2_bits(t2) + (["", tokens] if tokens else []) + [""] + table2_orderings(t2)
            + paper_orderings(t2) + [""] + table2_timing(t2) + [""] + timing_statements(t2))


def table2_bits(t2: dict) -> list[str]:
    cells, paper = t2["summary"], t2["paper"]
    seeds = min(c["seeds"] for c in cells.values())
    first = next(iter(next(iter(t2["runs"].values())).values()))
    out = [f"Table 2 at CPU scale, `python -m fast table2` ({t2['machine']}, torch {t2['torch']}; "
           f"{seeds} seeds per cell, mean ± standard deviation over seeds; the same "
           f"{first['steps']} steps, batch and schedule for every pattern, one thread per run; "
           f"held-out test bits: every test image, {t2['text_eval_windows']} evenly spread text "
           f"windows):", "",
           "| pattern | stdlib text, bits/byte | paper Enwik8 | photo crops, bits/dim "
           "| paper CIFAR-10 |",
           "|---|---|---|---|---|"]
    for p in PATTERN_ORDER:
        t, i = cells[f"text/{p}"], cells[f"image/{p}"]
        out.append(f"| {display_name(p)} | {t['test_bits']:.3f} ± {t['test_bits_std']:.3f} "
                   f"| {paper['text'][p][0]:.2f} "
                   f"| {i['test_bits']:.3f} ± {i['test_bits_std']:.3f} "
                   f"| {paper['image'][p][0]:.2f} |")
    return out


def table2_timing(t2: dict) -> list[str]:
    cells, paper = t2["summary"], t2["paper"]
    first_n = {m: next(iter(t2["runs"][f"{m}/full"].values()))["model_cfg"]["n_ctx"]
               for m in ("text", "image")}
    long_n = {r["modality"]: r["n"] for r in t2.get("timing", [])}
    out = ["Time per training iteration, relative to dense: the same runs (each run's median "
            "step, mean over seeds), then the same architecture at the paper's lengths (batch 1, "
            "one thread, alone); the paper's on their GPUs:", "",
            "| pattern | " + " | ".join(
                f"{m} n={first_n[m]}" for m in ("text", "image")) + " | "
            + " | ".join(f"{m} n={long_n.get(m, '-')}" for m in ("text", "image"))
            + " | paper Enwik8 | paper CIFAR-10 |",
            "|---|---|---|---|---|---|---|"]
    timing = {(r["modality"], r["pattern"]): r["time_per_iter"] for r in t2.get("timing", [])}
    ratio = lambda t, dense, digits: f"{t:.{digits}f} s ({t / dense:.2f}x)"
    for p in PATTERN_ORDER:
        row = [display_name(p)]
        for m in ("text", "image"):
            row.append(ratio(cells[f"{m}/{p}"]["time_per_iter"],
                             cells[f"{m}/full"]["time_per_iter"], 3))
        for m in ("text", "image"):
            row.append(ratio(timing[(m, p)], timing[(m, "full")], 2) if (m, p) in timing else "-")
        for m in ("text", "image"):
            row.append(ratio(paper[m][p][1], paper[m]["full"][1], 2))
        out.append("| " + " | ".join(row) + " |")
    return out


def _moves(t2: dict, twins: dict) -> str:
    """'key move, seed std s; ...': how far each seed-0 twin's test bits are from seed 0's."""
    moves = []
    for key, d in sorted(twins.items()):
        seeds = [r["test_bits"] for r in t2["runs"][key].values()]
        move = abs(d["test_bits"] - t2["runs"][key]["0"]["test_bits"])
        spread = f", seed std {np.std(seeds, ddof=1):.2g}" if len(seeds) > 1 else ""
        moves.append(f"{key} {move:.2g}{spread}")
    return "; ".join(moves)


def drift_section(t2: dict) -> list[str]:
    """Reproducibility: what is bitwise, and how far the bits moved when only the
    floating-point summation order changed (``python -m fast table2 --drift``): on two
    threads, and with an AVX-512 host's own kernels instead of the pinned AVX2 ones."""
    out = ["Reproducibility: every run draws all its randomness from its seed, uses a fixed "
           "number of intra-op threads (one per Table 2 run) and runs in a child process with "
           "PyTorch's and MKL's AVX2 kernels pinned (fast/experiments/reproducible.py), so with "
           "the same library versions a rerun gives bitwise-equal weights and bits on any x86 "
           "host with AVX2, with or without AVX-512, however many runs share the machine "
           "(`tests/fast/transformer/training/test_reproducibility.py` trains an image cell as "
           "on both kinds of host, two at a time, and compares the weights bitwise). Each run "
           "records its kernels and a digest of its weights, and the data it saw by SHA-256 "
           "fingerprints, in "
           "figures/data/table2.json."]
    drift = t2.get("drift", {})
    unknown = sorted(k for k in drift if "0" not in t2["runs"].get(k, {}))
    if unknown:
        raise ShapeError(f"['drift'] names {unknown}, which have no seed-0 run in ['runs']")
    if drift:
        out.append(f"Changing only the summation order (seed 0 retrained with 2 threads instead of "
                   f"1, `--drift`) moved the test bits by: {_moves(t2, drift)} (bits). A different "
                   f"CPU or library version changes the order the same way, so read differences "
                   f"between patterns against this and against the spread over seeds.")
    kernels = t2.get("drift_kernels", {})
    if kernels:
        out.append(f"Running seed 0 with an AVX-512 host's own kernels instead of the pinned AVX2 "
                   f"ones (what a run without the pin does there; `--drift` on such a host) moved "
                   f"the test bits by: {_moves(t2, kernels)} (bits).")
    return out


def fig2_section(la: dict, long: bool = False) -> list[str]:
    dense = la["models"]["full"]
    train = la["train"]
    if "machine" in train:
        check(train, {"threads": int, "wall_s": float, "cpu_s": float}, "['train']")
    cfg = train["model_cfg"]
    where = ""
    if "machine" in train:                 # a run behind a flag says where and how long it ran
        m = train["machine"]
        where = (f"; trained on {m['cpu']} ({m['cpu_count']} cores, {train['threads']} "
                 f"thread{'s' if train['threads'] > 1 else ''}, torch {m['torch']}) in "
                 f"{train['wall_s'] / 60:.0f} min wall, {train['cpu_s'] / 60:.0f} CPU min")
    command = "python -m fast fig2 --long" if long else "python -m fast fig2"
    out = [f"Figure 2, `{command}`: a dense model ({cfg['n_layers']} layers, "
           f"d={cfg['d_model']}, {cfg['n_heads']} heads, {train['steps']} steps, "
           f"{train['test_bits']:.3f} test bits/dim{where}) on {la['images']}; per layer, "
           f"the head that departs most from uniform attention, start sinks left out (local "
           f"within {dense['window']} px "
           f"and row+column: share of the pixel mass as a multiple of uniform's; image entropy: "
           f"1 = uniform; data dependence: 0 = the same weights for every image):", "",
           "| layer | the package's head labels | local | row+column | lowest entropy "
           "| start token, max | data dependence, max |", "|---|---|---|---|---|---|---|"]
    for r in dense["layers"]:
        out.append(f"| {r['layer']} | {', '.join(r['labels'])} | {r['local_x']:.1f}x "
                   f"| {r['rowcol_x']:.1f}x | {r['min_entropy']:.2f} | {r['max_start']:.2f} "
                   f"| {r['max_data_dependence']:.2f} |")
    return out


def _steps(record: dict, default=None):
    """The steps of a Table 2 record's first run."""
    return next(iter(next(iter(record["runs"].values())).values())).get("steps", default)


def output_init_lines(data: Path, zero: dict | None = None) -> list[str]:
    """The W_out = 0 section from the folder ``data``: the W_out = 0 runs
    (table2_zero_output.json, or ``zero`` where the caller has read it) against the drawn
    runs of Table 2 (table2.json) or, where Table 2 now trains another length, of
    ``KEPT_T2`` (``output_init_section``). What ``report`` prints, and the notebooks. A
    damaged file raises ``CacheError``."""
    def read(name, shape):
        return read_cache(Path(data) / name, shape, advice=f"run {WRITERS[name]} to rewrite it")

    drawn = {"runs": Map(Map(T2_RUN))}                 # what is read from the drawn runs
    if zero is None:
        zero = read(ZERO, SHAPES[ZERO])
    t2, kept = read("table2.json", drawn), read(KEPT_T2, drawn)
    if zero is None:
        return [f"Output layer at initialisation: no {ZERO} in {data} (run {WRITERS[ZERO]})."]
    return output_init_section(t2, zero, kept)


def output_init_section(t2: dict | None, zero: dict, kept: dict | None = None) -> list[str]:
    """W_out = 0 (sec. 6, ``table2 --output-init zero``) against the default drawn W_out: per
    cell measured, the mean per-seed change of the test bits (same seeds: same other
    weights and batches), in how many seeds it is worse, beside the spread over seeds. The
    drawn runs are Table 2's, or, where Table 2 now trains another length, ``kept``'s
    (``KEPT_T2``: Table 2's record as it stood when the W_out = 0 runs were made) if those
    are of the W_out = 0 runs' length. ``t2`` is None where Table 2 has not been run."""
    steps = _steps(zero)
    base = None if t2 is None else _steps(t2, steps)
    against = ""
    if steps != base and kept is not None and _steps(kept) == steps:
        t2, base = kept, steps
        against = f"; the drawn runs are Table 2's of that length, kept in figures/data/{KEPT_T2}"
    if steps != base:
        now = ("no Table 2 record (figures/data/table2.json) now" if t2 is None
               else f"Table 2 runs of {base} steps now")
        return [f"Output layer at initialisation (`python -m fast table2 --output-init zero`): "
                f"measured at {steps} steps (figures/data/{ZERO}), against {now}: not "
                f"comparable; rerun it to compare."]
    parts = []
    for key, by_seed in zero["runs"].items():
        drawn = t2["runs"][key]
        seeds = sorted(set(by_seed) & set(drawn))
        diffs = [by_seed[s]["test_bits"] - drawn[s]["test_bits"] for s in seeds]
        spread = np.std([drawn[s]["test_bits"] for s in drawn], ddof=1)
        parts.append(f"{key} {np.mean(diffs):+.3f} (worse in {sum(d > 0 for d in diffs)} of "
                     f"{len(diffs)} seeds; seed std {spread:.3f})")
    return [f"Output layer at initialisation (`python -m fast table2 --output-init zero`, "
            f"{steps} steps, the same seeds, batches and other initial weights{against}): "
            f"W_out = 0 as "
            f"sec. 6 says, instead of drawn like every other weight (the default), changed the "
            f"test bits by: {'; '.join(parts)}."]


def fig2_depth_section(d: dict) -> list[str]:
    """Figure 2 against depth: per model its bits, head labels and most row-like and
    column-like head, then the answer: whether, and from which depth, a head is labelled
    row or column by the rule."""
    models = {int(k): v for k, v in d.get("models", {}).items()}
    if not models:               # the trainings write the JSON before the models are measured
        return [f"Figure 2 against depth, `python -m fast fig2 --depth`: models of "
                f"{', '.join(sorted(d.get('train', {}), key=int))} layers trained, not measured "
                f"yet (run it again to measure them)."]
    first = d["train"][str(min(models))]
    cfg, tcfg = first["model_cfg"], first["train_cfg"]
    m = first["machine"]
    out = [f"Figure 2 against depth, `python -m fast fig2 --depth`: dense models of "
           f"{', '.join(map(str, sorted(models)))} layers (d={cfg['d_model']}, "
           f"{cfg['n_heads']} heads, {first['steps']} steps of batch {tcfg['batch_size']}, "
           f"one thread each, trained on {m['cpu']}, weights kept in figures/data/models) on "
           f"{d['images']}; per model, the labels of its heads (the rule of "
           f"fast.measure.attention_stats) and its most row-like and most column-like head: "
           f"the share of its pixel mass on the query's row (column) outside the local "
           f"window, as a multiple of uniform attention's share over the same pixels:", "",
           "| layers | test bits/dim | the package's head labels | row lift, max (layer) "
           "| column lift, max (layer) | row/column heads |", "|---|---|---|---|---|---|"]
    found = []
    for depth, s in sorted(models.items()):
        labels = [lab for layer in s["labels"] for lab in layer]
        counts = ", ".join(f"{lab} {labels.count(lab)}" for lab in dict.fromkeys(
            sorted(labels, key=lambda lab: -labels.count(lab))))
        row = max(s["layers"], key=lambda r: r["row_x"])
        col = max(s["layers"], key=lambda r: r["column_x"])
        heads = [(r["layer"], h) for r in s["layers"] for h in r["rowcol_heads"]]
        found += [(depth, layer) for layer, _ in heads]
        named = ", ".join(f"layer {layer} h{h} ({s['labels'][layer][h]})" for layer, h in heads)
        out.append(f"| {depth} | {d['train'][str(depth)]['test_bits']:.3f} | {counts} "
                   f"| {row['row_x']:.1f}x ({row['layer']}) | {col['column_x']:.1f}x "
                   f"({col['layer']}) | {named or 'none'} |")
    best = max(((depth, r) for depth, s in models.items() for r in s["layers"]),
               key=lambda dr: max(dr[1]["row_x"], dr[1]["column_x"]))
    if found:
        shallowest = min(depth for depth, _ in found)
        answer = (f"Row/column attention appears from the {shallowest}-layer model on: heads "
                  f"labelled row, column or row+column in "
                  + "; ".join(f"the {depth}-layer model's layers "
                              f"{', '.join(str(lay) for dep, lay in found if dep == depth)}"
                              for depth in sorted({dep for dep, _ in found})) + ".")
    else:
        answer = (f"No head of any depth is labelled row, column or row+column (most of its "
                  f"pixel mass there): row/column attention does not appear up to "
                  f"{max(models)} layers. The strongest lift is "
                  f"{max(best[1]['row_x'], best[1]['column_x']):.1f}x uniform's "
                  f"({'row' if best[1]['row_x'] >= best[1]['column_x'] else 'column'}, layer "
                  f"{best[1]['layer']} of the {best[0]}-layer model).")
    return out + ["", f"- {answer}"]


def table3_section(t3: dict) -> list[str]:
    """Table 3: bits per byte of each kept text model at every minimum context, the paper's
    beside, and per model the change from n / 2 to the largest context with its standard
    error over the stretches (paired) and whether the fall is monotonic."""
    models = t3["models"]
    patterns = [p for p in PATTERN_ORDER if p in models]
    n = models[patterns[0]]["n"]
    rows = {p: sorted(models[p]["contexts"].values(), key=lambda r: r["m"]) for p in patterns}
    out = [f"Table 3 at CPU scale, `python -m fast table3` ({t3['machine']}, torch "
           f"{t3['torch']}; Table 2's kept text models, seed 0, n = {n}; {t3['stretches']} "
           f"stretches of {t3['stretch']} bytes evenly spread over the {t3['dataset']} "
           f"{t3['split']} split, the same bytes at every minimum context m; sliding windows "
           f"of n bytes: a window scores its positions p >= m - 1, each byte predicted from at "
           f"least m bytes, and the next window starts n - m + 1 bytes later; the paper's "
           f"contexts mapped to the same fractions of n, rounded):", "",
           "| minimum context m | fraction of n | "
           + " | ".join(f"{display_name(p)}, bits/byte" for p in patterns)
           + " | paper: tokens of 12,288 | paper Enwik8 |",
           "|---|---|" + "---|" * len(patterns) + "---|---|"]
    for i, r in enumerate(rows[patterns[0]]):
        paper = t3["paper"].get(str(r["paper_tokens"])) if r["paper_tokens"] else None
        out.append(f"| {r['m']} | {r['fraction']:.3f} | "
                   + " | ".join(f"{rows[p][i]['bits']:.4f}" for p in patterns)
                   + (f" | {r['paper_tokens']:,} | {paper:.4f} |" if paper else " | - | - |"))
    out.append("")
    paper = sorted((int(k), v) for k, v in t3["paper"].items())
    for p in patterns:
        on_paper = [r for r in rows[p] if r["paper_tokens"]]
        change = steps(models[p]["contexts"])
        bits = [r["bits"] for r in on_paper]
        falls = all(b < a for a, b in zip(bits, bits[1:]))
        out.append(f"- {display_name(p)}: from m = {on_paper[0]['m']} to {on_paper[-1]['m']} "
                   f"the bits change by {np.mean(change):+.4f} ± {standard_error(change):.4f} "
                   f"(one standard error over the {len(change)} stretches, paired); "
                   + ("they fall at every step of the paper's contexts." if falls else
                      "they do not fall at every step of the paper's contexts."))
    out.append(f"- Paper: from {paper[0][0]:,} to {paper[-1][0]:,} tokens the bits change by "
               f"{paper[-1][1] - paper[0][1]:+.4f}, falling at every step.")
    return out


def profile_section(prof: dict) -> list[str]:
    """Where a Table 2 training step's time goes (``python -m fast table2 --profile``)."""
    c = prof["conditions"]
    out = [f"Where a Table 2 training step's time goes, `python -m fast table2 --profile` "
           f"({c['machine']}, torch {c['torch']}, {c['threads']} thread, kernels "
           f"{c['kernels']['aten_cpu_capability']}; CPU seconds, median of {c['steps']} steps "
           f"after {c['warmup']} warm-up steps; shares of the operators' own time from "
           f"torch.profiler):", "",
           "| cell | step | forward | backward | optimizer | clip | data | attention | matmul "
           "| other ops | op calls | dispatch, est. | eval per item | per token at batch "
           + " / ".join(str(b) for b in c["batches"]) + " | step, host's own kernels "
           "| compiled step / eager (compiling) | dense: window kernel / SDPA step |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in prof["cells"].items():
        ph, ops = r["phases"], r["op_shares"]
        step = sum(ph.values())
        out.append(f"| {key} | {step * 1e3:.0f} ms | " + " | ".join(
            f"{100 * ph[k] / step:.1f}%" for k in ("forward", "backward", "optimizer", "clip",
                                                 "data"))
            + " | " + " | ".join(f"{100 * ops[k]:.0f}%" for k in ("attention", "matmul",
                                                                   "other"))
            + f" | {r['op_calls']:.0f} | {100 * r['dispatch_s'] / step:.0f}% "
            f"| {r['eval_item_s'] * 1e3:.1f} ms | "
            + " / ".join(f"{t * 1e6:.0f} us" for t in r["per_token_s"])
            + (f" | {sum(r['host_kernels']['phases'].values()) * 1e3:.0f} ms "
               f"({r['host_kernels']['kernels']['aten_cpu_capability']})"
               if "host_kernels" in r else " | -")
            + (f" | {r['compiled']['step_s'] / r['compiled']['eager_step_s']:.2f}x "
               f"({r['compiled']['compile_s']:.0f} CPU s)" if "compiled" in r else " | -")
            + (f" | {r['dense_attention']['window'] * 1e3:.0f} / "
               f"{r['dense_attention']['sdpa'] * 1e3:.0f} ms "
               f"({r['dense_attention']['window'] / r['dense_attention']['sdpa']:.2f}x) |"
               if "dense_attention" in r else " | - |"))
    if prof.get("dense_kernels"):
        out += ["", "Dense causal attention, the window kernel against SDPA (fast/measure/"
                    "dense_kernels.py: 4 heads, B H n = 16384 rows, one thread, in turns, CPU "
                    "seconds, the fastest of the rounds; window / SDPA below 1: the window "
                    "kernel is faster; `fast.backends.structured.dense_window` takes it for "
                    "heads of width <= 16 at n = 256..1024):", "",
                "| n | head width | forward: SDPA | window | window / SDPA "
                "| forward+backward: SDPA | window | window / SDPA |",
                "|---|---|---|---|---|---|---|---|"]
        for r in prof["dense_kernels"]:
            out.append(f"| {r['n']} | {r['d']} | {r['sdpa_fwd_s'] * 1e3:.1f} ms "
                       f"| {r['window_fwd_s'] * 1e3:.1f} ms "
                       f"| {r['window_fwd_s'] / r['sdpa_fwd_s']:.2f} "
                       f"| {r['sdpa_fb_s'] * 1e3:.1f} ms | {r['window_fb_s'] * 1e3:.1f} ms "
                       f"| {r['window_fb_s'] / r['sdpa_fb_s']:.2f} |")
    return out


def figures_section(log: dict) -> list[str]:
    steps = log.get("steps", log)
    check(steps, Map(object), "['steps']")
    for name, info in steps.items():
        if isinstance(info, dict) and "seconds" in info:
            check(info["seconds"], float, f"['steps'][{name!r}]['seconds']")
    parts = [f"{name} {info['seconds'] / 60:.1f} min" for name, info in steps.items()
             if isinstance(info, dict) and "seconds" in info]
    return ["`make figures` steps: " + ", ".join(parts) + "."] if parts else []


def _provenance(record: dict) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, main at 81a3fc0, 2026-11-28' (the
    record's provenance, else its machine)."""
    p = record.get("provenance") or {}
    m = record.get("machine", {})
    words = [p.get("gpu") or m.get("gpu"), f"torch {p.get('torch') or m.get('torch')}"]
    triton = p.get("triton") or m.get("triton")
    if triton:
        words.append(f"Triton {triton}")
    if p.get("commit"):
        words.append(f"main at {p['commit']}")
    if p.get("date"):
        words.append(p["date"])
    return ", ".join(w for w in words if w)


def gpu_variants_section(v: dict) -> list[str]:
    """The kernel variants at the target point, both harnesses side by side: each
    contender's time and speed-up over dense causal SDPA timed by the same harness."""
    pt = v["point"]
    rows = v["rows"]
    names = list(dict.fromkeys((r["contender"], r["variant"]) for r in rows
                               if r["contender"] != "dense"))

    def cell(harness, name, variant, pattern, what):
        r = next((r for r in rows if (r["harness"], r["contender"], r["variant"]) ==
                  (harness, name, variant) and r["pattern"] == pattern
                  and r.get(what) is not None), None)
        d = next((r for r in rows if (r["harness"], r["contender"]) == (harness, "dense")
                  and r["pattern"] in (pattern, None) and r.get(what) is not None), None)
        if r is None or d is None:
            return "-"
        return f"{r[what]:.3f} ms ({d[what] / r[what]:.2f}x)"

    t = v["tests"]
    out = [f"Kernel variants on a GPU ({_provenance(v)}; {pt['dtype']}, B={pt['B']}, "
           f"H={pt['H']}, n={pt['n']}, d={pt['d']}; strided l=128, fixed l=128 c=32; each "
           f"cell: time and speed-up over dense causal SDPA timed by the same harness, the "
           f"variant sweep's CUDA-event medians / triton.testing.do_bench medians; `-`: not "
           f"reached):", "",
           "| contender | strided fwd, sweep | strided fwd, do_bench | strided fwd+bwd, sweep "
           "| strided fwd+bwd, do_bench | fixed fwd, do_bench |", "|---|---|---|---|---|---|"]
    dense = {h: {(r["pattern"] or "any", w): r.get(w) for r in rows if r["harness"] == h
                 and r["contender"] == "dense" for w in ("fwd_ms", "fb_ms")}
             for h in ("sweep", "do_bench")}
    out.append("| dense causal SDPA | " + " | ".join(
        "-" if x is None else f"{x:.3f} ms" for x in (
            dense["sweep"].get(("any", "fwd_ms")), dense["do_bench"].get(("strided", "fwd_ms")),
            dense["sweep"].get(("any", "fb_ms")), dense["do_bench"].get(("strided", "fb_ms")),
            dense["do_bench"].get(("fixed", "fwd_ms")))) + " |")
    for name, variant in names:
        label = f"{name} ({variant})" if variant else name
        out.append(f"| {label} | " + " | ".join(
            cell(h, name, variant, pattern, what) for h, pattern, what in (
                ("sweep", "strided", "fwd_ms"), ("do_bench", "strided", "fwd_ms"),
                ("sweep", "strided", "fb_ms"), ("do_bench", "strided", "fb_ms"),
                ("do_bench", "fixed", "fwd_ms"))) + " |")
    ideal = ", ".join(f"{p} {x:.3g}x" for p, x in v["ideal"].items())
    floor = ", ".join(f"{p} fwd {f['fwd']:.3f} ms, fwd+bwd {f['fb']:.3f} ms"
                      for p, f in v["floor_ms"].items())
    out += ["", f"- Tile-count ideal: {ideal}; the benchmark's floor: {floor}.",
            f"- The gpu tests on that machine: {t['passed']} passed, {t['failed']} failed "
            f"({t['variant_tests_passed']} kernel-variant tests among the passed) in "
            f"{t['seconds']:.0f} s; the failures counted host waits in a training step."]
    return out


def gpu_bench_section(b: dict) -> list[str]:
    """The GPU benchmark: per (B, H) the speed-up of the Triton kernel and FlexAttention
    over dense causal SDPA at every n measured (float16), then the targets."""
    c = b["config"]
    rows = [r for r in b["results"] if r["dtype"] == "float16" and "skipped" not in r]
    peer = ("its first FlexAttention peer (dynamic shapes, about 4x slower than "
            "flex_sparse_attention)" if c.get("flex_peer") == "first peer"
            else "FlexAttention as flex_sparse_attention runs it")
    out = [f"Attention on a GPU, `python -m fast bench --device cuda` ({_provenance(b)}; "
           f"float16, d=64, kernel variant {c.get('default_variant', '?')}, {peer}; "
           f"speed-up over dense causal SDPA, forward / forward+backward; `-`: not "
           f"measured):"]

    def sp(name, pattern, n, B, H, what):
        r = next((r for r in rows if (r["contender"], r["pattern"], r["n"], r["B"], r["H"]) ==
                  (name, pattern, n, B, H) and r.get(what, {}).get("speedup")), None)
        return "-" if r is None else f"{r[what]['speedup']:.2f}x"

    for B, H in c["shapes"]:
        ns = sorted({r["n"] for r in rows if (r["B"], r["H"]) == (B, H)})
        if not ns:
            continue
        out += ["", f"| B={B}, H={H}: n | dense fwd / fwd+bwd | Triton strided | Triton fixed "
                    f"| FlexAttention strided | FlexAttention fixed |", "|---|---|---|---|---|---|"]
        for n in ns:
            d = next((r for r in rows if (r["contender"], r["n"], r["B"], r["H"]) ==
                      ("dense", n, B, H)), {})
            dense = " / ".join("-" if not d.get(k) else f"{d[k] * 1e3:.3f} ms"
                               for k in ("fwd_s", "fb_s"))
            cells = [" / ".join(sp(name, p, n, B, H, w) for w in ("fwd", "fb"))
                     for name, p in (("triton block-sparse", "strided"),
                                     ("triton block-sparse", "fixed"), ("flex", "strided"),
                                     ("flex", "fixed"))]
            out.append(f"| {n} | {dense} | " + " | ".join(cells) + " |")
    out.append("")
    for B, H in c["shapes"]:
        spans = []
        for pattern in ("strided", "fixed"):
            for key, what in (("fwd_s", "forward"), ("fb_s", "forward+backward")):
                ts = [r[key] * 1e3 for r in rows if (r["contender"], r["pattern"], r["B"],
                      r["H"]) == ("triton block-sparse", pattern, B, H) and r.get(key)]
                if ts:
                    spans.append(f"{pattern} {what} {min(ts):.2f}-{max(ts):.2f} ms")
        ns = sorted({r["n"] for r in rows if (r["B"], r["H"]) == (B, H)})
        if spans:
            out.append(f"- Triton at B={B}, H={H}, n = {ns[0]} .. {ns[-1]}: "
                       + ", ".join(spans) + ".")
    targets = gpu_targets(b["results"])
    met = [k for k, g in targets.items() if g["speedup"] is not None and g["speedup"] >= g["goal"]]
    missed = [f"{k} {g['speedup']:.2f}x (goal {g['goal']:g}x)" for k, g in targets.items()
              if g["speedup"] is not None and g["speedup"] < g["goal"]]
    unmeasured = [k for k, g in targets.items() if g["speedup"] is None]
    out += [f"- Targets met: {len(met)} of {len(targets)}"
            + (f" ({'; '.join(met)})" if met else "") + ".",
            "- Missed: " + ("; ".join(missed) or "none") + ".",
            "- Not measured in this record: " + ("; ".join(unmeasured) or "none") + "."]
    return out


def gpu_train_time_section(t: dict) -> list[str]:
    """Table 2's time per iteration on a GPU: each row against dense and against the
    attention-free floor where the record has it; how much of the paper's speed-up is
    attainable now."""
    c = t["config"]
    rows = t["rows"]
    out = [f"Table 2's time per iteration on a GPU, `python -m fast train-time` "
           f"({_provenance(t)}; batch {c['batch']}, {c['warm']} warm-up and {c['steps']} "
           f"timed steps, the median; fp16 autocast with loss scaling, recomputation, "
           f"AdamW; merged heads; `-`: not measured):", "",
           "| shape | row | ms per iteration | vs dense | above the attention-free floor "
           "| host waits per step | paper: s per iteration (vs dense) |",
           "|---|---|---|---|---|---|---|"]
    notes = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        sel = {r["pattern"]: r for r in rows if r["shape"] == shape}
        dense, floor = sel.get("full"), sel.get(FLOOR)
        paper = PAPER_S.get(shape, {})
        for pattern in (FLOOR, "full", "fixed", "strided"):
            r = sel.get(pattern)
            if r is None:
                continue
            s = r["s_per_iter"]
            vs = f"{dense['s_per_iter'] / s:.2f}x" if dense and pattern not in (
                "full", FLOOR) else "-"
            above = f"{(s - floor['s_per_iter']) * 1e3:.1f} ms" if floor and pattern != FLOOR \
                else "-"
            p = paper.get(pattern)
            paper_cell = "-" if p is None else (
                f"{p} s" + (f" ({paper['full'] / p:.2f}x)" if pattern != "full" else ""))
            waits = "-" if r["syncs_per_step"] is None else str(r["syncs_per_step"])
            name = "attention-free (floor)" if pattern == FLOOR else pattern
            out.append(f"| {shape} (n={r['n']}, d={r['d']}, {r['heads']} heads, {r['layers']} "
                       f"layers) | {name} | {s * 1e3:.1f} | {vs} | {above} | {waits} | "
                       f"{paper_cell} |")
        if dense is None:
            continue
        d = dense["s_per_iter"]
        for pattern in ("fixed", "strided"):
            if pattern not in paper or pattern not in sel:
                continue
            ratio = paper["full"] / paper[pattern]
            need = d / ratio
            got = d / sel[pattern]["s_per_iter"]
            line = (f"- {shape}, {pattern}: {got:.2f}x dense here, the paper's {ratio:.2f}x. "
                    f"Even with its attention at no cost a step is {ratio:.2f}x faster than "
                    f"dense only if the rest of it (the attention-free floor) takes at most "
                    f"{need * 1e3:.1f} ms ({need / d:.0%} of dense's {d * 1e3:.1f} ms)")
            if floor is not None:
                f = floor["s_per_iter"]
                line += (f"; it takes {f * 1e3:.1f} ms (the floor): at most {d / f:.2f}x is "
                         f"attainable now, {'enough' if d / f >= ratio else 'short of it'}.")
            else:
                line += ("; this record has no attention-free row to say whether it does "
                         "(`python -m fast train-time` measures it).")
            notes.append(line)
    said = (t.get("provenance") or {}).get("waits")
    if said:
        notes.append(f"- Host waits: {said}.")
    return out + ([""] + notes if notes else [])


def gpu_results(data: Path = DATA) -> dict:
    """The GPU's records in figures/data, loaded and shape-checked in one call: {"variants":
    gpu_variants_h200.json, "bench": bench_cuda.json, "train_time": gpu_iteration_time.json}
    (None for a file not there), and "text": their sections as ``python -m fast results``
    prints them. A damaged file raises ``CacheError``."""
    out = {}
    for key, name, section in (("variants", "gpu_variants_h200.json", gpu_variants_section),
                               ("bench", "bench_cuda.json", gpu_bench_section),
                               ("train_time", "gpu_iteration_time.json",
                                gpu_train_time_section)):
        out[key] = read_cache(Path(data) / name, SHAPES[name],
                              advice=f"run {WRITERS[name]} to rewrite it")
        out.setdefault("sections", []).append(
            None if out[key] is None else "\n".join(section(out[key])))
    out["text"] = "\n\n".join(s for s in out.pop("sections") if s)
    return out


# The command that writes each file: the way to produce or replace it (results computes
# nothing).
WRITERS = {"bench_cpu.json": "python -m fast bench", "memory.json": "python -m fast memory",
           "memory_big.json": "python -m fast memory --big",
           "table2.json": "python -m fast table2",
           ZERO: "python -m fast table2 --output-init zero",
           "table2_profile.json": "python -m fast table2 --profile",
           "table3.json": "python -m fast table3", "learned_attention.json": "python -m fast fig2",
           "learned_attention_long.json": "python -m fast fig2 --long",
           "learned_attention_depth.json": "python -m fast fig2 --depth",
           "make_figures.json": "python -m fast figures",
           KEPT_T2: f"git checkout figures/data/{KEPT_T2} (Table 2's record when the "
                    f"W_out = 0 runs were made; no command writes it)",
           "gpu_variants_h200.json": "git checkout figures/data/gpu_variants_h200.json (a "
                                     "record of the first GPU run; a new run writes "
                                     "data/bench_cuda_variants.json)",
           "bench_cuda.json": "python -m fast bench --device cuda",
           "gpu_iteration_time.json": "python -m fast train-time"}


def bench_lacks(bench: dict) -> str | None:
    """What a bench record from a valid sweep lacks for the targets' table (its float32
    sweep, or the n the targets are measured at), in words ending in how to produce it;
    None when it has all of it."""
    if incomplete(bench):
        return incomplete(bench)
    config, t = bench.get("config"), bench.get("targets")
    if not isinstance(config, dict) or not isinstance(t, dict):
        return None                     # not a bench record: its shape check says why
    if "float32" not in config.get("dtypes", ["float32"]):
        return (f"its sweep has no float32 (--dtypes {' '.join(config['dtypes'])}); needs "
                f"float32 in the sweep: run python -m fast bench (float32 is the CPU's "
                f"default)")
    t = t.get("float32")
    # a valid sweep without the targets' n records them as None (absent: damaged)
    absent = [k for k in TARGETS if isinstance(t, dict) and k in t and t[k] is None]
    if not absent:
        return None
    ns = config.get("ns") or []
    swept = f"n = {min(ns)} .. {max(ns)}" if ns else "no n"
    return (f"its sweep ({swept}) measured none of {', '.join(absent)}; needs n = 16384 "
            f"and n = 4096 .. 65536 in the sweep: run python -m fast bench (its default "
            f"sweep, n = 1024 .. 65536)")


LACKS = {"bench_cpu.json": bench_lacks}


def report(data: Path) -> tuple[str, list[str], list[str]]:
    """(the markdown of every section whose JSON is in the folder ``data`` and holds what
    it needs, the names of the JSON files not there yet, one line per file that is there
    but lacks what its section needs: which file, what it lacks, how to produce it). A
    damaged file raises ``CacheError``, naming it and the command that rewrites it."""
    sections = [("bench_cpu.json", bench_section), ("memory.json", memory_section),
                ("memory_big.json", memory_big_section),
                ("table2.json", lambda t2: table2_section(t2) + gpu_timing(read_cache(
                    Path(data) / "gpu_iteration_time.json")) + [""] + drift_section(t2)),
                (ZERO, lambda zero: output_init_lines(data, zero)),   # and the drawn runs
                ("table2_profile.json", profile_section),
                ("table3.json", table3_section),
                ("learned_attention.json", fig2_section),
                ("learned_attention_long.json", lambda la: fig2_section(la, long=True)),
                ("learned_attention_depth.json", fig2_depth_section),
                ("make_figures.json", figures_section),
                ("gpu_variants_h200.json", gpu_variants_section),
                ("bench_cuda.json", gpu_bench_section),
                ("gpu_iteration_time.json", gpu_train_time_section)]
    text, missing, lacking = [], [], []
    for name, section in sections:
        path = Path(data) / name
        advice = f"run {WRITERS[name]} to rewrite it"
        if name in LACKS:               # a valid record that cannot fill its section
            raw = read_cache(path, advice=advice)
            why = None if raw is None else LACKS[name](raw)
            if why is not None:
                lacking.append(f"{path}: no section: {why}")
                continue
        payload = read_cache(path, SHAPES[name], advice=advice)
        if payload is None:
            if name not in GPU_SHAPES:          # a GPU record is there after a GPU run only
                missing.append(name)
            continue
        try:
            text.append("\n".join(section(payload)) + "\n")
        except ShapeError as err:                # what a shape alone cannot say
            raise CacheError(f"{path} does not hold what is read from it ({err}); allowed: "
                             f"a JSON file written by this project's scripts ({advice})"
                             ) from err
    return "\n".join(text), missing, lacking
