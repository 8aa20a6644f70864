"""Figures for notebook 03: the transposition trick of the structured path, and its cost.

Child et al., 2019, section 5.5: "attention with a stride of k can be computed by
transposing the matrix and computing a local window"; the matrix is the sequence
folded into an (n/l, l) grid. Three panels:
the sequence (one colour per column s = i mod l), the (n/l, l) grid it folds
into, and the transposed (l, n/l) grid in which every column of the grid -- the
keys of the strided head A(2) -- is one contiguous row, so A(2) is plain causal
attention along rows (``fast.backends.structured.strided.Column``). The query and its keys are
outlined.

``plot_cost`` draws what O(n sqrt n) means (sec. 4.2): the query-key pairs of a
strided head, n l + about n^2 / (2 l), and measured times, against n, for a
stride that grows as sqrt(n) and for a fixed one, beside an n^1.5 line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.patches import Rectangle

from fast.measure.bench import fitted_slope
from fast.plots import style
from fast.plots.style import plt


def _cells(ax, grid: np.ndarray, cols: np.ndarray, mark: set, query: int, title: str):
    cmap = plt.get_cmap("tab10")
    rows, width = grid.shape
    for r in range(rows):
        for s in range(width):
            i = int(grid[r, s])
            ax.add_patch(Rectangle((s, rows - 1 - r), 1, 1, facecolor=cmap(int(cols[r, s]) % 10),
                                   alpha=0.35 if i not in mark else 0.9, edgecolor="white"))
            if i == query:
                ax.add_patch(Rectangle((s, rows - 1 - r), 1, 1, fill=False, edgecolor="black",
                                       linewidth=2.5))
            ax.text(s + 0.5, rows - 0.5 - r, str(i), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, width)
    ax.set_ylim(0, rows)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)


def draw_transposition(n: int = 24, stride: int = 6, query: int = 20, *,
                       path: Path | str):
    """Draw the three panels for a sequence of n = M l positions into ``path``; return
    the (closed) figure."""
    if n % stride:
        raise ValueError(f"n must be a multiple of the stride for this drawing, got n={n}, "
                         f"l={stride}")
    if not 0 <= query < n:
        raise ValueError(f"query must lie in [0, {n}), got {query}")
    M = n // stride
    pos = np.arange(n)
    keys = {j for j in range(query + 1) if (query - j) % stride == 0}   # A(2) of the query
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6),
                             gridspec_kw={"width_ratios": [n / 2, stride, M]})
    _cells(axes[0], pos.reshape(2, n // 2), (pos % stride).reshape(2, n // 2), keys, query,
           f"sequence, n = {n} (in 2 lines)\ncolour = column i mod l")
    grid = pos.reshape(M, stride)                                       # (n/l, l)
    _cells(axes[1], grid, grid % stride, keys, query,
           f"(n/l, l) = ({M}, {stride}) grid:\nA(2) keys lie in one column")
    _cells(axes[2], grid.T, grid.T % stride, keys, query,
           f"transposed ({stride}, {M}): the column\nis one row, read causally")
    fig.suptitle(f"The transposition trick (strided pattern, l = {stride}; query {query} "
                 "outlined, the positions it reads in A(2) opaque)", fontsize=10)
    fig.tight_layout()
    style.save(fig, path)
    return fig


def plot_cost(ns, pairs: dict, seconds: dict | None = None,
              seconds_label: str = "seconds per forward (min of repeats)"):
    """Log-log against n: left, the query-key pairs of one head for each stride rule
    in ``pairs`` (label -> array over ``ns``); right, measured seconds per call
    (``seconds``, same labels; ``seconds_label`` says which seconds), with fitted slopes
    in the legend. Both panels draw n^1.5 through the first point of the first series.
    Returns the figure."""
    ns = np.asarray(ns, dtype=float)
    panels = [("query-key pairs of one head", pairs)]
    if seconds:
        panels.append((seconds_label, seconds))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 4.2), squeeze=False)
    for ax, (ylabel, series) in zip(axes[0], panels):
        first = None
        for idx, (label, ys) in enumerate(series.items()):
            ys = np.asarray(ys, dtype=float)
            first = ys[0] if first is None else first
            slope = fitted_slope(ns, ys)
            ax.loglog(ns, ys, "os"[idx % 2] + "-", color=f"C{idx}", markersize=6,
                      fillstyle="full" if idx % 2 == 0 else "none",
                      label=f"{label} (slope {slope:.2f})")
        ax.loglog(ns, first * (ns / ns[0]) ** 1.5, ":", color="black", label="n^1.5")
        ax.loglog(ns, first * (ns / ns[0]) ** 2, ":", color="grey", label="n^2")
        ax.set(xlabel="sequence length n", ylabel=ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_title("work: pairs read (closed forms)", fontsize=10)
    if seconds:
        axes[0][1].set_title("measured on this machine (structured path)", fontsize=10)
    fig.tight_layout()
    return fig
