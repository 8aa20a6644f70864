"""The training loop: ``train(model_cfg, train_cfg) -> dict``.

Child et al., 2019, section 6: Adam (here AdamW, decoupled weight decay 0.01 on
weight matrices), linear warm-up then cosine decay, gradient clipping at 1.0
(``fast.transformer.training.optim``); section 5.6: mixed precision with fp32 master
weights (fp16 activations and dynamic loss scaling on CUDA; bf16 autocast on
CPU; ``fast.transformer.network.devices``); evaluation in bits per byte (text) or
bits per dim (images) (``fast.transformer.training.loss``). ``python -m fast train``
(``fast.commands.train``) reads any ModelConfig or TrainConfig field as
``--field value`` and calls ``train``.

Before the first step, ``fast.transformer.training.preflight.check_run`` checks
everything that can be known then (device, data and every evaluation split, a
writable ``out_dir``, a checkpoint already there: resumed, replaced on
``overwrite``, or the run is refused), so no run is lost to a mistake found after
training. While it runs, the run holds out_dir's lock and writes its checkpoint only
over the file it expects there (``fast.transformer.training.output``); it stops
early, never with a traceback, on SIGTERM or SIGINT (after saving the step it was
on) and on a NaN or inf in the loss or the weights (saving nothing after it:
``fast.transformer.training.stop``).

The trainer knows nothing about the model beyond ``model(x) -> logits``. Every
random draw flows from ``train_cfg.seed`` (``fast.transformer.training.seed``): the
weights, the dropout masks, and the batch of step t on rank r. A checkpoint
(``fast.transformer.training.resume``) holds the model, optimiser, scheduler, loss
scaler, every rank's RNG states and the step, so ``resume=True`` continues to the
same weights as an uninterrupted run (bitwise with the same CPU thread count; a
resume with another count is told that it matches only to float rounding:
``fast.transformer.training.resume``). Under torchrun every rank draws its own
batches (batch_size is split across ranks) and its own dropout masks
(``seed.seed_rank``); only rank 0 writes checkpoints and shows progress.

With float16 and loss scaling, a step whose gradients overflow is skipped by the
scaler, and then the learning-rate schedule does not advance either: the schedule
counts the updates made.

On a shared CPU, one intra-op thread (``cpu_threads=1`` or ``OMP_NUM_THREADS=1``)
can be many times faster than two threads contending with other processes: each
parallel operation waits for both cores.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tqdm import tqdm

from fast.core.checks import NonFiniteInput
from fast.data import Dataset
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.devices import autocast
from fast.transformer.network.model import SparseTransformer
from fast.transformer.training import seed as seeding
from fast.transformer.training.clock import StepClock
from fast.transformer.training.distributed import gather, init_distributed
from fast.transformer.training.loss import LN2, evaluate, loss_fn, unit
from fast.transformer.training.optim import make_optimizer, make_scheduler
from fast.transformer.training.output import RunOutput
from fast.transformer.training.preflight import Plan, check_run
from fast.transformer.training.resume import restore, training_state
from fast.transformer.training.stop import (
    NAMES,
    FiniteWatch,
    Interrupted,
    NonFinite,
    Signals,
    agreed_signal,
)


def train(model_cfg: ModelConfig, train_cfg: TrainConfig, *, progress: bool = True,
          dataset: Dataset | None = None, plan: Plan | None = None) -> dict:
    """Train a SparseTransformer; returns the run's record.

    dataset: an already loaded ``fast.data.Dataset`` (else ``fast.data.load`` by
    ``train_cfg.dataset``). plan: what ``check_run(model_cfg, train_cfg, dataset)``
    returned, if the caller checked the run itself (a command does, to report a bad
    run in one line); otherwise ``train`` checks it first, and a bad run raises a
    ValueError before any step; so does an out_dir another run holds
    (``fast.core.lock.FolderBusy``). A run that stops early raises a
    ``stop.RunStopped`` (on SIGTERM / SIGINT after saving, on a non-finite loss or
    weight without saving it: ``fast.transformer.training.stop``); a checkpoint that
    cannot be written raises ``fast.transformer.network.checkpoint.CheckpointWriteError``,
    an OSError; the previous checkpoint is then intact. Returns a dict:

      model          the trained SparseTransformer (unwrapped from DDP), train mode
      history        {"step", "loss", "bits", "lr"}: training loss (nats) and
                     bits per byte/dim every log_interval steps (this rank's batch);
                     "lr" at step s is lr * lr_factor(s + 1), the rate of the next
                     step (``scheduler.get_last_lr()`` after step s, which itself took
                     lr * lr_factor(s); ``fast.transformer.training.optim``)
      evals          [{"step": s, "<split>": bits, ...}] every eval_interval and at the end
      final          {"<split>": bits} of the last evaluation
      time_per_iter  mean seconds per optimiser step (steps after the first of this
                     process, evaluation and checkpointing excluded); None when this
                     process took no step (a resume of a finished run)
      iter_times     seconds of every step of this process (on CUDA the GPU's time
                     between CUDA events around the step: ``clock.StepClock``)
      checkpoint     path of the run's checkpoint (None if none, or rank > 0)
      step           optimiser steps done in total
      n_params, device, precision, world_size, unit ("bits per dim" / "bits per byte")
    """
    if plan is None:
        plan = check_run(model_cfg, train_cfg, dataset)     # ValueError before any step
    rank, world, created_group = init_distributed(plan.device)
    threads = torch.get_num_threads()
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)             # cpu_threads, or as it was
    try:
        with (RunOutput(plan, writes=train_cfg.save_checkpoint and rank == 0) as output,
              Signals() as signals):
            run = _Run(model_cfg, train_cfg, progress, plan, rank, world, output, signals)
            run.loop()
            return run.record()
    finally:
        torch.set_num_threads(threads)
        if created_group:
            dist.destroy_process_group()


def train_step(net, model, x, y, optimizer, scheduler, scaler, precision, device,
          grad_clip: float) -> torch.Tensor:
    """One optimiser step on batch (x, y): forward under autocast, backward (loss-scaled
    when fp16), gradient clipping, update, and the schedule's step if the update was
    made (the loss scaler skips it when the gradients overflow). Returns the loss (nats).

    The host waits for the GPU once: inside ``GradScaler.step``, which reads whether the
    gradients overflowed. Whether the update was made is taken from that same read (the
    optimizer's step hook runs only when the scaler calls ``optimizer.step``), not by
    reading the scale before and after (``scaler.get_scale()``: two more waits). The
    optimizer must be one the scaler skips, not one that applies the scaling itself
    (``fused=True``: it is always called; ValueError)."""
    if scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
        # the attribute GradScaler.step itself reads to decide whether to skip
        raise ValueError("train_step with an optimizer that applies the loss scaling itself "
                         "(fused=True); allowed: one the GradScaler skips "
                         "(fast.transformer.training.optim.make_optimizer's AdamW)")
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
    updated = True
    if scaler is not None:
        stepped = []
        hook = optimizer.register_step_post_hook(lambda *_: stepped.append(True))
        try:
            scaler.step(optimizer)                  # the step's one wait: the check for inf
        finally:
            hook.remove()
        scaler.update()
        updated = bool(stepped)                     # skipped: the gradients overflowed
    else:
        optimizer.step()
    if updated:
        scheduler.step()
    return loss


class _Run:
    """One process's part of a run: the model and its optimiser state, the learning
    curve, and the steps from the first (or the resumed) one to the end. ``train``
    makes one inside the run's folder lock and signal handlers; ``loop`` takes the
    steps, ``record`` returns what ``train`` returns."""

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, progress: bool,
                 plan: Plan, rank: int, world: int, output: RunOutput, signals: Signals):
        self.model_cfg, self.cfg, self.plan = model_cfg, train_cfg, plan
        self.rank, self.world, self.output, self.signals = rank, world, output, signals
        self.dataset, self.device, self.precision = plan.dataset, plan.device, plan.precision
        seeding.seed_everything(train_cfg.seed)                      # one seed for everything
        self.model = SparseTransformer(model_cfg).to(self.device)    # the same on every rank
        seeding.seed_rank(train_cfg.seed, rank)                      # dropout: per rank
        self.optimizer = make_optimizer(self.model, train_cfg)
        self.scheduler = make_scheduler(self.optimizer, train_cfg)
        self.scaler = (torch.amp.GradScaler(self.device.type) if self.precision == "fp16"
                       else None)
        self.history = {"step": [], "loss": [], "bits": [], "lr": []}
        self.evals: list[dict] = []
        self.step = 0
        if plan.resume_state is not None:
            self.step, saved = restore(plan.resume_state, model=self.model,
                                       optimizer=self.optimizer, scheduler=self.scheduler,
                                       scaler=self.scaler, rank=rank)
            plan.resume_state = None                                 # free it
            self.history, self.evals = saved["train"], saved["evals"]
        self.first_step = self.step
        self.net = self.model
        if world > 1:
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda"
                else None)
        self.end = (train_cfg.max_iters if train_cfg.stop_iter is None
                    else min(train_cfg.stop_iter, train_cfg.max_iters))
        self.clock = StepClock(self.device)   # no host-device sync of its own per step
        self.watch = FiniteWatch(self.model)  # nor this one: read where the loop waits anyway
        self.checkpoint_path = None
        self.bar = None
        if progress and rank == 0:
            self.bar = tqdm(total=self.end, initial=self.step,
                            desc=f"train {self.dataset.name}", dynamic_ncols=True)

    def save(self) -> str | None:
        """The checkpoint of the step the run is on (every rank takes part; rank 0
        writes); None when this run saves none or on another rank."""
        if not self.cfg.save_checkpoint:
            return None
        rng = gather(seeding.rng_state(), self.world)
        if self.rank != 0:
            return None
        return self.output.save(training_state(
            model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            scaler=self.scaler, step=self.step, world=self.world, model_cfg=self.model_cfg,
            train_cfg=self.cfg, history=self.history, evals=self.evals, rng=rng,
            data=self.plan.data, precision=self.precision, device=self.device), self.step)

    def kept(self) -> str:
        """Which checkpoint out_dir holds now, in words."""
        if not self.cfg.save_checkpoint:
            return "no checkpoint is saved by this run (save_checkpoint false)"
        if self.rank != 0:
            return f"rank 0 writes the run's checkpoint ({self.plan.path}), this rank none"
        if self.output.saved_step is not None:
            return f"{self.plan.path} keeps step {self.output.saved_step}"
        if self.first_step:
            return f"{self.plan.path} keeps step {self.first_step}, where this run resumed"
        return "no checkpoint was written (raise checkpoint_interval's frequency to keep some)"

    def check_finite(self) -> None:
        bad = self.watch.first_bad(self.world)
        if bad is not None:
            raise NonFinite(f"the loss or the weights turned non-finite (NaN or inf) at step "
                            f"{bad}; the run stopped there and saved nothing after it: "
                            f"{self.kept()} (a lower lr, or precision fp32, may keep it finite)")

    def run_eval(self, record: bool = True) -> dict:
        row = {"step": self.step}
        for split in self.cfg.eval_splits:
            # the whole batch on every rank: the same items and number as one process
            # reads (a rank's share read fewer, and the number followed the world size)
            row[split] = evaluate(self.model, self.dataset, split,
                                  batch_size=self.cfg.batch_size,
                                  max_batches=self.cfg.eval_batches, precision=self.precision)
        if record:
            self.evals.append(row)
        return row

    def log(self, loss: torch.Tensor) -> None:
        """The learning curve's point of this step (the host waits for the step here)."""
        value = loss.item()
        self.clock.collect()                  # the host waited for this step already
        self.history["step"].append(self.step)
        self.history["loss"].append(value)
        self.history["bits"].append(value / LN2)
        self.history["lr"].append(self.scheduler.get_last_lr()[0])
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{value:.3f}", bits=f"{value / LN2:.3f}")

    def take_step(self) -> torch.Tensor:
        self.clock.start()
        gen = seeding.data_generator(self.cfg.seed, self.step, self.rank)
        x, y = self.dataset.batch("train", self.plan.local_batch, self.model_cfg.n_ctx,
                                  gen)                                     # (B, n) each
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        try:
            loss = train_step(self.net, self.model, x, y, self.optimizer, self.scheduler,
                              self.scaler, self.precision, self.device, self.cfg.grad_clip)
        except NonFiniteInput as err:        # finite weights whose activations overflowed
            raise NonFinite(f"the activations turned non-finite (NaN or inf) at step "
                            f"{self.step + 1} ({err}); the run stopped there and saved "
                            f"nothing after it: {self.kept()} (a lower lr, or precision "
                            f"fp32, may keep it finite)") from None
        self.step += 1
        self.clock.stop()
        self.watch.add(self.step, loss)
        return loss

    def loop(self) -> None:
        """The steps up to ``end``: log, evaluate and save on their intervals; stop on
        a non-finite loss or weight, or after saving on an agreed signal."""
        cfg, end = self.cfg, self.end
        self.model.train()
        try:
            while self.step < end:
                loss = self.take_step()
                step = self.step
                # the last step of the whole run is logged, not the step a stopped run ends
                # on (a stop and resume must give the same learning curve as one run)
                logged = step % cfg.log_interval == 0 or step == cfg.max_iters
                due_eval = bool(cfg.eval_interval) and step % cfg.eval_interval == 0 \
                    and step < end
                due_save = bool(cfg.checkpoint_interval) and \
                    step % cfg.checkpoint_interval == 0 and step < end
                signum = agreed_signal(self.signals, self.world, self.device)
                if (self.device.type == "cpu" or logged or due_eval or due_save or signum
                        or step == end):
                    self.check_finite()           # before anything reads or saves this step
                if logged:
                    self.log(loss)
                if self.bar is not None:
                    self.bar.update(1)
                if due_eval:
                    row = self.run_eval()
                    if self.bar is not None:
                        self.bar.write(f"step {step}: " + ", ".join(
                            f"{s} {row[s]:.4f} {unit(self.dataset)}" for s in cfg.eval_splits))
                if due_save or (signum and step < end):
                    self.checkpoint_path = self.save()
                if signum and step < end:
                    raise Interrupted(
                        f"stopped by {NAMES.get(signum, signum)} after step {step} of {end}; "
                        + (f"{self.kept()}: continue it with --resume"
                           if cfg.save_checkpoint else self.kept()), signum)
        finally:
            if self.bar is not None:
                self.bar.close()

    def record(self) -> dict:
        """The final evaluation and checkpoint; what ``train`` returns."""
        cfg, step = self.cfg, self.step
        # The final evaluation joins the learning curve at the run's last step, or at a
        # stop that falls on the eval interval; a run stopped elsewhere (stop_iter) reports
        # it without recording it, so that stop + resume gives one run's curve. A step
        # already recorded (a resume that took no step) is not recorded twice.
        on_interval = bool(cfg.eval_interval) and step % cfg.eval_interval == 0
        recorded = bool(self.evals) and self.evals[-1]["step"] == step
        final = self.run_eval(record=(step == cfg.max_iters or on_interval) and not recorded)
        if cfg.save_checkpoint:
            if step > self.first_step:
                self.checkpoint_path = self.save()
            elif self.rank == 0 and self.plan.path.is_file():
                self.checkpoint_path = str(self.plan.path)  # nothing new: the one resumed stands
        if self.world > 1:
            dist.barrier()
        iter_times = self.clock.seconds()
        timed = iter_times[1:] if len(iter_times) > 1 else iter_times
        return {
            "model": self.model, "history": self.history, "evals": self.evals,
            "final": {s: final[s] for s in cfg.eval_splits},
            "time_per_iter": sum(timed) / len(timed) if timed else None,
            "iter_times": iter_times, "checkpoint": self.checkpoint_path, "step": step,
            "n_params": self.model.num_params(), "device": str(self.device),
            "precision": self.precision, "world_size": self.world, "unit": unit(self.dataset),
        }
