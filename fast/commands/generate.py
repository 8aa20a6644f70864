"""``python -m fast generate``: tokens per second of decoding with sparse and dense caches.

Child et al., 2019, sections 4.3 and 7. What is measured, on which models and how, is
``fast.experiments.generation``; this command runs it, writes
figures/data/generation.json and figures/generation.png (--quick: runs/quick/), and
prints what it found.

    python -m fast generate [--quick] [--threads N] [--runs R]
"""

from __future__ import annotations

from fast.commands import cli
from fast.experiments import generation
from fast.transformer.config import MAX_THREADS

COMMAND = "python -m fast generate"


def parser() -> cli.Parser:
    """The parser of ``python -m fast generate``; measures nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--quick", action="store_true", help="tiny models, for development")
    p.add_argument("--threads", type=cli.integer(1, MAX_THREADS), default=1,
                   help="torch threads of the cached samplers (default 1, the sampler's own "
                        "default on the CPU); the re-run sampler is timed with 1 and with one "
                        "per core, and credited with the faster")
    p.add_argument("--runs", type=cli.integer(1, 20), default=None,
                   help="times the photos32 measurement is made, the median kept (default 3; "
                        "--quick 1): its ratio of two wall-clock totals moves from run to run "
                        "on a shared machine")
    return p


def print_summary(data: dict) -> None:
    print(f"the first compiled step of the run (compiling it, or loading it from Numba's disk "
          f"cache; not counted): {data['machine']['first_step_s']:.1f} s")
    for name, m in data["models"].items():
        r = m["rerun"]
        for kind in ("sparse", "dense"):
            print(f"{name}: {kind} cache, steps per engine: {m[kind]['steps']}")
        if "engines" in m:
            e = m["engines"]
            print(f"{name}: sparse cache, tokens/s compiled vs PyTorch step at keys per head "
                  + ", ".join(f"{k:.0f}: {a:.0f} vs {b:.0f}"
                              for k, a, b in zip(e["keys_per_head"], e["numba"], e["torch"])))
        if "sparse_torch" in m:
            print(f"{name}: sparse cache on the PyTorch step alone "
                  f"{m['sparse_torch']['total_s']:.1f} s, engine {m['sparse']['engine']} "
                  f"{m['sparse']['total_s']:.1f} s")
        print(f"{name} (n={m['n']}): sparse {m['sparse']['total_s']:.1f} s whole sample, "
              f"cache {m['sparse']['cache_bytes'] / 2**20:.1f} MiB vs dense "
              f"{m['dense']['cache_bytes'] / 2**20:.1f} MiB; re-run estimated "
              f"{r['total_s_estimated']:.0f} s (first {r['prefix']['tokens']} tokens: measured "
              f"{r['prefix']['measured_s']:.2f} s, estimated {r['prefix']['estimated_s']:.2f} s)")
    for t in data["targets"]:
        unit = t.get("unit", "x")
        cpu = f", CPU seconds {t['cpu_ratio']:.1f}x" if "cpu_ratio" in t else ""
        runs = (f", median of {len(t['runs'])} runs: "
                f"{', '.join(f'{r:.1f}x' for r in sorted(t['runs']))}"
                if len(t.get("runs", [])) > 1 else "")
        print(f"  {t['what']}: {t['measured']:.1f}{unit}{cpu}{runs} (goal {t['goal']}) "
              f"{verdict(t['met'])}")


def verdict(met: bool | None) -> str:
    """A goal's word: met, NOT MET, or n/a for a --quick run (its "met" is None)."""
    return "n/a (--quick)" if met is None else "met" if met else "NOT MET"



def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    json_path, png = generation.outputs(args.quick)
    cli.writable_or_exit(COMMAND, json_path.parent, png.parent)
    data = generation.run(args.quick, args.threads, args.runs or (1 if args.quick else 3))
    path, png = generation.write(data, args.quick)
    print_summary(data)
    print(f"wrote {path} and {png} ({data['machine']['wall_s']:.0f} s)")
    return 0
