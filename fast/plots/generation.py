"""The generation figure: tokens per second and cache memory against sequence length.

Child et al., 2019, section 4.3 (a factorized head reads about sqrt(n) keys, so
a step of a sparse cache reads l + t / l keys, or block + t c / l, instead of t)
and section 7 (3072-byte images, 12,288-byte texts). From
figures/data/generation.json (``python -m fast generate``): one row per model;
left, tokens per second at position t for the re-run sampler (a forward pass
over the prefix per token), a dense key/value cache and the sparse cache (both
on the decoder's compiled CPU step; photos32 also the sparse cache on the
PyTorch step); right, the bytes each cache holds for a sample of length n. The
caches step on the machine's recorded thread count; the re-run sampler is credited
with the fastest of its thread counts at each t (its record's "threads"), and the
title and legend say so.
"""

from __future__ import annotations

from pathlib import Path

from fast.plots import style
from fast.plots.style import plt

# contender -> (label, colour, line style)
LINES = {"sparse": ("sparse cache (ours)", style.PURPLE, "-"),
         "sparse_torch": ("sparse cache, PyTorch step", style.PURPLE, "-."),
         "dense": ("dense cache", style.GREY, "--"),
         "rerun": ("re-run sampler", style.RED, ":")}


def _steps(record: dict) -> str:
    """", compiled step" / ", compiled: 80% of steps" from a record's step counts."""
    steps = record.get("steps") or {}
    total = sum(steps.values())
    if not total or not steps.get("numba"):
        return ""
    share = steps["numba"] / total
    return ", compiled step" if share == 1 else f", compiled: {share:.0%} of steps"


# generation.json's keys as the figure names them: "enwik8" is a model of the paper's Enwik8
# shape (context, stride, summary width, heads; sec. 7.2) but far narrower and shallower.
NAMES = {"enwik8": "Enwik8-shaped"}


def _title(name: str, m: dict) -> str:
    """"photos32: n=3072, strided l=96" from the model's stored config."""
    cfg = m["config"]
    c = f", c={cfg['c']}" if cfg.get("c") else ""
    return (f"{NAMES.get(name, name)}: n={m['n']}, {cfg['pattern']} l={cfg['stride']}{c}, "
            f"{cfg['n_heads']} heads")


def _counts(counts) -> str:
    """"1", "1 and 2", "1, 2 and 4" from a list of thread counts."""
    words = [str(c) for c in counts]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def threads(data: dict) -> str:
    """Which sampler ran on how many intra-op threads: "caches on 1 thread; re-run sampler
    on the faster of 1 and 2 threads at each t". The caches ran on the machine's recorded
    count; the re-run sampler on each count of its record's "threads", the fastest kept."""
    cache = data["machine"]["torch_threads"]
    counts = sorted({c for m in data["models"].values()
                     for c in m["rerun"].get("threads", [cache])})
    rerun = (f"{counts[0]} thread{'s' * (counts[0] != 1)}" if len(counts) == 1 else
             f"the {'faster' if len(counts) == 2 else 'fastest'} of {_counts(counts)} threads "
             f"at each t")
    return f"caches on {cache} thread{'s' * (cache != 1)}; re-run sampler on {rerun}"


def _rerun_label(m: dict) -> str:
    """The re-run sampler's legend entry, with the thread counts it was timed on."""
    counts = m["rerun"].get("threads")
    return "" if not counts or len(counts) == 1 else f", best of {_counts(counts)} threads"


def _legend_below(ax) -> None:
    """The panel's legend under its axes: inside, it covered the re-run sampler's points
    (at both ends of t) and the memory lines' first points."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.27), ncol=2)


def plot_generation(data: dict, path) -> Path:
    """Write the figure (rows: models; columns: speed, memory) to ``path``."""
    models = data["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(10.0, 3.4 * len(models)), squeeze=False)
    for (ax_speed, ax_mem), (name, m) in zip(axes, models.items()):
        for kind in [k for k in LINES if k in m]:
            label, colour, ls = LINES[kind]
            marker = "o" if kind == "rerun" or len(m[kind]["t"]) < 10 else None
            ax_speed.plot(m[kind]["t"], m[kind]["tokens_per_s"], ls, color=colour,
                          marker=marker, ms=4,
                          label=label + (_rerun_label(m) if kind == "rerun" else _steps(m[kind])),
                          alpha=0.55 if kind == "sparse_torch" else 1.0)
        r = m["rerun"]
        speedup = r["total_s_estimated"] / m["sparse"]["total_s"]
        ax_speed.set_yscale("log")
        ax_speed.set_xlabel("position t of the token drawn")
        ax_speed.set_ylabel("tokens per second")
        ax_speed.set_title(f"{_title(name, m)}\nwhole sample: sparse "
                           f"{m['sparse']['total_s']:.0f} s, re-run ~{r['total_s_estimated']:.0f}"
                           f" s (estimated): {speedup:.0f}x", fontsize=9)
        ax_speed.grid(alpha=0.3, which="both")
        _legend_below(ax_speed)
        mib = 2.0 ** 20
        sizes = m["cache_bytes"]
        for kind, width in (("sparse", 4.0), ("dense", 1.5)):   # the sparse line under the dense
            label, colour, ls = LINES[kind]
            ax_mem.plot(sizes["n"], [b / mib for b in sizes[kind]], ls, color=colour, lw=width,
                        marker="o", ms=4, label=label, alpha=0.6 if kind == "sparse" else 1.0)
        if sizes["sparse"] == sizes["dense"]:
            ax_mem.text(0.03, 0.92, "the column reaches position 0:\nboth caches keep every key",
                        transform=ax_mem.transAxes, ha="left", va="top", fontsize=8)
        ax_mem.set_xlabel("sample length n (positions)")
        ax_mem.set_ylabel("keys and values held (MiB)")
        ax_mem.set_ylim(bottom=0)
        ax_mem.set_title("cache memory (the re-run sampler keeps none)", fontsize=9)
        ax_mem.grid(alpha=0.3)
        _legend_below(ax_mem)
    info = data["machine"]
    fig.suptitle(f"Sampling speed, batch 1, float32, random weights; {info['cpu']}, "
                 f"torch {info['torch']}\n{threads(data)}", fontsize=9.5)
    fig.tight_layout()
    return style.save(fig, path, tight=True)            # the legends hang below the panels
