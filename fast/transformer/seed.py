"""Seeding in one place (nanoGPT habit), and the RNG state a checkpoint keeps.

Child et al., 2019, section 5.4: recomputation must be exact, and a resumed run
must reach the same weights, so every random draw of a run flows from one seed:

* ``seed_everything(seed)`` -- Python, NumPy and torch (CPU and CUDA) global RNGs,
  used for weight initialisation and dropout;
* ``data_generator(seed, step, rank)`` -- a fresh torch.Generator per optimiser
  step and rank, so the data windows of step t never depend on what came before
  (the "data position" of a run is just its step count);
* ``rng_state()`` / ``set_rng_state(state)`` -- the global states a checkpoint saves.
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


def data_generator(seed: int, step: int, rank: int = 0, split: str = "train") -> torch.Generator:
    """The generator that draws the batch of optimiser step ``step`` on rank ``rank``."""
    tag = sum(ord(ch) * 131 ** i for i, ch in enumerate(split)) % 1_000_003
    g = torch.Generator()
    g.manual_seed((((seed * 1_000_003 + step) * 4099 + rank) * 1_000_033 + tag) % 2**63)
    return g


def rng_state() -> dict:
    """The global RNG states (for checkpoints)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
