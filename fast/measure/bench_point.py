"""One point of the attention benchmark: a contender at one shape, timed by a method.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute). A point is a contender (``fast.measure.contenders``) on seeded
q, k, v (B, H, n, d) and an output gradient; ``measure`` times it:

1. a contender that compiles is called once first (``compile_s``: compilation,
   and FlexAttention's block mask), so that the compiler's own memory is not
   counted as the attention's;
2. the first forward (``first_fwd_s``, ``peak_fwd_bytes``: peak memory above the
   level with the inputs allocated, ``fast.measure.memory.peak_memory``), then the
   steady forward by the method (``fwd_s``, every repetition in ``fwd_s_all``);
3. the same for forward + backward (``first_fb_s``, ``peak_fb_bytes``, ``fb_s``),
   where the contender has a backward; ``bwd_over_fwd`` = (fb_s - fwd_s) / fwd_s,
   the backward's time against the forward's (a flash-style backward recomputes
   the probabilities once and does about 2.5x the forward's work).

The naive contender builds its mask inside its first call (so the mask counts in
that call's peak memory) and again inside the first forward + backward, and its
steady state starts after it. On the CPU every repetition's process CPU seconds
and minor page faults are kept beside its time (``fwd_cpu_s_all``,
``fwd_faults_all``, ...; ``fast.measure.timing``).

With a time cap (``Method.cap_s``, the GPU sweeps' way to keep one slow contender from
spending the session) no phase starts once the contender's seconds at the point, its
compilation included, have passed the cap: a forward that passed it leaves the forward
+ backward unmeasured (``capped`` says so), a compilation that passed it leaves the point
skipped.

``run(spec, method)`` measures a point described by a JSON-able spec in this
process or, for the ``FRESH`` method, in a fresh one (``fast.measure.child``, so
that its peak memory is its own); a point that fails, runs out of time or out of
GPU memory is recorded as {"skipped": why}, not raised. ``outputs`` and
``max_rel_diff`` compare two contenders' results on the same inputs (the variant
sweep checks each kernel variant against the first one that way).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from fast.measure import contenders
from fast.measure.child import run_child
from fast.measure.timing import Method, first_call, steady, synchronize


def inputs(B: int, H: int, n: int, d: int, device, dtype, seed: int = 0) -> list:
    """Seeded q, k, v and an output gradient, (B, H, n, d) each."""
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(B, H, n, d, device=device, dtype=dtype, generator=g) for _ in range(4)]


def measure(fn, q, k, v, grad, method: Method, *, backward: bool = True) -> dict:
    """First calls apart, then the steady state by ``method``, forward and (if
    ``backward``) forward + backward (module docstring). Running out of GPU memory is
    recorded (``skipped``), not raised."""
    device = q.device
    builds_mask = getattr(fn, "builds_mask", False)
    res: dict = {}
    start = time.perf_counter()

    def over(what: str) -> str | None:
        spent = time.perf_counter() - start
        if method.cap_s is None or spent <= method.cap_s:
            return None
        return f"{what} not measured: {spent:.0f} s spent, past the cap of {method.cap_s:g} s"

    try:
        def fwd():
            with torch.no_grad():
                fn(q, k, v)

        if getattr(fn, "compiles", False):
            t = time.perf_counter()
            fwd()
            synchronize(device)
            res["compile_s"] = time.perf_counter() - t
            why = over("the point")
            if why is not None:
                return {**res, "skipped": "capped: " + why}
        res.update(_timed("fwd", fwd, device, method, builds_mask))
        why = over("the forward+backward") if backward else None
        if why is not None:
            res["capped"] = why
        elif backward:
            qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

            def fb():
                for x in (qg, kg, vg):
                    x.grad = None
                fn(qg, kg, vg).backward(grad)

            if builds_mask:
                fn.reset()                # rebuilt inside the window: the mask counts here too
            res.update(_timed("fb", fb, device, method, builds_mask))
            res["bwd_over_fwd"] = (res["fb_s"] - res["fwd_s"]) / res["fwd_s"]
            del qg, kg, vg
    except torch.cuda.OutOfMemoryError as err:
        res = {"skipped": f"out of memory: {str(err).splitlines()[0][:160]}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


def _timed(what: str, call, device, method: Method, builds_mask: bool) -> dict:
    """{first_<what>_s, peak_<what>_bytes, <what>_s, <what>_s_all, ...} of one call."""
    first = first_call(call, device)
    t = steady(call, device, method, None if builds_mask else first)
    out = {f"first_{what}_s": first["s"], f"peak_{what}_bytes": first["peak_bytes"],
           f"{what}_s": t["s"], f"{what}_s_all": t["times_s"]}
    if "faults" in first:
        out[f"first_{what}_faults"] = first["faults"]
    if "cpu_s_all" in t:
        out[f"{what}_cpu_s_all"], out[f"{what}_faults_all"] = t["cpu_s_all"], t["faults_all"]
    return out


def spec(name: str, pattern: str | None, params: dict, B: int, H: int, n: int, device: str,
         dtype: str, method: Method, variant: str | None = None) -> dict:
    """A point as plain data (what ``run`` and a fresh process take); dense, which has no
    pattern, is built with the first pattern's parameters (it reads none of them).
    ``variant``: a Triton contender's kernel variant (None: the default)."""
    if pattern is None:
        pattern, params = next(iter(contenders.PATTERN_PARAMS.items()))
    return {"name": name, "pattern": pattern, "params": dict(params), "B": B, "H": H, "n": n,
            "device": str(device), "dtype": dtype, "method": dataclasses.asdict(method),
            "variant": variant}


def measure_spec(spec: dict) -> dict:
    """``measure`` of the point ``spec`` describes, in this process (the function a fresh
    process runs): its contender, its inputs, the method."""
    dtype = contenders.DTYPES[spec["dtype"]]
    device = torch.device(spec["device"])
    fns = contenders.build(spec["pattern"], spec["params"], spec["H"], device, dtype,
                           names=[spec["name"]], variant=spec.get("variant"))
    if spec["name"] not in fns:
        return {"skipped": contenders.why_not(spec["name"], device, dtype)}
    q, k, v, grad = inputs(spec["B"], spec["H"], spec["n"], contenders.D, device, dtype)
    fn = fns[spec["name"]]
    res = measure(fn, q, k, v, grad, Method(**spec["method"]),
                  backward=contenders.has_backward(spec["name"], device))
    if getattr(fn, "density", None):
        res["flex_density"] = fn.density.get(spec["n"])
    return res


def measure_specs(specs: list[dict]) -> list[dict]:
    """``measure_spec`` of each spec in turn, in this one process."""
    return [measure_spec(s) for s in specs]


def run(spec_or_specs, method: Method, timeout: float | None = None):
    """Measure one spec (or a list, one after another in the same process): here for
    the "same" process method, else in a fresh process (``timeout`` seconds at most).
    A point that fails or times out is {"skipped": why}."""
    many = isinstance(spec_or_specs, list)
    if method.process == "same":
        if many:
            return [run(s, method) for s in spec_or_specs]
        try:
            return measure_spec(spec_or_specs)
        except Exception as err:        # a kernel that fails to compile or run: recorded
            return {"skipped": f"failed: {type(err).__name__}: "
                               f"{(str(err).strip().splitlines() or [''])[0][:200]}"}
    function = "fast.measure.bench_point:" + ("measure_specs" if many else "measure_spec")
    out = run_child(function, spec_or_specs, timeout=timeout)
    if "result" in out:
        return out["result"]
    return [{"skipped": out["error"]} for _ in spec_or_specs] if many else \
        {"skipped": out["error"]}


def outputs(fn, q, k, v, grad) -> list[torch.Tensor]:
    """The output and the q, k, v gradients of one forward + backward of ``fn`` (what a
    comparison of two contenders on the same inputs reads)."""
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out = fn(qg, kg, vg)
    out.backward(grad)
    return [out.detach(), qg.grad, kg.grad, vg.grad]


def max_rel_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest over the tensors of max |got - want| / max |want| (in float32)."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        scale = float(w.float().abs().max())
        worst = max(worst, float((g.float() - w.float()).abs().max()) / max(scale, 1e-30))
    return worst


def copy_bandwidth(device, nbytes: int, method: Method) -> dict:
    """Bytes per second of a device-to-device copy (read + write) of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    t = steady(lambda: dst.copy_(src), device, method)
    return {"bytes": nbytes, "seconds": t["s"], "bytes_per_s": 2 * nbytes / t["s"]}
