"""Table 3 redrawn: held-out bits per byte against the minimum context of evaluation.

Child et al., 2019, Table 3: Enwik8 bits per byte fall from 0.9952 to 0.9908 as the
minimum context grows from 6,144 to 12,160 of the 12,288 training tokens. Data from
``python -m fast table3`` (``fast.experiments.table3``):

* ``plot_context`` -- left, our text models' bits per byte against the minimum context
  m (every m evaluated); right, the change from the paper's smallest fraction (m = n / 2)
  as a percentage of the bits there (our small models pay several bits per byte, the paper's
  one: absolute changes would not compare) against the fraction of the training context,
  ours (mean over the stretches, the bar one standard error of the paired differences)
  beside the paper's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fast.plots import style
from fast.plots.style import display_name, plt


def _rows(model: dict) -> list[dict]:
    return sorted(model["contexts"].values(), key=lambda r: r["m"])


def plot_context(data: dict, path) -> Path:
    """data: the table3 JSON. Two panels (see the module docstring)."""
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 3.9))
    ax = axes[0]
    for pattern, model in data["models"].items():
        rows = _rows(model)
        ax.plot([r["m"] for r in rows], [r["bits"] for r in rows], "o-", ms=4,
                color=style.color(pattern), label=display_name(pattern))
    n = next(iter(data["models"].values()))["n"]
    ax.set_xlabel(f"minimum context m (bytes; the models were trained on n = {n})")
    ax.set_ylabel("test bits per byte")
    ax.set_title(f"{data['dataset']} test split, {data['stretches']} stretches of "
                 f"{data['stretch']} bytes", fontsize=9)
    ax.legend(fontsize=7.5)
    ax.grid(alpha=0.3)

    ax = axes[1]
    for pattern, model in data["models"].items():
        rows = [r for r in _rows(model) if r["paper_tokens"]]
        base = np.asarray(rows[0]["per_stretch"])
        # the change from m = n / 2, as a percentage of the bits there: a model of several bits per
        # byte and the paper's of 1 on one comparable scale
        diffs = [100 * (np.asarray(r["per_stretch"]) - base) / rows[0]["bits"] for r in rows]
        means = [d.mean() for d in diffs]
        errors = [d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else 0.0 for d in diffs]
        ax.errorbar([r["fraction"] for r in rows], means, yerr=errors, fmt="o-", ms=4,
                    capsize=3, color=style.color(pattern),
                    label=f"{display_name(pattern)} (m = {rows[0]['m']}..{rows[-1]['m']})")
    paper = sorted((int(k), v) for k, v in data["paper"].items())
    ax.plot([k / data["paper_n"] for k, _ in paper],
            [100 * (v - paper[0][1]) / paper[0][1] for _, v in paper],
            "s--", ms=5, color=style.BLACK,
            label=f"paper, Enwik8 ({paper[0][0]:,}..{paper[-1][0]:,} of {data['paper_n']:,})")
    ax.axhline(0.0, color=style.GREY, lw=0.8, ls=":")
    ax.set_xlabel("minimum context / training context")
    ax.set_ylabel("change from m = n / 2, % of the bits there")
    ax.set_title("the change with more context, paired byte by byte (bars: 1 s.e.)",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.suptitle("Table 3 at CPU scale: does a longer minimum context lower the bits?",
                 fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)
