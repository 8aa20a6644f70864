"""Training loop: ``train(model_cfg, train_cfg) -> dict``, and ``python -m fast train``.

Child et al., 2019, section 6: Adam (here AdamW, decoupled weight decay 0.01 on
weight matrices), linear warm-up then cosine decay, gradient clipping at 1.0
(``fast.transformer.optim``); section 5.6: mixed precision with fp32 master
weights (fp16 activations and dynamic loss scaling on CUDA; bf16 autocast on
CPU; ``fast.transformer.devices``); evaluation in bits per byte (text) or bits
per dim (images) (``fast.transformer.loss``).

    python -m fast train --preset quick
    python -m fast train --preset quick_text --n_layers 2 --max_iters 100
    python -m fast train --preset quick --resume          # continue runs/quick/ckpt.pt
    torchrun --nproc_per_node=2 -m fast train --preset quick   # DDP (gloo CPU / nccl CUDA)

The options are parsed by ``fast.transformer.cli`` (any ModelConfig or
TrainConfig field as ``--field value``).

The trainer knows nothing about the model beyond ``model(x) -> logits``. Every
random draw flows from ``train_cfg.seed`` (fast.transformer.seed): the weights, the dropout
masks, and the batch of step t on rank r. A checkpoint (fast.transformer.checkpoint) holds
the model, optimiser, scheduler, loss scaler, RNG states and step, so ``resume=True``
continues to the same weights as an uninterrupted run. Under torchrun every rank
draws its own batches (batch_size is split across ranks); only rank 0 writes
checkpoints and shows progress.

On a shared CPU, one intra-op thread (``--cpu_threads 1`` or ``OMP_NUM_THREADS=1``)
can be many times faster than two threads contending with other processes
(measured on the project's 2-core machine under load: 1.4 s vs 6.3 s per step of
the "quick" preset at batch 16).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from fast.data import Dataset, load
from fast.transformer import checkpoint as ckpt
from fast.transformer import cli
from fast.transformer import seed as seeding
from fast.transformer.config import ModelConfig, TrainConfig, preset
from fast.transformer.devices import autocast, init_distributed, resolve_device, resolve_precision
from fast.transformer.loss import LN2, evaluate, loss_fn, unit
from fast.transformer.model import SparseTransformer
from fast.transformer.optim import make_optimizer, make_scheduler


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
    rank, world, created_group = init_distributed(device)
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


def _dataset(model_cfg: ModelConfig, train_cfg: TrainConfig, dataset: Dataset | None) -> Dataset:
    """The run's data (loaded unless given), checked against the model."""
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
    return dataset


def _step(net, model, x, y, optimizer, scheduler, scaler, precision, device,
          grad_clip: float) -> torch.Tensor:
    """One optimiser step on batch (x, y): forward under autocast, backward (loss-scaled
    when fp16), gradient clipping, update, schedule. Returns the loss (nats)."""
    with autocast(precision, device):
        logits = net(x)                                                  # (B, n, vocab)
    loss = loss_fn(logits, y)
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    return loss


def _train(model_cfg, train_cfg, progress, dataset, device, precision, rank, world,
           local_batch) -> dict:
    dataset = _dataset(model_cfg, train_cfg, dataset)
    seeding.seed_everything(train_cfg.seed)                          # one seed for everything
    model = SparseTransformer(model_cfg).to(device)
    optimizer = make_optimizer(model, train_cfg)
    scheduler = make_scheduler(optimizer, train_cfg)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    history = {"step": [], "loss": [], "bits": [], "lr": []}
    evals: list[dict] = []
    step = 0
    path = Path(train_cfg.out_dir) / "ckpt.pt"

    if train_cfg.resume:
        state = ckpt.load_checkpoint(path, map_location=device)
        step, saved = ckpt.restore(state, path, model_cfg=model_cfg, train_cfg=train_cfg,
                                   world=world, model=model, optimizer=optimizer,
                                   scheduler=scheduler, scaler=scaler)
        history = saved.get("train", history)
        evals = saved.get("evals", evals)

    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    def save() -> str | None:
        if rank != 0 or not train_cfg.save_checkpoint:
            return None
        return ckpt.save_checkpoint(path, ckpt.training_state(
            model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, step=step,
            world=world, model_cfg=model_cfg, train_cfg=train_cfg, history=history,
            evals=evals))

    def run_eval(record: bool = True) -> dict:
        row = {"step": step}
        for split in train_cfg.eval_splits:
            row[split] = evaluate(model, dataset, split, batch_size=local_batch,
                                  max_batches=train_cfg.eval_batches, precision=precision)
        if record:
            evals.append(row)
        return row

    end = train_cfg.max_iters if train_cfg.stop_iter is None else min(train_cfg.stop_iter,
                                                                       train_cfg.max_iters)
    iter_times: list[float] = []
    checkpoint_path = None
    bar = None
    if progress and rank == 0:
        bar = tqdm(total=end, initial=step, desc=f"train {dataset.name}", dynamic_ncols=True)
    model.train()
    while step < end:
        t0 = time.perf_counter()
        gen = seeding.data_generator(train_cfg.seed, step, rank)
        x, y = dataset.batch("train", local_batch, model_cfg.n_ctx, gen)   # (B, n) each
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = _step(net, model, x, y, optimizer, scheduler, scaler, precision, device,
                     train_cfg.grad_clip)
        step += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        iter_times.append(time.perf_counter() - t0)

        # the last step of the whole run is logged, not the step a stopped run ends on
        # (a stop and resume must give the same learning curve as one run)
        logged = step % train_cfg.log_interval == 0 or step == train_cfg.max_iters
        if logged:
            value = loss.item()
            history["step"].append(step)
            history["loss"].append(value)
            history["bits"].append(value / LN2)
            history["lr"].append(scheduler.get_last_lr()[0])
        if bar is not None:
            bar.update(1)
            if logged:
                bar.set_postfix(loss=f"{history['loss'][-1]:.3f}",
                                bits=f"{history['bits'][-1]:.3f}")
        if train_cfg.eval_interval and step % train_cfg.eval_interval == 0 and step < end:
            row = run_eval()
            if bar is not None:
                bar.write(f"step {step}: " + ", ".join(
                    f"{s} {row[s]:.4f} {unit(dataset)}" for s in train_cfg.eval_splits))
        if (train_cfg.checkpoint_interval and step % train_cfg.checkpoint_interval == 0
                and step < end):
            checkpoint_path = save()
    if bar is not None:
        bar.close()
    # The final evaluation joins the learning curve at the run's last step, or at a
    # stop that falls on the eval interval; a run stopped elsewhere (stop_iter) reports
    # it without recording it, so that stop + resume gives one run's curve.
    on_interval = bool(train_cfg.eval_interval) and step % train_cfg.eval_interval == 0
    final = run_eval(record=step == train_cfg.max_iters or on_interval)
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
        "world_size": world, "unit": unit(dataset),
    }


def main(argv: list[str] | None = None) -> dict:
    """``python -m fast train [--preset NAME] [--field value ...]``: train, print one line."""
    name, overrides = cli.command_line(sys.argv[1:] if argv is None else argv)
    model_cfg, train_cfg = preset(name, **overrides)
    result = train(model_cfg, train_cfg, progress=True)
    if int(os.environ.get("RANK", "0")) == 0:
        print(cli.summary(name, result))
    return result


if __name__ == "__main__":
    main()
