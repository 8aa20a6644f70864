"""``python -m fast results``: print the README's result tables from figures/data.

Child et al., 2019, sections 5.4-5.5, 7 and Table 2: every number of the README's
"Results" section is written by ``fast.experiments.results.report`` from the JSON the
figure scripts wrote, so it can be checked against a fresh ``python -m fast figures``.

    python -m fast results [--data figures/data]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fast.commands import cli
from fast.experiments.cache import CacheError
from fast.experiments.paths import DATA
from fast.experiments.results import report

COMMAND = "python -m fast results"


def existing_folder(text: str) -> Path:
    """``--data``: a folder that exists (the figure scripts' JSON is read from it)."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an existing folder")
    return Path(text)


def parser() -> cli.Parser:
    """The options of ``python -m fast results`` (builds the parser, does no work)."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--data", type=existing_folder, default=DATA,
                   help="the folder of the figure scripts' JSON (default: figures/data)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    try:
        text, missing = report(args.data)
    except CacheError as err:
        cli.fail(COMMAND, err)
    print(text)
    if missing:
        print(f"(not yet measured: {', '.join(missing)}; run `make figures`)", file=sys.stderr)
    return 0
