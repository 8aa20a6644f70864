"""Figures of the dense / fixed / strided comparison (Child et al., 2019, Table 2).

From figures/data/table2.json (``python -m fast table2``), every cell trained
with several seeds:

* ``plot_bits``    -- held-out test bits per pattern, mean and standard deviation
  over seeds with every seed as a dot, beside the paper's numbers;
* ``plot_curves``  -- learning curves: validation bits against step, the mean
  over seeds as a line and the range over seeds as a band;
* ``plot_timing``  -- time per iteration relative to dense at the paper's sequence
  lengths, one panel per modality: the paper's GPUs, this architecture on the CPU
  (the ``timing`` record), and a GPU at the paper's shapes when its record
  (figures/data/gpu_iteration_time.json, ``python -m fast train-time``) is given.
  The Table 2 runs' own steps, at their short lengths, are not drawn: their times
  are printed with the record of the runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fast.plots import style
from fast.plots.style import PATTERN_ORDER, display_name, plt

MODALITY_TITLES = {"text": "stdlib bytes, n = 512 (bits per byte)",
                   "image": "16x16 grey photo crops, n = 256 (bits per dim)"}


def _seeds(data: dict, key: str) -> list[dict]:
    return list(data["runs"].get(key, {}).values())


def plot_bits(data: dict, path) -> Path:
    """Test bits per pattern: every seed (dots), mean +/- std (bar), paper beside (text)."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    for ax, modality in zip(axes, ("text", "image")):
        lows = []
        for x, pattern in enumerate(PATTERN_ORDER):
            bits = [r["test_bits"] for r in _seeds(data, f"{modality}/{pattern}")]
            if not bits:
                continue
            mean, std = np.mean(bits), (np.std(bits, ddof=1) if len(bits) > 1 else 0.0)
            ax.errorbar(x, mean, yerr=std, fmt="s", ms=8, capsize=6, color=style.color(pattern))
            ax.plot(np.full(len(bits), x + 0.18), bits, "o", ms=4, alpha=0.6,
                    color=style.color(pattern))
            # right-aligned, ending clear of the error bar's caps (6 points either side)
            ax.annotate(f"{mean:.3f} ± {std:.3f}\npaper {data['paper'][modality][pattern][0]:.2f}",
                        (x, mean), xytext=(-11, 0), textcoords="offset points", fontsize=7.5,
                        va="center", ha="right")
            lows.append(mean - std)
        ax.set_xticks(range(len(PATTERN_ORDER)), [display_name(p) for p in PATTERN_ORDER])
        ax.set_xlim(-1.0, len(PATTERN_ORDER) - 0.5)
        ax.set_title(MODALITY_TITLES[modality], fontsize=9)
        ax.set_ylabel("held-out test bits (lower is better)")
        ax.grid(alpha=0.3, axis="y")
    seeds = max(len(v) for v in data["runs"].values())
    fig.suptitle(f"Table 2 at CPU scale: test bits, {seeds} seeds per pattern "
                 f"(square: mean ± std; dots: seeds)", fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


def plot_curves(data: dict, path) -> Path:
    """Validation bits against step: mean over seeds (line), range over seeds (band)."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for ax, modality in zip(axes, ("text", "image")):
        highs, lows = [], []                 # every plotted mean and band lies between them
        for pattern in PATTERN_ORDER:
            runs = _seeds(data, f"{modality}/{pattern}")
            if not runs:
                continue
            steps = [e["step"] for e in runs[0]["evals"]]
            vals = np.array([[e["val"] for e in r["evals"]] for r in runs])    # (seeds, evals)
            ax.plot(steps, vals.mean(0), "o-", ms=3, color=style.color(pattern),
                    label=f"{display_name(pattern)} ({len(runs)} seeds)")
            ax.fill_between(steps, vals.min(0), vals.max(0), color=style.color(pattern),
                            alpha=0.2, lw=0)
            highs.append(vals.max())
            lows.append(vals.min())
        ax.set_title(MODALITY_TITLES[modality], fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("validation bits (evenly spread sample)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if highs:
            pad = 0.04 * (max(highs) - min(lows)) + 0.02
            ax.set_ylim(min(lows) - pad, max(highs) + pad)
    fig.suptitle("Table 2 at CPU scale: learning curves (line: mean over seeds; band: range)",
                 fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


# the GPU record's shape name for each modality's paper dataset
# (fast.experiments.gpu_iteration_time)
GPU_SHAPE_OF = {"text": "enwik8", "image": "cifar10"}


def gpu_times(gpu: dict | None, modality: str) -> dict:
    """{pattern: seconds per iteration} of one modality's paper shape in a GPU record
    (figures/data/gpu_iteration_time.json), or {} when it has no complete row set."""
    rows = {r["pattern"]: r["s_per_iter"] for r in (gpu or {}).get("rows", [])
            if r.get("shape") == GPU_SHAPE_OF[modality] and r.get("s_per_iter")}
    return rows if all(p in rows for p in PATTERN_ORDER) else {}


def _bars(ax, groups: list[tuple[str, dict]]):
    """groups: (label, {pattern: time}); bars relative to dense, each ratio written on it."""
    width = 0.26
    for g, (_, times) in enumerate(groups):
        dense = times["full"]
        for i, pattern in enumerate(PATTERN_ORDER):
            x, ratio = g + (i - 1) * width, times[pattern] / dense
            ax.bar(x, ratio, width, color=style.color(pattern),
                   label=display_name(pattern) if g == 0 else None)
            ax.text(x, ratio + 0.03, f"{ratio:.2f}", ha="center", fontsize=7, va="bottom")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_ylim(0, 1.45)


def plot_timing(data: dict, path, gpu: dict | None = None) -> Path:
    """Time per iteration relative to dense at the paper's lengths: one panel per modality,
    the paper's GPUs, this architecture on the CPU, and the GPU of ``gpu`` when given."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6), sharey=True)
    rows = data.get("timing", [])
    gpu_name = ((gpu or {}).get("machine") or {}).get("gpu", "GPU")
    for ax, modality in zip(axes, ("text", "image")):
        paper = data["paper"][modality]
        groups = [("paper, its GPUs", {p: paper[p][1] for p in PATTERN_ORDER})]
        cpu = {r["pattern"]: r["time_per_iter"] for r in rows if r["modality"] == modality}
        if all(p in cpu for p in PATTERN_ORDER):
            groups.append(("this CPU", cpu))
        if gpu_times(gpu, modality):
            groups.append((gpu_name, gpu_times(gpu, modality)))
        _bars(ax, groups)
        ax.set_title(f"{modality}: paper {paper['dataset'].split()[0]}, n = {paper['n']:,}",
                     fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("time per iteration / dense")
    axes[0].legend(fontsize=7.5, loc="upper right")
    fig.suptitle("time per training step relative to dense, at the paper's sequence lengths "
                 "(below 1: faster than dense)", fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


def make_all(data: dict, figdir, gpu: dict | None = None) -> list[Path]:
    """Every Table 2 figure that the data allows (``gpu``: the GPU's time per iteration
    record, drawn beside the CPU's); returns the paths written."""
    figdir = Path(figdir)
    paths = []
    if data.get("runs"):
        paths.append(plot_bits(data, figdir / "table2_bits.png"))
        paths.append(plot_curves(data, figdir / "table2_curves.png"))
    if data.get("timing") or gpu_times(gpu, "text") or gpu_times(gpu, "image"):
        paths.append(plot_timing(data, figdir / "table2_timing.png", gpu))
    return paths
