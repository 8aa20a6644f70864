"""Everything a run needs, checked before its first step: nothing is found out after training.

Child et al., 2019, section 6 trains for days; a mistake that surfaces only at the
first evaluation, or when the checkpoint is written, costs the whole run. So
``check_run`` looks at everything that can be known before a step is taken, and
``fast.transformer.training.train`` calls it first:

* the device and precision exist on this machine, and the batch divides over the ranks;
* the data: it loads, fits the model (vocabulary -- for images the same one, since the
  batches begin with the data's start token and sampling with the model's --, images
  or text, the images' shape, sequence length), its training split holds a sequence,
  and every split in ``eval_splits`` exists and gives at least one evaluation batch;
  its fingerprint is taken;
* the schedule: a warm-up not shorter than the run is a ``ScheduleWarning``
  (``fast.transformer.training.optim``);
* the output: ``out_dir`` can be made and written to (a file is created and removed
  there), never over or inside ``data_path`` (the run's input), and a checkpoint
  already in it is never overwritten by a fresh run unless ``overwrite=True``; with
  ``resume=True`` it must exist, be a safe, readable training checkpoint that this
  run -- its configs, world size, resolved precision and device, and data --
  continues exactly, with a ``stop_iter`` (if given) not before its step
  (``fast.transformer.training.resume``; another CPU thread count is a
  ``ResumeWarning``).
  The checkpoint found (or its absence) is remembered (``Plan.found``): the run
  takes the out_dir's lock and checks at every save that the file is still that one
  (``fast.transformer.training.output``).

Every failure raises a ValueError saying what was found and what to do (an OSError
met on the way is said as one too); ``python -m fast train`` prints it as one line,
exit status 2.
(The configuration's own fields are checked earlier, when it is made:
``fast.transformer.config``.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from fast.core.files import check_writable, identity, lands_on
from fast.core.lock import refuse_if_held
from fast.data import Dataset, load
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.checkpoint import load_checkpoint
from fast.transformer.network.devices import resolve_device, resolve_precision
from fast.transformer.training.distributed import world_size
from fast.transformer.training.optim import check_schedule
from fast.transformer.training.resume import check_resumable


@dataclass
class Plan:
    """What ``check_run`` found: everything the loop needs to start."""
    device: torch.device
    precision: str                   # "fp32", "bf16" or "fp16" ("auto" resolved)
    world: int                       # ranks
    local_batch: int                 # sequences per rank and step
    dataset: Dataset
    path: Path                       # out_dir / "ckpt.pt"
    resume_state: dict | None        # the checkpoint to resume, read safely, or None
    data: dict | None = None         # dataset.fingerprint(): what the run reads
    found: tuple | None = None       # fast.core.files.identity of the checkpoint seen
                                     # (None: there was none)
    threads: int | None = None       # intra-op CPU threads the steps use: cpu_threads,
                                     # or torch's count when that is None (None here:
                                     # left as it is)


def check_run(model_cfg: ModelConfig, train_cfg: TrainConfig,
              dataset: Dataset | None = None) -> Plan:
    """Check a run before its first step; ``dataset`` is loaded unless given."""
    if not isinstance(model_cfg, ModelConfig) or not isinstance(train_cfg, TrainConfig):
        raise ValueError(f"train needs (ModelConfig, TrainConfig), got "
                         f"({type(model_cfg).__name__}, {type(train_cfg).__name__})")
    try:
        return _check(model_cfg, train_cfg, dataset)
    except OSError as err:                               # a file met on the way, said so
        raise ValueError(str(err)) from err


def _check(model_cfg: ModelConfig, train_cfg: TrainConfig, dataset: Dataset | None) -> Plan:
    device = resolve_device(train_cfg.device)
    precision = resolve_precision(train_cfg.precision, device)
    world = world_size()
    if train_cfg.batch_size % world:
        raise ValueError(f"batch_size={train_cfg.batch_size} must divide evenly over "
                         f"{world} ranks")
    path = Path(train_cfg.out_dir) / "ckpt.pt"
    dataset = _check_data(model_cfg, train_cfg, dataset)
    check_schedule(train_cfg)
    threads = (torch.get_num_threads() if train_cfg.cpu_threads is None
               else train_cfg.cpu_threads)
    plan = Plan(device, precision, world, train_cfg.batch_size // world, dataset, path,
                None, dataset.fingerprint(), threads=threads)
    _check_output(model_cfg, train_cfg, plan)
    return plan


def _check_output(model_cfg, train_cfg, plan: Plan) -> None:
    """out_dir writable; an existing checkpoint resumed, replaced on request, or kept."""
    path = plan.path
    if path.is_dir():
        raise ValueError(f"{path} is a folder, where the checkpoint file would go; choose "
                         f"another --out_dir")
    plan.found = identity(path)
    data = train_cfg.data_path
    where = lands_on(path, data) if train_cfg.save_checkpoint and data is not None else None
    if where is not None:
        raise ValueError(f"the checkpoint {path} would be written {where} --data_path "
                         f"{data}, the run's input; choose an --out_dir outside the data")
    if train_cfg.resume:
        if not path.is_file():
            raise ValueError(f"cannot resume: there is no checkpoint {path}; run without "
                             f"--resume to start this run")
        plan.resume_state = load_checkpoint(path, map_location=plan.device)
        check_resumable(plan.resume_state, path, model_cfg=model_cfg, train_cfg=train_cfg,
                        world=plan.world, precision=plan.precision, device=plan.device,
                        data=plan.data, threads=plan.threads)
        if identity(path) != plan.found:
            raise ValueError(f"{path} changed while it was read; is another run writing "
                             f"out_dir {path.parent}?")
    else:
        if train_cfg.save_checkpoint and os.path.lexists(path) and not train_cfg.overwrite:
            refuse_if_held(path.parent, "out_dir")   # a run writing it now: named, first
            raise ValueError(f"{path} already holds a checkpoint, which this fresh run would "
                             f"overwrite; pass --resume to continue it, --overwrite to "
                             f"replace it, or choose another --out_dir")
    if train_cfg.save_checkpoint:
        try:
            check_writable(path.parent)
        except OSError as err:
            raise ValueError(f"out_dir {str(path.parent)!r} cannot be written to "
                             f"({err.strerror or err}); choose another --out_dir, or "
                             f"--save_checkpoint false") from err


def _check_data(model_cfg: ModelConfig, train_cfg: TrainConfig,
                dataset: Dataset | None) -> Dataset:
    """The run's data (loaded unless given), checked against the model and the splits."""
    if dataset is None:
        dataset = load(train_cfg.dataset, path=train_cfg.data_path,
                       max_bytes=train_cfg.data_max_bytes, image_shape=model_cfg.image_shape)
    if dataset.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.vocab_size} symbols, more "
                         f"than the model's vocab_size={model_cfg.vocab_size}")
    if dataset.kind == "image" and model_cfg.embedding != "image":
        raise ValueError(f"dataset {dataset.name!r} holds images; use embedding='image' "
                         f"with image_shape={dataset.image_shape}")
    if dataset.kind == "image":
        # the batches begin with the start token, id = the data's vocabulary size; the model
        # (and the sampler) take id vocab_size as the start token: they must be one id
        if dataset.vocab_size != model_cfg.vocab_size:
            raise ValueError(f"dataset {dataset.name!r} has {dataset.vocab_size} symbols and "
                             f"its images begin with start token {dataset.vocab_size}, but the "
                             f"model's start token is its vocab_size={model_cfg.vocab_size} "
                             f"(training and sampling would begin differently); allowed: "
                             f"vocab_size={dataset.vocab_size}")
        if tuple(model_cfg.image_shape) != tuple(dataset.image_shape):
            raise ValueError(f"dataset {dataset.name!r} holds images of shape (H, W, C) = "
                             f"{tuple(dataset.image_shape)}, but the model's image_shape is "
                             f"{tuple(model_cfg.image_shape)} (its row, column and channel "
                             f"embeddings would describe another layout); allowed: "
                             f"image_shape={tuple(dataset.image_shape)}")
    n = model_cfg.n_ctx
    for split in ("train", *train_cfg.eval_splits):
        if split not in dataset.splits:
            raise ValueError(f"dataset {dataset.name!r} has no split {split!r}; it has "
                             f"{sorted(dataset.splits)} (eval_splits={train_cfg.eval_splits})")
        dataset.check_length(n, split)
        if next(iter(dataset.eval_batches(split, 1, n, max_batches=1)), None) is None:
            raise ValueError(f"dataset {dataset.name!r}: split {split!r} holds no sequence "
                             f"of n_ctx={n}; nothing to train on or evaluate")
    return dataset
