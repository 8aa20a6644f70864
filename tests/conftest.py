"""Shared test fixtures and the hypothesis profile of the whole test suite.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers": every
test compares something with the NumPy ground truth in ``reference/`` (sec. 4).

Kept small and stable on purpose, other test files import from it:

* ``make_qkv(shape, d, seed)``  seeded float64 q, k, v (importable helper);
* ``rng``                       a seeded ``np.random.Generator`` fixture;
* ``one_thread``                one intra-op torch thread for a module's tiny models
                                (``pytestmark = pytest.mark.usefixtures("one_thread")``);
* hypothesis profile "ci" (loaded by default): ``deadline=None`` (the machine is
  shared and slow, so timing-based failures would be noise), few examples and a
  derandomized search so that a run is reproducible. Set
  ``HYPOTHESIS_PROFILE=thorough`` for a longer random search.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from fast.transformer.config import preset

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=25,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SEED = 0  # the one seed of the test suite


def make_qkv(n: int, d: int, batch: tuple[int, ...] = (), seed: int = SEED, d_v: int | None = None):
    """Seeded standard-normal float64 q, k of shape (*batch, n, d) and v of (*batch, n, d_v)."""
    rng = np.random.default_rng(seed)
    d_v = d if d_v is None else d_v
    q = rng.standard_normal((*batch, n, d))   # (..., n, d)
    k = rng.standard_normal((*batch, n, d))   # (..., n, d)
    v = rng.standard_normal((*batch, n, d_v))  # (..., n, d_v)
    return q, k, v


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator with the suite's seed, so every test is reproducible."""
    return np.random.default_rng(SEED)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread while a module runs, restored after. Tiny models
    gain nothing from a second OpenMP thread, and on a busy 2-core machine the
    threads contend with other processes and run many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_digits(out_dir, **kw):
    """A small digits model and its training config (CPU, fp32, no periodic evaluation):
    the run the training tests share; keywords override any field."""
    base = dict(d_model=32, n_heads=2, n_layers=2, batch_size=8, max_iters=6, warmup_iters=2,
                eval_batches=1, eval_interval=0, precision="fp32", device="cpu",
                out_dir=str(out_dir))
    return preset("digits", **{**base, **kw})
