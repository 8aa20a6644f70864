"""Figures of the dense / fixed / strided comparison (Child et al., 2019, Table 2).

From figures/data/table2.json (``python -m fast table2``):

* ``plot_curves``  -- learning curves: training bits (thin) and validation bits
  (markers) against step, one panel per modality, one colour per pattern;
* ``plot_timing``  -- time per iteration relative to dense, ours at n = 3072 and
  n = 12288 beside the paper's Table 2 ratios;
* ``plot_samples`` -- the images each image model drew (``fast.transformer.sample``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fast.plots import style
from fast.plots.style import PATTERN_ORDER, display_name, plt
from fast.transformer.sample import image_grid


def plot_curves(data: dict, path) -> Path:
    """Learning curves: training bits (thin line) and validation bits (markers) per step."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8))
    for ax, modality in zip(axes, ("text", "image")):
        for pattern in PATTERN_ORDER:
            run = data["runs"].get(f"{modality}/{pattern}")
            if run is None:
                continue
            h = run["history"]
            ax.plot(h["step"], h["bits"], color=style.color(pattern), alpha=0.35, lw=1)
            ev = run["evals"]
            ax.plot([e["step"] for e in ev], [e["val"] for e in ev], "o-", ms=3,
                    color=style.color(pattern),
                    label=f"{display_name(pattern)} (test {run['test_bits']:.2f})")
        unit = "bits per byte" if modality == "text" else "bits per dim"
        title = "stdlib bytes, n=512" if modality == "text" else "16x16 grey photo crops, n=256"
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        runs = [run for k, run in data["runs"].items() if k.startswith(modality)]
        if runs:   # from the lowest training bits to a little above the first evaluation
            lo = min(min(r["history"]["bits"]) for r in runs)
            hi = max(r["evals"][0]["val"] for r in runs)
            ax.set_ylim(lo - 0.2, hi + 0.5)
    fig.suptitle("Table 2 at CPU scale: training (line) and validation (markers) bits",
                 fontsize=10.5)
    fig.tight_layout()
    return style.save(fig, path)


def plot_timing(data: dict, path) -> Path:
    """Time per iteration relative to dense: ours at each n, beside the paper's Table 2."""
    rows = data["timing"]
    lengths = sorted({r["n"] for r in rows})
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    groups = [(f"ours n={n}", {r["pattern"]: r["time_per_iter"] for r in rows if r["n"] == n})
              for n in lengths]
    groups += [(f"paper {m}\n(n={n})", {p: data["paper"][m][p][1] for p in PATTERN_ORDER})
               for m, n in (("text", 12288), ("image", 3072))]
    width = 0.26
    for g, (_, times) in enumerate(groups):
        dense = times["full"]
        for i, pattern in enumerate(PATTERN_ORDER):
            ax.bar(g + (i - 1) * width, times[pattern] / dense, width, color=style.color(pattern),
                   label=display_name(pattern) if g == 0 else None)
            ax.text(g + (i - 1) * width, times[pattern] / dense + 0.02, f"{times[pattern]:.2f}s",
                    ha="center", fontsize=6.5, rotation=90, va="bottom")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
    ax.set_ylabel("time per iteration / dense")
    ax.set_ylim(0, 1.6)
    ax.axhline(1.0, color="black", lw=0.6)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("time per training step, relative to dense (ours: 2-core CPU, batch 1)",
                 fontsize=9.5)
    fig.tight_layout()
    return style.save(fig, path)


def plot_samples(data: dict, path) -> Path:
    """The images each image model drew, one panel per pattern."""
    runs = [(p, data["runs"][f"image/{p}"]) for p in PATTERN_ORDER
            if f"image/{p}" in data["runs"]]
    fig, axes = plt.subplots(1, len(runs), figsize=(3.2 * len(runs), 3.0), squeeze=False)
    for ax, (pattern, run) in zip(axes[0], runs):
        grid = image_grid(np.asarray(run["samples"]), run["model_cfg"]["image_shape"],
                          levels=run["model_cfg"]["vocab_size"])
        ax.imshow(grid, interpolation="nearest")
        ax.set_title(f"{display_name(pattern)} ({run['test_bits']:.2f} bits/dim)", fontsize=9)
        ax.axis("off")
    fig.suptitle("samples of the image models (fast.transformer.sample, seed 0)", fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


def make_all(data: dict, figdir) -> list[Path]:
    """Every Table 2 figure that the data allows; returns the paths written."""
    figdir = Path(figdir)
    paths = []
    if data.get("runs"):
        paths.append(plot_curves(data, figdir / "table2_curves.png"))
        if any(k.startswith("image/") for k in data["runs"]):
            paths.append(plot_samples(data, figdir / "samples_images.png"))
    if data.get("timing"):
        paths.append(plot_timing(data, figdir / "table2_timing.png"))
    return paths
