"""Where the source checkout is: the folder that holds figures/ and its measured data.

Child et al., 2019, section 7: the project's results are recomputed by its scripts and
kept as JSON in figures/data/, which the scripts read back (``fast.experiments.paths``);
the library itself reads none of them (what it takes from a measurement, auto's
crossovers, is committed as constants: ``fast.backends.crossovers``). ``CHECKOUT`` is
the repository root when this package runs from a source checkout (a pyproject.toml
beside ``fast/``), else None (an installed copy).
"""

from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() else None
