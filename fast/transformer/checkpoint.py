"""Checkpoints written atomically, and models loaded back from them.

Child et al., 2019, section 6 trains for days; a run must survive interruption
and continue to the same weights. A checkpoint is one ``torch.save`` dict:

    model, optimizer, scheduler, scaler   -- state_dicts (scaler None when unused)
    rng                                   -- global RNG states (fast.transformer.seed.rng_state)
    step                                  -- optimiser steps done
    data_position                         -- {step, seed, world_size}: batches are a
                                             function of (seed, step, rank) (fast.transformer.seed),
                                             so this is where the data stream resumes
    model_cfg, train_cfg                  -- the dataclasses as plain dicts
    history                               -- the run's log so far

It is written to ``<path>.tmp`` and moved over ``path`` with ``os.replace``, so a
crash mid-write never leaves a truncated checkpoint. Loading uses
``weights_only=False`` (RNG states hold NumPy arrays): load only files you trust.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from fast.core.files import atomic_write
from fast.transformer.config import ModelConfig, TrainConfig


def save_checkpoint(path, state: dict) -> str:
    """Write ``state`` to ``path`` atomically (tmp file + os.replace). Returns the path."""
    return atomic_write(path, lambda f: torch.save(state, f))


def load_checkpoint(path, map_location="cpu") -> dict:
    """Read a checkpoint written by ``save_checkpoint``; clear errors when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:
        raise ValueError(f"{path} is not a readable checkpoint: {err}") from err
    missing = {"model", "model_cfg", "step"} - set(state if isinstance(state, dict) else ())
    if missing:
        raise ValueError(f"{path} is not a fast.transformer.train checkpoint: missing {sorted(missing)}")
    return state


def configs_from(state: dict) -> tuple[ModelConfig, TrainConfig | None]:
    """The ModelConfig (and TrainConfig, if saved) of a checkpoint."""
    model_cfg = ModelConfig(**state["model_cfg"])
    train_cfg = TrainConfig(**state["train_cfg"]) if state.get("train_cfg") else None
    return model_cfg, train_cfg


def load_model(path, device="cpu"):
    """(model in eval mode, ModelConfig, TrainConfig) from a checkpoint file."""
    from fast.transformer.model import SparseTransformer
    state = load_checkpoint(path, map_location=device)
    model_cfg, train_cfg = configs_from(state)
    model = SparseTransformer(model_cfg).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, model_cfg, train_cfg


def as_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
