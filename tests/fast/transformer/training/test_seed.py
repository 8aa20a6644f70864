"""``fast.transformer.training.seed``: every rank of a data-parallel run draws its own
batches and its own dropout masks (Child et al., 2019, section 6 trains data parallel;
section 5.4: every draw flows from one seed, so a run can be repeated and resumed)."""

import random

import numpy as np
import pytest
import torch

from fast.data import Dataset
from fast.transformer.training import seed as seeding


@pytest.fixture
def global_rngs():
    """The tests below reseed the global generators: put them back afterwards."""
    state = seeding.rng_state()
    yield
    seeding.set_rng_state(state)


def _draws():
    """One draw from each global generator: Python's, NumPy's, torch's."""
    return random.random(), float(np.random.random()), torch.rand(4).tolist()


def test_each_rank_draws_its_own_batches():
    """data_generator(seed, step, rank): the same arguments draw the same batch, another
    rank (or step) another one, so the ranks of a data-parallel step read different
    windows."""
    ds = Dataset("toy", "text", 256, {"train": (np.arange(5000) % 251).astype(np.uint8)})
    draw = lambda step, rank: ds.batch("train", 8, 16, seeding.data_generator(3, step, rank))[0]
    assert torch.equal(draw(5, 0), draw(5, 0))
    for a, b in [((5, 0), (5, 1)), ((5, 1), (5, 2)), ((5, 0), (6, 0))]:
        assert not torch.equal(draw(*a), draw(*b)), f"(step, rank) {a} and {b} drew one batch"


def test_seed_rank_gives_every_rank_but_the_first_its_own_stream(global_rngs):
    """After seed_everything(s), rank 0 keeps the stream of s (a one-process run draws what
    it always did); ranks 1 and 2 each draw another one, in every global generator."""
    streams = {}
    for rank in (None, 0, 1, 2):                     # None: seed_everything alone
        seeding.seed_everything(11)
        if rank is not None:
            seeding.seed_rank(11, rank)
        streams[rank] = _draws()
    assert streams[0] == streams[None]
    for rank in (1, 2):
        for name, mine, first in zip(("python", "numpy", "torch"), streams[rank], streams[0]):
            assert mine != first, f"rank {rank} draws rank 0's {name} stream"
    assert all(a != b for a, b in zip(streams[1], streams[2]))
