"""``python -m fast bench``: sparse attention against dense causal attention, a sweep over n.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute). Times, for n = 1024 .. 65536 (powers of 2), B=1, H=4, d=64,
float32 on the CPU, the contenders of ``fast.measure.bench`` (its docstring
gives the method):

  dense         up to --dense-n-max = 32768 (at 65536 one forward+backward takes
                minutes here)
  naive         skipped where the (H, n, n) mask and SDPA's float copy of it exceed
                --mask-gb, and past --naive-n-max = 8192, where it would take most
                of the run
  flex          forward only on a CPU, and only at --flex-n: each new n compiles
                for ~25 s
  structured    ours, at every n

for the strided (l=128) and fixed (l=128, c=32) patterns, merged heads. Every
(contender, pattern, n) is measured in a fresh process (``fast.measure.child``),
so each peak memory is that run's alone.

With ``--device cuda`` the method changes (``fast.experiments.bench_gpu``): every
contender family (dense SDPA, FlexAttention, the structured path, the Triton
kernels) runs in this one process, the first call apart, steady state as medians
of CUDA-event times, float16 and bfloat16, (B, H) = (1, 4) and (4, 16); ``--long``
adds n up to 2**20. ``--same-process`` runs that method on the CPU (wall clock).

    python -m fast bench                  # the full CPU sweep (about 8 min on 2 cores)
    python -m fast bench --quick          # n <= 4096, no FlexAttention
    python -m fast bench --device cuda [--long] [--out DIR]
    python -m fast bench --replot [--device cuda]   # redraw the figure from the saved JSON

Writes figures/data/bench_cpu.json (machine, versions, load average, every
timing) and figures/bench_cpu.png (``fast.plots.bench``); bench_cuda.* on CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from fast.commands import cli
from fast.core.files import write_json
from fast.experiments import bench_gpu
from fast.experiments.paths import FIGURES
from fast.measure import bench
from fast.measure.child import run_child
from fast.plots.bench import plot, plot_gpu


def skip_reason(name: str, pattern: str | None, n: int, args, flex_ns: set) -> str | None:
    """Why the sweep does not measure ``name`` at ``n``, or None when it does."""
    if name == "dense" and n > args.dense_n_max:
        return (f"dense causal attention is O(n^2): past --dense-n-max "
                f"{args.dense_n_max} one call takes minutes here")
    if name == "naive" and n > args.naive_n_max:
        return (f"the naive path is O(n^2) and runs the full square: past --naive-n-max "
                f"{args.naive_n_max} it would take most of the run")
    if name == "naive" and bench.mask_bytes(pattern, n) > args.mask_gb * 2**30:
        return (f"the n x n mask needs {bench.mask_bytes(pattern, n) / 2**30:.1f}"
                f" GiB > --mask-gb {args.mask_gb}")
    if name == "flex" and (args.no_flex or n not in flex_ns):
        return "FlexAttention compiles per n (~25 s on this CPU): only run at --flex-n"
    return None


def measure_point(spec: dict, inline: bool, timeout: float) -> dict:
    """``bench.measure`` of one point in a fresh process (or in this one if inline);
    a point that fails or times out is recorded as {"skipped": why}."""
    if inline:
        return bench.measure(**spec)
    out = run_child("fast.measure.bench:measure_spec", spec, timeout=timeout)
    return out["result"] if "result" in out else {"skipped": out["error"]}


def run(args) -> dict:
    """The CPU sweep (a fresh process per point): every n and contender; returns the
    dict written to the JSON."""
    device = args.device
    dtypes = ["float32"]
    ns = _powers(args.n_min, args.n_max)
    flex_ns = set(args.flex_n)
    t_start = time.time()
    info = bench.machine_info(device)
    info["loadavg_start"] = os.getloadavg()
    results = []
    for dtype in dtypes:
        for n in ns:
            jobs = [("dense", None)]
            for pattern, params in bench.PATTERN_PARAMS.items():
                names = bench.registry(pattern, params, device, bench.DTYPES[dtype])
                jobs += [(x, pattern) for x in names if x != "dense"]
            for name, pattern in jobs:
                entry = {"contender": name, "pattern": pattern, "n": n, "dtype": dtype}
                reason = skip_reason(name, pattern, n, args, flex_ns)
                if reason is not None:
                    entry["skipped"] = reason
                else:
                    spec = {"name": name, "pattern": pattern or "strided", "n": n,
                            "device": device, "dtype_name": dtype, "target": args.target,
                            "backward": bench.has_backward(name, device)}
                    t0 = time.time()
                    entry.update(measure_point(spec, args.inline, args.timeout))
                    entry["wall_s"] = time.time() - t0
                results.append(entry)
                msg = entry.get("skipped") or (
                    f"fwd {entry['fwd_s'] * 1e3:.1f} ms" +
                    (f", fwd+bwd {entry['fb_s'] * 1e3:.1f} ms" if "fb_s" in entry else ""))
                print(f"[{time.time() - t_start:6.0f} s] {dtype} n={n:6d} {name:11} "
                      f"{pattern or '':8} {msg}", flush=True)
    info["loadavg_end"] = os.getloadavg()
    info["wall_s"] = time.time() - t_start
    return {"machine": info,
            "config": {"B": bench.B, "H": bench.H, "d": bench.D,
                       "patterns": bench.PATTERN_PARAMS, "combine": "merged",
                       "dense_n_max": args.dense_n_max, "naive_n_max": args.naive_n_max,
                       "device": device, "ns": ns, "flex_ns": sorted(flex_ns),
                       "target_s": args.target, "mask_gb": args.mask_gb,
                       "timing": "min over repetitions after a warm-up call",
                       "memory": ("peak RSS above the inputs, fresh process per point"
                                  if device == "cpu" and not args.inline else
                                  "peak RSS above the inputs, in-process" if device == "cpu"
                                  else "torch.cuda.max_memory_allocated above the inputs")},
            "results": results,
            "targets": {dt: bench.summarize(results, dt) for dt in dtypes}}


def print_table(results: list[dict], dtype: str) -> None:
    """Time, speed-up over dense and peak memory of every contender, one column per n."""
    rows = [r for r in results if r.get("dtype") == dtype]
    ns = sorted({r["n"] for r in rows})
    print(f"\n{dtype}: time (ms) and speed-up over dense causal SDPA (min over reps); "
          f"peak memory MiB (forward+backward, or forward)")
    print(f"{'pattern':8} {'contender':22} " + " ".join(f"{n:>17}" for n in ns))
    for pattern in bench.PATTERN_PARAMS:
        for name in bench.contender_names(rows, pattern):
            for what in ("fwd_s", "fb_s"):
                cells = []
                for n in ns:
                    r = bench.entry(rows, name, pattern, n)
                    d = bench.find(rows, contender="dense", n=n)
                    if r is None or "skipped" in r or not r.get(what):
                        cells.append(f"{'-':>17}")
                        continue
                    sp = f"{d[what] / r[what]:5.1f}x" if d and d.get(what) else "   -  "
                    cells.append(f"{r[what] * 1e3:9.1f} {sp:>7}")
                label = "fwd" if what == "fwd_s" else "fwd+bwd"
                print(f"{pattern:8} {name + ' ' + label:22} " + " ".join(cells))
            cells = []
            for n in ns:
                r = bench.entry(rows, name, pattern, n) or {}
                m = r.get("peak_fb_bytes") or r.get("peak_fwd_bytes")
                cells.append(f"{m / 2**20:17.0f}" if m is not None else f"{'-':>17}")
            print(f"{pattern:8} {name + ' peak MiB':22} " + " ".join(cells))


def shape(text: str) -> tuple[int, int]:
    """'4x16' -> (B, H) = (4, 16), each in [1, 4096]."""
    try:
        b, h = (int(x) for x in text.lower().split("x"))
        if not (1 <= b <= 4096 and 1 <= h <= 4096):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: BxH with B and H in "
                                         f"[1, 4096], e.g. 4x16") from None
    return b, h


def parser() -> cli.Parser:
    """The parser of ``python -m fast bench``; measures nothing."""
    n, seconds = cli.integer(1, cli.MAX_SEQUENCE), cli.finite(0.0, 86400.0, lo_open=True)
    p = cli.Parser("python -m fast bench", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", type=cli.choice(("cpu", "cuda")))
    p.add_argument("--n-min", type=n, default=1024)
    p.add_argument("--n-max", type=n, default=65536)
    p.add_argument("--quick", action="store_true",
                   help="n up to 4096, no FlexAttention, short repetitions")
    p.add_argument("--flex-n", type=n, nargs="*", default=[4096, 16384],
                   help="n at which FlexAttention runs on the CPU")
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--dense-n-max", type=cli.integer(0, cli.MAX_SEQUENCE), default=32768,
                   help="largest n for dense SDPA (O(n^2) time)")
    p.add_argument("--naive-n-max", type=cli.integer(0, cli.MAX_SEQUENCE), default=8192,
                   help="largest n for the naive masked SDPA (O(n^2) time and memory)")
    p.add_argument("--mask-gb", type=cli.finite(0.0, 2.0**20), default=3.0,
                   help="largest naive mask (bool + SDPA's float copy), GiB")
    p.add_argument("--target", type=cli.finite(0.0, 86400.0), default=None,
                   help="seconds of repetitions per measurement (CPU 1.0; same process 0.1; "
                        "0: --min-reps only)")
    p.add_argument("--timeout", type=seconds, default=600.0, help="seconds per point")
    p.add_argument("--inline", action="store_true",
                   help="measure in this process (tests; memory less isolated)")
    p.add_argument("--out", type=cli.writable_folder, default=None,
                   help="directory for data/bench_<device>.json and bench_<device>.png "
                        "(default: figures/)")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: redraw bench_<device>.png from the saved JSON")
    g = p.add_argument_group("the same-process method (the default on CUDA)")
    g.add_argument("--same-process", action="store_true",
                   help="every contender in this process, first call apart, medians")
    g.add_argument("--dtypes", nargs="+", type=cli.choice(bench.DTYPES), default=None,
                   help="default: float16 bfloat16 on CUDA, float32 on the CPU")
    g.add_argument("--shapes", nargs="+", type=shape, default=None,
                   help="(B, H) as BxH; default 1x4 4x16 (CPU: 1x4)")
    g.add_argument("--contenders", nargs="+", type=cli.choice(bench_gpu.CONTENDERS),
                   default=None)
    g.add_argument("--warmup", type=cli.integer(0, 10**4), default=2)
    g.add_argument("--min-reps", type=cli.integer(1, 10**6), default=5)
    g.add_argument("--max-minutes", type=cli.finite(0.0, 10**4, lo_open=True), default=None,
                   help="start no new point after this (default 9 on CUDA)")
    g.add_argument("--assume-tflops", type=cli.finite(0.0, 10**6, lo_open=True), default=None,
                   help="dense throughput assumed by the cost estimate (CUDA 300)")
    g.add_argument("--copy-mib", type=cli.integer(1, 2**20), default=None,
                   help="MiB copied to measure the bandwidth (CUDA 1024, CPU 64)")
    g.add_argument("--no-target-points", dest="target_points", action="store_false",
                   default=None, help="skip the (1, 16, 65536) target point")
    g.add_argument("--long", action="store_true", help="add the long sweep (B=1, H=8, l=256)")
    g.add_argument("--only-long", action="store_true",
                   help="only the long sweep (with a 10-minute limit per command, run the "
                        "default sweep and this one separately)")
    g.add_argument("--long-n-min", type=n, default=2**17)
    g.add_argument("--long-n-max", type=n, default=2**20)
    g.add_argument("--long-dense-n-max", type=cli.integer(0, cli.MAX_SEQUENCE), default=2**19)
    return p


def parse_args(argv=None):
    """The options, checked (one line and exit 2 on a bad one)."""
    args = parser().parse_or_exit(argv)
    args.out = None if args.out is None else Path(args.out)
    for lo, hi in (("n_min", "n_max"), ("long_n_min", "long_n_max")):
        if getattr(args, lo) > getattr(args, hi):
            flag = f"--{lo.replace('_', '-')}"
            cli.fail("python -m fast bench", f"{flag} {getattr(args, lo)} with "
                     f"--{hi.replace('_', '-')} {getattr(args, hi)}; allowed: {flag} <= "
                     f"--{hi.replace('_', '-')}")
    return args


def _powers(lo: int, hi: int) -> list[int]:
    return [2 ** e for e in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]


def same_process_defaults(args):
    """Fill the same-process options left unset, for the device."""
    cuda = args.device == "cuda"
    args.dtypes = args.dtypes or (["float16", "bfloat16"] if cuda else ["float32"])
    args.shapes = args.shapes or ([(1, 4), (4, 16)] if cuda else [(1, 4)])
    args.contenders = args.contenders or [
        c for c in bench_gpu.CONTENDERS if not (c == "flex" and (args.no_flex or not cuda))]
    args.target = 0.1 if args.target is None else args.target
    args.max_minutes = args.max_minutes if args.max_minutes is not None else (9 if cuda else None)
    args.assume_tflops = args.assume_tflops or (300.0 if cuda else 0.05)
    args.copy_mib = args.copy_mib or (1024 if cuda else 64)
    args.target_points = cuda if args.target_points is None else args.target_points
    args.patterns = bench.PATTERN_PARAMS
    args.ns = _powers(args.n_min, args.n_max)
    args.long_ns = _powers(args.long_n_min, args.long_n_max)
    args.long = args.long or args.only_long
    if args.only_long:
        args.ns, args.target_points = [], False
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    same = args.same_process or args.device == "cuda"
    name = f"bench_{args.device}" + ("_same_process" if same and args.device == "cpu" else "")
    out = args.out or FIGURES
    path, png = out / "data" / f"{name}.json", out / f"{name}.png"
    if args.replot:
        if not path.is_file():
            cli.fail("python -m fast bench", f"--replot with no {path}; allowed: --replot "
                     f"after a run of this device and method has written it")
        draw = plot_gpu if same else plot
        print(f"wrote {draw(json.loads(path.read_text()), png)}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        cli.fail("python -m fast bench", "--device cuda on a machine without CUDA; allowed: "
                                         "--device cpu here")
    cli.writable_or_exit("python -m fast bench", out, out / "data")
    if args.quick:
        args.n_max, args.no_flex = min(args.n_max, 4096), True
        args.target = 0.3 if args.target is None else args.target
        if args.n_min > args.n_max:
            cli.fail("python -m fast bench", f"--n-min {args.n_min} with --quick; allowed: "
                                             f"--n-min <= 4096 (the quick sweep's largest n)")
    if same:
        args = same_process_defaults(args)
        data = bench_gpu.run(args, save=lambda d: write_json(path, d, indent=1))
        write_json(path, data, indent=1)
        bench_gpu.print_targets(data)
        plot_gpu(data, png)
        print(f"\nwrote {path} and {png} ({data['machine']['wall_s']:.0f} s)")
        return 0
    args.target = 1.0 if args.target is None else args.target
    data = run(args)
    for dtype in data["targets"]:
        print_table(data["results"], dtype)
        print(f"\ntargets ({dtype}):")
        for key, val in data["targets"][dtype].items():
            print(f"  {key:32} {val if val is None else round(val, 3)}")
    write_json(path, data, indent=1)
    plot(data, png)
    print(f"\nwrote {path} and {png} ({data['machine']['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
