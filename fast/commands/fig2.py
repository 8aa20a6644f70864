"""``python -m fast fig2``: what a dense model learns to attend to (Figure 2).

Child et al., 2019, section 4.1 and Figure 2. What is trained and measured is
``fast.experiments.learned_attention``; this command reads the options and runs it.

    python -m fast fig2 [--quick] [--force] [--iters N] [--layers L] [--threads T]
    python -m fast fig2 --long [--force]
    python -m fast fig2 --depth [--force] [--jobs 2]
"""

from __future__ import annotations

from fast.commands import cli
from fast.experiments import learned_attention
from fast.experiments.cache import CacheError
from fast.experiments.learned_attention import (
    DEPTH_ITERS,
    DEPTH_WIDTH,
    DEPTHS,
    ITERS,
    LONG_ITERS,
    LONG_THREADS,
    THREADS,
)

COMMAND = "python -m fast fig2"


def parser() -> cli.Parser:
    """The options of ``python -m fast fig2`` (builds the parser, does no work)."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--quick", action="store_true", help="a tiny model, for development")
    p.add_argument("--force", action="store_true", help="retrain even if cached")
    p.add_argument("--iters", type=cli.integer(1), default=None,
                   help=f"training steps (default {ITERS}; retrains over the cache)")
    p.add_argument("--threads", type=cli.integer(1, 256), default=None,
                   help=f"intra-op threads of the training (default {THREADS}, --long "
                        f"{LONG_THREADS}; the weights depend on it in the last bits)")
    p.add_argument("--layers", type=cli.integer(1, 64), default=None,
                   help="layers of the dense model (default 6; retrains over the cache)")
    p.add_argument("--long", action="store_true",
                   help=f"the heavier run: {LONG_ITERS} steps on {LONG_THREADS} thread, kept in "
                        f"figures/data/models/ (trained only when missing or with --force); "
                        f"draws the dense model's figures as fig2_*_long.png")
    p.add_argument("--depth", action="store_true",
                   help=f"Fig. 2 against depth: dense models of {', '.join(map(str, DEPTHS))} "
                        f"layers (d = {DEPTH_WIDTH}, {DEPTH_ITERS} steps, one thread each), kept "
                        f"in figures/data/models/ (trained only when missing or with --force)")
    p.add_argument("--jobs", type=cli.integer(1, 256), default=2,
                   help="--depth: trainings at a time, one thread each (default 2)")
    return p



def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    if args.depth and (args.long or args.iters or args.layers or args.threads):
        cli.fail(COMMAND, "--depth with --long, --iters, --layers or --threads; allowed: "
                          "--depth alone (its models' sizes and steps are fixed), or "
                          "with --quick, --force, --jobs")
    try:
        if args.depth:
            learned_attention.run_depth(quick=args.quick, force=args.force, jobs=args.jobs)
        else:
            learned_attention.run(quick=args.quick, force=args.force, iters=args.iters,
                                  threads=args.threads, layers=args.layers, long=args.long)
    except CacheError as err:
        cli.fail(COMMAND, err)
    return 0
