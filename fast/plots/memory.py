"""Figures of recomputation (Child et al., 2019, section 5.4 and Figure 4).

* ``draw_dataflow`` -- one pre-activation residual block (eq. 11-14) with the
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


def draw_dataflow(path, block_tensors=None):
    """Figure 4: the residual block's dataflow; which tensors backward needs.

    block_tensors: optional list of (shape, dtype, bytes) that one block saved
    (from fast.experiments.memory_report), printed under the drawing.
    """
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 6.4))
    for ax, recompute in zip(axes, (False, True)):
        ax.set_xlim(-2.2, 4.4)
        ax.set_ylim(-0.6, 10.2)
        ax.axis("off")
        act = RECOMPUTED if recompute else KEPT
        # the forward pass, bottom to top (eq. 11-14)
        nodes = [  # (x, y, text, is tensor)
            (0, 0.0, "H_{k-1}  (n x d)  block input", True),
            (0, 1.2, "norm(H)", True),
            (0, 2.4, "q, k, v  (n x d each)", True),
            (0, 3.6, "attention out + lse", True),
            (0, 4.8, "a = dropout(W_p out)", True),
            (0, 6.0, "norm(H + a)", True),
            (0, 7.2, "W_1 x + b_1  (n x 4d)", True),
            (0, 8.4, "f(.)  GeLU  (n x 4d)", True),
            (0, 9.6, "H_k = H + a + b", True),
        ]
        for i, (x, y, text, _) in enumerate(nodes):
            first_or_last = i in (0, len(nodes) - 1)
            color = KEPT if first_or_last else act
            _box(ax, x, y, text, color, dashed=(recompute and not first_or_last))
            if i:
                _arrow(ax, (x, nodes[i - 1][1] + 0.3), (x, y - 0.3))
        # the residual stream around the block: H is added to both branches' outputs
        ax.plot([1.34, 1.7, 1.7], [0.0, 0.0, 9.6], color=OP, lw=1.0)
        _arrow(ax, (1.7, 9.6), (1.34, 9.6))
        ax.text(1.8, 4.8, "residual\nstream", fontsize=8, color=OP, va="center")
        ax.text(2.9, 3.0, "fast.sparse_attention\n(O(n d) kept:\nout and lse)", fontsize=7.5,
                color=OP, ha="center", va="center")
        title = ("with recomputation: keep H only,\nrecompute the rest in backward"
                 if recompute else "without recomputation: keep every\nintermediate for backward")
        ax.set_title(title, fontsize=10)
    handles = [plt.Line2D([], [], color=KEPT, lw=2, label="kept for backward"),
               plt.Line2D([], [], color=RECOMPUTED, lw=2, ls="--",
                          label="recomputed in backward (block by block)")]
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False, fontsize=9)
    if block_tensors:
        total = sum(t[2] for t in block_tensors)
        fig.text(0.5, 0.055, f"measured: one block kept {len(block_tensors)} tensors, "
                 f"{total / 2**20:.1f} MiB without recomputation", ha="center", fontsize=8.5)
    fig.suptitle("Figure 4: one residual block (sec. 5.4)", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
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


def plot_length(data: dict, path):
    """Bytes saved for backward vs sequence length, strided and dense."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    length = data["length"]
    lines = {("strided", False): (KEPT, "o-"), ("strided", True): (RECOMPUTED, "o-"),
             ("full", False): (KEPT, "^--"), ("full", True): (RECOMPUTED, "^--")}
    for (pattern, rc), (color, line) in lines.items():
        xs = _series(length["rows"], "n", pattern=pattern, recompute=rc)
        saved = _series(length["rows"], "saved_bytes", pattern=pattern, recompute=rc)
        ax.plot(xs, [b / GIB for b in saved], line, color=color,
                label=f"{style.display_name(pattern)}, "
                      f"{'recomputation' if rc else 'no recomputation'}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("GiB saved for backward")
    ax.set_title(f"{length['layers']} layers, d=256, 4 heads (CPU, fp32, batch 1)", fontsize=9)
    ax.legend(fontsize=7.5)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return style.save(fig, path)


def make_all(data: dict, figdir) -> list[Path]:
    """Every memory figure that the data allows; returns the paths written."""
    figdir = Path(figdir)
    tensors = None
    if "depth" in data:
        two = [r for r in data["depth"]["rows"] if r["layers"] >= 2 and not r["recompute"]]
        tensors = two[0]["block_tensors"] if two else None
    paths = [draw_dataflow(figdir / "fig4_dataflow.png", tensors)]
    if "depth" in data:
        paths.append(plot_depth(data, figdir / "memory_depth.png"))
    if "length" in data:
        paths.append(plot_length(data, figdir / "memory_length.png"))
    return paths
