"""The benchmark figures: time against n (log-log, fitted slopes), and on a GPU the speed-up.

Child et al., 2019, section 4 and Table 2: dense attention costs O(n^2) (slope 2
on a log-log plot), a factorized pattern O(n sqrt(n)) (slope 1.5). ``plot`` draws
the dict that ``python -m fast bench`` writes to figures/data/bench_cpu.json: one
row of panels per pattern, forward and forward+backward side by side, times in
milliseconds, slopes fitted by least squares over n >= 4096 (smaller n is
dominated by fixed overheads). ``plot_gpu`` draws bench_cuda.json: for one (B, H)
and dtype, the same two panels and a third with the speed-up over dense causal
SDPA beside the ideal (the tile count), and, when the long sweep ran, its times
and peak memory. Contenders are named by what they are (``LABELS``).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import FuncFormatter

from fast.measure.bench import contender_names, fitted_slope
from fast.measure.contenders import PATTERN_PARAMS
from fast.plots import style
from fast.plots.style import plt

SLOPE_FROM = 4096
LABELS = {
    "dense": "dense causal SDPA",
    "naive": "SDPA + boolean mask",
    "flex": "FlexAttention (BlockMask)",
    "flex flash": "FlexAttention, FLASH backend",
    "structured": "ours, PyTorch (structured)",
    "triton block-sparse": "ours, Triton block-sparse",
    "triton natural order": "Triton, natural order (no transposition)",
}


# On the CPU in float32 the structured path's strided band and column and fixed block and
# summaries run in the project's C window kernel (``fast.backends.cpu_window``), built on
# first use where a C compiler is found; PyTorch's flash kernel serves the other calls.
CPU_LABELS = {**LABELS, "structured": "ours, structured (C window kernel)"}

# the "flex" rows of a record whose config says "flex_peer": "first peer"
FIRST_FLEX = "FlexAttention, first peer (dynamic shapes: not its best)"


def label(name: str, config: dict | None = None, labels: dict = LABELS) -> str:
    """What a contender is, for a legend (``config``: the record's, which says which
    FlexAttention peer its "flex" rows ran; ``labels``: the names for this device)."""
    if name == "flex" and (config or {}).get("flex_peer") == "first peer":
        return FIRST_FLEX
    return labels.get(name, name)


def _legend(ax, below: bool = False) -> None:
    """The panel's legend (none when nothing was measured); ``below``: under the axes, for
    a panel whose curves fill it (the speed-ups, whose ideal line a legend inside hid)."""
    if not ax.get_legend_handles_labels()[0]:
        return
    if below:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    else:
        ax.legend(fontsize=7)


def _log_axes(ax) -> None:
    """n on a base-2 log axis; the values on a base-10 log axis written as plain numbers
    (0.1, 1, 10, 100 ms)."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))


def _time_panel(ax, rows, pattern, what, title, slopes=True, config=None,
                labels: dict = LABELS):
    for name in contender_names(rows, pattern):
        pts = sorted((r["n"], r[what] * 1e3) for r in rows if r["contender"] == name
                     and r["pattern"] in (pattern, None) and r.get(what))
        if not pts:
            continue
        ns, ts = zip(*pts)
        big = [(n, t) for n, t in pts if n >= SLOPE_FROM]
        slope = fitted_slope(*zip(*big)) if slopes and len(big) >= 2 else None
        name_of = label(name, config, labels)
        tag = f"{name_of} (slope {slope:.2f})" if slope is not None else name_of
        ax.plot(ns, ts, marker=style.marker(name), color=style.color(name), label=tag)
    _log_axes(ax)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("sequence length n")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax)


def plot(data: dict, path: Path, dtype: str = "float32") -> Path:
    """Draw data (the CPU benchmark's JSON dict) into path (PNG)."""
    rows = [r for r in data["results"] if r.get("dtype") == dtype and "skipped" not in r]
    fig, axes = plt.subplots(len(PATTERN_PARAMS), 2, figsize=(10, 4.2 * len(PATTERN_PARAMS)),
                             squeeze=False)
    for i, (pattern, params) in enumerate(PATTERN_PARAMS.items()):
        settings = ", ".join(f"{k}={v}" for k, v in params.items())
        for j, (what, text) in enumerate((("fwd_s", "forward"), ("fb_s", "forward + backward"))):
            _time_panel(axes[i, j], rows, pattern, what, f"{pattern} ({settings}): {text}",
                        labels=CPU_LABELS if dtype == "float32" else LABELS)
            axes[i, j].set_ylabel("milliseconds (min over repetitions)")
    m, c = data["machine"], data["config"]
    where = m.get("gpu") or f"{m['cpu']}, {m['cpu_count']} cores"
    fig.suptitle(f"Sparse attention vs dense causal SDPA, B={c['B']}, H={c['H']}, d={c['d']}, "
                 f"{dtype}; {where}; torch {m['torch']}", fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


def plot_gpu(data: dict, path: Path, dtype: str | None = None, shape=None) -> Path:
    """Draw the same-process benchmark (bench_cuda.json) into path (PNG): for one dtype
    and (B, H) (default: the first dtype, the largest shape), per pattern the forward
    and forward+backward times and the Triton kernel's speed-up beside its ideal."""
    c = data["config"]
    dtype = dtype or c["dtypes"][0]
    B, H = shape or max(tuple(s) for s in c["shapes"])
    rows = [r for r in data["results"] if r["dtype"] == dtype and (r["B"], r["H"]) == (B, H)
            and "skipped" not in r]
    long = [r for r in data.get("long", []) if "skipped" not in r]
    patterns = list(c["patterns"]) if rows or not long else []     # --only-long: its row only
    n_rows = len(patterns) + (1 if long else 0)
    fig, axes = plt.subplots(n_rows, 3, figsize=(15, 6.4 * n_rows), squeeze=False)
    timer = data["machine"].get("timer", "cuda events")
    for i, pattern in enumerate(patterns):
        settings = ", ".join(f"{k}={v}" for k, v in c["patterns"][pattern].items())
        for j, (what, text) in enumerate((("fwd_s", "forward"), ("fb_s", "forward + backward"))):
            _time_panel(axes[i, j], rows, pattern, what, f"{pattern} ({settings}): {text}",
                        config=c)
            axes[i, j].set_ylabel(f"milliseconds (median, {timer})")
        _speedup_panel(axes[i, 2], rows, pattern, c)
    if long:
        _long_panels(axes[-1], long)
    for ax in axes.flat:                  # every legend under its panel: these fill theirs
        _legend(ax, below=True)
    m = data["machine"]
    where = m.get("gpu") or f"{m['cpu']} (wall clock)"
    sdpa = data["calibration"]["sdpa_backend"].get(dtype, "?")
    variant = f", kernel variant {c['default_variant']}" if c.get("default_variant") else ""
    fig.suptitle(f"Sparse attention vs dense causal SDPA ({sdpa}) on {where}: B={B}, H={H}, "
                 f"d={c['d']}, {dtype}, block {c['block']}{variant}; torch {m['torch']}, "
                 f"Triton {m.get('triton')}", fontsize=10)
    fig.tight_layout()
    return style.save(fig, path, tight=True)        # the speed-up legends hang below


def _speedup_panel(ax, rows, pattern, config=None):
    """Speed-up over dense of every contender (forward solid, forward+backward dashed)
    and the two ideals the rows carry: the structured layout's tile count (dotted) and
    the keys read (grey dots)."""
    for name in contender_names(rows, pattern):
        if name == "dense":
            continue
        for what, ls in (("fwd", "-"), ("fb", "--")):
            pts = sorted((r["n"], r[what]["speedup"]) for r in rows if r["contender"] == name
                         and r["pattern"] == pattern and r.get(what, {}).get("speedup"))
            if pts:
                ax.plot(*zip(*pts), ls=ls, marker=style.marker(name), color=style.color(name),
                        label=f"{label(name, config)}, {'fwd' if what == 'fwd' else 'fwd+bwd'}")
    # one line per kind of ideal: the rows of the Triton contenders carry the tile count's,
    # the others the keys read's (fast.experiments.bench._derived): joined, they zigzag
    for by, colour, what in (("tiles", style.BLACK, "ideal (tile count)"),
                             ("pairs", style.LIGHT_GREY, "ideal (keys read)")):
        ideal = sorted({(r["n"], r["ideal"]) for r in rows if r["pattern"] == pattern
                        and r.get("ideal") and r.get("ideal_by", "tiles") == by})
        if ideal:
            ax.plot(*zip(*ideal), ls=":", lw=1.6, color=colour, label=what)
    ax.axhline(1.0, color=style.GREY, lw=0.8)
    _log_axes(ax)
    ax.set_title(f"{pattern}: speed-up over dense causal SDPA", fontsize=10)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("dense time / time")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, below=True)


def _long_panels(axes, rows):
    """The long sweep: times of the Triton kernel (and dense), its layout build and
    first call, and its forward+backward peak memory over the bytes of q, k, v, o."""
    B, H = rows[0]["B"], rows[0]["H"]
    for pattern in sorted({r["pattern"] for r in rows if r["pattern"]}):
        sel = sorted((r for r in rows if r["pattern"] == pattern), key=lambda r: r["n"])
        ns = [r["n"] for r in sel]
        col = style.color(pattern)
        axes[0].plot(ns, [r["fwd_s"] * 1e3 for r in sel], "-o", color=col,
                     label=f"{pattern}, fwd")
        axes[0].plot(ns, [r["fb_s"] * 1e3 for r in sel], "--o", color=col,
                     label=f"{pattern}, fwd+bwd")
        axes[1].plot(ns, [r["first_fwd_s"] for r in sel], "-o", color=col,
                     label=f"{pattern}, first call")
        if all("layout_s" in r for r in sel):
            axes[1].plot(ns, [r["layout_s"] for r in sel], ":o", color=col,
                         label=f"{pattern}, layout build")
        axes[2].plot(ns, [r.get("peak_fb_over_qkvo") or 0 for r in sel], "-o", color=col,
                     label=pattern)
    dense = sorted((r["n"], r["fwd_s"] * 1e3) for r in rows if r["pattern"] is None)
    if dense:
        axes[0].plot(*zip(*dense), "-o", color=style.color("dense"),
                     label="dense causal SDPA, fwd")
    axes[2].axhline(2.0, color=style.GREY, lw=0.8, ls=":", label="2x (target)")
    _log_axes(axes[0])
    _log_axes(axes[1])
    axes[2].set_xscale("log", base=2)
    for ax, title, unit in ((axes[0], f"long sequences (B={B}, H={H}, l=256): time", "ms"),
                            (axes[1], "first call and layout build", "seconds"),
                            (axes[2], "fwd+bwd peak memory / bytes of q, k, v, o", "ratio")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        _legend(ax)
