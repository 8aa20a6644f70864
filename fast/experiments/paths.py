"""Where the figure scripts write: figures, their JSON caches, and --quick runs.

Child et al., 2019, section 7: every result of the project is recomputed by a
script of ``fast.experiments`` and cached as JSON, so that tables and notebooks
read what was measured. The scripts run from the repository root; these paths
are relative to it.
"""

from __future__ import annotations

from pathlib import Path

FIGURES = Path("figures")          # the PNGs
DATA = FIGURES / "data"            # the JSON caches and the kept model weights
QUICK = Path("runs/quick")         # --quick writes here, never over the real caches
