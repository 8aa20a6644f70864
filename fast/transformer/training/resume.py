"""A training run's checkpoint: what it adds to the model, and how a run resumes from it.

Child et al., 2019, section 6 trains for days; a run must survive interruption and
continue to the same weights. A training checkpoint is the file format of
``fast.transformer.network.checkpoint`` (written atomically, read safely), in this
key order:

    format                                -- the format version (checkpoint.FORMAT)
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
    data                                  -- ``Dataset.fingerprint()``: the SHA-256 and
                                             shape of every split the run read
    precision, device                     -- what "auto" resolved to ("fp16", "bf16",
                                             "fp32"; "cpu", "cuda")
    cpu_threads                           -- the intra-op threads the steps that wrote
                                             it used (torch.get_num_threads(); format 4)
    cpu_kernel                            -- which kernel computed the strided or fixed
                                             pieces on the CPU (``cpu_window.build()``:
                                             the C kernel and its flags, or PyTorch's),
                                             None where none did (format 5)
    history                               -- {"train": the loss log, "evals": the evaluations}

``training_state`` assembles it, ``check_resumable`` says whether a run may continue
it, ``restore`` puts a run back where it stopped.

What a resume compares, and refuses in one sentence naming each field that differs
(``n_layers: 2 -> 3; precision: fp16 -> bf16``): the model config; the trajectory
fields of the training config (``TRAJECTORY_FIELDS``); the world size; the resolved
precision (an fp16 run with a loss scaler never continues in bf16 without one) and
device type; and the data, split by split, by its bytes (the same ``--data_path``
holding other bytes is another run; the same bytes at another path, a dataset moved
to another disk, are the same run). Before any of it is used, every part of the state is checked
against what this run would build (``fast.core.schema``): the weights against the
model, the optimiser's moments against the parameters' shapes, the scheduler's,
loss scaler's and RNG states against fresh ones, the step within [0, max_iters] and
the history's lists; a state that does not fit is refused, naming the place. A
``stop_iter`` before the checkpoint's step is refused too: the run cannot stop where
it has already been (it took no step and said nothing of it). ``stop_iter`` at the
checkpoint's step is allowed and takes no step (the same command run again), as is
resuming a finished run.

What a resume allows and says (``ResumeWarning``, one line each): another CPU thread
count, and another CPU kernel. Both belong to the machine, not the experiment --
refusing them would stop a run moved to another machine -- but on the CPU the order
of a parallel reduction follows the count, and the C window kernel
(``fast.backends.cpu_window``) sums in another order than PyTorch's kernel (a machine
without a compiler, or SPARSE_ATTENTION_CPU_KERNEL=0) and, built with other flags,
perhaps than itself: the weights then match an uninterrupted run only to float
rounding, not bitwise (bitwise equality holds for the same count and kernel: on CUDA
neither enters the arithmetic, and nothing is said). The kernel is compared where it
computes the model's attention: a strided or fixed model whose backend resolves to the
structured path on the CPU. A format-3 checkpoint, which does not record the count, is
compared with its ``cpu_threads`` field when that was given; a checkpoint before
format 5 does not record its kernel, which is then not compared. The other fields that
do not move the weights (``stop_iter``, the evaluation, logging and checkpoint
intervals, ``out_dir``) may change silently.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from fast.attention import resolve_backend
from fast.backends import cpu_window
from fast.core.schema import (
    Exact,
    Int,
    List,
    Map,
    Number,
    OneOf,
    Optional,
    ShapeError,
    Tensor,
    Tuple,
    check,
)
from fast.transformer.config import MAX_THREADS, ModelConfig, TrainConfig
from fast.transformer.network.checkpoint import check_weights, configs_from, format_of
from fast.transformer.network.model import SparseTransformer
from fast.transformer.training import seed as seeding
from fast.transformer.training.optim import make_optimizer, make_scheduler

TRAINING = ("optimizer", "scheduler", "scaler", "rng", "step", "data_position", "train_cfg",
            "data", "precision", "device", "cpu_threads", "cpu_kernel",
            "history")                                                  # a checkpoint that
                                                                        # can resume
SINCE = {"cpu_threads": 4, "cpu_kernel": 5}   # a key of TRAINING -> the format that added it
# The parts a resume compares with this run, checked first so that they can be compared
# (the rest of the state is checked after: ``_check_state``).
COMPARED = {"data_position": {"world_size": Int(1)}, "precision": str, "device": str,
            "data": Map(Exact({"sha256": str, "shape": [Int(0)]}))}


class ResumeWarning(UserWarning):
    """A resume that continues the run, but not bitwise (module docstring); ``python -m
    fast train`` prints it as one line."""

# Fields that change which batches are drawn or how the weights move: a resumed run
# must keep them, or it would silently stop being the run it continues. (precision
# and device are compared as resolved, not as the words "auto".)
# Not data_path: where the data lies is no part of the run (a dataset moved to another
# disk resumes); its bytes are, compared split by split through their fingerprint.
TRAJECTORY_FIELDS = ("dataset", "data_max_bytes", "batch_size", "max_iters",
                     "lr", "min_lr_frac", "warmup_iters", "weight_decay", "beta1", "beta2",
                     "grad_clip", "seed")


def training_state(*, model, optimizer, scheduler, scaler, step: int, world: int,
                   model_cfg: ModelConfig, train_cfg: TrainConfig, history: dict,
                   evals: list, data: dict, precision: str, device,
                   rng: list[dict] | None = None) -> dict:
    """The checkpoint of a run after ``step`` optimiser steps on ``world`` ranks, on
    ``data`` (``Dataset.fingerprint()``) in ``precision`` on ``device`` (resolved).
    rng: every rank's ``seed.rng_state()``, rank 0 first (default: this process's,
    for one rank). ``format`` is added by ``save_checkpoint``."""
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
        "data": data, "precision": precision, "device": torch.device(device).type,
        "cpu_threads": torch.get_num_threads(),
        "cpu_kernel": cpu_window.build() if cpu_kernel_computes(model_cfg, device) else None,
        "history": {"train": history, "evals": evals}}


def cpu_kernel_computes(model_cfg: ModelConfig, device) -> bool:
    """Whether a CPU kernel of ``fast.backends.cpu_window``'s choice computes this model's
    attention in training: a strided or fixed pattern on the CPU whose backend resolves
    to the structured path at n_ctx with a backward."""
    if torch.device(device).type != "cpu" or model_cfg.pattern not in ("strided", "fixed"):
        return False
    return resolve_backend(model_cfg.attention_backend, model_cfg.pattern, torch.device("cpu"),
                           torch.float32, model_cfg.n_ctx, stride=model_cfg.stride,
                           backward=True) == "structured"


def check_resumable(state: dict, path, *, model_cfg: ModelConfig, train_cfg: TrainConfig,
                    world: int, precision: str, device, data: dict,
                    threads: int | None = None) -> None:
    """ValueError unless ``state`` (read from ``path`` by ``load_checkpoint``) is a
    training checkpoint this run -- ``model_cfg``, ``train_cfg`` on ``world`` ranks, in
    ``precision`` on ``device``, reading ``data`` (a fingerprint) -- continues exactly,
    every part of it shaped as this run would have written it, and ``train_cfg.stop_iter``
    (if given) not before its step. ``threads``: the CPU threads this run's steps will use;
    another count than the saved run's, on the CPU, is a ``ResumeWarning``."""
    missing = [key for key in TRAINING
               if key not in state and format_of(state) >= SINCE.get(key, 0)]
    if missing:
        raise ValueError(f"cannot resume {path}: it holds no training state (missing "
                         f"{missing}); only checkpoints written by a training run resume")
    if format_of(state) < 2:
        raise ValueError(f"cannot resume {path}: it is a format-1 checkpoint (written before "
                         f"checkpoints recorded the data, precision and device a resume "
                         f"must compare); its model loads for sampling, but a run cannot "
                         f"continue it -- start a new out_dir")
    saved_cfg, saved_train = configs_from(state, path)
    if saved_train is None:
        raise ValueError(f"cannot resume {path}: its train_cfg is None; only checkpoints "
                         f"written by a training run resume")
    try:                                 # what is compared below, shaped to be compared
        for key, shape in COMPARED.items():
            check(state[key], shape, key)
    except ShapeError as err:
        raise ValueError(f"cannot resume {path}: it is not a training state this run can "
                         f"continue: {err}") from err
    changed = [f"{f.name}: {getattr(saved_cfg, f.name)!r} -> {getattr(model_cfg, f.name)!r}"
               for f in dataclasses.fields(ModelConfig)
               if getattr(saved_cfg, f.name) != getattr(model_cfg, f.name)]
    changed += [f"{name}: {getattr(saved_train, name)!r} -> {getattr(train_cfg, name)!r}"
                for name in TRAJECTORY_FIELDS
                if getattr(saved_train, name) != getattr(train_cfg, name)]
    now = {"world size": world, "precision": precision, "device": torch.device(device).type}
    saved = {"world size": state["data_position"]["world_size"],
             "precision": state["precision"], "device": state["device"]}
    changed += [f"{key}: {saved[key]!r} -> {now[key]!r}" for key in now if saved[key] != now[key]]
    changed += _data_changes(state["data"], data)
    if changed:
        raise ValueError(f"cannot resume {path}: the run would not continue the saved one "
                         f"({'; '.join(changed)}); start a new out_dir or keep these values")
    try:
        _check_state(state, model_cfg, saved_train, world, precision)
    except ShapeError as err:
        raise ValueError(f"cannot resume {path}: it is not a training state this run can "
                         f"continue: {err}") from err
    check_weights(state["model"], model_cfg, path)
    step, stop = state["step"], train_cfg.stop_iter
    if stop is not None and stop < step:
        raise ValueError(f"cannot resume {path} with stop_iter={stop}: the checkpoint is at "
                         f"step {step}, already past it; allowed: stop_iter >= {step} (at "
                         f"{step} the run takes no step), or no stop_iter (the run goes on "
                         f"to max_iters={train_cfg.max_iters})")
    saved_threads = state.get("cpu_threads", saved_train.cpu_threads)
    if (threads is not None and saved_threads is not None and threads != saved_threads
            and torch.device(device).type == "cpu"):
        warnings.warn(f"{path}: resumed with {threads} CPU threads where the run used "
                      f"{saved_threads}: the weights will match an uninterrupted run only to "
                      f"float rounding (bitwise with --cpu_threads {saved_threads})",
                      ResumeWarning, stacklevel=2)
    saved_kernel = state.get("cpu_kernel")
    if saved_kernel is not None and cpu_kernel_computes(model_cfg, device):
        kernel = cpu_window.build()
        if kernel != saved_kernel:
            how = ("with a C compiler ($CC, cc, gcc or clang) and SPARSE_ATTENTION_CPU_KERNEL "
                   "unset" if saved_kernel.startswith("cpu_window.c") else
                   "with SPARSE_ATTENTION_CPU_KERNEL=0")
            why = f" ({cpu_window.missing()})" if cpu_window.missing() else ""
            warnings.warn(f"{path}: resumed with {kernel}{why} where the run used "
                          f"{saved_kernel}: the weights will match an uninterrupted run only "
                          f"to float rounding (bitwise {how}, on a compiler that takes the "
                          f"same flags)", ResumeWarning, stacklevel=2)


def _data_changes(saved: dict, now: dict) -> list[str]:
    """The splits whose bytes differ from the ones the saved run read."""
    out = []
    for split in sorted(set(saved) | set(now)):
        a, b = saved.get(split), now.get(split)
        if a != b:
            said = lambda fp: (f"sha256 {fp['sha256']}, shape {fp['shape']}"
                               if isinstance(fp, dict) and {"sha256", "shape"} <= set(fp)
                               else "none")
            out.append(f"data split {split!r}: {said(a)} -> {said(b)}")
    return out


def _check_state(state: dict, model_cfg: ModelConfig, train_cfg: TrainConfig, world: int,
                 precision: str) -> None:
    """ShapeError unless every training part of ``state`` is shaped as this run would
    write it. Shapes come from the model on the meta device: nothing is allocated."""
    with torch.device("meta"):
        template = SparseTransformer(model_cfg)
        optimizer = make_optimizer(template, train_cfg)
        scheduler = make_scheduler(optimizer, train_cfg)
    step = state["step"]
    check(step, Int(0, train_cfg.max_iters), "step")
    if "cpu_threads" in state:
        check(state["cpu_threads"], Int(1, MAX_THREADS), "cpu_threads")
    if "cpu_kernel" in state:
        check(state["cpu_kernel"], OneOf(None, str), "cpu_kernel")
    check(state["data_position"], Exact({"step": Int(step, step),
                                         "seed": Int(train_cfg.seed, train_cfg.seed),
                                         "world_size": Int(world, world)}), "data_position")
    # the optimiser: AdamW's moments (none before its first update) and its groups
    fresh = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    check(state["optimizer"], Exact({"state": Map(object, key=int),
                                     "param_groups": List(dict, len(fresh["param_groups"]))}),
          "optimizer")
    if state["optimizer"]["state"]:
        check(state["optimizer"]["state"], Exact({
            i: Exact({"step": Tensor(()), "exp_avg": Tensor(tuple(p.shape)),
                      "exp_avg_sq": Tensor(tuple(p.shape))}) for i, p in enumerate(params)}),
              "optimizer['state']")
    for i, (have, want) in enumerate(zip(state["optimizer"]["param_groups"],
                                         fresh["param_groups"])):
        where = f"optimizer['param_groups'][{i}]"
        check(have, Exact({k: Number(lo=0) if k == "lr" else _like(v)
                           for k, v in want.items()}), where)
        for key, value in want.items():
            if key != "lr" and have[key] != value:
                raise ShapeError(f"{where}[{key!r}] is {str(have[key])[:60]}; expected "
                                 f"{str(value)[:60]} (what this run's config makes)")
    # the schedule: from the run's lr, at most one update per step
    check(state["scheduler"], Exact({k: _like(v) for k, v in scheduler.state_dict().items()}),
          "scheduler")
    check(state["scheduler"]["last_epoch"], Int(0, step), "scheduler['last_epoch']")
    if state["scheduler"]["base_lrs"] != scheduler.state_dict()["base_lrs"]:
        raise ShapeError(f"scheduler['base_lrs'] is {state['scheduler']['base_lrs']}; expected "
                         f"{scheduler.state_dict()['base_lrs']} (the run's lr)")
    scaler = Exact({"scale": Number(lo=1e-30), "growth_factor": float, "backoff_factor": float,
                    "growth_interval": int, "_growth_tracker": int})
    check(state["scaler"], scaler if precision == "fp16" else None, "scaler")
    check(state["rng"], List(_rng_shape(seeding.rng_state()), world), "rng")
    check(state["history"], Exact({"train": Exact({k: [float] for k in ("step", "loss", "bits",
                                                                         "lr")}),
                                   "evals": [Map(float)]}), "history")
    log = state["history"]["train"]
    if len({len(v) for v in log.values()}) > 1:
        raise ShapeError(f"history['train'] holds lists of lengths "
                         f"{ {k: len(v) for k, v in log.items()} }; expected one length")


def _like(value):
    """The shape of a fresh value: the same kind (and length, for lists), any content;
    tensors of the same shape and dtype."""
    if isinstance(value, torch.Tensor):
        return Tensor(tuple(value.shape), value.dtype)
    if isinstance(value, dict):
        return Exact({k: _like(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return Tuple(*map(_like, value))
    if value is None:
        return None
    return float if isinstance(value, float) and not isinstance(value, bool) else type(value)


def _rng_shape(fresh: dict):
    """The shape of one rank's RNG state (``seed.rng_state``): this process's, with the
    Mersenne Twister's words bounded to 32 bits and its position to 624; CUDA's states
    are there when the saving machine had CUDA (``set_rng_state`` restores them if
    this one has)."""
    version, words, _ = fresh["python"]
    word = Int(0, 2**32 - 1)
    python = Tuple(Int(version, version), Tuple(*[word] * (len(words) - 1), Int(0, 624)),
                   OneOf(None, float))
    numpy = Exact({"name": str, "keys": Tensor(tuple(fresh["numpy"]["keys"].shape), torch.int64),
                   "pos": Int(0, 624), "has_gauss": Int(0, 1), "cached_gaussian": float})
    return Exact({"python": python, "numpy": numpy, "torch": _like(fresh["torch"]),
                  "cuda": Optional([Tensor(dtype=torch.uint8)])})


def restore(state: dict, *, model, optimizer, scheduler, scaler,
            rank: int = 0) -> tuple[int, dict]:
    """Put rank ``rank`` of a run back where checkpoint ``state`` stopped.

    ``state`` has passed ``check_resumable`` (``fast.transformer.training.preflight``
    runs it before the first step); this loads the model, optimiser, scheduler and
    loss-scaler states and this rank's own global RNG states in place.
    Returns (step, the saved history: {"train": ..., "evals": ...}).
    """
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state.get("scaler") is not None:
        scaler.load_state_dict(state["scaler"])
    seeding.set_rng_state(state["rng"][rank])
    return state["step"], state["history"]
