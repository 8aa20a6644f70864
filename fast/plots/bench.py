"""The benchmark figure: time against n, log-log, with fitted slopes.

Child et al., 2019, section 4 and Table 2: dense attention costs O(n^2) (slope 2
on a log-log plot), a factorized pattern O(n sqrt(n)) (slope 1.5). Reads the
dict that ``fast.measure.bench`` writes to figures/data/bench_<device>.json; one row of
panels per pattern, forward and forward+backward side by side. Slopes are fitted
by least squares over n >= 4096 (smaller n is dominated by fixed overheads).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fast.measure.bench import PATTERNS, fitted_slope  # noqa: E402

STYLE = {"dense": ("k", "o"), "naive": ("tab:gray", "s"), "flex": ("tab:orange", "^"),
         "structured": ("tab:blue", "D")}
SLOPE_FROM = 4096


def plot(data: dict, path: Path, dtype: str = "float32") -> Path:
    """Draw data (fast.measure.bench's JSON dict) into path (PNG)."""
    rows = [r for r in data["results"] if r.get("dtype") == dtype and "skipped" not in r]
    fig, axes = plt.subplots(len(PATTERNS), 2, figsize=(10, 4.2 * len(PATTERNS)),
                             squeeze=False)
    for i, pattern in enumerate(PATTERNS):
        for j, (what, label) in enumerate((("fwd_s", "forward"), ("fb_s", "forward + backward"))):
            ax = axes[i, j]
            names = sorted({r["contender"] for r in rows if r["pattern"] in (pattern, None)},
                           key=lambda s: (s != "dense", s))
            for name in names:
                pts = sorted((r["n"], r[what]) for r in rows if r["contender"] == name
                             and r["pattern"] in (pattern, None) and r.get(what))
                if not pts:
                    continue
                ns, ts = zip(*pts)
                big = [(n, t) for n, t in pts if n >= SLOPE_FROM]
                slope = fitted_slope(*zip(*big)) if len(big) >= 2 else None
                color, marker = STYLE.get(name, (None, "x"))
                tag = f"{name} (slope {slope:.2f})" if slope is not None else name
                ax.loglog(ns, ts, marker=marker, color=color, label=tag, base=2)
            params = ", ".join(f"{k}={v}" for k, v in PATTERNS[pattern].items())
            ax.set_title(f"{pattern} ({params}): {label}", fontsize=10)
            ax.set_xlabel("sequence length n")
            ax.set_ylabel("seconds (min over repetitions)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    m, c = data["machine"], data["config"]
    where = m.get("gpu") or f"{m['cpu']}, {m['cpu_count']} cores"
    fig.suptitle(f"Sparse attention vs dense causal SDPA, B={c['B']}, H={c['H']}, d={c['d']}, "
                 f"{dtype}; {where}; torch {m['torch']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("figures/data/bench_cpu.json")
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("figures/bench_cpu.png")
    print(plot(json.loads(src.read_text()), out))
