"""The memory one Sparse Transformer needs for a training step, with or without recomputation.

Child et al., 2019, section 5.4 and Figure 4: with recomputation only each
residual block's input is kept for the backward pass; attention and the
feed-forward layer are recomputed from it. ``measure`` builds the model a spec
describes and returns what its forward pass saved for backward
(``fast.measure.memory.count_saved``, split per block) and, for a whole step, its
peak resident memory (``fast.measure.memory.peak_memory``). ``python -m fast
memory`` (``fast.experiments.memory_report``) runs every spec in a fresh
process (``fast.measure.child``, entry ``measure_all``), so that one run's
freed-but-cached memory never inflates or hides the next one's peak.

A spec: n, layers, d, heads, stride, c, pattern, recompute, impl ("sparse" or
"masked", ``ModelConfig.attention_impl``), batch, and ``what``: "saved" (forward
only: bytes saved for backward) or "step" (forward + backward under the peak;
``optimizer``: add an AdamW step; ``repeats``: time the step that many times in
this process, the peak being the first run's). Batch of random bytes, float32, CPU.

Besides wall-clock seconds (``fast.core.clock``), a step records the process's CPU
seconds (user and system) and its minor page faults over the step
(``fast.measure.timing.cpu_times``). On a machine
shared with other jobs the wall clock of one run says little (a step waits
whenever another job holds a core); CPU seconds count only the work this
process did, so they are what compares a step with and without recomputation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fast.core.clock import Clock
from fast.measure.memory import count_saved, peak_memory, rss_bytes
from fast.measure.timing import cpu_times, since
from fast.transformer.config import ModelConfig
from fast.transformer.network.model import SparseTransformer

# A large allocation straight from mmap, returned to the system when freed, so that the
# resident-memory peak follows the live tensors, not glibc's cache (the child's environment).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

_WARM: set = set()


def model_config(spec: dict) -> ModelConfig:
    """The text model of ``spec`` (merged heads; c only for the fixed pattern). Impl
    "sparse" runs the structured backend by name: what is measured is its O(n sqrt n)
    memory, where "auto" would take the dense masked path below its CPU crossover
    (``fast.backends.auto``)."""
    pattern = spec["pattern"]
    return ModelConfig(
        vocab_size=256, n_ctx=spec["n"], d_model=spec["d"], n_heads=spec["heads"],
        n_layers=spec["layers"], pattern=pattern, combine="merged",
        stride=spec["stride"], c=spec["c"] if pattern == "fixed" else None,
        embedding="text", recompute=spec["recompute"],
        attention_impl=spec.get("impl", "sparse"), attention_backend="structured")


def _warm_up(spec: dict) -> None:
    """A forward and backward of a tiny copy of ``spec``'s model, once per kind,
    so that lazy imports and one-time buffers (checkpoint, attention backends)
    are paid before any measurement starts."""
    key = (spec["pattern"], spec["recompute"], spec.get("impl", "sparse"))
    if key in _WARM:
        return
    tiny = {**spec, "n": min(spec["n"], 2 * spec["stride"]), "layers": 1}
    model = SparseTransformer(model_config(tiny)).train()
    model(torch.randint(0, 256, (1, tiny["n"]))).sum().backward()
    _WARM.add(key)


def measure(spec: dict) -> dict:
    """Build the model of ``spec`` (module docstring) and measure it; a dict of numbers."""
    _warm_up(spec)
    torch.manual_seed(0)
    model = SparseTransformer(model_config(spec)).train()
    n, batch = spec["n"], spec["batch"]
    idx = torch.randint(0, 256, (batch, n))                               # (B, n)
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-4) if spec.get("optimizer") else None
    out = {"param_bytes": param_bytes, "n_params": sum(p.numel() for p in params)}

    def tag_hook(name):
        def hook(_module, _args):
            log.tag = name
        return hook

    def run() -> dict:
        """One forward (and, for a step, backward and optimiser step); its times."""
        nonlocal log, loss
        clock = Clock("cpu")
        cpu0, start = cpu_times(), clock.mark()
        with count_saved(params) as log:
            log.tag = "embed"
            hooks = [b.register_forward_pre_hook(tag_hook(f"block{i}"))
                     for i, b in enumerate(model.blocks)]
            hooks.append(model.ln_f.register_forward_pre_hook(tag_hook("head")))
            logits = model(idx)                                           # (B, n, vocab)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), idx.view(-1))
            for h in hooks:
                h.remove()
        forward = clock.mark()
        if spec["what"] == "step":
            loss.backward()
            if opt is not None:
                opt.step()
            model.zero_grad(set_to_none=True)
        t_forward, t_total = clock.elapsed([(start, forward), (start, clock.mark())])
        return {"forward_s": t_forward, "total_s": t_total, **since(cpu0)}

    log = loss = None
    with peak_memory("cpu") as peak:
        first = run()
    # further timed runs of a step, in the same process (the peak is the first run's)
    runs = [first] + [run() for _ in range(spec.get("repeats", 1) - 1
                                           if spec["what"] == "step" else 0)]
    out.update(first)
    out.update({
        "saved_bytes": log.activation_bytes,
        "saved_param_bytes": log.parameter_bytes,
        "peak_bytes": peak["peak_bytes"] if spec["what"] == "step" else None,
        "rss_after_bytes": rss_bytes(),
        "loss": float(loss.detach()),
        # what one block (the second) keeps: (shape, dtype, bytes) per new storage
        "block_tensors": [list(t[1:]) for t in log.shapes if t[0] == "block1"],
    })
    if len(runs) > 1:
        out["runs"] = runs
    return out


def measure_all(specs: list[dict]) -> list[dict]:
    """``measure`` each spec in turn, in this process: the entry ``fast.measure.child`` runs."""
    return [measure(spec) for spec in specs]


def per_layer(small: dict, large: dict) -> float:
    """Bytes saved per residual block: the difference of two depths (spec + result dicts)."""
    return (large["saved_bytes"] - small["saved_bytes"]) / (large["layers"] - small["layers"])
