"""``python -m fast results``: print the README's result tables from figures/data.

Child et al., 2019, sections 5.4-5.5, 7 and Table 2: every number of the README's
"Results" section is written by ``fast.experiments.results.report`` from the JSON the
figure scripts wrote, so it can be checked against a fresh ``python -m fast figures``.

    python -m fast results [--data figures/data]
    python -m fast results --provenance   # which code wrote each results file there

Every section whose file is there is printed. A file not there yet is named on stderr.
A file from a valid run that lacks what its section needs (a bench sweep without
n = 16384, say) is one line on stderr: which file, what it lacks, which command produces
it. Exit status: 0 when every file there was printed; 1 when some file lacked what its
section needs (the others printed); 2 for a bad option or a damaged file (one line
naming it and the command that rewrites it; nothing printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fast.commands import cli
from fast.experiments.cache import CacheError
from fast.experiments.paths import DATA
from fast.experiments.provenance import provenance_lines
from fast.experiments.results import report

COMMAND = "python -m fast results"


def existing_folder(text: str) -> Path:
    """``--data``: a folder that exists (the figure scripts' JSON is read from it)."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: an existing folder")
    return Path(text)


def parser() -> cli.Parser:
    """The options of ``python -m fast results`` (builds the parser, does no work)."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__),
                   epilog="exit status: 0 every file there printed; 1 some file lacks what "
                          "its section needs (said on stderr, the others printed); 2 a bad "
                          "option or a damaged file")
    p.add_argument("--data", type=existing_folder, default=DATA,
                   help="the folder of the figure scripts' JSON (default: figures/data)")
    p.add_argument("--provenance", action="store_true",
                   help="instead of the tables: one line per results file, which code wrote "
                        "it (its sources hash and commit) against the sources checked out now")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    if args.provenance:
        print("\n".join(provenance_lines(args.data)))
        return 0
    try:
        text, missing, lacking = report(args.data)
    except CacheError as err:
        cli.fail(COMMAND, err)
    print(text)
    if missing:
        print(f"(not yet measured: {', '.join(missing)}; run `make figures`)", file=sys.stderr)
    for line in lacking:
        print(f"{COMMAND}: {line}", file=sys.stderr)
    return 1 if lacking else 0
