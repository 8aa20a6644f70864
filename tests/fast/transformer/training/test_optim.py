"""The learning-rate schedule: linear warm-up then cosine decay, and a step the fp16 loss
scaler skips does not advance it (Child et al., 2019, sec. 5.6 and 6)."""

from __future__ import annotations

import math

import pytest
import torch

from fast.transformer.config import preset
from fast.transformer.training import train as training
from fast.transformer.training.optim import lr_factor, make_optimizer, make_scheduler
from tests.conftest import tiny_digits

pytestmark = pytest.mark.usefixtures("one_thread")


def test_lr_schedule_warmup_then_cosine():
    _, cfg = preset("quick", lr=1.0, warmup_iters=4, max_iters=14, min_lr_frac=0.1)
    f = [lr_factor(s, cfg) for s in range(15)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(f[9], 0.1 + 0.9 * 0.5) and math.isclose(f[14], 0.1)
    assert all(a >= b for a, b in zip(f[4:], f[5:]))


def test_a_step_the_loss_scaler_skips_does_not_advance_the_schedule(digits):
    m, t = tiny_digits(".", d_model=16, n_layers=1, precision="fp16", warmup_iters=10,
                       max_iters=20)
    torch.manual_seed(0)
    model = training.SparseTransformer(m)
    optimizer, device = make_optimizer(model, t), torch.device("cpu")
    scheduler = make_scheduler(optimizer, t)
    x, y = digits.batch("train", 4, m.n_ctx, torch.Generator().manual_seed(0))
    # a scale so large that the scaled loss overflows: the scaler must skip this update
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    weights = [p.detach().clone() for p in model.parameters()]
    lr = scheduler.get_last_lr()
    loss = training.train_step(model, model, x, y, optimizer, scheduler, scaler, "fp16", device,
                               1.0)
    assert math.isfinite(loss.item()) and scaler.get_scale() < 2.0 ** 127   # skipped
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert scheduler.last_epoch == 0 and scheduler.get_last_lr() == lr
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)               # a usable scale
    training.train_step(model, model, x, y, optimizer, scheduler, scaler, "fp16", device, 1.0)
    assert scaler.get_scale() == 2.0 ** 8 and scheduler.last_epoch == 1
    assert not all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_an_optimizer_that_scales_itself_is_refused_with_loss_scaling(digits):
    """train_step learns whether the scaler made the update from the scaler's own read (the
    optimizer's step hook), which an optimizer that handles the scaling itself (fused AdamW:
    always called) would fool: it is refused, not silently mis-scheduled."""
    m, t = tiny_digits(".", d_model=16, n_layers=1, precision="fp16")
    model = training.SparseTransformer(m)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    scheduler = make_scheduler(optimizer, t)
    x, y = digits.batch("train", 2, m.n_ctx, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="applies the loss scaling itself"):
        training.train_step(model, model, x, y, optimizer, scheduler,
                            torch.amp.GradScaler("cpu"), "fp16", torch.device("cpu"), 1.0)
