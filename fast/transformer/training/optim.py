"""The optimiser and its learning-rate schedule.

Child et al., 2019, section 6: Adam with a weight decay penalty of 0.01, a linear
warm-up (5000 iterations in the paper), cosine decay of the learning rate, and
gradient clipping at 1.0 (the clipping itself is one call in the training loop).
Here the Adam is AdamW, with the decay decoupled from the gradient and applied to
weight matrices and embeddings only.
"""

from __future__ import annotations

import math
import warnings

import torch

from fast.transformer.config import TrainConfig


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings (dim >= 2), none on biases and norms."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


class ScheduleWarning(UserWarning):
    """A schedule that runs, but not as its settings suggest: a warm-up as long as the
    run or longer never reaches the peak rate, and its cosine decay never starts
    (``check_schedule``); ``python -m fast train`` prints it as one line."""


def check_schedule(cfg: TrainConfig) -> None:
    """A ``ScheduleWarning`` when warmup_iters >= max_iters (runs that short are legal:
    tests and smoke runs take a few steps of a preset)."""
    if cfg.warmup_iters >= cfg.max_iters:
        top = lr_factor(cfg.max_iters - 1, cfg)
        warnings.warn(f"warmup_iters={cfg.warmup_iters} is not below max_iters="
                      f"{cfg.max_iters}: the learning rate climbs to {top:.3g} of its peak "
                      f"lr={cfg.lr:g} at the last step and its cosine decay never starts "
                      f"(warmup_iters < max_iters gives the whole schedule)",
                      ScheduleWarning, stacklevel=3)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_iters, then cosine decay to min_lr_frac at max_iters."""
    if step < cfg.warmup_iters:
        return (step + 1) / cfg.warmup_iters
    span = max(1, cfg.max_iters - cfg.warmup_iters)
    progress = min(1.0, (step - cfg.warmup_iters) / span)
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer,
                   cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule of ``lr_factor`` times the peak learning rate, stepped once per step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
