"""``python -m fast table3``: bits per byte against the minimum context of evaluation (Table 3).

Child et al., 2019, section 7.2 and Table 3. Which models, which bytes and how a minimum
context is evaluated is ``fast.experiments.table3``; this command reads the options and
runs it. It reads the kept text models of figures/data/models/ (--quick: runs/quick/models/),
where ``python -m fast table2`` keeps them unless it was given --out.

    python -m fast table3 [--quick] [--force]
"""

from __future__ import annotations

from fast.commands import cli
from fast.experiments import table3
from fast.experiments.cache import CacheError

COMMAND = "python -m fast table3"


def parser() -> cli.Parser:
    """The options of ``python -m fast table3`` (builds the parser, does no work)."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--quick", action="store_true",
                   help="two stretches of the --quick Table 2 models (runs/quick/models; "
                        "default: figures/data/models, where table2 without --out keeps "
                        "them)")
    p.add_argument("--force", action="store_true",
                   help="replace a figures/data/table3.json of the other size")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    try:
        table3.run(quick=args.quick, force=args.force)
    except (CacheError, FileNotFoundError) as err:
        cli.fail(COMMAND, err)
    return 0
