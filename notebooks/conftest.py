"""Running the notebooks as tests (nbval): never over the committed figures, Triton only where it is.

Child et al., 2019: the notebooks re-derive the paper's figures (sec. 4-7). Under
pytest they are checked, not regenerated:

* the figures a notebook draws go to a temporary folder unless
  ``SPARSE_TRANSFORMER_FIGURES`` already names one (``fast.experiments.paths.figures_out``),
  so ``pytest notebooks --nbval`` never rewrites ``figures/``, however it is started
  (``make test`` sets the variable itself; ``make notebooks`` regenerates the figures);
* Triton ships for Linux only: where it is not installed, the notebook that runs the
  Triton kernels (04) is skipped, as the Triton tests are.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

import pytest

from fast.experiments.paths import FIGURES_ENV
NEEDS_TRITON = ("04_triton_kernel.ipynb",)


def pytest_configure(config):
    if not os.environ.get(FIGURES_ENV):      # the kernels inherit it
        os.environ[FIGURES_ENV] = tempfile.mkdtemp(prefix="notebook-figures-")


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("triton") is not None:
        return
    skip = pytest.mark.skip(reason="Triton is not installed (it ships for Linux only)")
    for item in items:
        if item.path.name in NEEDS_TRITON:
            item.add_marker(skip)
