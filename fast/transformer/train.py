"""Training loop: ``train(model_cfg, train_cfg) -> dict``, and ``python -m fast.transformer.train``.

Child et al., 2019, section 6 and paper-notes section 4: Adam (here AdamW,
decoupled weight decay 0.01 on weight matrices), linear warm-up then cosine
decay, gradient clipping at 1.0, mixed precision with fp32 master weights
(fp16 activations and dynamic loss scaling on CUDA; bf16 autocast on CPU),
evaluation in bits per byte (text) or bits per dim (images).

    python -m fast.transformer.train --preset quick
    python -m fast.transformer.train --preset quick_text --n_layers 2 --max_iters 100
    python -m fast.transformer.train --preset quick --resume          # continue runs/quick/ckpt.pt
    torchrun --nproc_per_node=2 -m fast.transformer.train --preset quick   # DDP (gloo CPU / nccl CUDA)

Any ModelConfig or TrainConfig field can be given as ``--field value`` (Python
literals: 2, 0.1, true, none, "(16, 16, 1)"); a bool field alone (``--resume``)
means true.

The trainer knows nothing about the model beyond ``model(x) -> logits``. Every
random draw flows from ``train_cfg.seed`` (fast.transformer.seed): the weights, the dropout
masks, and the batch of step t on rank r. A checkpoint holds the model,
optimiser, scheduler, loss scaler, RNG states and step, so ``resume=True``
continues to the same weights as an uninterrupted run. Under torchrun every rank
draws its own batches (batch_size is split across ranks); only rank 0 writes
checkpoints and shows progress.

On a shared CPU, one intra-op thread (``--cpu_threads 1`` or ``OMP_NUM_THREADS=1``)
can be many times faster than two threads contending with other processes
(measured on the project's 2-core machine under load: 1.4 s vs 6.3 s per step of
the "quick" preset at batch 16).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fast.transformer import checkpoint as ckpt
from fast.transformer import seed as seeding
from fast.transformer.config import PRESETS, ModelConfig, TrainConfig, preset
from fast.data import Dataset, load
from fast.transformer.model import SparseTransformer

LN2 = math.log(2.0)


# ----------------------------------------------------------------------------
# Pieces: device, precision, optimiser, schedule, loss.
# ----------------------------------------------------------------------------

def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available; use 'cpu'")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> "fp16" on CUDA (with loss scaling), "bf16" on CPU."""
    if precision == "auto":
        return "fp16" if device.type == "cuda" else "bf16"
    return precision


def autocast(precision: str, device: torch.device):
    """The autocast context of a precision ("fp32": none). Weights stay fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings (dim >= 2), none on biases and norms."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_iters, then cosine decay to min_lr_frac at max_iters."""
    if step < cfg.warmup_iters:
        return (step + 1) / cfg.warmup_iters
    span = max(1, cfg.max_iters - cfg.warmup_iters)
    progress = min(1.0, (step - cfg.warmup_iters) / span)
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats over every position, computed in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


# ----------------------------------------------------------------------------
# Evaluation.
# ----------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: Dataset, split: str = "val", *,
             batch_size: int = 16, max_batches: int | None = 8, precision: str = "fp32",
             device=None) -> float:
    """Bits per byte (text) or bits per dim (images) of ``model`` on ``split``.

    Deterministic: reads the split from its start (consecutive windows of
    n_ctx bytes, or images in order), at most ``max_batches`` batches; the mean
    is over every predicted position. The model is put back in its previous
    train/eval mode.
    """
    model = getattr(model, "module", model)
    device = next(model.parameters()).device if device is None else torch.device(device)
    n = model.cfg.n_ctx
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in dataset.eval_batches(split, batch_size, n, max_batches):
        x, y = x.to(device), y.to(device)
        with autocast(precision, device):
            logits = model(x)
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                 reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    if count == 0:
        raise ValueError(f"split {split!r} gave no evaluation batch")
    return total / count / LN2


# ----------------------------------------------------------------------------
# Distributed set-up (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).
# ----------------------------------------------------------------------------

def _init_distributed(device: torch.device) -> tuple[int, int, bool]:
    """(rank, world_size, whether we created the process group)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not dist.is_initialized():
        return 0, 1, False
    created = False
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        created = True
    return dist.get_rank(), dist.get_world_size(), created


# ----------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------

def train(model_cfg: ModelConfig, train_cfg: TrainConfig, *, progress: bool = True,
          dataset: Dataset | None = None) -> dict:
    """Train a SparseTransformer; returns the run's record.

    dataset: an already loaded ``fast.data.Dataset`` (else ``fast.data.load`` by
    ``train_cfg.dataset``). Returns a dict:

      model          the trained SparseTransformer (unwrapped from DDP), train mode
      history        {"step", "loss", "bits", "lr"}: training loss (nats) and
                     bits per byte/dim every log_interval steps (this rank's batch)
      evals          [{"step": s, "<split>": bits, ...}] every eval_interval and at the end
      final          {"<split>": bits} of the last evaluation
      time_per_iter  mean seconds per optimiser step (steps after the first of this
                     process, evaluation and checkpointing excluded)
      iter_times     seconds of every step of this process
      checkpoint     path of the checkpoint written (None if none, or rank > 0)
      step           optimiser steps done in total
      n_params, device, precision, world_size, unit ("bits per dim" / "bits per byte")
    """
    if not isinstance(model_cfg, ModelConfig) or not isinstance(train_cfg, TrainConfig):
        raise ValueError(f"train needs (ModelConfig, TrainConfig), got "
                         f"({type(model_cfg).__name__}, {type(train_cfg).__name__})")
    device = resolve_device(train_cfg.device)
    precision = resolve_precision(train_cfg.precision, device)
    rank, world, created_group = _init_distributed(device)
    if train_cfg.batch_size % world:
        raise ValueError(f"batch_size={train_cfg.batch_size} must divide evenly over "
                         f"{world} ranks")
    local_batch = train_cfg.batch_size // world
    threads = torch.get_num_threads()
    if train_cfg.cpu_threads is not None:
        torch.set_num_threads(train_cfg.cpu_threads)
    try:
        return _train(model_cfg, train_cfg, progress, dataset, device, precision, rank,
                      world, local_batch)
    finally:
        torch.set_num_threads(threads)
        if created_group:
            dist.destroy_process_group()


def _train(model_cfg, train_cfg, progress, dataset, device, precision, rank, world,
           local_batch) -> dict:
    if dataset is None:
        dataset = load(train_cfg.dataset, path=train_cfg.data_path,
                       max_bytes=train_cfg.data_max_bytes, image_shape=model_cfg.image_shape)
    if dataset.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"dataset {dataset.name!r} has {dataset.vocab_size} symbols, more "
                         f"than the model's vocab_size={model_cfg.vocab_size}")
    if dataset.kind == "image" and model_cfg.embedding != "image":
        raise ValueError(f"dataset {dataset.name!r} holds images; use embedding='image' "
                         f"with image_shape={dataset.image_shape}")
    dataset.check_length(model_cfg.n_ctx, "train")

    seeding.seed_everything(train_cfg.seed)                          # one seed for everything
    model = SparseTransformer(model_cfg).to(device)
    optimizer = make_optimizer(model, train_cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, train_cfg))
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    history = {"step": [], "loss": [], "bits": [], "lr": []}
    evals: list[dict] = []
    step = 0
    path = Path(train_cfg.out_dir) / "ckpt.pt"

    if train_cfg.resume:
        state = ckpt.load_checkpoint(path, map_location=device)
        saved_cfg, saved_train = ckpt.configs_from(state)
        if saved_cfg != model_cfg:
            raise ValueError(f"cannot resume {path}: it was trained with {saved_cfg}, "
                             f"the run asks for {model_cfg}")
        _check_same_trajectory(path, saved_train, train_cfg,
                               state.get("data_position", {}).get("world_size", world), world)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler") is not None:
            scaler.load_state_dict(state["scaler"])
        seeding.set_rng_state(state["rng"])
        step = state["step"]
        history = state.get("history", {}).get("train", history)
        evals = state.get("history", {}).get("evals", evals)

    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    def save() -> str | None:
        if rank != 0 or not train_cfg.save_checkpoint:
            return None
        return ckpt.save_checkpoint(path, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": seeding.rng_state(), "step": step,
            "data_position": {"step": step, "seed": train_cfg.seed, "world_size": world},
            "model_cfg": ckpt.as_dict(model_cfg), "train_cfg": ckpt.as_dict(train_cfg),
            "history": {"train": history, "evals": evals}})

    def run_eval() -> dict:
        row = {"step": step}
        for split in train_cfg.eval_splits:
            row[split] = evaluate(model, dataset, split, batch_size=local_batch,
                                  max_batches=train_cfg.eval_batches, precision=precision)
        evals.append(row)
        return row

    end = train_cfg.max_iters if train_cfg.stop_iter is None else min(train_cfg.stop_iter,
                                                                       train_cfg.max_iters)
    iter_times: list[float] = []
    checkpoint_path = None
    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm
        bar = tqdm(total=end, initial=step, desc=f"train {dataset.name}", dynamic_ncols=True)
    model.train()
    unit = "bits per dim" if dataset.kind == "image" else "bits per byte"
    while step < end:
        t0 = time.perf_counter()
        gen = seeding.data_generator(train_cfg.seed, step, rank)
        x, y = dataset.batch("train", local_batch, model_cfg.n_ctx, gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(precision, device):
            logits = net(x)
        loss = loss_fn(logits, y)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        if train_cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        step += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        iter_times.append(time.perf_counter() - t0)

        if step % train_cfg.log_interval == 0 or step == end:
            value = loss.item()
            history["step"].append(step)
            history["loss"].append(value)
            history["bits"].append(value / LN2)
            history["lr"].append(scheduler.get_last_lr()[0])
        if bar is not None:
            bar.update(1)
            if step % train_cfg.log_interval == 0 or step == end:
                bar.set_postfix(loss=f"{history['loss'][-1]:.3f}",
                                bits=f"{history['bits'][-1]:.3f}")
        if train_cfg.eval_interval and step % train_cfg.eval_interval == 0 and step < end:
            row = run_eval()
            if bar is not None:
                bar.write(f"step {step}: " + ", ".join(
                    f"{s} {row[s]:.4f} {unit}" for s in train_cfg.eval_splits))
        if (train_cfg.checkpoint_interval and step % train_cfg.checkpoint_interval == 0
                and step < end):
            checkpoint_path = save()
    if bar is not None:
        bar.close()
    final = run_eval()
    if train_cfg.save_checkpoint:
        checkpoint_path = save()
    if world > 1:
        dist.barrier()
    timed = iter_times[1:] if len(iter_times) > 1 else iter_times
    return {
        "model": model, "history": history, "evals": evals,
        "final": {s: final[s] for s in train_cfg.eval_splits},
        "time_per_iter": sum(timed) / len(timed) if timed else float("nan"),
        "iter_times": iter_times, "checkpoint": checkpoint_path, "step": step,
        "n_params": model.num_params(), "device": str(device), "precision": precision,
        "world_size": world, "unit": unit,
    }


# Fields that change which batches are drawn or how the weights move: a resumed run
# must keep them, or it would silently stop being the run it continues.
TRAJECTORY_FIELDS = ("dataset", "data_path", "data_max_bytes", "batch_size", "max_iters",
                     "lr", "min_lr_frac", "warmup_iters", "weight_decay", "beta1", "beta2",
                     "grad_clip", "precision", "seed")


def _check_same_trajectory(path, saved: TrainConfig | None, now: TrainConfig,
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


# ----------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------

def _literal(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_args(argv: list[str]) -> tuple[str, dict]:
    """``--preset NAME --field value ...`` -> (preset name, overrides)."""
    fields = {f.name: f for f in dataclasses.fields(ModelConfig) + dataclasses.fields(TrainConfig)}
    name, overrides, i = "quick", {}, 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            raise ValueError(f"expected --field value, got {token!r}")
        key = token[2:].replace("-", "_")
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if key == "preset":
            if not has_value:
                raise ValueError(f"--preset needs a name, one of {sorted(PRESETS)}")
            name, i = argv[i + 1], i + 2
            continue
        if key not in fields:
            raise ValueError(f"unknown option --{key}; fields: --preset, "
                             f"{', '.join('--' + k for k in sorted(fields))}")
        if has_value:
            overrides[key], i = _literal(argv[i + 1]), i + 2
        elif isinstance(fields[key].default, bool):
            overrides[key], i = True, i + 1
        else:
            raise ValueError(f"--{key} needs a value")
    return name, overrides


def usage() -> str:
    """The --help text: presets, then every field with its default in the quick preset."""
    model_cfg, train_cfg = preset("quick")
    lines = ["usage: python -m fast.transformer.train [--preset NAME] [--field value ...]", "",
             "Train a Sparse Transformer (Child et al., 2019). Every ModelConfig and",
             "TrainConfig field (fast/config.py documents each) is an option.", "",
             f"presets: {', '.join(sorted(PRESETS))} (default: quick)", "", "fields (quick preset's value):"]
    for cfg in (model_cfg, train_cfg):
        for f in dataclasses.fields(cfg):
            lines.append(f"  --{f.name:<20} {getattr(cfg, f.name)!r}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(usage())
        raise SystemExit(0)
    try:
        name, overrides = parse_args(argv)
    except ValueError as err:
        raise SystemExit(f"python -m fast.transformer.train: {err}\n(see --help)") from None
    model_cfg, train_cfg = preset(name, **overrides)
    result = train(model_cfg, train_cfg, progress=True)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"preset {name}: {result['n_params']:,} parameters, {result['step']} steps on "
              f"{result['device']} ({result['precision']}), "
              f"{result['time_per_iter'] * 1000:.1f} ms/iter; " + ", ".join(
                  f"{s} {v:.4f} {result['unit']}" for s, v in result["final"].items())
              + (f"; checkpoint {result['checkpoint']}" if result["checkpoint"] else ""))
    return result


if __name__ == "__main__":
    main()
