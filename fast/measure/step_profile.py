"""Where the time of a CPU training step goes: data, forward, backward, clipping, optimizer,
operators by kind, dispatch, evaluation, and the batch size.

Child et al., 2019, section 6 (the training step: Adam, clipping, the schedule) and Table
2 (time per iteration). A step of a small model can be slow for reasons that have nothing
to do with its arithmetic: per-operator dispatch in Python and ATen, an optimizer that
loops over many small tensors, drawing the batch, evaluations between steps. Before a
faster step is chosen, ``profile_step`` measures each of them on one configuration, in
CPU seconds of this process (what one thread spends, whatever else runs on the machine):

* ``phases``     -- per step (median over ``steps`` steps after ``warmup``): drawing the
  batch ("data"), the forward pass and loss, the backward pass (``zero_grad`` included),
  gradient clipping, and the optimizer step with the schedule;
* ``op_shares``  -- the operators' own time, from ``torch.profiler``, split into attention
  (the fused attention kernels and the pieces of the structured path), matrix products
  (mm, addmm, bmm, baddbmm) and every other operator, as fractions of their sum;
* ``op_calls``   -- ATen operator calls per step, and ``dispatch_s``: that many calls at the
  cost of one call of a one-element ``torch.add`` measured here -- an estimate of the
  per-operator overhead a compiled or fused step could save;
* ``per_token_s`` -- CPU seconds per token of a training step at each batch size of
  ``batches`` (fewer, larger steps pay off only if this falls with the batch);
* ``eval_item_s`` -- CPU seconds of one evaluation item (a window or an image, forward
  only, no gradients), what each held-out evaluation costs per item;
* ``compiled``   -- with ``compiled=True``: the same step with the model compiled whole
  (``torch.compile(fullgraph=True)``, inductor, the optimizer eager), its median CPU
  seconds per step and what compiling cost this process (``compile_s``: the CPU seconds of
  the first two calls, inductor's workers kept in this process so that they count).

The attention's own time is that of the fused ATen kernels and of the project's CPU window
kernel (``fast.backends.cpu_window``, a C library called through ctypes, which the profiler
sees by the names it records: ``cpu_window_*``). ``step_seconds`` times bare steps of one
or more configurations in turns (one step of each, then the next round): how a choice that
changes nothing but the kernels is compared on a shared machine.

The training step measured is ``fast.transformer.training.train.train_step``, the one the
trainer runs.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from fast.data import Dataset
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.model import SparseTransformer
from fast.transformer.training import seed as seeding
from fast.transformer.training.loss import evaluate, loss_fn
from fast.transformer.training.optim import make_optimizer, make_scheduler
from fast.transformer.training.train import train_step

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


WINDOW_KERNEL = "cpu_window"      # the profiler names of the CPU window kernel's calls start so


def op_kind(name: str) -> str:
    """"attention", "matmul" or "other" for an operator's profiler name (ATen's, or the CPU
    window kernel's)."""
    if "attention" in name or "flash" in name or name.startswith(WINDOW_KERNEL):
        return "attention"
    return "matmul" if name in MATMUL else "other"


def _counted(name: str) -> bool:
    """Whether a profiler event is an operator whose own time ``op_shares`` counts: ATen's,
    and the window kernel's (its self time is the C call; the ATen calls inside it, if any,
    are counted as their own)."""
    return name.startswith("aten::") or name.startswith(WINDOW_KERNEL)


def _setup(model_cfg: ModelConfig, train_cfg: TrainConfig):
    seeding.seed_everything(train_cfg.seed)
    model = SparseTransformer(model_cfg).train()
    optimizer = make_optimizer(model, train_cfg)
    return model, optimizer, make_scheduler(optimizer, train_cfg)


def _batch(dataset: Dataset, model_cfg, batch_size: int, step: int):
    return dataset.batch("train", batch_size, model_cfg.n_ctx,
                         seeding.data_generator(0, step, 0))


def dispatch_cost(calls: int = 20000) -> float:
    """CPU seconds of one call of ``torch.add`` on one-element tensors: the per-operator
    overhead of the eager path on this machine."""
    a = torch.ones(1)
    for _ in range(100):
        torch.add(a, a)
    t0 = time.process_time()
    for _ in range(calls):
        torch.add(a, a)
    return (time.process_time() - t0) / calls


def profile_step(model_cfg: ModelConfig, train_cfg: TrainConfig, dataset: Dataset, *,
                 steps: int = 6, warmup: int = 2, batches=(8, 16, 32),
                 compiled: bool = False) -> dict:
    """Measure a training step of ``model_cfg`` under ``train_cfg`` on ``dataset`` (CPU, the
    calling process's threads); see the module docstring for the fields returned
    (``compiled``: also the compiled step)."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps}, {warmup}")
    if train_cfg.precision != "fp32":
        raise ValueError(f"profile_step measures float32 steps (Table 2's), got precision "
                         f"{train_cfg.precision!r}; allowed: 'fp32'")
    device = torch.device("cpu")
    model, optimizer, scheduler = _setup(model_cfg, train_cfg)
    clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
    phases = {k: [] for k in ("data", "forward", "backward", "clip", "optimizer")}
    clock = time.process_time
    for step in range(warmup + steps):
        t0 = clock()
        x, y = _batch(dataset, model_cfg, train_cfg.batch_size, step)
        t1 = clock()
        loss = loss_fn(model(x), y)
        t2 = clock()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t3 = clock()
        clip()
        t4 = clock()
        optimizer.step()
        scheduler.step()
        t5 = clock()
        if step >= warmup:
            for key, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                phases[key].append(seconds)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(steps):
            x, y = _batch(dataset, model_cfg, train_cfg.batch_size, step)
            train_step(model, model, x, y, optimizer, scheduler, None, "fp32", device,
                       train_cfg.grad_clip)
    own = {"attention": 0.0, "matmul": 0.0, "other": 0.0}
    calls = 0
    for event in prof.key_averages():
        if _counted(event.key):
            own[op_kind(event.key)] += event.self_cpu_time_total
            calls += event.count
    total = sum(own.values()) or 1.0

    per_token = []
    for batch in batches:
        model, optimizer, scheduler = _setup(model_cfg, train_cfg)
        times = []
        for step in range(warmup + max(2, steps // 2)):
            x, y = _batch(dataset, model_cfg, batch, step)
            t0 = clock()
            train_step(model, model, x, y, optimizer, scheduler, None, "fp32", device,
                       train_cfg.grad_clip)
            if step >= warmup:
                times.append(clock() - t0)
        per_token.append(statistics.median(times) / (batch * model_cfg.n_ctx))

    items = 2 * 16
    t0 = clock()
    evaluate(model, dataset, "val", batch_size=16, max_batches=2)
    eval_item = (clock() - t0) / items
    out = {"phases": {k: statistics.median(v) for k, v in phases.items()},
           "op_shares": {k: v / total for k, v in own.items()},
           "op_calls": calls / steps, "dispatch_s": calls / steps * dispatch_cost(),
           "batches": list(batches), "per_token_s": per_token, "eval_item_s": eval_item,
           "threads": torch.get_num_threads()}
    if compiled:
        out["compiled"] = compiled_step(model_cfg, train_cfg, dataset, steps=steps)
    return out


def compiled_step(model_cfg: ModelConfig, train_cfg: TrainConfig, dataset: Dataset, *,
                  steps: int = 6, backend: str = "inductor") -> dict:
    """The training step with the model compiled whole by inductor (the optimizer eager, as
    ``train_step`` runs it): {"step_s": median CPU seconds of ``steps`` steps after two,
    "eager_step_s": the eager step's, in turns with it, "compile_s": CPU seconds of the
    first two compiled calls (compiling), "compile_wall_s"}. Inductor compiles in this
    process (``compile_threads`` = 1) so that its CPU seconds are this process's.
    ``backend``: torch.compile's (the tests use "aot_eager", which generates no code)."""
    from torch._inductor import config as inductor_config  # private, torch 2.13.0

    device = torch.device("cpu")
    eager, eager_opt, eager_sched = _setup(model_cfg, train_cfg)
    model, optimizer, scheduler = _setup(model_cfg, train_cfg)
    workers = inductor_config.compile_threads
    inductor_config.compile_threads = 1
    torch._dynamo.reset()
    try:
        net = torch.compile(model, fullgraph=True, backend=backend)
        w0, c0 = time.perf_counter(), time.process_time()
        for step in range(2):
            x, y = _batch(dataset, model_cfg, train_cfg.batch_size, step)
            train_step(net, model, x, y, optimizer, scheduler, None, "fp32", device,
                       train_cfg.grad_clip)
        compile_s, compile_wall = time.process_time() - c0, time.perf_counter() - w0
        for step in range(2):
            x, y = _batch(dataset, model_cfg, train_cfg.batch_size, step)
            train_step(eager, eager, x, y, eager_opt, eager_sched, None, "fp32", device,
                       train_cfg.grad_clip)
        times = {"compiled": [], "eager": []}
        for step in range(2, 2 + steps):
            x, y = _batch(dataset, model_cfg, train_cfg.batch_size, step)
            for name, (n, m, o, s) in (("compiled", (net, model, optimizer, scheduler)),
                                       ("eager", (eager, eager, eager_opt, eager_sched))):
                t0 = time.process_time()
                train_step(n, m, x, y, o, s, None, "fp32", device, train_cfg.grad_clip)
                times[name].append(time.process_time() - t0)
    finally:
        inductor_config.compile_threads = workers
        torch._dynamo.reset()
    return {"step_s": statistics.median(times["compiled"]),
            "eager_step_s": statistics.median(times["eager"]),
            "compile_s": compile_s, "compile_wall_s": compile_wall}


def step_seconds(configs: dict, train_cfg: TrainConfig, dataset: Dataset, *, steps: int = 6,
                 warmup: int = 2) -> dict:
    """{name: median CPU seconds of a training step} for every (name: ``ModelConfig``) of
    ``configs``, each its own model from the same seed, one step of each in turns for
    ``warmup`` + ``steps`` rounds (the first ``warmup`` not counted), on the same batches.
    ``configs`` may also map a name to (ModelConfig, a context manager factory) whose
    context is entered around that configuration's steps (e.g. a kernel choice)."""
    device = torch.device("cpu")
    runs = {}
    for name, cfg in configs.items():
        cfg, context = cfg if isinstance(cfg, tuple) else (cfg, None)
        runs[name] = (cfg, context, *_setup(cfg, train_cfg))
    times = {name: [] for name in runs}
    for step in range(warmup + steps):
        for name, (cfg, context, model, optimizer, scheduler) in runs.items():
            x, y = _batch(dataset, cfg, train_cfg.batch_size, step)
            with context() if context else contextlib.nullcontext():
                t0 = time.process_time()
                train_step(model, model, x, y, optimizer, scheduler, None, "fp32", device,
                           train_cfg.grad_clip)
                seconds = time.process_time() - t0
            if step >= warmup:
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}
