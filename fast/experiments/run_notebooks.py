"""Execute notebooks in place, so that their committed outputs are current.

Used by ``make notebooks`` (and so by ``make figures``). Each notebook runs in
its own directory (``notebooks/``), top to bottom, in a fresh kernel of the
current Python environment; a failing cell stops the run with the cell shown.

    python -m fast notebooks notebooks/*.ipynb
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


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
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks to execute in place")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    for path in sorted(args.notebooks):
        if not path.is_file():
            print(f"no such notebook: {path}", file=sys.stderr)
            return 2
        print(f"executing {path} ...", flush=True)
        seconds = run_notebook(path, args.timeout)
        print(f"  done in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
