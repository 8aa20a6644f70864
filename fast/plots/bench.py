"""The benchmark figure: time against n, log-log, with fitted slopes.

Child et al., 2019, section 4 and Table 2: dense attention costs O(n^2) (slope 2
on a log-log plot), a factorized pattern O(n sqrt(n)) (slope 1.5). Draws the
dict that ``python -m fast bench`` writes to figures/data/bench_<device>.json; one
row of panels per pattern, forward and forward+backward side by side. Slopes are
fitted by least squares over n >= 4096 (smaller n is dominated by fixed overheads).
"""

from __future__ import annotations

from pathlib import Path

from fast.measure.bench import PATTERN_PARAMS, contender_names, fitted_slope
from fast.plots import style
from fast.plots.style import plt

SLOPE_FROM = 4096


def plot(data: dict, path: Path, dtype: str = "float32") -> Path:
    """Draw data (the benchmark's JSON dict) into path (PNG)."""
    rows = [r for r in data["results"] if r.get("dtype") == dtype and "skipped" not in r]
    fig, axes = plt.subplots(len(PATTERN_PARAMS), 2, figsize=(10, 4.2 * len(PATTERN_PARAMS)),
                             squeeze=False)
    for i, (pattern, params) in enumerate(PATTERN_PARAMS.items()):
        for j, (what, label) in enumerate((("fwd_s", "forward"), ("fb_s", "forward + backward"))):
            ax = axes[i, j]
            for name in contender_names(rows, pattern):
                pts = sorted((r["n"], r[what]) for r in rows if r["contender"] == name
                             and r["pattern"] in (pattern, None) and r.get(what))
                if not pts:
                    continue
                ns, ts = zip(*pts)
                big = [(n, t) for n, t in pts if n >= SLOPE_FROM]
                slope = fitted_slope(*zip(*big)) if len(big) >= 2 else None
                tag = f"{name} (slope {slope:.2f})" if slope is not None else name
                ax.loglog(ns, ts, marker=style.marker(name), color=style.color(name), label=tag,
                          base=2)
            settings = ", ".join(f"{k}={v}" for k, v in params.items())
            ax.set_title(f"{pattern} ({settings}): {label}", fontsize=10)
            ax.set_xlabel("sequence length n")
            ax.set_ylabel("seconds (min over repetitions)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    m, c = data["machine"], data["config"]
    where = m.get("gpu") or f"{m['cpu']}, {m['cpu_count']} cores"
    fig.suptitle(f"Sparse attention vs dense causal SDPA, B={c['B']}, H={c['H']}, d={c['d']}, "
                 f"{dtype}; {where}; torch {m['torch']}", fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)
