"""``python -m fast table2``: dense, fixed and strided models on text and images (Table 2).

Child et al., 2019, section 7 and Table 2. What is trained, on which data and how
it is measured is ``fast.experiments.table2``; this command reads the options and
runs it.

    python -m fast table2 [--quick] [--force] [--seeds 3] [--jobs 2] [--iters 480]
                          [--only text/full,...]
    python -m fast table2 --drift     # seed 0 of every cell again, 2 threads (reproducibility)
    python -m fast table2 --profile   # where a step's time goes (figures/data/table2_profile.json)
"""

from __future__ import annotations

import os

from fast.commands import cli
from fast.experiments import table2
from fast.experiments.cache import CacheError
from fast.experiments.table2 import STEPS, cell_keys
from fast.transformer.config import OUTPUT_INITS

COMMAND = "python -m fast table2"


def parser() -> cli.Parser:
    """The options of ``python -m fast table2`` (builds the parser, does no work)."""
    keys = cell_keys() + ["timing"]
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--quick", action="store_true", help="tiny runs, for development")
    p.add_argument("--force", action="store_true", help="redo runs whose results exist")
    p.add_argument("--only", default=[], type=cli.names(keys),
                   help="the cells (and the timing runs) to run (default: all)")
    p.add_argument("--seeds", type=cli.integer(1, 100), default=3,
                   help="seeds per cell (default 3)")
    p.add_argument("--jobs", type=cli.integer(1, 256), default=min(2, os.cpu_count() or 1),
                   help="runs at a time, one thread each (default: 2 or the core count)")
    p.add_argument("--out", type=cli.output_file, default=None,
                   help="JSON (default: figures/data/table2.json); every output follows "
                        "it: the kept weights in models/ beside it, the PNGs beside it "
                        "(table3 and samples read only figures/data/models/); with "
                        "--profile, the profile's JSON")
    p.add_argument("--iters", type=cli.integer(1), default=None,
                   help=f"training steps per run (default {STEPS})")
    p.add_argument("--drift", action="store_true",
                   help="only retrain seed 0 of every cell (or of --only) with 2 threads, and "
                        "on an AVX-512 host also with its own kernels: how far the bits move "
                        "when only the summation order or the kernels change")
    p.add_argument("--output-init", type=cli.choice(OUTPUT_INITS), default="normal",
                   help="W_out at initialisation: drawn like every other weight (default) or "
                        "zero as sec. 6 says; zero writes figures/data/table2_zero_output.json "
                        "and keeps no weights (the measurement behind the default)")
    p.add_argument("--profile", action="store_true",
                   help="only measure where a training step's time goes, every cell on one "
                        "thread (figures/data/table2_profile.json); trains nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    if args.profile and (args.drift or args.only or args.force or args.iters):
        cli.fail(COMMAND, "--profile with --drift, --only, --force or --iters; allowed: "
                          "--profile alone or with --quick")
    try:
        if args.profile:
            table2.profile(quick=args.quick, out=args.out)
            return 0
        table2.run(quick=args.quick, force=args.force, only=args.only, seeds=args.seeds,
                   jobs=args.jobs, out=args.out, iters=args.iters, drift=args.drift,
                   output_init=args.output_init)
    except CacheError as err:
        cli.fail(COMMAND, err)
    return 0
