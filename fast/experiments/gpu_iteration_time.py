"""Table 2's time column on a GPU: seconds per training iteration, dense / fixed / strided.

Child et al., 2019, Table 2 reports seconds per iteration on their GPUs (dense /
fixed / strided: Enwik8 1.31 / 0.55 / 0.35, CIFAR-10 0.54 / 0.47 / 0.38). This
script times one training iteration of the network of ``fast.transformer`` at the
paper's shapes with fewer layers -- Enwik8: n = 12288, d = 512, 8 heads, 6 layers;
CIFAR-10: n = 3072, d = 256, 2 heads, 16 layers; batch 8; fixed l = 128, c = 32
(l = 96 for the 32 x 32 x 3 images), strided l = 128 (96) -- as the training loop
runs it (``fast.transformer.training.train``'s step: fp16 autocast with dynamic loss
scaling, recomputation of every residual block, gradient clipping, AdamW, the
schedule), on batches of random bytes (a step's time does not depend on the
values):

* ``--warm`` steps (10) first, untimed (compilation, layouts, allocator);
* ``--steps`` steps timed one by one on the device's clock (``fast.measure.timing.repeat``:
  CUDA events on a GPU, the wall clock on the CPU);
  the median is reported, every step kept;
* one more step under ``torch.cuda.set_sync_debug_mode("warn")``: every time
  the host waits for the GPU inside a step is counted (the loss scaler's check
  for inf is the one a step needs).

    python -m fast train-time [--shapes enwik8 cifar10] [--batch 8] [--out DIR]

Writes figures/data/gpu_iteration_time.json (``--out``: DIR/data/...).
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

from fast.measure.bench import machine_info
from fast.measure.timing import repeat, synchronize
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.devices import resolve_precision
from fast.transformer.network.model import SparseTransformer
from fast.transformer.training.optim import make_optimizer, make_scheduler
from fast.transformer.training.train import train_step  # the training loop's own step

# name -> sequence length, width, heads, layers, stride l, summary width c, image shape or None
SHAPES = {
    "enwik8": dict(n=12288, d=512, heads=8, layers=6, stride=128, c=32, image=None),
    "cifar10": dict(n=3072, d=256, heads=2, layers=16, stride=96, c=32, image=(32, 32, 3)),
}
PAPER_S = {"enwik8": {"full": 1.31, "fixed": 0.55, "strided": 0.35},
           "cifar10": {"full": 0.54, "fixed": 0.47, "strided": 0.38}}
PATTERNS = ("full", "fixed", "strided")


def model_config(shape: dict, pattern: str) -> ModelConfig:
    """The network of one (shape, pattern) cell: merged heads, recomputation on."""
    image = shape["image"]
    return ModelConfig(vocab_size=256, n_ctx=shape["n"], d_model=shape["d"],
                       n_heads=shape["heads"], n_layers=shape["layers"], pattern=pattern,
                       combine="merged", stride=shape["stride"],
                       c=shape["c"] if pattern == "fixed" else None,
                       embedding="image" if image else "text", image_shape=image,
                       recompute=True)


def _count_syncs(step) -> int:
    """Host waits for the GPU inside ``step()`` (``set_sync_debug_mode("warn")``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def time_cell(shape: dict, pattern: str, batch: int, device: torch.device, *, warm: int,
              steps: int, precision: str = "auto") -> dict:
    """Seconds per training iteration of one cell (median of ``steps`` timed steps)."""
    torch.manual_seed(0)
    cfg = model_config(shape, pattern)
    tcfg = TrainConfig(batch_size=batch, max_iters=warm + steps + 1, warmup_iters=1,
                       precision=precision, device=str(device))
    precision = resolve_precision(precision, device)
    model = SparseTransformer(cfg).to(device).train()
    optimizer = make_optimizer(model, tcfg)
    scheduler = make_scheduler(optimizer, tcfg)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, shape["n"]), generator=g).to(device)      # (B, n)
    y = torch.randint(0, 256, (batch, shape["n"]), generator=g).to(device)

    def step():
        train_step(model, model, x, y, optimizer, scheduler, scaler, precision, device,
                   tcfg.grad_clip)

    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    for _ in range(warm):
        step()
    synchronize(device)
    warm_s = time.perf_counter() - t0
    times = repeat(step, device, steps, counters=False)["s"]    # one mark pair per step
    syncs = _count_syncs(step) if cuda else None
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return {"pattern": pattern, "batch": batch, **{k: v for k, v in shape.items()},
            "precision": precision, "backend": cfg.attention_backend, "warm_steps": warm,
            "warm_s": warm_s, "s_per_iter": statistics.median(times), "times_s": times,
            "syncs_per_step": syncs, "peak_bytes": peak, "n_params": model.num_params()}


def run(shapes: dict, patterns, batch: int, device: torch.device, *, warm: int, steps: int,
        precision: str = "auto") -> dict:
    rows = []
    for name, shape in shapes.items():
        for pattern in patterns:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            row = {"shape": name, **time_cell(shape, pattern, batch, device, warm=warm,
                                              steps=steps, precision=precision)}
            dense = next((r for r in rows if r["shape"] == name and r["pattern"] == "full"),
                         None)
            row["speedup_vs_dense"] = dense["s_per_iter"] / row["s_per_iter"] if dense else None
            row["paper_s_per_iter"] = PAPER_S.get(name, {}).get(pattern)
            rows.append(row)
            sp = f", {row['speedup_vs_dense']:.2f}x dense" if row["speedup_vs_dense"] else ""
            print(f"{name:8} {pattern:8} {row['s_per_iter'] * 1e3:9.1f} ms/iter{sp}; "
                  f"syncs per step {row['syncs_per_step']}; paper "
                  f"{row['paper_s_per_iter']} s/iter", flush=True)
    info = machine_info(device.type)
    return {"machine": info, "config": {"batch": batch, "warm": warm, "steps": steps,
                                        "device": str(device), "combine": "merged",
                                        "recompute": True, "data": "random bytes"},
            "rows": rows}
