"""``python -m fast notebooks``: execute notebooks in place, so their saved outputs are current.

Used by ``make notebooks`` (and so by ``make figures``). Each notebook runs in
its own directory (``notebooks/``), top to bottom, in a fresh kernel of the
current Python environment; a failing cell stops the run with the cell shown.

    python -m fast notebooks notebooks/*.ipynb
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from fast.commands import cli
from fast.core.files import atomic_write


def run_notebook(path: Path, timeout: int = 1800) -> float:
    """Execute ``path`` in place; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    start = time.perf_counter()
    client.execute()
    text = nbformat.writes(nb).encode()
    atomic_write(path, lambda f: f.write(text))
    return time.perf_counter() - start


def notebook(value: str) -> Path:
    """A path to an existing ``.ipynb`` file."""
    path = Path(cli.existing_file(value))
    if path.suffix != ".ipynb" or not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"got {value!r}; allowed: a notebook, a .ipynb file "
                                         f"this user can write (it is executed in place)")
    return path


def parser() -> cli.Parser:
    """The parser of ``python -m fast notebooks``; runs nothing."""
    p = cli.Parser("python -m fast notebooks", description=cli.about(__doc__))
    p.add_argument("notebooks", nargs="+", type=notebook, help="notebooks to execute in place")
    p.add_argument("--timeout", type=cli.integer(1, 86400), default=1800,
                   help="seconds allowed per cell (default 1800)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    for path in sorted(args.notebooks):
        print(f"executing {path} ...", flush=True)
        seconds = run_notebook(path, args.timeout)
        print(f"  done in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
