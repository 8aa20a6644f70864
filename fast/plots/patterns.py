"""Drawings of the attention patterns: connectivity matrices, Figure 3, keys per query.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers",
section 4.3 and Figure 3 (a 6x6 image, n = 36, l = 6: for one query pixel, the
pixels each of the two heads reads, over the n x n connectivity matrices), and
the cost argument of section 4.2 (about sqrt(n) keys per query instead of n).

``reference/`` stays NumPy-only, so the matplotlib code lives here. The masks
come from ``reference.patterns``; the keys each row reads come from the closed
forms of ``reference.counts.keys_per_query`` (imported here, so the notebooks'
``pp.keys_per_query`` keeps working), which run at n = 16,384 without an n x n mask.

Colours follow the paper: head A(1) dark blue, head A(2) light blue; a position
both heads read is drawn in between; positions after the query (never read:
causal) are grey.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

from fast.plots import style
from reference import patterns
from reference.counts import keys_per_query as keys_per_query  # re-exported for the notebooks
from reference.heads import PARTS, head_roles

A1_COLOUR = "#1b4f9c"     # head A(1): dark blue, as in Fig. 3
A2_COLOUR = "#8cc0eb"     # head A(2): light blue
BOTH_COLOUR = "#4d86c6"   # read by both heads
FUTURE_COLOUR = "#e6e6e6"  # j > i: never read (causal)
EMPTY_COLOUR = "#ffffff"   # allowed by causality but not read


# ----------------------------------------------------------------------------
# Colouring masks.
# ----------------------------------------------------------------------------

def _rgb(name: str) -> np.ndarray:
    return np.array(to_rgb(name))


def colour_parts(a1: np.ndarray, a2: np.ndarray | None = None,
                 future: np.ndarray | None = None) -> np.ndarray:
    """An RGB image (..., 3) of one or two bool masks of one shape: A(1) only dark
    blue, A(2) only light blue, both in between, ``future`` grey, the rest white."""
    a1 = np.asarray(a1, dtype=bool)
    a2 = np.zeros_like(a1) if a2 is None else np.asarray(a2, dtype=bool)
    img = np.empty(a1.shape + (3,))
    img[...] = _rgb(EMPTY_COLOUR)
    if future is not None:
        img[np.asarray(future, dtype=bool)] = _rgb(FUTURE_COLOUR)
    img[a1 & ~a2] = _rgb(A1_COLOUR)
    img[a2 & ~a1] = _rgb(A2_COLOUR)
    img[a1 & a2] = _rgb(BOTH_COLOUR)
    return img


# Steps between labelled positions on a connectivity matrix's axes, smallest first.
TICK_STEPS = (1, 2, 4, 5, 8, 10, 16, 20, 32, 50, 64, 100, 128, 200, 256, 500, 512, 1000)


def tick_step(n: int, most: int = 16) -> int:
    """The step between labelled positions 0, step, 2 step, ... of an n x n matrix: 1 up
    to n = ``most`` (every position), else the smallest step of ``TICK_STEPS`` giving at
    most min(10, ``most``) labels, so that labels never crowd. Small panels pass a
    smaller ``most``."""
    if n <= most:
        return 1
    return next((s for s in TICK_STEPS if -(-n // s) <= min(10, most)), TICK_STEPS[-1])


def draw_connectivity(ax, a1: np.ndarray, a2: np.ndarray | None = None, title: str = "",
                      most_ticks: int = 16) -> None:
    """Draw an (n, n) connectivity matrix (rows = outputs i, columns = inputs j)
    on ``ax``; with two masks, each head in its own colour. The axes number the
    positions (``tick_step(n, most_ticks)``): query i on the left, key j along the bottom."""
    n = a1.shape[-1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    ax.imshow(colour_parts(a1, a2, future), interpolation="nearest")
    ticks = np.arange(0, n, tick_step(n, most_ticks))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.tick_params(labelsize=7, length=2, pad=1)
    ax.set_title(title, fontsize=9)


def draw_query(ax, a1_row: np.ndarray, a2_row: np.ndarray | None, query: int, width: int,
               title: str = "") -> None:
    """Draw on the image grid (row-major, ``width`` pixels a row) which pixels the
    query reads: ``a1_row``/``a2_row`` are the query's rows of the two heads' masks.
    Each cell shows its position, as notebook 03's grids do."""
    n = len(a1_row)
    height = -(-n // width)
    pad = height * width - n  # a partial last row is drawn grey

    def grid(x):
        flat = np.concatenate([np.asarray(x, dtype=bool), np.zeros(pad, dtype=bool)])
        return flat.reshape(height, width)                                # (rows, width)

    future = np.arange(height * width).reshape(height, width) > query  # also the padding
    ax.imshow(colour_parts(grid(a1_row), None if a2_row is None else grid(a2_row), future),
              interpolation="nearest")
    r, col = divmod(query, width)
    ax.add_patch(Rectangle((col - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    dark = {A1_COLOUR, BOTH_COLOUR}      # white numbers on the dark blues, black elsewhere
    size = 7 if width <= 8 else 6
    for pos in range(n):
        y, x = divmod(pos, width)
        on = [c for c, row in ((A1_COLOUR, a1_row), (A2_COLOUR, a2_row)) if row is not None
              and row[pos]]
        colour = BOTH_COLOUR if len(on) == 2 else (on[0] if on else None)
        ax.text(x, y, str(pos), ha="center", va="center", fontsize=size,
                color="white" if colour in dark else "black")
    ax.set_xticks(np.arange(-0.5, width, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, height, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    ax.set_title(title, fontsize=9)


def legend_patches(two_heads: bool = True, full_panel: bool = False) -> list[Patch]:
    """The colours' names; ``full_panel``: a figure that also draws full attention, whose one
    head is drawn in A(1)'s colour, says that this colour means "read" there."""
    if not two_heads:
        return [Patch(color=A1_COLOUR, label="read"),
                Patch(color=FUTURE_COLOUR, label="future (j > i)")]
    a1 = "head A(1); in (a), full: read" if full_panel else "head A(1)"
    return [Patch(color=A1_COLOUR, label=a1), Patch(color=A2_COLOUR, label="head A(2)"),
            Patch(color=BOTH_COLOUR, label="both"),
            Patch(color=FUTURE_COLOUR, label="future (j > i)")]


# ----------------------------------------------------------------------------
# Figures.
# ----------------------------------------------------------------------------

def plot_pattern(pattern: str, n: int, stride: int | None = None, c: int | None = None):
    """One pattern as connectivity matrices: A(1), A(2) and the merged head
    (``full`` has a single panel). Returns the figure."""
    parts = patterns.factorized(pattern, n, 0, stride=stride, c=c)
    if len(parts) == 1:
        fig, ax = plt.subplots(figsize=(3.2, 3.4))
        draw_connectivity(ax, parts[0], title=f"full, n={n}: {int(parts[0].sum())} pairs")
        fig.legend(handles=legend_patches(False), loc="lower center", ncol=2, fontsize=8,
                   frameon=False)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        return fig
    a1, a2 = parts
    names = {"strided": ("local", "column"), "fixed": ("block", "summary")}[pattern]
    fig, axes = plt.subplots(1, 3, figsize=(8.4, 3.3))
    draw_connectivity(axes[0], a1, title=f"A(1) {names[0]}: {int(a1.sum())} pairs")
    draw_connectivity(axes[1], np.zeros_like(a1), a2,
                      title=f"A(2) {names[1]}: {int(a2.sum())} pairs")
    draw_connectivity(axes[2], a1, a2, title=f"merged A(1) | A(2): {int((a1 | a2).sum())} pairs")
    p = f"l={stride}" + (f", c={c}" if pattern == "fixed" else "")
    fig.suptitle(f"{pattern} pattern, n={n}, {p} (rows = outputs i, columns = inputs j)",
                 fontsize=10)
    fig.legend(handles=legend_patches(), loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def figure3(n: int = 36, stride: int = 6, c: int = 1, query: int = 27):
    """The paper's Figure 3 for an image of ``stride`` x ``stride`` pixels:
    top row, for pixel ``query``, which pixels each head reads on the image grid;
    bottom row, the n x n connectivity matrices; (a) full, (b) strided, (c) fixed."""
    full = patterns.full(n)
    s1, s2 = patterns.strided(n, stride)
    f1, f2 = patterns.fixed(n, stride, c)
    panels = [("(a) Transformer (full)", full, None),
              (f"(b) Sparse Transformer (strided, l={stride})", s1, s2),
              (f"(c) Sparse Transformer (fixed, l={stride}, c={c})", f1, f2)]
    fig, axes = plt.subplots(2, 3, figsize=(9.0, 6.4), gridspec_kw={"height_ratios": [1, 1]})
    for col, (title, a1, a2) in enumerate(panels):
        draw_query(axes[0, col], a1[query], None if a2 is None else a2[query], query, stride, title)
        draw_connectivity(axes[1, col], a1, a2)
    axes[0, 0].set_ylabel(f"query pixel {query}\n(black frame)", fontsize=9)
    axes[1, 0].set_ylabel(f"{n} x {n} connectivity\n(rows = outputs)", fontsize=9)
    fig.legend(handles=legend_patches(full_panel=True), loc="lower center", ncol=4, fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def plot_head_masks(masks: np.ndarray, parts: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
                    titles: Sequence[str] | None = None, suptitle: str = "", axes=None):
    """One connectivity matrix per head of ``masks`` (H, n, n). With ``parts``
    (each head's (A(1), A(2))), a head's entries are coloured by the part they
    come from. Draws into ``axes`` (a row of H axes) or a new figure."""
    masks = np.asarray(masks, dtype=bool)
    H = masks.shape[0]
    fig = None
    if axes is None:
        fig, axes = plt.subplots(1, H, figsize=(2.3 * H, 2.6), squeeze=False)
        axes = axes[0]
    for h in range(H):
        title = titles[h] if titles is not None else f"head {h}"
        if parts is None:
            draw_connectivity(axes[h], masks[h], title=title, most_ticks=8)
        else:
            a1, a2 = parts[h]
            draw_connectivity(axes[h], masks[h] & a1, masks[h] & a2, title=title, most_ticks=8)
    if fig is not None:
        if suptitle:
            fig.suptitle(suptitle, fontsize=10)
        fig.tight_layout()
    return fig


def head_parts(pattern: str, n: int, role, **params) -> tuple[np.ndarray, np.ndarray]:
    """(A(1), A(2)) as the head of ``reference.heads.HeadRole`` ``role`` reads them:
    a part the head does not read is all False; a fixed head's A(2) is its own
    summary sub-block (its rank)."""
    masks = patterns.factorized(pattern, n, role.rank or 0, **params)
    names = PARTS[pattern]
    return tuple(m if role.reads(name) else np.zeros_like(m) for m, name in zip(masks, names))


def role_title(role, stride: int | None, c: int | None) -> str:
    """"head h" and what it reads: the parts, and a fixed summary's sub-block."""
    parts = []
    for name in role.parts:
        if name == "summary":
            parts.append(f"summary {role.rank % (stride // c)}")
        else:
            parts.append(name)
    return f"head {role.head}: " + " + ".join(parts)


def plot_combine_modes(pattern: str, n: int, n_heads: int,
                       rows: Sequence[tuple[str, int]] = (("merged", 0), ("multihead", 0),
                                                          ("interleaved", 0), ("interleaved", 1)),
                       **params):
    """What every head reads under the three ways of using the two heads (sec. 5.1):
    one row of connectivity matrices per (combine, layer) in ``rows``, one column
    per head, entries coloured by the part they come from; the head roles of
    ``reference.heads.head_roles``, the masks of ``reference.patterns.head_masks``.
    A fixed summary sub-block is numbered k = rank mod (l / c). Returns the figure."""
    stride, c = params.get("stride"), params.get("c")
    fig, axes = plt.subplots(len(rows), n_heads, figsize=(2.3 * n_heads, 2.45 * len(rows)),
                             squeeze=False)
    for (combine, layer), ax_row in zip(rows, axes):
        masks = patterns.head_masks(pattern, n, n_heads, combine, layer=layer,
                                    **params)                                  # (H, n, n)
        roles = head_roles(pattern, n_heads, combine, layer, stride=stride, c=c)
        parts = [head_parts(pattern, n, role, **params) for role in roles]
        titles = [role_title(role, stride, c) for role in roles]
        plot_head_masks(masks, parts, titles, axes=ax_row)
        ax_row[0].set_ylabel(f"{combine}\nlayer {layer}", fontsize=10)
    p = ", ".join(f"{k if k != 'stride' else 'l'} = {v}" for k, v in params.items())
    summary = "summary" in PARTS[pattern]           # only a fixed head names a sub-block
    fig.suptitle(f"What each of {n_heads} heads reads: the {pattern} pattern (n = {n}, {p}), "
                 f"merged, multi-head and interleaved (sec. 5.1)\n"
                 f"rows = outputs i, columns = inputs j"
                 + ("; 'summary k' = sub-block k of each block" if summary else ""), fontsize=10)
    fig.legend(handles=legend_patches(), loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.035, 1, 0.965))
    return fig


# Where the right panel of ``plot_keys_per_query`` labels its log axis, in each decade.
RATIO_TICKS = (1.0, 1.5, 2.0, 3.0, 5.0)

# Line style of each curve of ``plot_keys_per_query``, by label prefix: curves that
# lie on top of each other get different markers (filled / hollow, small / large),
# so that neither hides the other.
_KPQ_STYLE = {"full": ("o", 5, "full", "-"), "strided": ("s", 9, "none", "-"),
              "fixed l=sqrt": ("o", 4, "full", "--"), "fixed l=128": ("D", 8, "none", ":")}


def _kpq_style(label: str):
    for prefix, st in _KPQ_STYLE.items():
        if label.startswith(prefix):
            return st
    return ("x", 6, "full", "-")


def plot_keys_per_query(ns: np.ndarray, curves: dict[str, tuple[np.ndarray, np.ndarray]]):
    """Log-log, two panels. Left: keys read by the query that reads the most
    against n, with a sqrt(n) guide (full attention's curve is n itself). Right:
    query-key pairs of one head (the sum over queries, n times the mean) divided
    by n sqrt(n): O(n sqrt n) is a flat line there. ``curves`` maps a label to
    (mean, max) arrays over ``ns``. Curves that coincide are drawn with different
    markers (hollow over filled), so none is hidden."""
    ns = np.asarray(ns, dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.6, 4.3))
    for idx, (label, (mean, top)) in enumerate(curves.items()):
        marker, size, fill, line = _kpq_style(label)
        kw = dict(color=f"C{idx}", marker=marker, markersize=size, fillstyle=fill,
                  markeredgewidth=1.4, linestyle=line, label=label)
        left.loglog(ns, top, **kw)
        right.semilogx(ns, np.asarray(mean) * ns / ns ** 1.5, **kw)
    left.loglog(ns, np.sqrt(ns), ":", color="black", label="sqrt(n)")
    left.set(xlabel="sequence length n", ylabel="keys read (the query that reads most)",
             title="keys read by the query that reads most")
    right.set_yscale("log")    # ticks at 1, 1.5, 2, 3, 5 of each decade, each labelled:
    right.yaxis.set_major_locator(LogLocator(base=10, subs=RATIO_TICKS))  # 1.5 can be read off
    right.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    right.yaxis.set_minor_formatter(NullFormatter())
    right.set(xlabel="sequence length n", ylabel="query-key pairs of one head / n^1.5",
              title="pairs per head / n^1.5: flat means O(n sqrt n)")
    left.legend(fontsize=7.5)
    right.legend(fontsize=7.5)
    for ax in (left, right):
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def save(fig, path: str | Path) -> Path:
    """Write ``fig`` as a PNG cropped to what is drawn, creating the folder; the figure
    stays open (the notebooks show it next). Returns the path."""
    return style.save(fig, path, tight=True, close=False)
