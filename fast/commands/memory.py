"""``python -m fast memory``: bytes kept for backward with and without recomputation.

Child et al., 2019, section 5.4 and Figure 4. The steps and what each measures are
``fast.experiments.memory_report``; this command reads the options and runs them,
writing figures/data/memory.json (resumed from: a step already there is skipped
unless --force) and figures/memory_*.png; with --out every output goes beside that JSON.
``--big`` measures the paper's scale instead (a 128-layer model at n = 16384, about 5
minutes) into figures/data/memory_big.json, only when that file is missing or --force.

    python -m fast memory [--quick] [--force] [--steps a,b] [--out X.json]
    python -m fast memory --big [--quick] [--force] [--out X.json]
"""

from __future__ import annotations

from fast.commands import cli
from fast.experiments import memory_report
from fast.experiments.cache import CacheError
from fast.experiments.memory_report import CACHE, STEPS
from fast.experiments.paths import QUICK

COMMAND = "python -m fast memory"


def parser() -> cli.Parser:
    """The parser of ``python -m fast memory``; measures nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--quick", action="store_true", help="small sizes, for development")
    p.add_argument("--force", action="store_true", help="redo steps whose results exist")
    p.add_argument("--steps", type=cli.names(STEPS), default=None,
                   help=f"comma list of {', '.join(STEPS)} (default: all)")
    p.add_argument("--big", action="store_true",
                   help="measure the 128-layer, n = 16384 step instead (memory_big.json)")
    p.add_argument("--out", type=cli.output_file, default=None,
                   help=f"JSON written and resumed from (default {CACHE}; --quick: {QUICK}); "
                        f"the PNGs go beside it (default figures/)")
    return p



def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    if args.big and args.steps is not None:
        cli.fail(COMMAND, "--big with --steps; allowed: one of them (--big is its own step)")
    steps = args.steps or list(STEPS)
    try:
        if args.big:
            cli.writable_or_exit(COMMAND, memory_report.big_path(args.quick, args.out).parent)
            memory_report.run_big(quick=args.quick, force=args.force, out=args.out)
            return 0
        out, figures = memory_report.out_paths(args.quick, args.out)
        cli.writable_or_exit(COMMAND, out.parent,
                             *([figures] if "figures" in steps else []))
        # args.out, not out: run places the figures beside an --out it is given
        memory_report.run(steps=steps, quick=args.quick, force=args.force, out=args.out)
    except CacheError as err:
        cli.fail(COMMAND, f"--out {err}")
    return 0
