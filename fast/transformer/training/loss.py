"""The training loss in nats, and evaluation in bits per byte or bits per dim.

Child et al., 2019, section 7 reports text models in bits per byte (Enwik8) and
image models in bits per dim (CIFAR-10, ImageNet 64x64): the mean negative
log-likelihood of every predicted byte, in base 2. The loss that is minimised is
the same cross-entropy in nats; dividing by ln 2 turns one into the other.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fast.data import Dataset
from fast.transformer.network.devices import autocast

LN2 = math.log(2.0)


def loss_fn(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy in nats over every position (mean, or "sum"), computed in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                           reduction=reduction)                          # (B*n, vocab)


def unit(dataset: Dataset) -> str:
    """What the numbers of ``dataset`` are called: bits per dim (images) or per byte (text)."""
    return "bits per dim" if dataset.kind == "image" else "bits per byte"


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: Dataset, split: str = "val", *,
             batch_size: int = 16, max_batches: int | None = 8, precision: str = "fp32",
             device=None) -> float:
    """Bits per byte (text) or bits per dim (images) of ``model`` on ``split``.

    Deterministic: reads every evaluation item of the split (the non-overlapping
    windows of n_ctx bytes that tile a text split, or its images), or, with
    ``max_batches``, an evenly spread sample of max_batches * batch_size of them
    (``Dataset.eval_items``); the mean is over every predicted position. The
    model is put back in its previous train/eval mode.
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
        total += loss_fn(logits, y, reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    if count == 0:
        raise ValueError(f"split {split!r} gave no evaluation batch")
    return total / count / LN2
