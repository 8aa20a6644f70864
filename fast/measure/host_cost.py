"""What one attention call costs the host: microseconds, kernel launches and every other op.

Child et al., 2019, section 5.5 (block-sparse kernels): a sparse pattern pays only for
what it computes -- on the GPU. Around the kernels, every call also spends host time
(checks, the backend choice, the layout look-up, allocations, launches), and every
PyTorch op it dispatches besides the kernels is more host time and, on a GPU, a
kernel of its own (a zero-fill, a cast, a reduction) or a wait (a value read back on
the host). At small and medium shapes that fixed cost, paid by every layer of every
step, is larger than the kernels' work, so it is measured here, where the kernels do
not matter: on the CPU, under Triton's interpreter, with every kernel launch recorded
but not run (``stubbed_launches``), at a size whose tensor work is negligible.

Per case and per call, forward alone and forward+backward:

* ``wall_us`` and ``cpu_us``: the host time, the median over many single calls of the
  wall clock and of this thread's CPU time (on a shared machine the CPU time does not
  count the time other processes held the core), the calls of every case taken in turns
  (``timed``), so that the load weighs on each alike;
* ``vs_dense``: ``cpu_us`` over dense SDPA's in the same run (``PEER``), the figure to
  compare across runs: on a shared machine the same call's microseconds can move by a
  factor of two from one minute to the next, every case's alike, so the ratio holds;
* ``launches``: Triton kernel launches, by kernel;
* ``ops``: every other PyTorch op dispatched (``OpCounter``, a ``TorchDispatchMode``),
  by name and in kinds: allocations, fills, casts and copies, reductions, host reads
  (``_local_scalar_dense``: a value brought to the host, a wait on a GPU), views (no
  kernel, a dispatch all the same), others.
  The operators of this project (``sparse_transformer::*``) are counted with what
  runs inside them. The counter is a dispatch mode, which sees an operator only if the
  call takes it, so under the counter every call does (``fast.core.autograd.operator_call``);
  the timed calls, which nothing watches, run the operators' kernels directly: their ops
  are the ones counted less one per operator.

The cases: ``fast.sparse_attention(..., backend="triton")`` with the fused and the
baseline kernel variant, the structured CPU path in float32, dense causal SDPA
(``torch.nn.functional.scaled_dot_product_attention``) on the same tensors, and the
"full" pattern through ``fast.sparse_attention``; and the model's attention layer
(``fast.transformer.network.model.Attention``: projections, attention, output
projection) with the Triton backend and with the "full" pattern (SDPA). The Triton,
"full" and layer cases run with ``check_finite``'s default as on a GPU
(``gpu_defaults``: nothing looks at the values), the structured case with the CPU's.
Beside them, "operator": one empty operator bound three ways (``operator_calls``), the
cost of the binding alone. ``measure`` runs them in this process, which must have set
TRITON_INTERPRET=1 before Triton was imported (``fast.experiments.bench.measure_host_cost``
starts such a process).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections import Counter

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from fast.attention import sparse_attention
from fast.transformer.config import ModelConfig
from fast.transformer.network.model import Attention

# (B, H, n, d) of the calls: the tensor work of a call is a few microseconds
SHAPE = (1, 2, 64, 16)
PEER = "dense"        # the case every other is divided by (``vs_dense``): SDPA's own call
STRIDE = 8
NAMESPACE = "sparse_transformer"       # this project's operators: counted with their insides

ALLOCATIONS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
FILLS = ("zeros", "zeros_like", "new_zeros", "full", "full_like", "new_full", "fill_", "zero_",
         "ones", "ones_like", "masked_fill", "masked_fill_")
CASTS = ("_to_copy", "copy_", "clone", "contiguous", "to")
REDUCTIONS = ("sum", "amax", "amin", "aminmax", "max", "min", "all", "any", "norm",
              "linalg_vector_norm", "mean", "cummax")
HOST_READS = ("_local_scalar_dense", "item", "is_nonzero")
VIEWS = ("view", "_unsafe_view", "reshape", "transpose", "t", "permute", "expand", "slice",
         "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "unflatten",
         "flatten", "narrow", "split", "chunk", "unbind")


def kind(op: str) -> str:
    """The kind of an op named as ``OpCounter`` names it ("aten.empty.memory_format")."""
    namespace, name = op.split(".")[:2]
    if namespace == NAMESPACE:
        return "operator"
    for label, names in (("allocation", ALLOCATIONS), ("fill", FILLS), ("cast", CASTS),
                         ("reduction", REDUCTIONS), ("host read", HOST_READS),
                         ("view", VIEWS)):
        if name in names:
            return label
    return "other"


class OpCounter(TorchDispatchMode):
    """Every op dispatched while it is on, by name ("aten.empty.memory_format"), and the
    host reads by what they read (``reads``: the tensor's device type, dtype and size). An
    operator of this project is counted and its implementation run with the counter on,
    so what it dispatches inside is counted too (the dispatcher would otherwise run it
    with the mode off)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.reads: Counter = Counter()   # host reads: (device type, dtype, elements) read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops[str(func)] += 1
        if kind(str(func)) == "host read" and args and isinstance(args[0], torch.Tensor):
            self.reads[(args[0].device.type, args[0].dtype, args[0].numel())] += 1
        if func.namespace == NAMESPACE:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
            key = torch._C.DispatchKey.CUDA if device is not None and device.type == "cuda" \
                else torch._C.DispatchKey.CPU
            with self:                           # below the mode: the backend's kernel
                return func.redispatch(torch._C.DispatchKeySet(key), *args, **kwargs)
        return func(*args, **kwargs)


class LaunchCounter:
    """Triton kernel launches recorded, by kernel, and not run: while on, ``kernel[grid]``
    of every kernel of ``fast.kernels.triton_kernels`` returns a function that counts the
    launch and returns (the outputs keep whatever their buffers held)."""

    def __init__(self):
        self.launches: Counter = Counter()

    @contextlib.contextmanager
    def stubbed(self):
        from fast.kernels import triton_kernels  # only when measuring the kernels
        kernel_type = type(triton_kernels._fwd_kernel)
        original = kernel_type.__getitem__
        counts = self.launches

        def launch(kernel, grid):
            name = getattr(getattr(kernel, "fn", kernel), "__name__", "kernel")

            def record(*args, **kwargs):
                counts[name] += 1
            return record

        kernel_type.__getitem__ = launch
        try:
            yield self
        finally:
            kernel_type.__getitem__ = original


def _per_call(counter: Counter, calls: int) -> dict:
    out = {}
    for name, count in sorted(counter.items()):
        if count % calls:
            raise AssertionError(f"{name}: {count} in {calls} calls is not the same per call")
        out[name] = count // calls
    return out


def _kinds(ops: dict) -> dict:
    kinds: Counter = Counter()
    for name, count in ops.items():
        kinds[kind(name)] += count
    return dict(sorted(kinds.items()))


def _times(call, calls: int) -> tuple[list, list]:
    """(wall, CPU) microseconds of ``calls`` single calls of ``call``."""
    wall, cpu = [], []
    for _ in range(calls):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        call()
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        wall.append((w1 - w0) / 1e3)
        cpu.append((c1 - c0) / 1e3)
    return wall, cpu


def counts(call, *, warmup: int = 20, counted: int = 10) -> dict:
    """Launches and ops of ``call()`` (a forward, or a forward and backward) in the steady
    state: after ``warmup`` calls (the first builds what a signature needs once), per call
    of ``counted`` calls."""
    launches = LaunchCounter()
    with launches.stubbed():
        for _ in range(warmup):
            call()
        launches.launches.clear()
        counter = OpCounter()
        with counter:
            for _ in range(counted):
                call()
    by_kernel = _per_call(launches.launches, counted)
    ops = _per_call(counter.ops, counted)
    return {"launches": sum(by_kernel.values()), "launches_by_kernel": by_kernel,
            "ops": sum(ops.values()), "ops_by_kind": _kinds(ops), "ops_by_name": ops}


def timed(runs: dict, calls: int, rounds: int = 10) -> dict:
    """{name: {part: {"wall_us", "cpu_us"}}} of ``runs`` = {name: (context, {part: call})}:
    medians over ``calls`` single calls each, taken in ``rounds`` turns through every
    name and part (a shared machine's load then weighs on each alike), each turn after 5
    untimed calls (a context may have made its call plans anew). Launches stubbed."""
    times: dict = {name: {part: ([], []) for part in parts} for name, (_, parts) in
                   runs.items()}
    with LaunchCounter().stubbed():
        for _ in range(rounds):
            for name, (context, parts) in runs.items():
                with context():
                    for part, call in parts.items():
                        for _ in range(5):
                            call()
                        wall, cpu = _times(call, max(1, calls // rounds))
                        times[name][part][0].extend(wall)
                        times[name][part][1].extend(cpu)
    return {name: {part: {"wall_us": round(statistics.median(wall), 1),
                          "cpu_us": round(statistics.median(cpu), 1)}
                   for part, (wall, cpu) in parts.items()} for name, parts in times.items()}


def _tensors(requires_grad: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(*SHAPE, generator=g) for _ in range(4))  # (B, H, n, d)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)], go


def _function_calls(fn) -> dict:
    """{"fwd": a forward call, "fwd_bwd": a forward and backward call} of fn(q, k, v)."""
    (q, k, v), _ = _tensors(False)
    (qg, kg, vg), go = _tensors(True)

    def forward():
        fn(q, k, v)

    def forward_backward():
        for t in (qg, kg, vg):
            t.grad = None
        fn(qg, kg, vg).backward(go)
    return {"fwd": forward, "fwd_bwd": forward_backward}


def _layer_calls(pattern: str, backend: str) -> dict:
    """The model's attention layer (projections, attention, output projection) on
    x (B, n, H d): forward (no grad) and forward+backward."""
    B, H, n, d = SHAPE
    torch.manual_seed(0)
    layer = Attention(ModelConfig(n_ctx=n, d_model=H * d, n_heads=H, pattern=pattern,
                                  stride=STRIDE, attention_backend=backend), layer=0)
    x = torch.randn(B, n, H * d)
    xg = x.clone().requires_grad_(True)
    go = torch.randn(B, n, H * d)

    def forward():
        with torch.no_grad():
            layer(x)

    def forward_backward():
        xg.grad = None
        layer.zero_grad(set_to_none=True)
        layer(xg).backward(go)
    return {"fwd": forward, "fwd_bwd": forward_backward}


@contextlib.contextmanager
def gpu_defaults():
    """``check_finite``'s default as on a GPU (nothing looks at the values) for the calls
    made inside: the CPU's default reads q, k, v for NaN (the model's layer names no
    ``check_finite``). Call plans made before and inside are forgotten on the way in and
    out."""
    from fast.attention import plan
    before = plan.finite_default
    plan.clear_call_plans()
    plan.finite_default = lambda device: None
    try:
        yield
    finally:
        plan.finite_default = before
        plan.clear_call_plans()


@contextlib.contextmanager
def default_variant(name: str):
    """The Triton kernels' default variant set to ``name`` (the model's layer takes the
    default: it names none)."""
    from fast.kernels import variants
    before = variants.DEFAULT
    variants.DEFAULT = name
    try:
        yield
    finally:
        variants.DEFAULT = before


def cases() -> dict:
    """{name: (description, {"fwd": call, "fwd_bwd": call}, context)} of every case."""
    from fast.kernels.variants import VARIANTS
    out = {}
    for name in VARIANTS:
        if name not in ("fused", "baseline"):
            continue
        out[f"triton/{name}"] = (
            f"fast.sparse_attention(backend='triton', variant={name!r}, check_finite=False)",
            _function_calls(lambda q, k, v, name=name: sparse_attention(
                q, k, v, "strided", stride=STRIDE, backend="triton", variant=name,
                check_finite=False)), contextlib.nullcontext)
    out["structured"] = (
        "fast.sparse_attention(backend='structured'), float32 on the CPU (its kernels run: "
        "a few microseconds at this size), the finite check on (the CPU default)",
        _function_calls(lambda q, k, v: sparse_attention(q, k, v, "strided", stride=STRIDE,
                                                         backend="structured")),
        contextlib.nullcontext)
    out["dense"] = (
        "torch.nn.functional.scaled_dot_product_attention(is_causal=True) (its CPU kernel "
        "runs: a few microseconds at this size)",
        _function_calls(lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                       is_causal=True)),
        contextlib.nullcontext)
    out["full"] = (
        "fast.sparse_attention(pattern 'full'), check_finite's default as on a GPU (no look "
        "at the values): causal SDPA", _function_calls(lambda q, k, v: sparse_attention(
            q, k, v, "full")), gpu_defaults)
    for name in ("fused", "baseline"):
        out[f"layer/triton/{name}"] = (
            f"the model's attention layer, pattern 'strided', backend 'triton' (default "
            f"variant set to {name!r}), check_finite's default as on a GPU",
            _layer_calls("strided", "triton"), lambda name=name: _both(name))
    out["layer/dense"] = (
        "the model's attention layer, pattern 'full' (backend 'auto': causal SDPA), "
        "check_finite's default as on a GPU", _layer_calls("full", "auto"), gpu_defaults)
    return out


@contextlib.contextmanager
def _both(variant: str):
    with default_variant(variant), gpu_defaults():
        yield


@functools.cache
def operator_calls() -> dict:
    """{way: {"fwd": call, "fwd_bwd": call}}: one operator whose forward allocates its
    output and whose backward returns the incoming gradient, bound three ways --
    "custom_op": ``torch.library.custom_op`` with ``register_autograd``, called directly;
    "library+Function": a ``torch.library.Library`` operator called by a
    ``torch.autograd.Function`` (``setup_context`` apart); "library+ours": the same
    operator the way this project binds its operators, a ``fast.core.autograd.Function``
    whose forward is ``operator_call`` (the kernel run directly when nothing watches).
    Registered under the namespace "host_cost", once per process (the library is kept
    with the calls: the operator lives as long as it)."""
    from fast.core.autograd import Function, operator_call

    def body(q, name: str, scale: float):
        return torch.empty_like(q), q.new_empty(q.shape[:-1])

    @torch.library.custom_op("host_cost::custom", mutates_args=())
    def custom(q: torch.Tensor, name: str, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        return body(q, name, scale)

    custom.register_fake(body)
    custom.register_autograd(lambda ctx, g, _: (g, None, None),
                             setup_context=lambda ctx, inputs, output: None)
    lib = torch.library.Library("host_cost", "FRAGMENT")
    lib.define("library(Tensor q, str name, float scale) -> (Tensor, Tensor)")
    lib.impl("library", body, "CompositeExplicitAutograd")
    op = torch.ops.host_cost.library.default

    def forward(q, name, scale):
        return op(q, name, scale)

    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)

    def backward(ctx, g, _):
        return g, None, None

    methods = dict(forward=staticmethod(forward), setup_context=staticmethod(setup_context),
                   backward=staticmethod(backward))
    torch_function = type("TorchApply", (torch.autograd.Function,), methods)
    ours = type("OurApply", (Function,),
                {**methods, "forward": staticmethod(operator_call(op, body))})
    ways = {"custom_op": custom, "library+Function": torch_function.apply,
            "library+ours": ours.apply}
    calls = {way: _function_calls(lambda q, k, v, f=fn: f(q, "x", 0.5)[0])
             for way, fn in ways.items()}
    calls["library+Function"]["library"] = lib          # kept alive with the calls
    return calls


def measure(spec: dict | None = None) -> dict:
    """Every case of ``cases``, forward and forward+backward: {"config": ..., "results":
    {case: {"what": ..., "fwd": {times and counts}, "fwd_bwd": {...}}}, "operator": {way:
    {...}}} (``counts``; ``timed``: every case and way in turns). spec: {"calls": timed
    calls per measurement (default 2000)}. One intra-op thread (what a call costs one
    core). Needs TRITON_INTERPRET=1 set before Triton was imported."""
    from fast.kernels.launch import interpreted
    if not interpreted():
        raise RuntimeError("the host-cost benchmark runs the Triton path under the "
                           "interpreter: set TRITON_INTERPRET=1 before importing triton")
    calls = int((spec or {}).get("calls", 2000))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        table = cases()
        results = {}
        for name, (what, runs, context) in table.items():
            with context():
                results[name] = {"what": what, **{part: counts(call)
                                                  for part, call in runs.items()}}
        ways = operator_calls()
        operator = {way: {part: counts(runs[part]) for part in ("fwd", "fwd_bwd")}
                    for way, runs in ways.items()}
        times = timed({**{name: (context, runs) for name, (_, runs, context) in table.items()},
                       **{("operator", way): (contextlib.nullcontext,
                                              {part: runs[part] for part in ("fwd", "fwd_bwd")})
                          for way, runs in ways.items()}}, calls)
    finally:
        torch.set_num_threads(threads)
    for name, parts in times.items():
        into = operator[name[1]] if isinstance(name, tuple) else results[name]
        for part, t in parts.items():
            into[part] = {**t, **into[part]}
    peer = results[PEER]
    for entry in (*results.values(), *operator.values()):
        for part in ("fwd", "fwd_bwd"):
            entry[part]["vs_dense"] = round(entry[part]["cpu_us"] / peer[part]["cpu_us"], 2)
    B, H, n, d = SHAPE
    return {"config": {"B": B, "H": H, "n": n, "d": d, "pattern": "strided",
                       "stride": STRIDE, "dtype": "float32", "calls": calls, "threads": 1},
            "results": results, "operator": operator}


def report(data: dict) -> str:
    """One line per case and part: host time, launches and ops by kind."""
    c = data["config"]
    lines = [f"host cost per call (B, H, n, d) = ({c['B']}, {c['H']}, {c['n']}, {c['d']}), "
             f"{c['pattern']} l={c['stride']}, {c['dtype']}, {c['threads']} thread, kernel "
             f"launches stubbed; medians of {c['calls']} calls",
             f"  {'case':22} {'part':8} {'wall us':>8} {'cpu us':>8} {'vs SDPA':>8} "
             f"{'launches':>8} {'ops':>5}  ops by kind"]
    for name, r in data["results"].items():
        for part in ("fwd", "fwd_bwd"):
            p = r[part]
            kinds = ", ".join(f"{k} {v}" for k, v in p["ops_by_kind"].items()) or "none"
            lines.append(f"  {name:22} {part:8} {p['wall_us']:8.1f} {p['cpu_us']:8.1f} "
                         f"{p['vs_dense']:7.2f}x {p['launches']:8d} {p['ops']:5d}  {kinds}")
    if "operator" in data:
        lines.append("  one empty operator, bound three ways (us per call, wall / cpu): "
                     + "; ".join(f"{way} fwd {r['fwd']['wall_us']:.1f} / {r['fwd']['cpu_us']:.1f}"
                                 f", fwd_bwd {r['fwd_bwd']['wall_us']:.1f} / "
                                 f"{r['fwd_bwd']['cpu_us']:.1f}"
                                 for way, r in data["operator"].items()))
    return "\n".join(lines)
