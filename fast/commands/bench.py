"""``python -m fast bench``: sparse attention against dense causal attention, a sweep over n.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute). The options build a ``fast.experiments.bench_sweep.Sweep`` (what to
measure; its docstring gives the three default runs) and the sweep is measured,
written to JSON and drawn:

    python -m fast bench                  # the CPU sweep, a fresh process per point
    python -m fast bench --quick          # n <= 4096, no FlexAttention, short repetitions
    python -m fast bench --same-process   # the same sweep in one process (medians)
    python -m fast bench --device cuda [--long | --only-long] [--out DIR]
    python -m fast bench --device cuda --variants [NAME ...]   # the kernel variants
    python -m fast bench --replot [--device cuda]   # redraw the figure from the saved JSON
    python -m fast bench --crossover [--quick]      # where backend="auto" switches on the CPU
    python -m fast bench --compile [--quick]        # a GPT's training step, eager vs compiled
    python -m fast bench --host-cost [--quick]      # what one attention call costs the host

Writes figures/data/bench_cpu.json (machine, versions, load average, every
timing) and figures/bench_cpu.png (``fast.plots.bench``); bench_cpu_same_process.*
with --same-process, bench_cuda.* on CUDA. ``--variants`` times every kernel variant
(``fast.kernels.variants.VARIANTS``, or those named) at the GPU targets' points and
writes data/bench_cuda_variants.json with its "winners" (no figure: the table and the
winners are printed). ``--crossover`` times the naive and the structured path in turns
at short n on the CPU (``fast.measure.crossover``), writes the measurement to
data/auto_cpu.json and prints the crossovers it proposes for ``backend="auto"`` (the
constants of ``fast.backends.crossovers``, which a commit adopts). ``--compile`` times a small
GPT's training step eager and under ``torch.compile``, in turns, on the CPU
(``fast.measure.compile_step``) and writes data/compile_cpu.json (compiled / eager per
pattern and n). ``--host-cost`` measures what one attention call costs the host -- time,
Triton launches (stubbed: recorded, not run) and every other PyTorch op -- for the
Triton path, the structured path, dense SDPA and the model's attention layer
(``fast.measure.host_cost``) and writes data/host_cost_cpu.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from fast.commands import cli
from fast.experiments.bench import (
    RECORD,
    compile_report,
    crossover_report,
    draw,
    host_cost_report,
    incomplete,
    measure_and_save,
    measure_compile,
    measure_crossover,
    measure_host_cost,
    paths,
    report,
)
from fast.experiments.bench_sweep import Sweep, points, powers
from fast.experiments.cache import CacheError, read_cache
from fast.experiments.paths import FIGURES
from fast.kernels.variants import VARIANTS
from fast.measure.contenders import DTYPES, NAMES, TRITON

PROG = "python -m fast bench"
QUICK_N_MAX = 4096
N_MIN, N_MAX = 1024, 65536          # the sweep's n when --n-min / --n-max are not given


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


def bhn(text: str) -> tuple[int, int, int]:
    """'4x16x16384' -> (B, H, n) = (4, 16, 16384): B and H in [1, 4096], n a power of two."""
    try:
        b, h, n = (int(x) for x in text.lower().split("x"))
        if not (1 <= b <= 4096 and 1 <= h <= 4096 and 1 <= n <= cli.MAX_SEQUENCE
                and n & (n - 1) == 0):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: BxHxN with B and H in "
                                         f"[1, 4096] and N a power of two, e.g. "
                                         f"4x16x16384") from None
    return b, h, n


def parser() -> cli.Parser:
    """The parser of ``python -m fast bench``; measures nothing."""
    n = cli.integer(1, cli.MAX_SEQUENCE)
    end = cli.power_of_two(1, cli.MAX_SEQUENCE)      # an end of a sweep of powers of two
    limit = cli.integer(0, cli.MAX_SEQUENCE)
    p = cli.Parser(PROG, description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", type=cli.choice(("cpu", "cuda")))
    p.add_argument("--same-process", action="store_true",
                   help="every point in this process, medians (the method CUDA always uses); "
                        "default on the CPU: a fresh process per point, minimum")
    p.add_argument("--quick", action="store_true",
                   help=f"n up to {QUICK_N_MAX}, no FlexAttention, short repetitions")
    p.add_argument("--n-min", type=end, default=None,
                   help=f"the sweep's smallest n, a power of two (the sweep measures n = "
                        f"n-min, 2 n-min, ..., n-max, never outside them); default {N_MIN}")
    p.add_argument("--n-max", type=end, default=None,
                   help=f"the sweep's largest n, a power of two >= --n-min; default {N_MAX}")
    p.add_argument("--dtypes", nargs="+", type=cli.choice(DTYPES), default=None,
                   help="default: float16 bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--shapes", nargs="+", type=shape, default=None,
                   help="(B, H) as BxH; default 1x4 4x16 on CUDA, 1x4 on the CPU")
    p.add_argument("--contenders", nargs="+", type=cli.choice(NAMES), default=None,
                   help="default: dense naive flex structured on the CPU; dense flex "
                        "structured and the Triton kernels on CUDA")
    p.add_argument("--flex-n", type=n, nargs="+", default=None,
                   help="n at which FlexAttention runs (it compiles per n); default 16384 "
                        "on the CPU, every n on CUDA; each an n of the sweep, and --contenders "
                        "flex needs one of them in it")
    p.add_argument("--dense-n-max", type=limit, default=None,
                   help="largest n for dense SDPA (O(n^2) time); default 16384 on the CPU")
    p.add_argument("--naive-n-max", type=limit, default=None,
                   help="largest n for the naive masked SDPA (O(n^2) time and memory); "
                        "default 4096 on the CPU")
    p.add_argument("--mask-gb", type=cli.finite(0.0, 2.0**20), default=None,
                   help="largest naive mask (bool + SDPA's float copy), GiB; default 3")
    p.add_argument("--target", type=cli.finite(0.0, 86400.0), default=None,
                   help="seconds of repetitions per measurement (fresh process 1.0, --quick "
                        "0.3; same process 0.1; 0: the fewest repetitions)")
    p.add_argument("--min-reps", type=cli.integer(1, 10**6), default=None,
                   help="fewest repetitions of a short call (fresh process 3, same process 5)")
    p.add_argument("--max-minutes", type=cli.finite(0.0, 10**4, lo_open=True), default=None,
                   help="start no new point after this (default 9 on CUDA)")
    p.add_argument("--points", nargs="+", type=bhn, default=None,
                   help="(B, H, n) measured after the sweep's shapes and n, in the first "
                        "dtype, as BxHxN; default 1x16x65536 on CUDA, the variant sweep "
                        "1x4x16384 1x16x65536, none on the CPU")
    p.add_argument("--cap-s", type=cli.finite(0.0, 86400.0, lo_open=True), default=None,
                   help="seconds one contender may spend at one point, compilation included "
                        "(no new phase of it starts past the cap, and it is not run at the "
                        "larger n of its shape); default 60 on CUDA, none on the CPU")
    p.add_argument("--long", action="store_true",
                   help="add the long sweep (B=1, H=8, l=256; one process: CUDA or "
                        "--same-process)")
    p.add_argument("--only-long", action="store_true",
                   help="only the long sweep (with a 10-minute limit per command, run the "
                        "default sweep and this one separately)")
    p.add_argument("--long-n-min", type=end, default=2**17,
                   help="the long sweep's smallest n, a power of two; default 2^17")
    p.add_argument("--long-n-max", type=end, default=2**20,
                   help="the long sweep's largest n, a power of two >= --long-n-min; "
                        "default 2^20")
    p.add_argument("--out", type=cli.writable_folder, default=None,
                   help="directory for data/bench_<device>.json and bench_<device>.png "
                        "(default: figures/)")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: redraw bench_<device>.png from the saved JSON (a "
                        "record of an interrupted run, \"complete\": false, is drawn with a "
                        "line saying so)")
    p.add_argument("--crossover", action="store_true",
                   help="only auto's crossover on the CPU: the naive and the structured path "
                        "in turns at n = 64 .. 2048, strides 16 .. 128 (--quick: two rounds); "
                        "writes data/auto_cpu.json and prints the constants it proposes for "
                        "backend='auto' (fast/backends/crossovers.py)")
    p.add_argument("--compile", action="store_true",
                   help="only a small GPT's training step, eager against torch.compile, in "
                        "turns on the CPU (one thread) at n = 256 and 1024 for full, strided, "
                        "fixed (--quick: n = 256, two rounds); writes data/compile_cpu.json")
    p.add_argument("--host-cost", action="store_true",
                   help="only the host's cost per attention call: time, Triton launches "
                        "(stubbed) and every other op, for the Triton and structured paths, "
                        "dense SDPA and the model's attention layer (--quick: 300 calls a "
                        "measurement, not 2000); writes data/host_cost_cpu.json")
    p.add_argument("--variants", nargs="*", type=cli.choice(VARIANTS), default=None,
                   help="the variant sweep: these kernel variants (none named: all) side by "
                        "side at the GPU targets' points, float16, (B, H, n) = (4, 16, 16384), "
                        "(1, 4, 16384), (1, 16, 65536) (--shapes / --n-min / --n-max replace "
                        "them), with dense and FlexAttention; no new point after 7 minutes; "
                        "writes data/bench_<device>_variants.json with the winners")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The options, each checked, and checked against each other (one line and exit 2
    on a bad one)."""
    args = parser().parse_or_exit(argv)
    args.n_given = args.n_min is not None or args.n_max is not None
    args.n_min = N_MIN if args.n_min is None else args.n_min
    args.n_max = N_MAX if args.n_max is None else args.n_max
    for lo, hi in (("n_min", "n_max"), ("long_n_min", "long_n_max")):
        if getattr(args, lo) > getattr(args, hi):
            flag, other = f"--{lo.replace('_', '-')}", f"--{hi.replace('_', '-')}"
            cli.fail(PROG, f"{flag} {getattr(args, lo)} with {other} {getattr(args, hi)}; "
                           f"allowed: {flag} <= {other}")
    if args.quick and args.n_min > QUICK_N_MAX:
        cli.fail(PROG, f"--n-min {args.n_min} with --quick; allowed: --n-min <= "
                       f"{QUICK_N_MAX} (the quick sweep's largest n)")
    if (args.long or args.only_long) and args.device == "cpu" and not args.same_process:
        flag = "--only-long" if args.only_long else "--long"
        cli.fail(PROG, f"{flag} with the CPU's fresh process per point; allowed: {flag} with "
                       f"--same-process or --device cuda (the long sweep runs in one process)")
    if args.points and args.only_long:
        cli.fail(PROG, "--points with --only-long; allowed: --points with a sweep (the long "
                       "sweep has its own n: --long-n-min, --long-n-max)")
    alone_given = [f"--{a.replace('_', '-')}" for a in ("crossover", "compile", "host_cost")
                   if getattr(args, a)]
    if len(alone_given) > 1:
        cli.fail(PROG, f"{' with '.join(alone_given)}; allowed: one of them (each is its own "
                       f"run)")
    for alone in ("crossover", "compile", "host_cost"):
        if not getattr(args, alone):
            continue
        for flag, given in (("--device cuda", args.device == "cuda"), ("--long", args.long),
                            ("--only-long", args.only_long), ("--replot", args.replot),
                            ("--variants", args.variants is not None),
                            ("--same-process", args.same_process)):
            if given:
                name = alone.replace("_", "-")
                cli.fail(PROG, f"--{name} with {flag}; allowed: --{name} alone, or with "
                               f"--quick and --out (it times the CPU paths in one process)")
    if args.variants is not None:
        _check_variant_sweep(args)
    flex_asked = args.contenders is not None and "flex" in args.contenders
    if args.flex_n is not None or flex_asked:
        try:
            sweep = sweep_from(args)
            ns = sorted({p[3] for p in points(sweep)})
        except ValueError:                  # said by main, with the sweep's own words
            sweep, ns = None, powers(args.n_min, args.n_max)
        allowed = f"n among {', '.join(map(str, ns)) or 'none (no sweep)'}"
        off = [x for x in (args.flex_n or ()) if x not in ns]
        if off:
            cli.fail(PROG, f"--flex-n {' '.join(map(str, off))} is not an n of the sweep; "
                           f"allowed: {allowed}")
        flex_ns = sweep.flex_ns if sweep is not None else None
        if flex_asked and flex_ns is not None and not set(flex_ns) & set(ns):
            # flex would be skipped at every point: refused like an --flex-n off the sweep
            cli.fail(PROG, f"--contenders flex with no n of its --flex-n "
                           f"({' '.join(map(str, flex_ns))}) in the sweep; allowed: --flex-n "
                           f"with {allowed}, or a sweep (--n-min, --n-max) that reaches one")
    return args


def _check_variant_sweep(args: argparse.Namespace) -> None:
    """--variants with an option it cannot honour: one line and exit 2."""
    for flag, given in (("--long", args.long), ("--only-long", args.only_long),
                        ("--quick", args.quick), ("--replot", args.replot)):
        if given:
            cli.fail(PROG, f"--variants with {flag}; allowed: --variants alone or {flag} "
                           f"alone (the variant sweep times the targets' points and draws "
                           f"no figure: it prints its table and winners)")
    if args.device == "cpu" and not args.same_process:
        cli.fail(PROG, "--variants with the CPU's fresh process per point; allowed: --variants "
                       "with --same-process or --device cuda (the variant sweep runs in one "
                       "process)")
    if args.contenders is not None and not set(args.contenders) & set(TRITON):
        cli.fail(PROG, f"--variants with --contenders {' '.join(args.contenders)}; allowed: "
                       f"--contenders with at least one of {', '.join(TRITON)} (the variants "
                       f"are the Triton kernel's)")


def sweep_from(args: argparse.Namespace) -> Sweep:
    """The ``Sweep`` the options ask for: the device's defaults, changed by each option
    given (ValueError from ``Sweep`` on values that do not fit together). The variant
    sweep keeps its points unless --shapes, --n-min or --n-max replace them."""
    same = args.same_process or args.device == "cuda"
    variants = tuple(dict.fromkeys(args.variants or VARIANTS)) if args.variants is not None \
        else ()
    base = Sweep.defaults(args.device, same, variants)
    target = 0.3 if args.quick and args.target is None else args.target
    method = base.method.with_(target_s=target, min_reps=args.min_reps, cap_s=args.cap_s)
    if method.min_reps > method.max_reps:
        method = method.with_(max_reps=method.min_reps)
    n_max = min(args.n_max, QUICK_N_MAX) if args.quick else args.n_max
    chosen = args.contenders or [c for c in base.contenders if not (args.quick and c == "flex")]
    given = tuple(args.points) if args.points else None
    if variants:
        ns = powers(args.n_min, n_max) if args.n_given else None
        target_points = given or (() if args.n_given or args.shapes else None)
    else:
        ns = () if args.only_long else powers(args.n_min, n_max)
        target_points = () if args.only_long else given
    return Sweep.defaults(
        args.device, same, variants, method=method, ns=ns,
        dtypes=tuple(args.dtypes) if args.dtypes else None,
        shapes=tuple(args.shapes) if args.shapes else None,
        contenders=tuple(dict.fromkeys(chosen)),
        flex_ns=tuple(sorted(set(args.flex_n))) if args.flex_n else None,
        dense_n_max=args.dense_n_max, naive_n_max=args.naive_n_max, mask_gb=args.mask_gb,
        max_minutes=args.max_minutes,
        long_ns=powers(args.long_n_min, args.long_n_max) if args.long or args.only_long
        else None,
        target_points=target_points)


def main(argv=None) -> int:
    args = parse_args(argv)
    for alone, measure, say in (("crossover", measure_crossover, crossover_report),
                                ("compile", measure_compile, compile_report),
                                ("host_cost", measure_host_cost, host_cost_report)):
        if getattr(args, alone):
            out = Path(args.out) if args.out is not None else FIGURES
            cli.writable_or_exit(PROG, out, out / "data")
            data, path = measure(out, args.quick, log=lambda line: print(line, flush=True))
            print(say(data))
            print(f"\nwrote {path} ({data['machine']['wall_s']:.0f} s)")
            return 0
    try:
        sweep = sweep_from(args)
    except ValueError as err:
        cli.fail(PROG, err)
    out = Path(args.out) if args.out is not None else FIGURES
    path, png = paths(sweep, out)
    if args.replot:
        try:
            data = read_cache(path, RECORD)
        except CacheError as err:
            cli.fail(PROG, f"--replot: {err}")
        if data is None:
            cli.fail(PROG, f"--replot with no {path}; allowed: --replot after a run of this "
                           f"device and method has written it")
        partial = incomplete(data)
        if partial:
            print(f"{PROG}: --replot: {path} is {partial} (drawn from what it holds)",
                  file=sys.stderr)
        print(f"wrote {draw(sweep, data, png)}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        cli.fail(PROG, "--device cuda on a machine without CUDA; allowed: --device cpu here")
    cli.writable_or_exit(PROG, out, out / "data")
    data, path, png = measure_and_save(sweep, out, log=lambda line: print(line, flush=True))
    print(report(data))
    wrote = f"{path} and {png}" if png is not None else f"{path}"
    print(f"\nwrote {wrote} ({data['machine']['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
