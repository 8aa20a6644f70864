"""Print the README's result tables from the JSON that the figure scripts wrote.

Child et al., 2019: the attention speed targets (sec. 4.4 and 5.5, ``python -m
fast bench``), recomputation memory (sec. 5.4 and the blog's table, ``python -m
fast memory``) and Table 2 (``python -m fast table2``). Every number in the
README's "Results" section is printed by this script, so it can be checked
against a fresh ``python -m fast figures``:

    python -m fast results            # markdown, from figures/data/*.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fast.experiments.paths import DATA
from fast.plots.style import PATTERN_ORDER, display_name

GIB = 2.0 ** 30


def _load(data: Path, name: str) -> dict | None:
    path = data / name
    return json.loads(path.read_text()) if path.exists() else None


def bench_section(bench: dict) -> list[str]:
    m, t = bench["machine"], bench["targets"]["float32"]
    out = [f"Attention, `python -m fast bench` ({m['cpu']}, {m['cpu_count']} cores, torch "
           f"{m['torch']}; B=1, H=4, d=64, float32; times are the minimum over repetitions):", "",
           "| target | goal | measured |", "|---|---|---|"]
    rows = [
        ("strided l=128, n=16384, forward vs dense causal SDPA", ">= 12x",
         f"{t['strided_fwd_speedup_16384']:.1f}x"),
        ("strided l=128, n=16384, forward+backward", ">= 8x",
         f"{t['strided_fb_speedup_16384']:.1f}x"),
        ("fixed l=128 c=32, n=16384, forward", ">= 3x", f"{t['fixed_fwd_speedup_16384']:.2f}x"),
        ("fixed l=128 c=32, n=16384, forward+backward", "-", f"{t['fixed_fb_speedup_16384']:.2f}x"),
        ("strided time slope, n = 4096..65536 (fwd / fwd+bwd)", "<= 1.6",
         f"{t['strided_fwd_slope_4096_65536']:.2f} / {t['strided_fb_slope_4096_65536']:.2f}"),
        ("strided forward+backward peak memory, n=65536", "< 2 GB",
         f"{t['strided_fb_peak_bytes_65536'] / 1e9:.2f} GB"),
    ]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return out


def memory_section(mem: dict) -> list[str]:
    rows = {(r["layers"], r["recompute"]): r["saved_bytes"] for r in mem["depth"]["rows"]}
    deepest = max(layers for layers, _ in rows)
    kept, recomputed = rows[(deepest, False)], rows[(deepest, True)]
    big = mem["big"]
    return [
        "Recomputation, `python -m fast memory` (d=256, 4 heads, strided, float32, batch 1):",
        "",
        f"- {deepest} layers at n={mem['depth']['n']}: bytes saved for backward "
        f"{kept / GIB:.2f} GiB without recomputation, {recomputed / GIB:.3f} GiB with it: "
        f"**{kept / recomputed:.1f}x** less (goal >= 10x).",
        f"- {big['layers']} layers at n={big['n']} ({big['step']['n_params'] / 1e6:.0f}M "
        f"parameters): a training step with recomputation peaks at "
        f"{big['measured_peak_with'] / GIB:.1f} GiB on this "
        f"{big['machine_total_bytes'] / GIB:.0f} GiB machine; without it, the measured "
        f"{big['per_layer_without'] / 2**20:.0f} MiB per layer would need about "
        f"{big['estimated_peak_without'] / GIB:.0f} GiB.",
    ]


def table2_section(t2: dict) -> list[str]:
    runs, paper = t2["runs"], t2["paper"]
    out = ["Table 2 at CPU scale, `python -m fast table2` (same budget for every pattern; "
           "held-out test bits; paper's numbers beside):", "",
           "| pattern | stdlib text, bits/byte | paper Enwik8 | photo crops, bits/dim "
           "| paper CIFAR-10 |",
           "|---|---|---|---|---|"]
    for p in PATTERN_ORDER:
        out.append(f"| {display_name(p)} | {runs[f'text/{p}']['test_bits']:.3f} "
                   f"| {paper['text'][p][0]:.2f} "
                   f"| {runs[f'image/{p}']['test_bits']:.3f} | {paper['image'][p][0]:.2f} |")
    out += ["", "Time per training iteration (2 layers, d=256, batch 1; paper: Enwik8 / CIFAR-10 "
            "seconds per iteration on their GPUs):", "",
            "| pattern | " + " | ".join(f"n={n}" for n in sorted({r["n"] for r in t2["timing"]}))
            + " | paper Enwik8 | paper CIFAR-10 |", "|---|---|---|---|---|"]
    by = {(r["pattern"], r["n"]): r["time_per_iter"] for r in t2["timing"]}
    ns = sorted({r["n"] for r in t2["timing"]})
    for p in PATTERN_ORDER:
        cells = [f"{by[(p, n)]:.2f} s ({by[(p, n)] / by[('full', n)]:.2f}x)" for n in ns]
        out.append(f"| {display_name(p)} | " + " | ".join(cells)
                   + f" | {paper['text'][p][1]:.2f} | {paper['image'][p][1]:.2f} |")
    return out


def figures_section(log: dict) -> list[str]:
    steps = log.get("steps", log)
    parts = [f"{name} {info['seconds'] / 60:.1f} min" for name, info in steps.items()
             if isinstance(info, dict) and "seconds" in info]
    return ["`make figures` steps: " + ", ".join(parts) + "."] if parts else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    sections = [("bench_cpu.json", bench_section), ("memory.json", memory_section),
                ("table2.json", table2_section), ("make_figures.json", figures_section)]
    missing = []
    for name, section in sections:
        payload = _load(args.data, name)
        if payload is None:
            missing.append(name)
            continue
        print("\n".join(section(payload)) + "\n")
    if missing:
        print(f"(not yet measured: {', '.join(missing)}; run `make figures`)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
