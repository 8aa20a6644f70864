"""Where the source checkout is: the folder that holds figures/ and its measured data.

Child et al., 2019, section 7: the project's results are recomputed by its scripts and
kept as JSON in figures/data/. Most of them are read by the scripts only
(``fast.experiments.paths``); one is read by the library itself: the crossovers that
``backend="auto"`` chooses by (``fast.backends.auto``). Both find the checkout here.
``CHECKOUT`` is the repository root when this package runs from a source checkout
(a pyproject.toml beside ``fast/``), else None (an installed copy, which then uses
the defaults committed in the code).
"""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() else None
