"""Benchmark library: sparse attention against dense causal attention, time and peak memory.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute). The contenders, for one pattern, B=1, H=4, d=64:

  dense         scaled_dot_product_attention(is_causal=True)   (pattern-free)
  naive         SDPA with the pattern's boolean mask           (fast.backends.naive)
  flex          FlexAttention with the pattern's BlockMask      (fast.backends.flex; forward only
                on a CPU: PyTorch has no FlexAttention backward there)
  structured    fast.sparse_attention(backend="structured")    (ours)

for the strided (l=128) and fixed (l=128, c=32) patterns (``PATTERN_PARAMS``),
merged heads. They form a registry {name: fn(q, k, v) -> out}. ``python -m fast
bench`` (``fast.experiments.bench``) sweeps n, writes the JSON and draws the
figure. This is the CPU's method; on a GPU the benchmark times every contender
in one process with CUDA events instead (``fast.measure.bench_gpu``).

Method (``measure``: one contender at one n; the sweep runs each in a fresh
process, ``fast.measure.child``, so that each peak memory is that run's alone):
inputs are made, the peak is reset (``fast.measure.memory.peak_memory``: the RSS
high-water mark on the CPU, torch.cuda.max_memory_allocated on CUDA), the first
forward runs -> ``peak_fwd`` (bytes above the level with the inputs allocated);
reset again, one forward+backward -> ``peak_fb``. These first calls are the
warm-up; then each measurement repeats until about ``target`` seconds (at least
one repetition, three for calls under 0.3 s; a first call longer than 2 s
counts as the only repetition).
Times reported are the minimum over repetitions (the machine is shared: the
minimum is the least disturbed run); all repetitions are kept.
The naive contender builds its mask inside its first call (so the mask counts
in its peak memory) and reuses it afterwards (so the time is the attention's);
FlexAttention is called once before all measurements (it compiles; the compile
time is kept as ``compile_s``). ``summarize`` turns a sweep into the speed-up,
slope and memory targets the README reports.
"""

from __future__ import annotations

import math
import os
import platform
import time

import torch
import torch.nn.functional as F

from fast.attention import sparse_attention
from fast.backends import masks as masks_torch
from fast.backends.flex import flex_sparse_attention
from fast.backends.naive import masked_attention
from fast.measure.timing import first_call, synchronize

B, H, D = 1, 4, 64
# pattern name -> the parameters the benchmark runs it with (the patterns: reference.patterns)
PATTERN_PARAMS = {"strided": {"stride": 128}, "fixed": {"stride": 128, "c": 32}}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ----------------------------------------------------------------------------
# The registry of contenders: name -> fn(q, k, v) -> out.
# ----------------------------------------------------------------------------

def registry(pattern: str, params: dict, device: str, dtype: torch.dtype) -> dict:
    """{name: fn(q, k, v)} for one pattern; q, k, v (B, H, n, d)."""
    def dense(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    mask_cache = {}

    def naive(q, k, v):
        n = q.shape[2]
        if n not in mask_cache:
            m = masks_torch.head_masks(pattern, n, q.shape[1], device=q.device, **params)
            mask_cache.clear()
            mask_cache[n] = m[:1] if bool((m == m[:1]).all()) else m       # (1 | H, n, n)
        return masked_attention(q, k, v, mask_cache[n])

    def flex(q, k, v):
        return flex_sparse_attention(q, k, v, pattern, **params)

    flex.compiles = True       # warm up (compile) before the memory and time measurements
    naive.builds_mask = True   # its first call builds the mask: memory yes, time no
    naive.reset = mask_cache.clear

    def structured(q, k, v):
        return sparse_attention(q, k, v, pattern, backend="structured", **params)

    return {"dense": dense, "naive": naive, "flex": flex, "structured": structured}


def has_backward(name: str, device: str) -> bool:
    return not (name == "flex" and device == "cpu")   # "does not support backward on CPU"


def mask_bytes(pattern: str, n: int) -> int:
    """Bytes of the naive path's bool mask plus SDPA's float copy of it."""
    heads = 1 if pattern == "strided" else H                             # fixed: per-head summaries
    return heads * n * n * 5


# ----------------------------------------------------------------------------
# One measurement (runs in a child process).
# ----------------------------------------------------------------------------

def _timed(fn, device, target: float, first: float) -> list[float]:
    """Repetitions of fn() until about ``target`` seconds; the first call's time
    ``first`` is the only repetition when it exceeds 2 s."""
    if first > 2.0:
        return [first]
    if first == 0.0:                      # the first call was not a clean measurement
        synchronize(device)
        t = time.perf_counter()
        fn()
        synchronize(device)
        first = time.perf_counter() - t
        if first > 2.0 or first * 2 > target:
            return [first]
    # at least 3 repetitions of a short call: on a shared machine one run can be unlucky
    reps = max(3 if first < 0.3 else 1, min(20, math.ceil(target / max(first, 1e-4))))
    times = []
    for _ in range(reps):
        synchronize(device)
        t = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t)
    return times


def measure(name: str, pattern: str, n: int, device: str, dtype_name: str,
            target: float, backward: bool) -> dict:
    """Time and peak memory of one contender at one n (call in a fresh process)."""
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    fn = registry(pattern, PATTERN_PARAMS[pattern], device, dtype)[name]
    q, k, v = (torch.randn(B, H, n, D, device=device, dtype=dtype) for _ in range(3))
    grad = torch.randn(B, H, n, D, device=device, dtype=dtype)
    res = {}

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    if getattr(fn, "compiles", False):
        t = time.perf_counter()
        fwd()
        res["compile_s"] = time.perf_counter() - t
    first, res["peak_fwd_bytes"] = first_call(fwd, device)
    if getattr(fn, "builds_mask", False):
        res["first_call_s"], first = first, 0.0      # the mask is built: not a timing
    res["fwd_s_all"] = _timed(fwd, device, target, first)
    res["fwd_s"] = min(res["fwd_s_all"])

    if backward:
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

        def fb():
            for t in (qg, kg, vg):
                t.grad = None
            fn(qg, kg, vg).backward(grad)

        if getattr(fn, "builds_mask", False):
            fn.reset()                    # rebuilt inside the window: the mask counts here too
        first, res["peak_fb_bytes"] = first_call(fb, device)
        if getattr(fn, "builds_mask", False):
            first = 0.0
        res["fb_s_all"] = _timed(fb, device, target, first)
        res["fb_s"] = min(res["fb_s_all"])
    return res


def measure_spec(spec: dict) -> dict:
    """``measure(**spec)``: the function ``fast.measure.child`` runs in a fresh process."""
    return measure(**spec)


# ----------------------------------------------------------------------------
# The machine, and what a sweep amounts to.
# ----------------------------------------------------------------------------

def machine_info(device: str) -> dict:
    """Platform, versions, CPU model and core count (and the GPU on CUDA) for the JSON."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu": cpu, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cpu_flash_kernel": hasattr(torch.ops.aten,
                                        "_scaled_dot_product_flash_attention_for_cpu")}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def fitted_slope(ns, ts) -> float | None:
    """Least-squares slope of log t against log n."""
    pts = [(math.log(n), math.log(t)) for n, t in zip(ns, ts) if t]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def find(results: list[dict], **key) -> dict | None:
    """The first measured (not skipped) result whose fields equal ``key``."""
    for r in results:
        if all(r.get(k) == v for k, v in key.items()) and "skipped" not in r:
            return r
    return None


def entry(results: list[dict], name: str, pattern: str, n: int) -> dict | None:
    """The result of contender ``name`` at ``n`` in ``pattern``'s sweep (dense, which has no
    pattern, belongs to every pattern's), measured or skipped; None if absent."""
    return next((r for r in results if r["contender"] == name and r["n"] == n
                 and r["pattern"] in (pattern, None)), None)


def contender_names(results: list[dict], pattern: str) -> list[str]:
    """The contenders of ``pattern``'s sweep in ``results``: dense first, then by name."""
    return sorted({r["contender"] for r in results if r["pattern"] in (pattern, None)},
                  key=lambda s: (s != "dense", s))


def summarize(results: list[dict], dtype: str = "float32") -> dict:
    """The README's targets, computed from the results (None where not measured): speed-ups
    over dense at n=16384, time slopes over n=4096..65536, peak memory at n=65536."""
    def ratio(pattern, n, what):
        d = find(results, contender="dense", n=n, dtype=dtype)
        s = find(results, contender="structured", pattern=pattern, n=n, dtype=dtype)
        if d and s and d.get(what) and s.get(what):
            return d[what] / s[what]
        return None

    strided = sorted((r["n"], r["fb_s"], r.get("fwd_s")) for r in results
                     if r.get("contender") == "structured" and r.get("pattern") == "strided"
                     and r.get("dtype") == dtype and "skipped" not in r
                     and 4096 <= r["n"] <= 65536)
    peak = find(results, contender="structured", pattern="strided", n=65536, dtype=dtype)
    return {
        "strided_fwd_speedup_16384": ratio("strided", 16384, "fwd_s"),
        "strided_fb_speedup_16384": ratio("strided", 16384, "fb_s"),
        "fixed_fwd_speedup_16384": ratio("fixed", 16384, "fwd_s"),
        "fixed_fb_speedup_16384": ratio("fixed", 16384, "fb_s"),
        "strided_fwd_slope_4096_65536": fitted_slope([s[0] for s in strided],
                                                     [s[2] for s in strided]),
        "strided_fb_slope_4096_65536": fitted_slope([s[0] for s in strided],
                                                    [s[1] for s in strided]),
        "strided_fb_peak_bytes_65536": peak.get("peak_fb_bytes") if peak else None,
    }
