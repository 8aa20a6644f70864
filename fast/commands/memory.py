"""``python -m fast memory``: bytes kept for backward with and without recomputation.

Child et al., 2019, section 5.4 and Figure 4. The steps and what each measures are
``fast.experiments.memory_report``; this command reads the options and runs them,
writing figures/data/memory.json (resumed from: a step already there is skipped
unless --force) and figures/memory_*.png; with --out every output goes beside that JSON.

    python -m fast memory [--quick] [--force] [--steps a,b]
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
    p.add_argument("--steps", type=cli.names(STEPS), default=list(STEPS),
                   help=f"comma list of {', '.join(STEPS)} (default: all)")
    p.add_argument("--out", type=cli.output_file, default=None,
                   help=f"JSON written and resumed from (default {CACHE}; --quick: {QUICK}); "
                        f"the PNGs go beside it (default figures/)")
    return p



def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    out, figures = memory_report.out_paths(args.quick, args.out)
    cli.writable_or_exit(COMMAND, out.parent, *([figures] if "figures" in args.steps else []))
    try:
        memory_report.run(steps=args.steps, quick=args.quick, force=args.force, out=out)
    except CacheError as err:
        cli.fail(COMMAND, f"--out {err}")
    return 0
