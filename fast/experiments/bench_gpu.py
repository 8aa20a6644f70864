"""The GPU benchmark's sweep: every contender family in one process, steady state apart.

Child et al., 2019, section 5.5 and Table 2, and the long sequences of the
paper's title. ``python -m fast bench --device cuda`` (``fast.experiments.bench``)
runs this: for float16 and bfloat16, (B, H) = (1, 4) and (4, 16), n = 1024 ..
65536, d = 64, strided (l = 128) and fixed (l = 128, c = 32), merged heads, it
measures dense causal SDPA, FlexAttention, the structured PyTorch path and the
Triton kernels (``fast.measure.bench_gpu``) in this one process: the first call
(compile, layout, block mask) and its peak memory apart, then medians of
CUDA-event times, forward and forward+backward. Each point gets its speed-up over
dense, the ideal, the % of ideal and the floor (``fast.measure.bench_gpu.derive``).
One more point, (B, H, n) = (1, 16, 65536), serves the long-n targets. ``--long``
adds the long sweep: B = 1, H = 8, l = 256, n = 2**17 .. 2**20, the layout build,
the first call and the peak memory against the bytes of q, k, v and o.

Its cost follows from its size (``estimate``, printed before it starts): each
measurement costs at most its first call plus (warm-up + max(min reps, target / t))
calls of t seconds, t from the FLOPs at ``--assume-tflops`` (every contender
assumed at most 3x dense, compilation 20 s per dtype and contender). The sweep
starts no new point after ``--max-minutes`` and records the rest as skipped; the
JSON is rewritten after every (dtype, shape), so an interrupted run keeps what it
measured.

On the CPU the same loop runs with a wall-clock timer (``--same-process``), which
is how the tests check it on a machine without a GPU.
"""

from __future__ import annotations

import time

import torch

from fast.measure import bench, bench_gpu
from fast.measure.bench_triton import DEFAULT_BLOCK, flops
from fast.measure.timing import estimate_s, synchronize

TARGET_SHAPE = (1, 16, 65536)        # one more point, for the long-n targets
CONTENDERS = ("dense", "flex", "structured", "triton block-sparse", "triton natural order")


def triton_runs(device: str, dtype: torch.dtype) -> bool:
    """The Triton contenders run: compiled on CUDA, or interpreted (float32) on the CPU."""
    try:
        from fast.kernels.triton_attention import interpreted  # optional dependency
    except ImportError:
        return False
    return not interpreted() if device == "cuda" else interpreted() and dtype == torch.float32


def points(args) -> list[tuple]:
    """(dtype name, B, H, n) of the sweep, in the order measured."""
    out = [(dt, B, H, n) for dt in args.dtypes for (B, H) in args.shapes for n in args.ns]
    if args.target_points:
        out.append((args.dtypes[0], *TARGET_SHAPE))
    return out


def timing(args) -> dict:
    return dict(warmup=args.warmup, min_reps=args.min_reps, target_s=args.target)


def estimate(args) -> dict:
    """Measurements and an upper estimate of the sweep's seconds, from its size."""
    total, count = 20.0 * len(args.dtypes) * len(args.contenders), 0
    per_point = 1 + len(args.patterns) * (len(args.contenders) - 1)
    for _, B, H, n in points(args):
        fwd = 2 * B * H * n * n * bench_gpu.D / (args.assume_tflops * 1e12)   # causal half
        for t in (3 * fwd, 3 * 3.5 * fwd):
            total += per_point * estimate_s(t, first_s=t, **timing(args))
            count += per_point
    if args.long:
        for n in args.long_ns:
            fwd = 2 * 8 * n * n * bench_gpu.D / (args.assume_tflops * 1e12)
            total += 2 * estimate_s(4.5 * fwd, first_s=5.0, **timing(args))
            count += 4
    return {"measurements": count, "estimate_s": total}


def _row(name, pattern, dtype, B, H, n) -> dict:
    return {"contender": name, "pattern": pattern, "dtype": dtype, "B": B, "H": H, "n": n}


def _derived(row: dict, dense: dict | None, pattern: str | None, params: dict, copy_bps: float):
    """Add the ideal, speed-up, % of ideal, floor (and TFLOP/s of Triton's tiles)."""
    B, H, n, dtype = row["B"], row["H"], row["n"], bench.DTYPES[row["dtype"]]
    natural = row["contender"] == "triton natural order"
    ideal = 1.0 if pattern is None else bench_gpu.ideal(pattern, n, H, params)
    row["ideal"] = ideal
    if natural:
        row["ideal_natural_order"] = bench_gpu.ideal(pattern, n, H, params, order="natural")
    for what, key, backward in (("fwd", "fwd_s", False), ("fb", "fb_s", True)):
        if row.get(key):
            dense_s = dense.get(key) if dense else None
            row[what] = bench_gpu.derive(row[key], dense_s, ideal,
                                         bench_gpu.io_bytes(B, H, n, bench_gpu.D, dtype,
                                                            backward), copy_bps)
            if row["contender"].startswith("triton"):
                row[what]["tflops"] = flops(pattern, B, n, H, bench_gpu.D, params,
                                            backward=backward,
                                            order="natural" if natural else "structured"
                                            ) / row[key] / 1e12


def _say(row: dict, t0: float) -> None:
    head = (f"[{time.time() - t0:5.0f} s] {row['dtype']} B={row['B']} H={row['H']} "
            f"n={row['n']:6d} {row['pattern'] or '':8} {row['contender']:21}")
    if "skipped" in row:
        print(f"{head} skipped: {row['skipped']}", flush=True)
        return
    cells = []
    for what, key in (("fwd", "fwd_s"), ("fwd+bwd", "fb_s")):
        if row.get(key):
            d = row.get("fwd" if key == "fwd_s" else "fb", {})
            sp = f" {d['speedup']:.2f}x ({d['pct_ideal']:.0f}% of {d['ideal']:.1f}x)" \
                if d.get("speedup") and row["pattern"] else ""
            cells.append(f"{what} {row[key] * 1e3:8.3f} ms{sp}, {d.get('x_floor', 0):.1f}x floor")
    first = row.get("first_fwd_s")
    print(f"{head} {'; '.join(cells)}; first call {first:.2f} s", flush=True)


def run(args, save=None) -> dict:
    """The sweep (and the long sweep): returns the dict written to the JSON; ``save(data)``
    is called after every (dtype, shape) with what is measured so far."""
    device, t0 = args.device, time.time()
    deadline = t0 + 60 * args.max_minutes if args.max_minutes else None
    info = bench.machine_info(device)
    info["timer"] = "cuda events" if device == "cuda" else "perf_counter"
    try:
        import triton  # optional dependency
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device == "cuda":
        info["cuda"] = torch.version.cuda
    cost = estimate(args)
    print(f"sweep: {len(points(args))} points, {cost['measurements']} measurements; "
          f"estimated at most {cost['estimate_s'] / 60:.1f} min (dense at "
          f"{args.assume_tflops} TFLOP/s, every contender at most 3x dense)", flush=True)
    copy = bench_gpu.copy_bandwidth(device, args.copy_mib * 2**20, **timing(args))
    data = {"machine": info, "config": config(args), "estimate": cost,
            "calibration": {"copy": copy, "sdpa_backend": {}}, "results": [], "long": []}
    last = None
    for dt, B, H, n in points(args):
        if save is not None and last not in (None, (dt, B, H)):
            save(data)
        last = (dt, B, H)
        dtype = bench.DTYPES[dt]
        q, k, v, g = bench_gpu.inputs(B, H, n, bench_gpu.D, device, dtype)
        if dt not in data["calibration"]["sdpa_backend"]:
            data["calibration"]["sdpa_backend"][dt] = bench_gpu.sdpa_backend(q, k, v)
        dense = None
        for pattern, params in [(None, {})] + list(args.patterns.items()):
            fns = bench_gpu.registry(pattern or "strided", params, H, device, dtype,
                                     flex="flex" in args.contenders,
                                     triton=triton_runs(device, dtype))
            for name, fn in fns.items():
                if (name == "dense") != (pattern is None) or name not in args.contenders:
                    continue
                row = _row(name, pattern, dt, B, H, n)
                if deadline and time.time() > deadline:
                    row["skipped"] = f"--max-minutes {args.max_minutes} spent before this point"
                else:
                    row.update(bench_gpu.measure(fn, q, k, v, g, **timing(args)))
                    if getattr(fn, "density", None):
                        row["flex_density"] = fn.density.get(n)
                    if "skipped" not in row:
                        _derived(row, row if name == "dense" else dense, pattern, params,
                                 copy["bytes_per_s"])
                if name == "dense":
                    dense = row
                data["results"].append(row)
                _say(row, t0)
        del q, k, v, g
    if args.long:
        if save is not None:
            save(data)
        data["long"] = run_long(args, copy["bytes_per_s"], deadline, t0)
    data["machine"]["wall_s"] = time.time() - t0
    data["targets"] = targets(data["results"])
    return data


def run_long(args, copy_bps: float, deadline, t0) -> list[dict]:
    """B = 1, H = 8, l = 256: the layout build, first call, steady times and peak memory
    of the Triton kernel (and dense up to --long-dense-n-max) at n = 2**17 .. 2**20."""
    from fast.kernels.triton_attention import cached_layout, clear_layout_cache  # optional

    rows = []
    B, H = bench_gpu.LONG_SHAPE
    dt = args.dtypes[0]
    dtype = bench.DTYPES[dt]
    for n in args.long_ns:
        q, k, v, g = bench_gpu.inputs(B, H, n, bench_gpu.D, args.device, dtype)
        dense = None
        for pattern, params in [(None, {})] + list(bench_gpu.LONG_PARAMS.items()):
            name = "dense" if pattern is None else "triton block-sparse"
            row = _row(name, pattern, dt, B, H, n)
            row["qkvo_bytes"] = 4 * q.numel() * q.element_size()
            if pattern is None and n > args.long_dense_n_max:
                row["skipped"] = f"dense past --long-dense-n-max {args.long_dense_n_max}"
            elif pattern is not None and not triton_runs(args.device, dtype):
                row["skipped"] = "the Triton kernels do not run here"
            elif deadline and time.time() > deadline:
                row["skipped"] = f"--max-minutes {args.max_minutes} spent before this point"
            else:
                fn = bench_gpu.registry(pattern or "strided", params, H, args.device, dtype,
                                        flex=False)[name]
                if pattern is not None:
                    clear_layout_cache()
                    synchronize(args.device)
                    t = time.perf_counter()
                    cached_layout(pattern, n, H, "merged", 0, params, DEFAULT_BLOCK, args.device)
                    synchronize(args.device)
                    row["layout_s"] = time.perf_counter() - t
                    clear_layout_cache()             # the first call builds it again
                row.update(bench_gpu.measure(fn, q, k, v, g, **timing(args)))
                if "skipped" not in row:
                    _derived(row, row if pattern is None else dense, pattern, params, copy_bps)
                    if row.get("peak_fb_bytes") is not None:
                        row["peak_fb_over_qkvo"] = row["peak_fb_bytes"] / row["qkvo_bytes"]
            if pattern is None:
                dense = row
            rows.append(row)
            _say(row, t0)
        del q, k, v, g
        clear_layout_cache()
    return rows


def targets(results: list[dict]) -> dict:
    """The GPU targets, float16, Triton block-sparse against dense causal SDPA in the same
    run: (B, H, n, pattern, fwd or fwd+bwd) -> {speedup, goal, pct_ideal}."""
    goals = [((4, 16, 16384), "strided", "fwd", 12.0), ((4, 16, 16384), "strided", "fb", 8.0),
             ((4, 16, 16384), "fixed", "fwd", 3.0), ((4, 16, 16384), "fixed", "fb", 2.5),
             ((1, 16, 65536), "strided", "fwd", 40.0), ((1, 4, 16384), "strided", "fwd", 3.0)]
    out = {}
    for (B, H, n), pattern, what, goal in goals:
        row = next((r for r in results if r["contender"] == "triton block-sparse"
                    and r["pattern"] == pattern and (r["B"], r["H"], r["n"]) == (B, H, n)
                    and r["dtype"] == "float16" and what in r), None)
        d = row[what] if row else {}
        out[f"{pattern} {what} B={B} H={H} n={n}"] = {
            "goal": goal, "speedup": d.get("speedup"), "pct_ideal": d.get("pct_ideal"),
            "x_floor": d.get("x_floor")}
    return out


def config(args) -> dict:
    return {"device": args.device, "d": bench_gpu.D, "block": DEFAULT_BLOCK,
            "shapes": [list(s) for s in args.shapes], "ns": args.ns, "dtypes": args.dtypes,
            "patterns": args.patterns, "combine": "merged", "contenders": list(args.contenders),
            "target_points": [list(TARGET_SHAPE)] if args.target_points else [],
            "long_ns": args.long_ns if args.long else [], "long_params": bench_gpu.LONG_PARAMS,
            "long_shape": list(bench_gpu.LONG_SHAPE), "timing": {
                **timing(args), "method": "same process; first call apart; median of "
                                          "steady-state repetitions"},
            "max_minutes": args.max_minutes, "assume_tflops": args.assume_tflops,
            "memory": "torch.cuda.max_memory_allocated above the inputs" if args.device == "cuda"
            else "peak RSS above the inputs, in-process (under-counts)"}


def print_targets(data: dict) -> None:
    print("\ntargets (float16, Triton block-sparse vs dense causal SDPA, same run):")
    for key, t in data["targets"].items():
        got = "not measured" if t["speedup"] is None else (
            f"{t['speedup']:.2f}x ({t['pct_ideal']:.0f}% of ideal, {t['x_floor']:.1f}x floor)")
        print(f"  {key:34} goal >= {t['goal']:>4}x: {got}")
    sdpa = data["calibration"]["sdpa_backend"]
    copy = data["calibration"]["copy"]
    print(f"dense SDPA backend: {sdpa}; copy bandwidth {copy['bytes_per_s'] / 1e9:.3g} GB/s")
    print("Read % of ideal (tile count) and x floor (bytes at the copy bandwidth, tiles at "
          "dense's throughput): first calls (compile, layout) are apart in first_fwd_s.")
