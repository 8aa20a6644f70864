"""Table 2's time column on a GPU: seconds per training iteration, against the step's floor.

Child et al., 2019, Table 2 reports seconds per iteration on their GPUs (dense /
fixed / strided: Enwik8 1.31 / 0.55 / 0.35, CIFAR-10 0.54 / 0.47 / 0.38). This
script times one training iteration of the network of ``fast.transformer`` at the
paper's shapes with fewer layers -- Enwik8: n = 12288, d = 512, 8 heads, 6 layers;
CIFAR-10: n = 3072, d = 256, 2 heads, 16 layers; batch 8; fixed l = 128, c = 32
(l = 96 for the 32 x 32 x 3 images), strided l = 128 (96) -- as the training loop
runs it (``fast.transformer.training.train``'s step: fp16 autocast with dynamic loss
scaling, recomputation of every residual block, gradient clipping, AdamW, the
schedule), on batches of random bytes (a step's time does not depend on the
values).

The rows of a shape: ``none`` first -- the same model with its attention replaced by
``NoAttention``, a stand-in of the same shapes that costs nothing (the output is v,
its gradient goes to v, and q and k get a zero gradient that writes no memory, so
every projection, residual, norm, feed-forward, the loss, the optimizer and the
recomputation run as with attention) -- then dense (``full``), fixed and strided. The
attention-free step is the floor no attention can go below: each row reports its time
above the floor (what its attention costs in a step), and per shape the record says
how much faster than dense a sparse model can be at all now (dense / floor, its
attention at zero cost) against the paper's ratio (``derive``). The paper's dense
attention was not FlashAttention and its step was not this one, so the paper's
speed-up is attainable here only where the floor leaves room for it.

Per row:

* ``warm`` steps (10) first, untimed (compilation, layouts, allocator);
* ``steps`` steps timed one by one on the device's clock (``fast.measure.timing.repeat``:
  CUDA events on a GPU, the wall clock on the CPU); the median is reported, every step
  kept;
* on CUDA one more step with every host wait recorded and named by its stack
  (``fast.measure.host_reads.device_waits``): the loss scaler's check for inf is the
  one a step needs.

``step_reads`` counts the host reads of one step anywhere, the CPU included
(``fast.measure.host_reads.host_reads``): how the waits are found without a GPU.
``run`` calls ``save`` after every row with the record so far (``"complete": false``
until the last row), so an interrupted run keeps what it measured.

    python -m fast train-time [--shapes enwik8 cifar10] [--batch 8] [--out DIR]

Writes figures/data/gpu_iteration_time.json (``--out``: DIR/data/...).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fast.measure.bench import machine_info
from fast.measure.host_reads import Read, device_waits, host_reads, host_state, summary
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
FLOOR = "none"                         # the attention-free row
ROWS = (FLOOR, *PATTERNS)              # what a run measures per shape, in this order


class NoAttention(torch.autograd.Function):
    """Attention that costs nothing, with attention's shapes: q, k (B, H, n, dqk) and v
    (B, H, n, dh) -> v (a view, no copy). The output's gradient is v's; q and k get a
    zero gradient of their shape and dtype as a stride-0 view (no memory written), so
    their projections' backward runs as it does after real attention."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.meta = (q.shape, q.dtype, k.shape, k.dtype)
        return v.view_as(v)                                             # (B, H, n, dh)

    @staticmethod
    def backward(ctx, grad):
        q_shape, q_dtype, k_shape, k_dtype = ctx.meta
        zero = grad.new_zeros(())
        return zero.to(q_dtype).expand(q_shape), zero.to(k_dtype).expand(k_shape), grad


def _attend_nothing(q, k, v, dtype, return_attention=False):
    """``Attention.attend``'s signature, with ``NoAttention`` inside."""
    if return_attention:
        raise ValueError("the attention-free stand-in has no attention weights to return")
    return NoAttention.apply(q, k, v), None


def attention_free(model: SparseTransformer) -> SparseTransformer:
    """``model`` with every layer's attention replaced by ``NoAttention`` (in place): the
    projections, the output projection and everything around them stay."""
    for block in model.blocks:
        block.attn.attend = _attend_nothing
    return model


def model_config(shape: dict, pattern: str) -> ModelConfig:
    """The network of one (shape, pattern) cell: merged heads, recomputation on. The
    attention-free row (``FLOOR``) is dense's network, its attention replaced."""
    image = shape["image"]
    pattern = "full" if pattern == FLOOR else pattern
    return ModelConfig(vocab_size=256, n_ctx=shape["n"], d_model=shape["d"],
                       n_heads=shape["heads"], n_layers=shape["layers"], pattern=pattern,
                       combine="merged", stride=shape["stride"],
                       c=shape["c"] if pattern == "fixed" else None,
                       embedding="image" if image else "text", image_shape=image,
                       recompute=True)


@dataclass
class Cell:
    """One (shape, pattern) training step, ready to run: ``step()`` takes it."""
    step: Callable[[], torch.Tensor]
    model: SparseTransformer
    optimizer: torch.optim.Optimizer
    config: ModelConfig
    precision: str


def build_cell(shape: dict, pattern: str, batch: int, device: torch.device, *,
               precision: str = "auto", loss_scaling: bool | None = None,
               backend: str | None = None) -> Cell:
    """The model, optimizer, schedule, loss scaler and batch of one cell, seeded.
    ``loss_scaling``: a ``GradScaler`` (None: with fp16, as the training loop does);
    ``backend``: the attention backend (None: the model's default, "auto")."""
    torch.manual_seed(0)
    cfg = model_config(shape, pattern)
    if backend is not None:
        cfg = dataclasses.replace(cfg, attention_backend=backend)
    precision = resolve_precision(precision, device)
    tcfg = TrainConfig(batch_size=batch, max_iters=10**6, warmup_iters=1, precision=precision,
                       device=str(device))
    model = SparseTransformer(cfg).to(device).train()
    if pattern == FLOOR:
        attention_free(model)
    optimizer = make_optimizer(model, tcfg)
    scheduler = make_scheduler(optimizer, tcfg)
    scaling = precision == "fp16" if loss_scaling is None else loss_scaling
    scaler = torch.amp.GradScaler(device.type) if scaling else None
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, shape["n"]), generator=g).to(device)      # (B, n)
    y = torch.randint(0, 256, (batch, shape["n"]), generator=g).to(device)

    def step():
        return train_step(model, model, x, y, optimizer, scheduler, scaler, precision, device,
                          tcfg.grad_clip)

    return Cell(step, model, optimizer, cfg, precision)


def step_reads(shape: dict, pattern: str, batch: int, device: torch.device, *,
               precision: str = "auto", loss_scaling: bool | None = None,
               backend: str | None = None, warm: int = 1) -> list[Read]:
    """The host reads of one training step of a cell after ``warm`` steps, on any device
    (``fast.measure.host_reads.host_reads``; the optimizer's host-side step counters
    left out)."""
    cell = build_cell(shape, pattern, batch, device, precision=precision,
                      loss_scaling=loss_scaling, backend=backend)
    for _ in range(warm):
        cell.step()
    return host_reads(cell.step, host_state(cell.optimizer))


def time_cell(shape: dict, pattern: str, batch: int, device: torch.device, *, warm: int,
              steps: int, precision: str = "auto") -> dict:
    """Seconds per training iteration of one cell (median of ``steps`` timed steps), and
    on CUDA the waits of one more step, each named by its stack."""
    cell = build_cell(shape, pattern, batch, device, precision=precision)
    t0 = time.perf_counter()
    for _ in range(warm):
        cell.step()
    synchronize(device)
    warm_s = time.perf_counter() - t0
    times = repeat(cell.step, device, steps, counters=False)["s"]    # one mark pair per step
    waits = device_waits(cell.step) if device.type == "cuda" else None
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return {"pattern": pattern, "batch": batch, **{k: v for k, v in shape.items()},
            "precision": cell.precision,
            "backend": None if pattern == FLOOR else cell.config.attention_backend,
            "warm_steps": warm, "warm_s": warm_s, "s_per_iter": statistics.median(times),
            "times_s": times, "syncs_per_step": None if waits is None else len(waits),
            "waits": None if waits is None else summary(waits), "peak_bytes": peak,
            "n_params": cell.model.num_params()}


def derive(rows: list[dict]) -> dict:
    """Each row's time against dense and against the floor, in place; returns the shape's
    summary (Nones where a row it needs is not measured):

      speedup_vs_dense            dense / row
      above_floor_s               row - floor: the row's attention in a step
      attention_speedup_vs_dense  (dense - floor) / (row - floor): attention alone
      max_speedup_vs_dense        dense / floor: the most any attention could gain now
      paper_speedup_vs_dense      the paper's dense / pattern, per pattern
    """
    by = {r["pattern"]: r for r in rows}
    dense, floor = by.get("full"), by.get(FLOOR)
    d_s = dense["s_per_iter"] if dense else None
    f_s = floor["s_per_iter"] if floor else None
    for r in rows:
        s = r["s_per_iter"]
        r["speedup_vs_dense"] = d_s / s if d_s and r["pattern"] not in ("full", FLOOR) else None
        r["above_floor_s"] = s - f_s if f_s is not None and r["pattern"] != FLOOR else None
        above = r["above_floor_s"]
        r["attention_speedup_vs_dense"] = (
            (d_s - f_s) / above if d_s and f_s is not None and above and above > 0
            and r["pattern"] not in ("full", FLOOR) else None)
    paper = PAPER_S.get(rows[0]["shape"], {}) if rows else {}
    return {"dense_s": d_s, "floor_s": f_s,
            "floor_share_of_dense": f_s / d_s if d_s and f_s is not None else None,
            "max_speedup_vs_dense": d_s / f_s if d_s and f_s else None,
            "paper_speedup_vs_dense": {p: paper["full"] / paper[p] for p in PATTERNS
                                       if p != "full" and p in paper}}


def _say(row: dict) -> str:
    more = []
    if row.get("speedup_vs_dense"):
        more.append(f"{row['speedup_vs_dense']:.2f}x dense")
    if row.get("above_floor_s") is not None:
        more.append(f"{row['above_floor_s'] * 1e3:.1f} ms above the attention-free floor")
    if row.get("attention_speedup_vs_dense"):
        more.append(f"its attention {row['attention_speedup_vs_dense']:.2f}x dense's")
    label = "attention-free" if row["pattern"] == FLOOR else row["pattern"]
    waits = "" if row["syncs_per_step"] is None else (
        f"; waits per step {row['syncs_per_step']}"
        + (f" ({', '.join(w['where'] for w in row['waits'])})" if row["waits"] else ""))
    paper = row.get("paper_s_per_iter")
    return (f"{row['shape']:8} {label:14} {row['s_per_iter'] * 1e3:9.1f} ms/iter"
            + "".join(f", {m}" for m in more) + waits
            + (f"; paper {paper} s/iter" if paper is not None else ""))


def run(shapes: dict, patterns, batch: int, device: torch.device, *, warm: int, steps: int,
        precision: str = "auto", save: Callable[[dict], None] | None = None,
        log: Callable[[str], None] = print) -> dict:
    """Every shape x row of ``patterns`` (in the order of ``ROWS``); the record, also
    given to ``save`` after every row (``"complete": false`` until the end)."""
    chosen = [p for p in ROWS if p in patterns]
    data = {"machine": machine_info(device.type),
            "config": {"batch": batch, "warm": warm, "steps": steps, "device": str(device),
                       "combine": "merged", "recompute": True, "data": "random bytes",
                       "rows": chosen, "floor": "the same model, its attention replaced by "
                       "NoAttention (output v, no attention work)"},
            "complete": False, "rows": [], "summary": {}}
    try:
        import triton  # optional dependency
        data["machine"]["triton"] = triton.__version__
    except ImportError:
        data["machine"]["triton"] = None
    for name, shape in shapes.items():
        for pattern in chosen:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            row = {"shape": name, **time_cell(shape, pattern, batch, device, warm=warm,
                                              steps=steps, precision=precision)}
            row["paper_s_per_iter"] = PAPER_S.get(name, {}).get(pattern)
            data["rows"].append(row)
            data["summary"][name] = derive([r for r in data["rows"] if r["shape"] == name])
            log(_say(row))
            if save is not None:
                save(data)
    for name, s in data["summary"].items():
        if s["max_speedup_vs_dense"]:
            paper = ", ".join(f"{p} {x:.2f}x" for p, x in s["paper_speedup_vs_dense"].items())
            log(f"{name}: the attention-free step is {s['floor_share_of_dense']:.0%} of dense's;"
                f" no attention can make a step more than {s['max_speedup_vs_dense']:.2f}x "
                f"faster than dense now (the paper's speed-ups: {paper or '-'})")
    data["complete"] = True
    if save is not None:
        save(data)
    return data
