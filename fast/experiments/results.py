"""The README's result tables, written from the JSON that the figure scripts wrote.

Child et al., 2019: the attention speed targets (sec. 4.4 and 5.5, ``python -m
fast bench``), recomputation memory (sec. 5.4 and the blog's table, ``python -m
fast memory``), Table 2 (``python -m fast table2``) and Figure 2's per-layer
statistics (``python -m fast fig2``). Every number in the
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

from fast.core.schema import Map, Number, Optional, ShapeError, Tuple, check
from fast.experiments.cache import CacheError, read_cache
from fast.experiments.table2 import TIMING_ROW
from fast.plots.style import PATTERN_ORDER, display_name

GIB = 2.0 ** 30
CELLS = [f"{m}/{p}" for m in ("text", "image") for p in PATTERN_ORDER]
MACHINE = {"cpu": str, "cpu_count": int, "torch": str}
TARGETS = ("strided_fwd_speedup_16384", "strided_fb_speedup_16384", "fixed_fwd_speedup_16384",
           "fixed_fb_speedup_16384", "strided_fwd_slope_4096_65536",
           "strided_fb_slope_4096_65536", "strided_fb_peak_bytes_65536")
T2_RUN = {"test_bits": float, "steps": int, "model_cfg": {"n_ctx": int}}
FIG2_TRAIN = {"model_cfg": {"n_layers": int, "d_model": int, "n_heads": int}, "steps": int,
              "test_bits": float, "machine": Optional(MACHINE)}
FIG2_LAYER = {k: float for k in ("local_x", "rowcol_x", "min_entropy", "max_start",
                                 "max_data_dependence")} | {"layer": int, "labels": [str]}
# The file each section reads, and what it reads from it (``fast.core.schema``).
SHAPES = {
    "bench_cpu.json": {"machine": MACHINE, "targets": {"float32": {k: float for k in TARGETS}}},
    "memory.json": {"depth": {"n": int, "rows": [{"layers": int, "recompute": bool,
                                                  "saved_bytes": Number(lo=0)}]},
                    "big": {"layers": int, "n": int, "step": {"n_params": float},
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
    "make_figures.json": Map(object),
}
SHAPES["learned_attention_long.json"] = SHAPES["learned_attention.json"]


def bench_section(bench: dict) -> list[str]:
    m, t = bench["machine"], bench["targets"]["float32"]
    out = [f"Attention, `python -m fast bench` ({m['cpu']}, {m['cpu_count']} cores, torch "
           f"{m['torch']}; B=1, H=4, d=64, float32; times are the minimum over repetitions):", "",
           "| target | goal | measured |", "|---|---|---|"]
    rows = [
        ("strided l=128, n=16384, forward vs dense causal SDPA", ">= 12x",
         f"{t['strided_fwd_speedup_16384']:.1f}x"),
        ("strided l=128, n=16384, forward+backward", ">= 8x",
         f"{t['strided_fb_speedup_16384']:.1f}x"),
        ("fixed l=128 c=32, n=16384, forward", ">= 3x", f"{t['fixed_fwd_speedup_16384']:.2f}x"),
        ("fixed l=128 c=32, n=16384, forward+backward", "-", f"{t['fixed_fb_speedup_16384']:.2f}x"),
        ("strided time slope, n = 4096..65536 (fwd / fwd+bwd)", "<= 1.6",
         f"{t['strided_fwd_slope_4096_65536']:.2f} / {t['strided_fb_slope_4096_65536']:.2f}"),
        ("strided forward+backward peak memory, n=65536", "< 2 GB",
         f"{t['strided_fb_peak_bytes_65536'] / 1e9:.2f} GB"),
    ]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return out


def memory_section(mem: dict) -> list[str]:
    rows = {(r["layers"], r["recompute"]): r["saved_bytes"] for r in mem["depth"]["rows"]}
    deepest = max((layers for layers, _ in rows), default=None)
    if deepest is None or {(deepest, False), (deepest, True)} - set(rows) or not rows[
            (deepest, True)]:
        raise ShapeError(f"['depth']['rows'] holds no pair of runs of the deepest model "
                         f"({deepest} layers) with and without recomputation")
    kept, recomputed = rows[(deepest, False)], rows[(deepest, True)]
    big = mem["big"]
    return [
        "Recomputation, `python -m fast memory` (d=256, 4 heads, strided, float32, batch 1):",
        "",
        f"- {deepest} layers at n={mem['depth']['n']}: bytes saved for backward "
        f"{kept / GIB:.2f} GiB without recomputation, {recomputed / GIB:.3f} GiB with it: "
        f"**{kept / recomputed:.1f}x** less (goal >= 10x).",
        f"- {big['layers']} layers at n={big['n']} ({big['step']['n_params'] / 1e6:.0f}M "
        f"parameters): a training step with recomputation peaks at "
        f"{big['measured_peak_with'] / GIB:.1f} GiB on this "
        f"{big['machine_total_bytes'] / GIB:.0f} GiB machine; without it, the measured "
        f"{big['per_layer_without'] / 2**20:.0f} MiB per layer would need about "
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
    return (table2_bits(t2) + [""] + table2_orderings(t2) + [""] + table2_timing(t2) + [""]
            + timing_statements(t2))


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


def drift_section(t2: dict) -> list[str]:
    """Reproducibility: what is bitwise, and how far the bits moved when only the
    floating-point summation order changed (``python -m fast table2 --drift``)."""
    out = ["Reproducibility: every run draws all its randomness from its seed and uses a fixed "
           "number of intra-op threads (one per Table 2 run), so on the same CPU with the same "
           "library versions a rerun gives bitwise-equal weights and bits "
           "(`tests/fast/transformer/training/test_reproducibility.py` checks it on short "
           "trainings). The data each result saw are named by SHA-256 fingerprints in "
           "figures/data/table2.json."]
    drift = t2.get("drift", {})
    unknown = sorted(k for k in drift if "0" not in t2["runs"].get(k, {}))
    if unknown:
        raise ShapeError(f"['drift'] names {unknown}, which have no seed-0 run in ['runs']")
    if drift:
        moves = []
        for key, d in sorted(drift.items()):
            seeds = [r["test_bits"] for r in t2["runs"][key].values()]
            move = abs(d["test_bits"] - t2["runs"][key]["0"]["test_bits"])
            spread = f", seed std {np.std(seeds, ddof=1):.2g}" if len(seeds) > 1 else ""
            moves.append(f"{key} {move:.2g}{spread}")
        out.append(f"Changing only the summation order (seed 0 retrained with 2 threads instead of "
                   f"1, `--drift`) moved the test bits by: {'; '.join(moves)} (bits). A different "
                   f"CPU or library version changes the order the same way, so read differences "
                   f"between patterns against this and against the spread over seeds.")
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
           f"the head that departs most from uniform attention (local within {dense['window']} px "
           f"and row+column: share of the pixel mass as a multiple of uniform's; image entropy: "
           f"1 = uniform; data dependence: 0 = the same weights for every image):", "",
           "| layer | head labels | local | row+column | lowest entropy | start token, max "
           "| data dependence, max |", "|---|---|---|---|---|---|---|"]
    for r in dense["layers"]:
        out.append(f"| {r['layer']} | {', '.join(r['labels'])} | {r['local_x']:.1f}x "
                   f"| {r['rowcol_x']:.1f}x | {r['min_entropy']:.2f} | {r['max_start']:.2f} "
                   f"| {r['max_data_dependence']:.2f} |")
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


def report(data: Path) -> tuple[str, list[str]]:
    """(the markdown of every section whose JSON is in the folder ``data``, the names of
    the JSON files not there yet). A damaged file raises ``CacheError``, naming it."""
    sections = [("bench_cpu.json", bench_section), ("memory.json", memory_section),
                ("table2.json", lambda t2: table2_section(t2) + [""] + drift_section(t2)),
                ("learned_attention.json", fig2_section),
                ("learned_attention_long.json", lambda la: fig2_section(la, long=True)),
                ("make_figures.json", figures_section)]
    text, missing = [], []
    for name, section in sections:
        path = Path(data) / name
        payload = read_cache(path, SHAPES[name])
        if payload is None:
            missing.append(name)
            continue
        try:
            text.append("\n".join(section(payload)) + "\n")
        except ShapeError as err:                # what a shape alone cannot say
            raise CacheError(f"{path} does not hold what is read from it ({err}); allowed: "
                             f"a JSON file written by this project's scripts (delete it to "
                             f"have it recomputed)") from err
    return "\n".join(text), missing
