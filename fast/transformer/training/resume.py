"""A training run's checkpoint: what it adds to the model, and how a run resumes from it.

Child et al., 2019, section 6 trains for days; a run must survive interruption and
continue to the same weights. A training checkpoint is the file format of
``fast.transformer.network.checkpoint`` (written atomically, read safely), in this
key order:

    model, optimizer, scheduler, scaler   -- state_dicts (scaler None when unused)
    rng                                   -- [the global RNG states of rank 0, 1, ...]
                                             (``fast.transformer.training.seed.rng_state``):
                                             every rank resumes its own dropout stream
    step                                  -- optimiser steps done
    data_position                         -- {step, seed, world_size}: batches are a
                                             function of (seed, step, rank)
                                             (``fast.transformer.training.seed``), so this
                                             is where the data stream resumes
    model_cfg, train_cfg                  -- the dataclasses as plain dicts
    history                               -- {"train": the loss log, "evals": the evaluations}

``training_state`` assembles it, ``check_resumable`` says whether a run may continue
it, ``restore`` puts a run back where it stopped.
"""

from __future__ import annotations

import dataclasses

from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.checkpoint import configs_from
from fast.transformer.training import seed as seeding

TRAINING = ("optimizer", "scheduler", "rng", "step")           # a checkpoint that can resume

# Fields that change which batches are drawn or how the weights move: a resumed run
# must keep them, or it would silently stop being the run it continues.
TRAJECTORY_FIELDS = ("dataset", "data_path", "data_max_bytes", "batch_size", "max_iters",
                     "lr", "min_lr_frac", "warmup_iters", "weight_decay", "beta1", "beta2",
                     "grad_clip", "precision", "seed")


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
        "model_cfg": dataclasses.asdict(model_cfg),
        "train_cfg": dataclasses.asdict(train_cfg),
        "history": {"train": history, "evals": evals}}


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


def restore(state: dict, *, model, optimizer, scheduler, scaler,
            rank: int = 0) -> tuple[int, dict]:
    """Put rank ``rank`` of a run back where checkpoint ``state`` stopped.

    ``state`` has passed ``check_resumable`` (``fast.transformer.training.preflight``
    runs it before the first step); this loads the model, optimiser, scheduler and
    loss-scaler states and this rank's own global RNG states in place.
    Returns (step, the saved history: {"train": ..., "evals": ...}, or {}).
    """
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
