"""Checkpoints: the one file format of a run, how it is saved, loaded and resumed.

Child et al., 2019, section 6 trains for days; a run must survive interruption
and continue to the same weights. A checkpoint is one ``torch.save`` dict, in
this key order:

    model, optimizer, scheduler, scaler   -- state_dicts (scaler None when unused)
    rng                                   -- [the global RNG states of rank 0, 1, ...]
                                             (fast.transformer.seed.rng_state): every
                                             rank resumes its own dropout stream
    step                                  -- optimiser steps done
    data_position                         -- {step, seed, world_size}: batches are a
                                             function of (seed, step, rank) (fast.transformer.seed),
                                             so this is where the data stream resumes
    model_cfg, train_cfg                  -- the dataclasses as plain dicts
    history                               -- {"train": the loss log, "evals": the evaluations}

``training_state`` assembles it, ``restore`` puts a run back where it stopped.
A weights-only checkpoint (``save_weights``: the models the figure scripts keep,
in fp16 to be small) holds just ``model`` and ``model_cfg``; ``load_model``
reads both kinds, ``restore`` only the full one.

Every file is written to ``<path>.tmp`` and moved over ``path`` with
``os.replace`` (``fast.core.files.atomic_write``), so a crash mid-write never
leaves a truncated checkpoint (a process killed mid-write can leave the ``.tmp``
file itself behind; nothing reads it, and the next save replaces it).

Safety: a checkpoint holds only tensors and plain Python values (dicts, lists,
tuples, numbers, strings, None; the RNG states too), and is always read with
``torch.load(weights_only=True)``, whose unpickler builds nothing else. A file that
holds anything else -- a pickle crafted to run code when opened, or a training
checkpoint written before this format (its RNG states were NumPy objects) -- is
refused with a ValueError, and nothing in it runs.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import torch

from fast.core.files import atomic_write
from fast.transformer import seed as seeding
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.model import SparseTransformer

REQUIRED = ("model", "model_cfg")                              # every checkpoint
TRAINING = ("optimizer", "scheduler", "rng", "step")           # and one that can resume

# Fields that change which batches are drawn or how the weights move: a resumed run
# must keep them, or it would silently stop being the run it continues.
TRAJECTORY_FIELDS = ("dataset", "data_path", "data_max_bytes", "batch_size", "max_iters",
                     "lr", "min_lr_frac", "warmup_iters", "weight_decay", "beta1", "beta2",
                     "grad_clip", "precision", "seed")


def as_dict(cfg) -> dict:
    """A config dataclass as the plain dict a checkpoint stores."""
    return dataclasses.asdict(cfg)


# ----------------------------------------------------------------------------
# Writing.
# ----------------------------------------------------------------------------

def training_state(*, model, optimizer, scheduler, scaler, step: int, world: int,
                   model_cfg: ModelConfig, train_cfg: TrainConfig, history: dict,
                   evals: list, rng: list[dict] | None = None) -> dict:
    """The checkpoint of a run after ``step`` optimiser steps on ``world`` ranks.
    rng: every rank's ``seed.rng_state()``, rank 0 first (default: this process's,
    for one rank)."""
    rng = [seeding.rng_state()] if rng is None else list(rng)
    if len(rng) != world:
        raise ValueError(f"a checkpoint of {world} ranks needs {world} RNG states, "
                         f"got {len(rng)}")
    return {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": rng, "step": step,
        "data_position": {"step": step, "seed": train_cfg.seed, "world_size": world},
        "model_cfg": as_dict(model_cfg), "train_cfg": as_dict(train_cfg),
        "history": {"train": history, "evals": evals}}


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a folder made read-only); the
    file that was there before, if any, is intact and no ``.tmp`` file is left."""


def save_checkpoint(path, state: dict) -> str:
    """Write ``state`` to ``path`` atomically (tmp file + os.replace). Returns the path;
    raises CheckpointWriteError, saying so, if the file system refuses."""
    try:
        return atomic_write(path, lambda f: torch.save(state, f))
    except OSError as err:
        before = "the previous checkpoint there is intact" if Path(path).exists() else \
            "no checkpoint was there before"
        raise CheckpointWriteError(
            err.errno, f"could not write the checkpoint {path} ({err.strerror or err}); "
                       f"{before}, and no partial file was left") from err


def save_weights(path, model: SparseTransformer, dtype=torch.float16) -> str:
    """A weights-only checkpoint: floating-point tensors cast to ``dtype``, and the config."""
    state = {k: v.to(dtype) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    return save_checkpoint(path, {"model": state, "model_cfg": as_dict(model.cfg)})


# ----------------------------------------------------------------------------
# Reading.
# ----------------------------------------------------------------------------

def load_checkpoint(path, map_location="cpu") -> dict:
    """Read a checkpoint written here, safely (``weights_only=True``, see the module
    docstring); clear errors when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        found = next((line.strip().rstrip(".") for line in str(err).splitlines()
                      if "GLOBAL" in line or "nsupported" in line), "")
        raise ValueError(
            f"{path} is refused: it holds Python objects other than tensors and plain "
            f"values ({found or 'see torch.load(weights_only=True)'}), so it was not written "
            f"by this code's checkpoint format (or predates it); nothing in it was run. "
            f"Open it with torch.load(weights_only=False) only if you trust its "
            f"source") from err
    except Exception as err:
        raise ValueError(f"{path} is not a readable checkpoint: {err}") from err
    missing = set(REQUIRED) - set(state if isinstance(state, dict) else ())
    if missing:
        raise ValueError(f"{path} is not a fast.transformer checkpoint: missing "
                         f"{sorted(missing)} (a checkpoint holds at least {list(REQUIRED)})")
    return state


def configs_from(state: dict) -> tuple[ModelConfig, TrainConfig | None]:
    """The ModelConfig (and TrainConfig, if saved) of a checkpoint."""
    model_cfg = ModelConfig(**state["model_cfg"])
    train_cfg = TrainConfig(**state["train_cfg"]) if state.get("train_cfg") else None
    return model_cfg, train_cfg


def load_model(path, device="cpu"):
    """(model in eval mode, ModelConfig, TrainConfig or None) from a checkpoint file.

    Reads training checkpoints and weights-only ones alike; fp16 weights are
    loaded into the float32 model (``load_state_dict`` casts them)."""
    state = load_checkpoint(path, map_location=device)
    model_cfg, train_cfg = configs_from(state)
    model = SparseTransformer(model_cfg).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, model_cfg, train_cfg


# ----------------------------------------------------------------------------
# Resuming.
# ----------------------------------------------------------------------------

def check_resumable(state: dict, path, *, model_cfg: ModelConfig, train_cfg: TrainConfig,
                    world: int) -> None:
    """ValueError unless ``state`` (read from ``path``) is a training checkpoint of the
    same model and the same trajectory (``TRAJECTORY_FIELDS`` and the world size)."""
    missing = [key for key in TRAINING if key not in state]
    if missing:
        raise ValueError(f"cannot resume {path}: it holds no training state (missing "
                         f"{missing}); only checkpoints written by a training run resume")
    saved_cfg, saved_train = configs_from(state)
    if saved_cfg != model_cfg:
        raise ValueError(f"cannot resume {path}: it was trained with {saved_cfg}, "
                         f"the run asks for {model_cfg}")
    check_same_trajectory(path, saved_train, train_cfg,
                          state.get("data_position", {}).get("world_size", world), world)
    if not isinstance(state["rng"], list) or len(state["rng"]) != world:
        raise ValueError(f"cannot resume {path}: it holds no RNG state per rank for "
                         f"{world} ranks")


def restore(state: dict, path, *, model_cfg: ModelConfig, train_cfg: TrainConfig, world: int,
            model, optimizer, scheduler, scaler, rank: int = 0) -> tuple[int, dict]:
    """Put rank ``rank`` of a run back where checkpoint ``state`` (read from ``path``)
    stopped.

    Checks it (``check_resumable``), then loads the model, optimiser, scheduler and
    loss-scaler states and this rank's own global RNG states in place.
    Returns (step, the saved history: {"train": ..., "evals": ...}, or {}).
    """
    check_resumable(state, path, model_cfg=model_cfg, train_cfg=train_cfg, world=world)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    seeding.set_rng_state(state["rng"][rank])
    return state["step"], state.get("history", {})


def check_same_trajectory(path, saved: TrainConfig | None, now: TrainConfig,
                          saved_world: int, world: int) -> None:
    """ValueError unless resuming ``now`` continues the run saved at ``path`` exactly
    (stop_iter, resume, logging and evaluation fields may differ)."""
    changed = [f"{name}: {getattr(saved, name)!r} -> {getattr(now, name)!r}"
               for name in TRAJECTORY_FIELDS
               if saved is not None and getattr(saved, name) != getattr(now, name)]
    if saved_world != world:
        changed.append(f"world size: {saved_world} -> {world}")
    if changed:
        raise ValueError(f"cannot resume {path}: the run would not continue the saved one "
                         f"({'; '.join(changed)}); start a new out_dir or keep these values")
