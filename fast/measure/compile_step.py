"""A small GPT's training step, eager against ``torch.compile``, timed in turns on the CPU.

Child et al., 2019, sections 5.2-5.5 and Table 2 (time per training iteration of the
same model on the same hardware, dense against sparse): here the same model and step,
eager against compiled. The attention computes the same either way: traced, the
structured path is one custom operator (``fast.backends.structured``, docs/design.md
"torch.compile"), eager it runs the same functions without the dispatcher; "full"
and short sequences under "auto" are SDPA (``fast.backends.auto``). What compiling can win
is the rest of the step -- the projections' reshapes, the norms, the GeLU, the residual
sums and the loss fused by inductor into fewer passes -- and what it must not do is
lose time around the attention (graph breaks, recompiles, copies).

``step_times`` builds one ``fast.transformer.network.model.SparseTransformer`` per
(pattern, n), an eager copy and a ``torch.compile(fullgraph=True)`` copy with the same
weights, warms both up (the first compiled call compiles: its time is recorded as
``compile_s``), then times one training step of each -- forward, cross-entropy,
backward, an AdamW step, the gradients set to None -- in turns (``fast.measure.in_turns``:
A, B, A, B, the fastest round of each, the load average and CPU seconds beside them).
The ratio compiled / eager below 1 is the compiled step's gain. The thread count is set
before compiling: dynamo guards on it, and a compiled model whose process changes it
compiles again. ``python -m fast bench --compile`` writes the record to
figures/data/compile_cpu.json.
"""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn.functional as F

from fast.measure.in_turns import in_turns
from fast.transformer.config import ModelConfig
from fast.transformer.network.model import SparseTransformer

PATTERNS = ("full", "strided", "fixed")
MODEL = {"d_model": 128, "n_heads": 4, "n_layers": 4, "vocab_size": 256}  # nanoGPT-small-ish


def _stride(n: int) -> int:
    """l near sqrt(n), a power of two (sec. 4.3: close to sqrt(n))."""
    return 1 << round(math.log2(n) / 2)


def config(pattern: str, n: int, backend: str = "auto", model: dict | None = None
           ) -> ModelConfig:
    """The model timed at (pattern, n): ``model`` (default ``MODEL``), stride near
    sqrt(n), c = l / 4."""
    l = _stride(n)
    return ModelConfig(n_ctx=n, pattern=pattern, stride=l, c=max(1, l // 4) if pattern ==
                       "fixed" else None, attention_backend=backend, **(model or MODEL))


def _step(model, opt, idx):
    """One training step: returns a zero-argument call."""
    def call():
        logits = model(idx[:, :-1])                                      # (B, n, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return call


def step_times(ns=(256, 1024), patterns=PATTERNS, batch: int = 2, backend: str = "auto",
               rounds: int = 5, threads: int | None = None, compiler: str = "inductor",
               model: dict | None = None, log=print) -> dict:
    """Time a training step eager and compiled at every (pattern, n) (module docstring),
    of the model ``model`` (``ModelConfig`` fields; default ``MODEL``), compiled by
    ``compiler``. Returns {"config", "results": [one row per point: eager_s, compiled_s
    (per round), their CPU seconds, compile_s, ratio = min compiled / min eager,
    load_average]}."""
    model = dict(MODEL if model is None else model)
    threads = torch.get_num_threads() if threads is None else threads
    before = torch.get_num_threads()
    torch.set_num_threads(threads)       # before compiling: dynamo guards on the thread count
    try:
        results = _points(ns, patterns, batch, backend, rounds, threads, compiler, model, log)
    finally:
        torch.set_num_threads(before)
    return {"config": {**model, "batch": batch, "backend": backend, "ns": list(ns),
                       "patterns": list(patterns), "rounds": rounds, "threads": threads,
                       "compiler": compiler, "optimizer": "AdamW (eager, not compiled)",
                       "timing": "in turns, one process, fastest round of each; warmed up "
                                 "twice, the first compiled call (compiling) timed apart"},
            "results": results}


def _points(ns, patterns, batch, backend, rounds, threads, compiler, model, log) -> list:
    """The rows of ``step_times``, with ``threads`` already set."""
    results = []
    for n in ns:
        for pattern in patterns:
            torch.manual_seed(0)
            cfg = config(pattern, n, backend, model)
            eager = SparseTransformer(cfg)
            twin = copy.deepcopy(eager)
            torch._dynamo.reset()
            compiled = torch.compile(twin, fullgraph=True, backend=compiler)
            idx = torch.randint(0, cfg.vocab_size, (batch, n + 1),
                                generator=torch.Generator().manual_seed(1))
            calls = {"eager": _step(eager, torch.optim.AdamW(eager.parameters()), idx),
                     "compiled": _step(compiled, torch.optim.AdamW(twin.parameters()), idx)}
            t0 = time.perf_counter()
            calls["compiled"]()                               # compiles: timed apart
            compile_s = time.perf_counter() - t0
            calls["eager"]()
            for call in calls.values():                       # warm-up, not timed
                call()
            timed = in_turns(calls, rounds=rounds, threads=threads)
            row = {"pattern": pattern, "n": n, "stride": cfg.stride, "c": cfg.c,
                   "batch": batch, "backend": backend, "compile_s": compile_s,
                   "eager_s": timed["wall_s"]["eager"], "compiled_s": timed["wall_s"]["compiled"],
                   "eager_cpu_s": timed["cpu_s"]["eager"],
                   "compiled_cpu_s": timed["cpu_s"]["compiled"],
                   "ratio": timed["min_s"]["compiled"] / timed["min_s"]["eager"],
                   "load_average": timed["load_average"]}
            results.append(row)
            fastest = timed["min_s"]
            log(f"{pattern:8} n={n:5d} l={cfg.stride:3d}: eager {fastest['eager'] * 1e3:8.1f} "
                f"ms, compiled {fastest['compiled'] * 1e3:8.1f} ms, compiled / eager "
                f"{row['ratio']:.3f} (compiling took {compile_s:.0f} s)")
    return results
