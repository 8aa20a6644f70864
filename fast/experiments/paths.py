"""Where results live: figures, their JSON caches, --quick runs, and what notebooks draw.

Child et al., 2019, section 7: every result of the project is recomputed by a
script of ``fast.experiments`` and cached as JSON, so that tables and notebooks
read what was measured. Paths are absolute, anchored at the repository root, so
that scripts and notebooks work from the root or from ``notebooks/`` alike
(outside a source checkout they fall back to the current directory).

Notebooks write the figures they draw into ``figures_out()``: ``figures/`` by
default, or the folder named by the environment variable
``SPARSE_TRANSFORMER_FIGURES``. The test command points it at a temporary folder,
so that running the tests never rewrites the committed figures; ``make
notebooks`` leaves it unset and regenerates them.
"""

from __future__ import annotations

import os
from pathlib import Path

from fast.core.paths import CHECKOUT

ROOT = CHECKOUT or Path.cwd()     # the source checkout (fast.core.paths), or here
FIGURES = ROOT / "figures"         # the PNGs
DATA = FIGURES / "data"            # the JSON caches and the kept model weights
QUICK = ROOT / "runs" / "quick"    # --quick writes here, never over the real caches
FIGURES_ENV = "SPARSE_TRANSFORMER_FIGURES"


def figures_out() -> Path:
    """The folder notebooks write figures into (created if missing)."""
    out = Path(os.environ.get(FIGURES_ENV) or FIGURES)
    out.mkdir(parents=True, exist_ok=True)
    return out


def named(path) -> str:
    """``path`` from the repository root when inside it (as the JSON files name the kept
    weights they read), else the absolute path; POSIX separators either way."""
    path = Path(path).resolve()
    return (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path).as_posix()
