"""Figures of recomputation (Child et al., 2019, section 5.4 and Figure 4).

* ``draw_dataflow`` -- one pre-activation residual block (eq. 10, 12-14) with the
  tensors kept for backward drawn solid and the recomputed ones dashed;
* ``plot_depth`` / ``plot_length`` -- bytes saved for backward (and peak
  resident memory) against depth and sequence length, with and without
  recomputation, from ``figures/data/memory.json`` (``python -m fast memory``).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from fast.plots import style
from fast.plots.style import plt

KEPT, RECOMPUTED, OP = style.BLUE, style.ORANGE, style.GREY
GIB = 2.0 ** 30


def _box(ax, x, y, text, color, dashed=False, width=2.6, fill="white"):
    ax.add_patch(FancyBboxPatch((x - width / 2, y - 0.28), width, 0.56,
                                boxstyle="round,pad=0.04", linewidth=1.8, edgecolor=color,
                                facecolor=fill, linestyle="--" if dashed else "-"))
    ax.text(x, y, text, ha="center", va="center", fontsize=8.5, color="black")


def _arrow(ax, a, b, rad=0.0):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, color=OP,
                                 linewidth=1.0, connectionstyle=f"arc3,rad={rad}"))


# The block's forward pass, bottom to top (eq. 10, 12-14): (text, kept for backward without
# recomputation, rebuilt in backward with it). Measured (``fast.measure.memory.graph_saved``):
# a and b themselves are never kept (only H + a, which the second norm reads, and f, which
# W_2 reads, are); the GeLU keeps all three of its (n x 4d) tensors (u and s for its own
# backward, f for W_2's); and torch.utils.checkpoint stops rebuilding once the last tensor
# backward needs exists, so W_2 f is not recomputed.
DATAFLOW = [
    ("H_{k-1}  (n x d)  block input", True, False),
    ("norm(H)  (n x d)", True, True),
    ("q, k, v  (n x d each)", True, True),
    ("attention out (n x d) + lse", True, True),
    ("a = dropout(W_p out)  (n x d)", False, True),
    ("norm(H + a), and H + a  (n x d)", True, True),
    ("u = W_1 x + b_1  (n x 4d)", True, True),
    ("s = sigmoid(1.702 u)  (n x 4d)", True, True),
    ("f = u s, the GeLU  (n x 4d)", True, True),
    ("b = dropout(W_2 f + b_2)  (n x d)", False, False),
    ("H_k = H + a + b  (next block's input)", True, False),
]
FREED = style.LIGHT_GREY


def draw_dataflow(path, block_tensors=None, *, n=None, d=None, pattern=None):
    """Figure 4: the residual block's dataflow; which tensors backward needs.

    The forward pass runs bottom to top: attention branch a, then the
    feed-forward branch b, both added to the residual stream H. Solid blue: kept
    for backward; dashed orange: rebuilt in backward (recomputation); thin grey:
    computed and freed at once.
    block_tensors: optional list of (shape, dtype, bytes) that one block of a
    model of width d at length n saved (a row of ``memory.json``'s "depth" step,
    from ``fast.experiments.memory_report``), summed under the drawing.
    """
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 8.0))
    step = 1.15
    top = step * (len(DATAFLOW) - 1)
    for ax, recompute in zip(axes, (False, True)):
        ax.set_xlim(-1.8, 4.6)
        ax.set_ylim(-0.6, top + 0.6)
        ax.axis("off")
        for i, (text, kept, rebuilt) in enumerate(DATAFLOW):
            y = step * i
            if i in (0, len(DATAFLOW) - 1):
                color, dashed = KEPT, False          # block input and output: kept either way
            elif recompute:
                color, dashed = (RECOMPUTED, True) if rebuilt else (FREED, False)
            else:
                color, dashed = (KEPT, False) if kept else (FREED, False)
            _box(ax, 0, y, text, color, dashed=dashed, width=3.2)
            if i:
                _arrow(ax, (0, y - step + 0.3), (0, y - 0.3))
        # the residual stream around the block: H is added to both branches' outputs
        ax.plot([1.64, 1.9, 1.9], [0.0, 0.0, top], color=OP, lw=1.0)
        _arrow(ax, (1.9, top), (1.64, top))
        ax.text(2.0, top / 2, "residual\nstream", fontsize=8, color=OP, va="center")
        ax.text(2.0, step * 2.5, "attention branch a:\nfast.sparse_attention keeps\n"
                "out and lse, O(n d),\nnever an n x n matrix", fontsize=7.5, color=OP,
                va="center")
        ax.text(2.0, step * 7, "feed-forward branch b", fontsize=7.5, color=OP, va="center")
        title = ("with recomputation: keep H_{k-1} only,\nrebuild the rest in backward"
                 if recompute else "without recomputation: keep what\nbackward needs")
        ax.set_title(title, fontsize=10)
    handles = [plt.Line2D([], [], color=KEPT, lw=2, label="kept for backward"),
               plt.Line2D([], [], color=RECOMPUTED, lw=2, ls="--",
                          label="rebuilt in backward (block by block)"),
               plt.Line2D([], [], color=FREED, lw=2, label="computed, then freed")]
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False, fontsize=9)
    if block_tensors:
        total = sum(t[2] for t in block_tensors)
        fig.text(0.5, 0.05, f"measured ({pattern}, d = {d}, n = {n}, fp32): without "
                 f"recomputation one block keeps {len(block_tensors)} tensors, "
                 f"{total / 2**20:.1f} MiB; with it, its input alone, "
                 f"{n * d * 4 / 2**20:.1f} MiB", ha="center", fontsize=8.5)
    fig.suptitle("Figure 4: one pre-activation residual block (sec. 5.2, 5.4)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    return style.save(fig, path)


def _series(rows, key, **match):
    sel = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return [r[key] for r in sel]


def plot_depth(data: dict, path):
    """Bytes saved for backward and peak memory vs number of layers."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    depth = data["depth"]
    for rc, color, label in ((False, KEPT, "no recomputation"),
                             (True, RECOMPUTED, "recomputation")):
        xs = _series(depth["rows"], "layers", recompute=rc)
        ys = [b / GIB for b in _series(depth["rows"], "saved_bytes", recompute=rc)]
        ax.plot(xs, ys, "o-", color=color, label=f"saved for backward, {label}")
    if "peak" in data:
        peak = data["peak"]
        for rc, color in ((False, KEPT), (True, RECOMPUTED)):
            xs = _series(peak["rows"], "layers", recompute=rc)
            ys = [(b or 0) / GIB for b in _series(peak["rows"], "peak_bytes", recompute=rc)]
            ax.plot(xs, ys, "s:", color=color, alpha=0.8,
                    label=f"peak RSS of a step, {'recomputation' if rc else 'no recomputation'}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("layers")
    ax.set_ylabel("GiB")
    ax.set_title(f"d=256, 4 heads, strided l=128, n={depth['n']} (CPU, fp32, batch 1)", fontsize=9)
    ax.legend(fontsize=7.5)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return style.save(fig, path)


def extra_per_block(length: dict) -> list[float]:
    """(strided - dense) bytes saved without recomputation, per block, in units of one
    n x d fp32 tensor, at every n of the "length" step of ``memory.json``."""
    rows, L = length["rows"], length["layers"]
    out = []
    for n in sorted({r["n"] for r in rows}):
        saved = {r["pattern"]: r for r in rows if r["n"] == n and not r["recompute"]}
        out.append((saved["strided"]["saved_bytes"] - saved["full"]["saved_bytes"])
                   / (L * n * saved["full"]["d"] * 4))
    return out


def plot_length(data: dict, path):
    """Bytes saved for backward vs sequence length, strided and dense: left the
    whole model in GiB, right per token and layer in KiB (where the curves part)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.4))
    length = data["length"]
    L = length["layers"]
    lines = {("strided", False): (KEPT, "o-", 6, "full"),
             ("full", False): (KEPT, "^--", 10, "none"),
             ("strided", True): (RECOMPUTED, "o-", 6, "full"),
             ("full", True): (RECOMPUTED, "^--", 10, "none")}
    for (pattern, rc), (color, line, size, fill) in lines.items():
        xs = _series(length["rows"], "n", pattern=pattern, recompute=rc)
        saved = _series(length["rows"], "saved_bytes", pattern=pattern, recompute=rc)
        label = (f"{style.display_name(pattern)}, "
                 f"{'recomputation' if rc else 'no recomputation'}")
        for ax, ys in ((left, [b / GIB for b in saved]),
                       (right, [b / (L * n) / 1024 for b, n in zip(saved, xs)])):
            ax.plot(xs, ys, line, color=color, markersize=size, fillstyle=fill,
                    markeredgewidth=1.5, label=label)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length n")
        ax.grid(alpha=0.3, which="both")
    left.set_yscale("log")
    left.set_ylabel("GiB saved for backward (whole model)")
    left.set_title(f"{L} layers, d=256, 4 heads (CPU, fp32, batch 1)", fontsize=9)
    left.legend(fontsize=7.5)
    right.set_ylim(bottom=0)
    right.set_ylabel(f"KiB saved per token and layer (total / ({L} n))")
    right.set_title("flat in n: O(n d) per block, no n x n term", fontsize=9)
    extra = extra_per_block(length)
    right.text(0.03, 0.5, f"strided keeps {min(extra):.2f} n x d tensor more per block than "
               "dense:\n"
               "its attention output is copied when the heads are put side by side\n"
               "for W_p; dense attention (SDPA) writes it in that order already.\n"
               "With recomputation both keep the block inputs only (same curve).",
               transform=right.transAxes, fontsize=7.5, va="center")
    fig.tight_layout()
    return style.save(fig, path)


def make_all(data: dict, figdir) -> list[Path]:
    """Every memory figure that the data allows; returns the paths written."""
    figdir = Path(figdir)
    row = None
    if "depth" in data:
        two = [r for r in data["depth"]["rows"] if r["layers"] >= 2 and not r["recompute"]]
        row = two[0] if two else None
    paths = [draw_dataflow(figdir / "fig4_dataflow.png", row and row["block_tensors"],
                           n=row and row["n"], d=row and row["d"],
                           pattern=row and row["pattern"])]
    if "depth" in data:
        paths.append(plot_depth(data, figdir / "memory_depth.png"))
    if "length" in data:
        paths.append(plot_length(data, figdir / "memory_length.png"))
    return paths
