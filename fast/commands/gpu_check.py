"""``python -m fast gpu-check``: everything a GPU session runs, in order, results under one folder.

Child et al., 2019, section 5.5 and Table 2: the kernels compiled and proven on the
GPU, their speed against dense attention, the time per training iteration. The
parts and what each writes: ``fast.experiments.gpu_check`` (docs/gpu.md has the
session's checklist and each part's time).

    python -m fast gpu-check --out gpu-results              # the session: 9 min at most
    python -m fast gpu-check --out DIR --minutes 8          # the parts that fit in 8 min
    python -m fast gpu-check --out DIR --parts long         # a part (make gpu-long)
    python -m fast gpu-check --out DIR --all                # every part, the longer sweeps
    python -m fast gpu-check --dry-run                      # the plan: commands, minutes
"""

from __future__ import annotations

import shlex
from pathlib import Path

import torch

from fast.commands import cli
from fast.experiments.gpu_check import (
    PART_NAMES,
    SESSION,
    parts,
    plan,
    run,
    test_workers,
    warnings_for,
    xdist_installed,
)

COMMAND = "python -m fast gpu-check"


def parser() -> cli.Parser:
    """The parser of ``python -m fast gpu-check``; runs nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--out", type=cli.text, default="gpu-results",
                   help="folder for every log and result (default gpu-results; made, and "
                        "checked writable, only when the parts run, never by --dry-run)")
    p.add_argument("--parts", nargs="+", type=cli.choice(PART_NAMES), default=None,
                   help=f"the parts to run, in the order of the list above (default: the "
                        f"session, {' '.join(SESSION)})")
    p.add_argument("--all", action="store_true",
                   help="every part: the session, then the tests split by variant, the variant "
                        "sweep at every point, the whole benchmark, the long sweep and the "
                        "layout build (about 40 minutes)")
    p.add_argument("--minutes", type=cli.finite(0.0, 10**4, lo_open=True), default=None,
                   help="start no part whose estimate no longer fits in this many minutes "
                        "(a machine that limits one command's time); default: no limit")
    p.add_argument("--test-workers", type=cli.integer(0, 256), default=0,
                   help="pytest-xdist workers for the gpu tests (0: the cores but two, at most "
                        "16, where pytest-xdist is installed; 1: none; with --dry-run any "
                        "number, to see that plan)")
    p.add_argument("--test-args", type=cli.words, default=None,
                   help="more pytest arguments for the gpu tests, e.g. \"-x -k strided\"")
    p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    return p


def main(argv=None) -> int:
    args = parser().parse_or_exit(argv)
    if args.all and args.parts is not None:
        cli.fail(COMMAND, "--all with --parts; allowed: one of them")
    out = Path(args.out).resolve()
    workers = test_workers(args.test_workers)
    if workers > 1 and args.test_workers > 1 and not xdist_installed() and not args.dry_run:
        cli.fail(COMMAND, f"--test-workers {args.test_workers} without pytest-xdist; "
                          f"allowed: --test-workers 0 or 1 here (or install pytest-xdist)")
    every = parts(out, workers, tuple(args.test_args or ()))
    names = PART_NAMES if args.all else args.parts or SESSION
    chosen = [p for p in every if p.name in names]
    if args.dry_run:
        print("\n".join(plan(chosen)))
        for line in warnings_for(chosen, workers):
            print(f"note: {line}")
        print(f"estimated {sum(p.minutes for p in chosen):g} min in all")
        return 0
    if not torch.cuda.is_available():
        cli.fail(COMMAND, "no CUDA device here (torch.cuda.is_available() is False); allowed: "
                          "a machine with CUDA, or --dry-run to print the plan")
    cli.writable_or_exit(COMMAND, out)
    again = f"{COMMAND} --out {shlex.quote(args.out)}"
    record = run(chosen, out, args.minutes, log=lambda line: print(line, flush=True),
                 again=again)
    return 1 if any(e["status"] == "failed" for e in record["parts"]) else 0
