"""Figures of the dense / fixed / strided comparison (Child et al., 2019, Table 2).

From figures/data/table2.json (``python -m fast table2``), every cell trained
with several seeds:

* ``plot_bits``    -- held-out test bits per pattern, mean and standard deviation
  over seeds with every seed as a dot, beside the paper's numbers;
* ``plot_curves``  -- learning curves: validation bits against step, the mean
  over seeds as a line and the range over seeds as a band;
* ``plot_timing``  -- time per iteration relative to dense: the Table 2 runs
  themselves, the same architecture at the paper's lengths, and the paper's ratios.
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


def _bars(ax, groups: list[tuple[str, dict, dict]]):
    """groups: (label, {pattern: time}, {pattern: std}); bars relative to dense."""
    width = 0.26
    for g, (_, times, stds) in enumerate(groups):
        dense = times["full"]
        for i, pattern in enumerate(PATTERN_ORDER):
            x, ratio = g + (i - 1) * width, times[pattern] / dense
            ax.bar(x, ratio, width, yerr=stds.get(pattern, 0.0) / dense, capsize=2,
                   color=style.color(pattern), label=display_name(pattern) if g == 0 else None)
            ax.text(x, ratio + 0.04, f"{ratio:.2f}", ha="center", fontsize=6.5, rotation=90,
                    va="bottom")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=7.5)
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_ylim(0, 1.7)


def plot_timing(data: dict, path) -> Path:
    """Time per iteration relative to dense: the Table 2 runs, the paper's lengths, the paper."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10.0, 3.8), gridspec_kw={"width_ratios": [2, 3]})
    summary = data.get("summary", {})
    groups = []
    for modality in ("text", "image"):
        cells = {p: summary.get(f"{modality}/{p}") for p in PATTERN_ORDER}
        if all(cells.values()):
            n = _seeds(data, f"{modality}/full")[0]["model_cfg"]["n_ctx"]
            groups.append((f"{modality}, n={n}", {p: c["time_per_iter"] for p, c in cells.items()},
                           {p: c["time_per_iter_std"] for p, c in cells.items()}))
    if groups:
        _bars(ax1, groups)
        ax1.legend(fontsize=7.5, loc="upper right")
    ax1.set_ylabel("time per iteration / dense")
    ax1.set_title("the Table 2 runs (mean ± std over seeds)", fontsize=9)
    rows = data.get("timing", [])
    groups = []
    for modality in ("text", "image"):
        mine = {r["pattern"]: r["time_per_iter"] for r in rows if r["modality"] == modality}
        if len(mine) == len(PATTERN_ORDER):
            n = next(r["n"] for r in rows if r["modality"] == modality)
            groups.append((f"ours, n={n}", mine, {}))
        paper = data["paper"][modality]
        groups.append((f"paper {paper['dataset'].split()[0]}\nn={paper['n']}",
                       {p: paper[p][1] for p in PATTERN_ORDER}, {}))
    _bars(ax2, groups)
    ax2.set_title("same architecture at the paper's lengths (batch 1), and the paper",
                  fontsize=9)
    fig.suptitle("time per training step relative to dense (ours: one CPU thread per run)",
                 fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


def make_all(data: dict, figdir) -> list[Path]:
    """Every Table 2 figure that the data allows; returns the paths written."""
    figdir = Path(figdir)
    paths = []
    if data.get("runs"):
        paths.append(plot_bits(data, figdir / "table2_bits.png"))
        paths.append(plot_curves(data, figdir / "table2_curves.png"))
    if data.get("runs") or data.get("timing"):
        paths.append(plot_timing(data, figdir / "table2_timing.png"))
    return paths
