"""Shared test fixtures and the hypothesis profile of the whole test suite.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers": every
test compares something with the NumPy ground truth in ``reference/`` (sec. 4).

Kept small and stable on purpose, other test files import from it:

* ``make_qkv(shape, d, seed)``  seeded float64 q, k, v (importable helper);
* ``rng``                       a seeded ``np.random.Generator`` fixture;
* ``one_thread``                one intra-op torch thread for a module's tiny models
                                (``pytestmark = pytest.mark.usefixtures("one_thread")``);
* ``fresh_call_plans``          (every test) no call plan of ``fast.sparse_attention``
                                kept from an earlier test;
* ``--kernel-variants NAMES``  only the tests of these kernel variants (``none``: those
                                without one), the GPU session's groups;
* hypothesis profile "ci" (loaded by default): ``deadline=None`` (the machine is
  shared and slow, so timing-based failures would be noise), few examples and a
  derandomized search so that a run is reproducible. Set
  ``HYPOTHESIS_PROFILE=thorough`` for a longer random search.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from fast.transformer.config import preset

ROOT = Path(__file__).resolve().parents[1]     # the repository

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
NO_VARIANT = "none"  # --kernel-variants: the tests that take no kernel variant


def pytest_addoption(parser):
    parser.addoption("--kernel-variants", default=None, metavar="NAMES",
                     help="run only the tests of these kernel variants (names of "
                          "fast.kernels.variants.VARIANTS separated by commas; 'none': the "
                          "tests without a variant parameter), e.g. none,baseline,fused")


def pytest_collection_modifyitems(config, items):
    """``--kernel-variants``: keep the tests whose ``variant`` parameter is named (the GPU
    session runs the ``gpu`` tests in groups of variants: fast.experiments.gpu_check)."""
    wanted = config.getoption("--kernel-variants")
    if wanted is None:
        return
    from fast.kernels.variants import VARIANTS

    names = [s.strip() for s in wanted.split(",") if s.strip()]
    unknown = [s for s in names if s != NO_VARIANT and s not in VARIANTS]
    if not names or unknown:
        raise pytest.UsageError(f"--kernel-variants {wanted!r}; allowed: names from "
                                f"{NO_VARIANT}, {', '.join(VARIANTS)}, separated by commas")
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        variant = params.get("variant", NO_VARIANT)
        (keep if getattr(variant, "name", variant) in names else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


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


@pytest.fixture(autouse=True)
def fresh_call_plans():
    """Every test starts without the call plans of earlier tests (``fast.attention``): a
    plan decides its path once, from the module state of its first call, and a test that
    monkeypatches that state (auto's crossovers, the memory available, the CPU kernel)
    must see its own decision, as a fresh process would."""
    from fast.attention import clear_call_plans

    clear_call_plans()


def tiny_digits(out_dir, **kw):
    """A small digits model and its training config (CPU, fp32, no periodic evaluation):
    the run the training tests share; keywords override any field."""
    base = dict(d_model=32, n_heads=2, n_layers=2, batch_size=8, max_iters=6, warmup_iters=2,
                eval_batches=1, eval_interval=0, precision="fp32", device="cpu",
                out_dir=str(out_dir))
    return preset("digits", **{**base, **kw})
