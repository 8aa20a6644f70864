"""One look for every figure: the backend, one resolution, one colour and name per pattern.

Child et al., 2019 compares dense attention with the fixed and strided patterns
(sec. 4.3, Table 2) and, for speed, with other ways of computing them (sec. 5.5).
Every figure of the project draws those with the same colour and calls them by
the same name; this module holds both, and ``save`` writes every figure.

* The backend: Agg (no window; scripts and tests draw straight to files),
  unless a backend was chosen explicitly -- by the user, or by Jupyter, which
  sets ``MPLBACKEND`` to its inline backend so that notebooks show figures.
* ``display_name``: the pattern "full" of ``reference.patterns`` is the paper's
  dense attention, and is shown as "dense"; other names are shown as they are.
* ``COLORS`` / ``MARKERS``: by display name, patterns and benchmark contenders.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import matplotlib

from fast.core.files import write_bytes

if not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 110

BLUE, ORANGE, GREY, GREEN = "#2b6cb0", "#dd6b20", "#4a5568", "#38a169"
LIGHT_GREY, BLACK, RED, PURPLE = "#a0aec0", "#1a202c", "#c53030", "#805ad5"
TEAL = "#2c7a7b"

# The paper's Table 2 rows, as reference.patterns names: dense, then fixed and strided.
PATTERN_ORDER = ("full", "fixed", "strided")
NAMES = {"full": "dense"}   # a name -> how figures and tables show it (others unchanged)

COLORS = {
    # the patterns
    "dense": GREY, "fixed": BLUE, "strided": ORANGE,
    # the benchmark's other contenders (fast.measure.contenders)
    "naive": LIGHT_GREY, "flex": GREEN, "flex flash": TEAL, "structured": PURPLE,
    "triton block-sparse": RED, "triton natural order": BLACK,
}
MARKERS = {"dense": "o", "naive": "s", "flex": "^", "flex flash": "<", "structured": "D",
           "triton block-sparse": "v", "triton natural order": "P"}


def display_name(name: str) -> str:
    """"full" -> "dense"; every other pattern or contender name as it is."""
    return NAMES.get(name, name)


def color(name: str) -> str | None:
    """The colour of a pattern or contender (None: matplotlib's next colour)."""
    return COLORS.get(display_name(name))


def marker(name: str) -> str:
    return MARKERS.get(display_name(name), "x")


def save(fig, path, *, tight: bool = False, close: bool = True) -> Path:
    """Write ``fig`` to ``path`` at ``DPI`` in the format its suffix names (PNG), creating
    the folder; returns the path. Drawn into memory first, then written atomically
    (``fast.core.files.write_bytes``): a full disk or a crash leaves the previous
    figure, never a truncated one.

    tight: crop to what is drawn (``bbox_inches="tight"``). close: free the figure
    (keep it open to show it next, e.g. with ``plt.show()`` in a notebook).
    """
    path = Path(path)
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix[1:] or "png", dpi=DPI,
                bbox_inches="tight" if tight else None)
    write_bytes(path, image.getvalue())
    if close:
        plt.close(fig)
    return path
