"""Benchmark: sparse attention against dense causal attention, time and peak memory.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute). ``python -m fast.measure.bench`` times, for n = 1024 .. 65536 (powers of 2),
B=1, H=4, d=64, float32 on the CPU:

  dense         scaled_dot_product_attention(is_causal=True)   (pattern-free; up to
                --dense-n-max = 32768: at 65536 one forward+backward takes minutes here)
  naive         SDPA with the pattern's boolean mask           (fast.backends.naive; skipped
                where the (H, n, n) mask and SDPA's float copy of it exceed --mask-gb,
                and past --naive-n-max = 8192, where it would take most of the run)
  flex          FlexAttention with the pattern's BlockMask      (fast.backends.flex; forward only
                on a CPU, and only at --flex-n: each new n compiles for ~25 s)
  structured    fast.sparse_attention(backend="structured")    (ours)

for the strided (l=128) and fixed (l=128, c=32) patterns, merged heads. With
``--device cuda`` it adds ``fast.measure.bench_triton.contenders`` and runs float32,
float16 and bfloat16. Contenders form a registry {name: fn(q, k, v) -> out}.

Method. Every (contender, pattern, n) runs in a fresh subprocess, so each peak
memory is that run's alone: inputs are made, the peak-RSS high-water mark is
reset (Linux /proc/self/clear_refs, ``fast.measure.memory.peak_rss``), the first
forward runs -> ``peak_fwd`` (bytes above the RSS with the inputs allocated);
reset again, one forward+backward -> ``peak_fb``. These first calls are the
warm-up; then each measurement repeats until about --target seconds (at least
one repetition, three for calls under 0.3 s; a first call longer than 2 s
counts as the only repetition).
Times reported are the minimum over repetitions (the machine is shared: the
minimum is the least disturbed run); all repetitions are kept in the JSON. On
CUDA peak memory is torch.cuda.max_memory_allocated above the inputs.
The naive contender builds its mask inside its first call (so the mask counts
in its peak memory) and reuses it afterwards (so the time is the attention's);
FlexAttention is called once before all measurements (it compiles; the compile
time is kept as ``compile_s``).

Writes figures/data/bench_cpu.json (machine, versions, load average, every
timing) and figures/bench_cpu.png (``fast.plots.bench``); bench_cuda.* on CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from fast.core.files import write_json

ROOT = Path(__file__).resolve().parent.parent
B, H, D = 1, 4, 64
PATTERNS = {"strided": {"stride": 128}, "fixed": {"stride": 128, "c": 32}}
NAMES = ("dense", "naive", "flex", "structured")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ----------------------------------------------------------------------------
# The registry of contenders: name -> fn(q, k, v) -> out.
# ----------------------------------------------------------------------------

def registry(pattern: str, params: dict, device: str, dtype: torch.dtype) -> dict:
    """{name: fn(q, k, v)} for one pattern; q, k, v (B, H, n, d)."""
    from fast import sparse_attention
    from fast.backends.naive import masked_attention
    from fast.backends import masks as masks_torch

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
        from fast.backends.flex import flex_sparse_attention
        return flex_sparse_attention(q, k, v, pattern, **params)

    flex.compiles = True       # warm up (compile) before the memory and time measurements
    naive.builds_mask = True   # its first call builds the mask: memory yes, time no
    naive.reset = mask_cache.clear

    def structured(q, k, v):
        return sparse_attention(q, k, v, pattern, backend="structured", **params)

    out = {"dense": dense, "naive": naive, "flex": flex, "structured": structured}
    if device == "cuda":
        from fast.measure.bench_triton import contenders
        out.update(contenders(pattern, params, dtype))
    return out


def has_backward(name: str, device: str) -> bool:
    return not (name == "flex" and device == "cpu")   # "does not support backward on CPU"


def mask_bytes(pattern: str, n: int) -> int:
    """Bytes of the naive path's bool mask plus SDPA's float copy of it."""
    heads = 1 if pattern == "strided" else H                             # fixed: per-head summaries
    return heads * n * n * 5


# ----------------------------------------------------------------------------
# One measurement (runs in a child process).
# ----------------------------------------------------------------------------

def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, target: float, first: float) -> list[float]:
    """Repetitions of fn() until about ``target`` seconds; the first call's time
    ``first`` is the only repetition when it exceeds 2 s."""
    if first > 2.0:
        return [first]
    if first == 0.0:                      # the first call was not a clean measurement
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        first = time.perf_counter() - t
        if first > 2.0 or first * 2 > target:
            return [first]
    # at least 3 repetitions of a short call: on a shared machine one run can be unlucky
    reps = max(3 if first < 0.3 else 1, min(20, math.ceil(target / max(first, 1e-4))))
    times = []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return times


class _Peak:
    """Peak memory above the current level: RSS high-water mark on CPU, the
    allocator's maximum on CUDA."""

    def __init__(self, device):
        self.device, self.bytes = device, None

    def __enter__(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            from fast.measure.memory import peak_rss
            self.ctx = peak_rss()
            self.result = self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.start
        else:
            self.ctx.__exit__(*exc)
            self.bytes = self.result["peak_bytes"]
        return False


def _first_call(call, device) -> tuple[float, int]:
    """Seconds and peak bytes of the first call (allocations, caches, masks included)."""
    with _Peak(device) as peak:
        _sync(device)
        t = time.perf_counter()
        call()
        _sync(device)
        seconds = time.perf_counter() - t
    return seconds, peak.bytes


def measure(name: str, pattern: str, n: int, device: str, dtype_name: str,
            target: float, backward: bool) -> dict:
    """Time and peak memory of one contender at one n (call in a fresh process)."""
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    fn = registry(pattern, PATTERNS[pattern], device, dtype)[name]
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
    first, res["peak_fwd_bytes"] = _first_call(fwd, device)
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
        first, res["peak_fb_bytes"] = _first_call(fb, device)
        if getattr(fn, "builds_mask", False):
            first = 0.0
        res["fb_s_all"] = _timed(fb, device, target, first)
        res["fb_s"] = min(res["fb_s_all"])
    return res


def _child(spec: dict, inline: bool, timeout: float) -> dict:
    """Run ``measure`` in a fresh subprocess (or in this process if inline)."""
    if inline:
        return measure(**spec)
    cmd = [sys.executable, "-m", "fast.measure.bench", "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return {"skipped": f"failed: {tail[0][:200]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------
# The whole run.
# ----------------------------------------------------------------------------

def machine_info(device: str) -> dict:
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


def _find(results, **key):
    for r in results:
        if all(r.get(k) == v for k, v in key.items()) and "skipped" not in r:
            return r
    return None


def summarize(results: list[dict], dtype: str = "float32") -> dict:
    """The issue-3 targets, computed from the results (None where not measured)."""
    def ratio(pattern, n, what):
        d = _find(results, contender="dense", n=n, dtype=dtype)
        s = _find(results, contender="structured", pattern=pattern, n=n, dtype=dtype)
        if d and s and d.get(what) and s.get(what):
            return d[what] / s[what]
        return None

    strided = sorted((r["n"], r["fb_s"], r.get("fwd_s")) for r in results
                     if r.get("contender") == "structured" and r.get("pattern") == "strided"
                     and r.get("dtype") == dtype and "skipped" not in r
                     and 4096 <= r["n"] <= 65536)
    peak = _find(results, contender="structured", pattern="strided", n=65536, dtype=dtype)
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


def print_table(results: list[dict], dtype: str) -> None:
    rows = [r for r in results if r.get("dtype") == dtype]
    ns = sorted({r["n"] for r in rows})
    print(f"\n{dtype}: time (ms) and speed-up over dense causal SDPA (min over reps); "
          f"peak memory MiB (forward+backward, or forward)")
    print(f"{'pattern':8} {'contender':22} " + " ".join(f"{n:>17}" for n in ns))
    for pattern in PATTERNS:
        names = sorted({r["contender"] for r in rows if r["pattern"] in (pattern, None)},
                       key=lambda s: (s != "dense", s))
        for name in names:
            for what in ("fwd_s", "fb_s"):
                cells = []
                for n in ns:
                    r = next((x for x in rows if x["contender"] == name and x["n"] == n
                              and x["pattern"] in (pattern, None)), None)
                    d = _find(rows, contender="dense", n=n)
                    if r is None or "skipped" in r or not r.get(what):
                        cells.append(f"{'-':>17}")
                        continue
                    sp = f"{d[what] / r[what]:5.1f}x" if d and d.get(what) else "   -  "
                    cells.append(f"{r[what] * 1e3:9.1f} {sp:>7}")
                label = "fwd" if what == "fwd_s" else "fwd+bwd"
                print(f"{pattern:8} {name + ' ' + label:22} " + " ".join(cells))
            cells = []
            for n in ns:
                r = next((x for x in rows if x["contender"] == name and x["n"] == n
                          and x["pattern"] in (pattern, None)), None)
                m = (r or {}).get("peak_fb_bytes") or (r or {}).get("peak_fwd_bytes")
                cells.append(f"{m / 2**20:17.0f}" if m is not None else f"{'-':>17}")
            print(f"{pattern:8} {name + ' peak MiB':22} " + " ".join(cells))


def run(args) -> dict:
    device = args.device
    dtypes = ["float32"] if device == "cpu" else ["float32", "float16", "bfloat16"]
    ns = [2 ** e for e in range(int(math.log2(args.n_min)), int(math.log2(args.n_max)) + 1)]
    flex_ns = set(args.flex_n) if device == "cpu" else set(ns)
    t_start = time.time()
    info = machine_info(device)
    info["loadavg_start"] = os.getloadavg()
    results = []
    for dtype in dtypes:
        for n in ns:
            jobs = [("dense", None)]
            for pattern in PATTERNS:
                names = [x for x in registry(pattern, PATTERNS[pattern], device,
                                             DTYPES[dtype]) if x != "dense"]
                jobs += [(x, pattern) for x in names]
            for name, pattern in jobs:
                entry = {"contender": name, "pattern": pattern, "n": n, "dtype": dtype}
                if name == "dense" and n > args.dense_n_max:
                    entry["skipped"] = (f"dense causal attention is O(n^2): past --dense-n-max "
                                        f"{args.dense_n_max} one call takes minutes here")
                elif name == "naive" and n > args.naive_n_max:
                    entry["skipped"] = (f"the naive path is O(n^2) and runs the full square: "
                                        f"past --naive-n-max {args.naive_n_max} it would take "
                                        f"most of the run")
                elif name == "naive" and mask_bytes(pattern, n) > args.mask_gb * 2**30:
                    entry["skipped"] = (f"the n x n mask needs {mask_bytes(pattern, n) / 2**30:.1f}"
                                        f" GiB > --mask-gb {args.mask_gb}")
                elif name == "flex" and (args.no_flex or n not in flex_ns):
                    entry["skipped"] = "FlexAttention compiles per n (~25 s on this CPU): " \
                                       "only run at --flex-n"
                else:
                    spec = {"name": name, "pattern": pattern or "strided", "n": n,
                            "device": device, "dtype_name": dtype, "target": args.target,
                            "backward": has_backward(name, device)}
                    t0 = time.time()
                    entry.update(_child(spec, args.inline, args.timeout))
                    entry["wall_s"] = time.time() - t0
                results.append(entry)
                msg = entry.get("skipped") or (
                    f"fwd {entry['fwd_s'] * 1e3:.1f} ms" +
                    (f", fwd+bwd {entry['fb_s'] * 1e3:.1f} ms" if "fb_s" in entry else ""))
                print(f"[{time.time() - t_start:6.0f} s] {dtype} n={n:6d} {name:11} "
                      f"{pattern or '':8} {msg}", flush=True)
    info["loadavg_end"] = os.getloadavg()
    info["wall_s"] = time.time() - t_start
    return {"machine": info,
            "config": {"B": B, "H": H, "d": D, "patterns": PATTERNS, "combine": "merged",
                       "dense_n_max": args.dense_n_max, "naive_n_max": args.naive_n_max,
                       "device": device, "ns": ns, "flex_ns": sorted(flex_ns),
                       "target_s": args.target, "mask_gb": args.mask_gb,
                       "timing": "min over repetitions after a warm-up call",
                       "memory": ("peak RSS above the inputs, fresh process per point"
                                  if device == "cpu" and not args.inline else
                                  "peak RSS above the inputs, in-process" if device == "cpu"
                                  else "torch.cuda.max_memory_allocated above the inputs")},
            "results": results,
            "targets": {dt: summarize(results, dt) for dt in dtypes}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--n-min", type=int, default=1024)
    p.add_argument("--n-max", type=int, default=65536)
    p.add_argument("--quick", action="store_true",
                   help="n up to 4096, no FlexAttention, short repetitions")
    p.add_argument("--flex-n", type=int, nargs="*", default=[4096, 16384],
                   help="n at which FlexAttention runs on the CPU")
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--dense-n-max", type=int, default=32768,
                   help="largest n for dense SDPA (O(n^2) time)")
    p.add_argument("--naive-n-max", type=int, default=8192,
                   help="largest n for the naive masked SDPA (O(n^2) time and memory)")
    p.add_argument("--mask-gb", type=float, default=3.0,
                   help="largest naive mask (bool + SDPA's float copy), GiB")
    p.add_argument("--target", type=float, default=1.0,
                   help="seconds of repetitions per measurement")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per point")
    p.add_argument("--inline", action="store_true",
                   help="measure in this process (tests; memory less isolated)")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for data/bench_<device>.json and bench_<device>.png "
                        "(default: figures/)")
    p.add_argument("--child", type=str, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child is not None:
        print(json.dumps(measure(**json.loads(args.child))))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if args.quick:
        args.n_max, args.no_flex, args.target = min(args.n_max, 4096), True, 0.3
    if args.n_min < 1 or args.n_max < args.n_min:
        raise SystemExit(f"need 1 <= --n-min <= --n-max, got {args.n_min}, {args.n_max}")

    data = run(args)
    for dtype in data["targets"]:
        print_table(data["results"], dtype)
        print(f"\ntargets ({dtype}):")
        for key, val in data["targets"][dtype].items():
            print(f"  {key:32} {val if val is None else round(val, 3)}")
    out = args.out or ROOT / "figures"
    (out / "data").mkdir(parents=True, exist_ok=True)
    path = out / "data" / f"bench_{args.device}.json"
    write_json(path, data, indent=1)
    from fast.plots.bench import plot
    png = plot(data, out / f"bench_{args.device}.png")
    print(f"\nwrote {path} and {png} ({data['machine']['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
