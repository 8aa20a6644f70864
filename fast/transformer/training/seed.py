"""Seeding in one place (nanoGPT habit), and the RNG state a checkpoint keeps.

Child et al., 2019, section 5.4: recomputation must be exact, and a resumed run
must reach the same weights, so every random draw of a run flows from one seed:

* ``seed_everything(seed)`` -- Python, NumPy and torch (CPU and CUDA) global RNGs,
  used for weight initialisation and dropout;
* ``seed_rank(seed, rank)`` -- called after the weights are made: rank r > 0 of a
  data-parallel run reseeds its global RNGs with ``rank_seed(seed, r)``, so every
  rank draws its own dropout masks (section 6 trains data parallel: identical masks
  on every rank would make the ranks' batches less independent than they look).
  Rank 0 keeps the stream of ``seed``, so a one-process run draws what it always did;
* ``data_generator(seed, step, rank)`` -- a fresh torch.Generator per optimiser
  step and rank, so the data windows of step t never depend on what came before
  (the "data position" of a run is just its step count);
* ``rng_state()`` / ``set_rng_state(state)`` -- this process's global RNG states as
  tensors and plain Python values (what ``torch.load(weights_only=True)`` reads):
  a checkpoint keeps one per rank (``fast.transformer.training.resume``).
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (all CUDA devices too)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s global RNGs after initialisation (rank 0: ``seed``)."""
    return seed if rank == 0 else (seed * 1_000_003 + 7919 * rank) % 2**63


def seed_rank(seed: int, rank: int) -> None:
    """Give rank ``rank`` its own dropout stream (rank 0 keeps the one it has)."""
    if rank > 0:
        seed_everything(rank_seed(seed, rank))


def data_generator(seed: int, step: int, rank: int = 0, split: str = "train") -> torch.Generator:
    """The generator that draws the batch of optimiser step ``step`` on rank ``rank``."""
    tag = sum(ord(ch) * 131 ** i for i, ch in enumerate(split)) % 1_000_003
    g = torch.Generator()
    g.manual_seed((((seed * 1_000_003 + step) * 4099 + rank) * 1_000_033 + tag) % 2**63)
    return g


def rng_state() -> dict:
    """This process's global RNG states, as tensors and plain values:
    {"python": (version, 625 ints, gauss), "numpy": {"name", "keys" (int64 tensor),
    "pos", "has_gauss", "cached_gaussian"}, "torch": uint8 tensor, "cuda": [uint8 tensors]}."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss),
                       "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
