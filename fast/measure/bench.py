"""What a benchmark sweep amounts to: speed-ups, ideals, floors, slopes, the targets.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for the
blocks it computes, so its time should grow as n sqrt(n) (slope 1.5 on a log-log
plot) where dense attention's grows as n^2, and its speed-up over dense should
approach the ratio of their work. ``python -m fast bench`` writes the rows of a
sweep (one per contender, pattern, dtype, shape and n; ``fast.measure.bench_point``
measures each); the functions here read them:

* ``derive``: for one row, the speed-up over dense causal SDPA measured in the
  same run, the ideal, the % of ideal, and the floor: the larger of the bytes that
  must move (``io_bytes``) at the copy bandwidth measured in the same run and the
  work at the dense kernel's measured rate (dense time / ideal). The ideal and the
  work are what the contender computes in: a Triton kernel's tiles
  (``fast.layout.costs.ideal_speedup``, the tile count of its block layout), and for
  every other contender, which computes no tiles, the (query, key) pairs the pattern
  reads (``keys_read_ideal``, the README's ideal): a tile count below dense's at short n
  would put that floor above what a CPU path measures;
* ``summarize``: the CPU targets the README reports (speed-ups at n = 16384, the
  strided time slope over n = 4096 .. 65536, peak memory at n = 65536) and each
  contender's backward / forward time ratio at n = 16384;
* ``gpu_targets``: the GPU goals, the Triton kernel against dense (its fastest
  kernel variant where several were measured);
* ``winners``: the fastest kernel variant per point, pattern and part, and the one
  to make the default (``fast.kernels.variants.DEFAULT``);
* ``fitted_slope``, ``find``, ``entry``, ``contender_names``: reading rows;
* ``machine_info``: the machine and versions a record was made on.
"""

from __future__ import annotations

import math
import os
import platform

import torch

from fast.measure.contenders import PATTERN_PARAMS
from fast.measure.kernel_pairs import kernel_ceiling
from reference.counts import keys_per_query

TARGET_N = 16384                 # the n of the speed-up targets
SLOPE_NS = (4096, 65536)         # the range of the time-slope target
PEAK_N = 65536                   # the n of the peak-memory target


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
        info["cuda"] = torch.version.cuda
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


def io_bytes(B: int, H: int, n: int, d: int, dtype, backward: bool) -> int:
    """Bytes any attention must move: read q, k, v and write o (4 tensors); with the
    backward also read q, k, v, o, dO and write dq, dk, dv (12 in all)."""
    return (12 if backward else 4) * B * H * n * d * torch.tensor([], dtype=dtype).element_size()


def derive(time_s: float, dense_s: float | None, ideal: float, bytes_moved: int,
           copy_bps: float, work: str = "tiles") -> dict:
    """Speed-up over dense, % of the ideal speed-up, the floor and how far above it;
    ``work`` names what the ideal counts ("tiles" or "pairs", module docstring)."""
    floor_bytes = bytes_moved / copy_bps
    floor_work = dense_s / ideal if dense_s else None
    floor = max(floor_bytes, floor_work or 0.0)
    speedup = dense_s / time_s if dense_s else None
    return {"speedup": speedup, "ideal": ideal,
            "pct_ideal": 100 * speedup / ideal if speedup else None,
            "floor_s": floor, "floor_bytes_s": floor_bytes, "floor_work_s": floor_work,
            "floor_by": "bytes" if floor == floor_bytes else work,
            "x_floor": time_s / floor}


def summarize(results: list[dict], dtype: str = "float32") -> dict:
    """The README's CPU targets, computed from the results (None where not measured):
    speed-ups of the structured path over dense at n = 16384, the strided time slopes
    over n = 4096 .. 65536, peak memory at n = 65536, and the backward / forward time
    ratio of dense and of each pattern's structured path at n = 16384; beside them the
    keys-read ideal and the ceiling of the pairs the CPU kernel computes
    (``fast.measure.kernel_pairs``)."""
    def row(pattern, n=TARGET_N):
        name = "dense" if pattern is None else "structured"
        return find(results, contender=name, pattern=pattern, n=n, dtype=dtype)

    def ratio(pattern, what):
        d, s = row(None), row(pattern)
        if d and s and d.get(what) and s.get(what):
            return d[what] / s[what]
        return None

    strided = sorted((r["n"], r["fb_s"], r.get("fwd_s")) for r in results
                     if r.get("contender") == "structured" and r.get("pattern") == "strided"
                     and r.get("dtype") == dtype and "skipped" not in r
                     and SLOPE_NS[0] <= r["n"] <= SLOPE_NS[1])
    peak = row("strided", PEAK_N)
    return {
        "strided_fwd_speedup_16384": ratio("strided", "fwd_s"),
        "strided_fb_speedup_16384": ratio("strided", "fb_s"),
        "fixed_fwd_speedup_16384": ratio("fixed", "fwd_s"),
        "fixed_fb_speedup_16384": ratio("fixed", "fb_s"),
        "strided_fwd_slope_4096_65536": fitted_slope([s[0] for s in strided],
                                                     [s[2] for s in strided]),
        "strided_fb_slope_4096_65536": fitted_slope([s[0] for s in strided],
                                                    [s[1] for s in strided]),
        "strided_fb_peak_bytes_65536": peak.get("peak_fb_bytes") if peak else None,
        **{f"{label}_bwd_over_fwd_16384": (row(pattern) or {}).get("bwd_over_fwd")
           for label, pattern in (("dense", None), ("strided", "strided"),
                                  ("fixed", "fixed"))},
        **{f"{pattern}_ideal_16384": keys_read_ideal(pattern, TARGET_N, **params)
           for pattern, params in PATTERN_PARAMS.items()},
        # the ceiling of the pairs the CPU kernel computes (the structured path's pieces)
        **{f"{pattern}_kernel_ceiling_16384": kernel_ceiling(pattern, TARGET_N, **params)
           for pattern, params in PATTERN_PARAMS.items()},
        # the slope that reading exactly the pattern's keys would give over the same n
        "strided_keys_slope_4096_65536": fitted_slope(
            [s[0] for s in strided],
            [int(keys_per_query("strided", s[0], **PATTERN_PARAMS["strided"]).sum())
             for s in strided]),
    }


def keys_read_ideal(pattern: str, n: int, **params) -> float:
    """The speed-up over dense causal attention that reading fewer keys allows: the
    (query, key) pairs dense causal attention reads over those the pattern reads
    (``reference.counts``; every head reads as many under the merged heads)."""
    pattern_pairs = int(keys_per_query(pattern, n, **params).sum())
    return n * (n + 1) / 2 / pattern_pairs


# The GPU targets (docs/gpu.md, "Speed"): the speed-up over dense causal SDPA at the target
# point, at one long n, and at the small shape (1, 4) not slower than dense from n = 4096 on.
GPU_GOALS = ([((4, 16, 16384), "strided", "fwd", 12.0), ((4, 16, 16384), "strided", "fb", 9.0),
              ((4, 16, 16384), "fixed", "fwd", 2.5), ((4, 16, 16384), "fixed", "fb", 2.2),
              ((1, 16, 65536), "strided", "fwd", 40.0), ((1, 4, 16384), "strided", "fwd", 3.0)]
             + [((1, 4, n), pattern, what, 1.0) for n in (4096, 8192, 16384, 32768, 65536)
                for pattern in ("strided", "fixed") for what in ("fwd", "fb")
                if (n, pattern, what) != (16384, "strided", "fwd")])


def gpu_targets(results: list[dict]) -> dict:
    """The GPU targets, float16, Triton block-sparse against dense causal SDPA in the same
    run: "<pattern> <fwd|fb> B= H= n=" -> {goal, speedup, pct_ideal, x_floor, variant};
    where several kernel variants were measured, the fastest one's."""
    out = {}
    for (B, H, n), pattern, what, goal in GPU_GOALS:
        rows = [r for r in results if r["contender"] == "triton block-sparse"
                and r["pattern"] == pattern and (r.get("B"), r.get("H"), r["n"]) == (B, H, n)
                and r["dtype"] == "float16" and r.get(what, {}).get("speedup")]
        row = max(rows, key=lambda r: r[what]["speedup"], default=None)
        d = row[what] if row else {}
        out[f"{pattern} {what} B={B} H={H} n={n}"] = {
            "goal": goal, "speedup": d.get("speedup"), "pct_ideal": d.get("pct_ideal"),
            "x_floor": d.get("x_floor"), "variant": row.get("variant") if row else None}
    return out


# A kernel variant whose output or q, k, v gradients differ from the reference variant's
# by more than this (max |difference| / max |reference|, per tensor) computes something
# else: it wins nothing. Two correct variants differ in their float32 summation order and
# in where the probabilities are rounded to the input dtype (another tile size rounds them
# at other running maxima): a few roundings of float16 (2^-11 each); a missed, doubled or
# misplaced tile moves values by their own size.
AGREE = 1e-2
WINNER_RULE = ("per (dtype, B, H, n, pattern) and part (fwd: forward, fb: forward + "
               "backward), the variant with the shortest time among those that agree with "
               f"the reference variant (max relative difference <= {AGREE:g}); the default is "
               "the variant measured at every entry with the highest geometric mean of (the "
               "entry's shortest time / its time), 1 for a variant that wins everywhere")


def agrees(row: dict) -> bool:
    """Whether a row computes what its reference variant does (no check made: True)."""
    check = row.get("agreement")
    return check is None or check.get("max_rel_diff", math.inf) <= AGREE


def winners(results: list[dict], contender: str = "triton block-sparse") -> dict:
    """Which kernel variant of ``contender`` is fastest where (``WINNER_RULE``), in the
    form a change of the default reads: {"entries": one per (dtype, B, H, n, pattern,
    part) with the winner, its time, speed-up, % of ideal, floor, the runner-up and its
    margin, its gain over the baseline and every variant's time; "scores": per variant its
    wins, entries measured and geometric mean; "default": the variant to make the
    default (None when no variant was measured everywhere); "disagree": the rows left
    out because they disagree with their reference variant (``agrees``); "rule"}."""
    measured: dict = {}                    # (dtype, B, H, n, pattern) -> {variant: row}
    disagree = []
    for r in results:
        if r["contender"] == contender and r.get("variant") and "skipped" not in r:
            key = (r["dtype"], r["B"], r["H"], r["n"], r["pattern"])
            if agrees(r):
                measured.setdefault(key, {})[r["variant"]] = r
            else:
                disagree.append({**dict(zip(("dtype", "B", "H", "n", "pattern"), key)),
                                 "variant": r["variant"], **r["agreement"]})
    variants = list(dict.fromkeys(r["variant"] for r in results
                                  if r["contender"] == contender and r.get("variant")))
    entries = []
    for (dt, B, H, n, pattern), by_variant in measured.items():
        for part in ("fwd", "fb"):
            times = {v: r[f"{part}_s"] for v, r in by_variant.items() if r.get(f"{part}_s")}
            if not times:
                continue
            first, *rest = sorted(times, key=times.get)
            d = by_variant[first].get(part, {})
            entries.append({
                "dtype": dt, "B": B, "H": H, "n": n, "pattern": pattern, "part": part,
                "variant": first, "s": times[first], "speedup": d.get("speedup"),
                "pct_ideal": d.get("pct_ideal"), "floor_s": d.get("floor_s"),
                "floor_by": d.get("floor_by"), "x_floor": d.get("x_floor"),
                "runner_up": rest[0] if rest else None,
                "margin": times[rest[0]] / times[first] - 1 if rest else None,
                "over_baseline": (times["baseline"] / times[first]
                                  if "baseline" in times else None),
                "times_s": times})
    scores = {}
    for v in variants:
        rel = [e["s"] / e["times_s"][v] for e in entries if v in e["times_s"]]
        scores[v] = {"wins": sum(e["variant"] == v for e in entries), "entries": len(rel),
                     "of": len(entries),
                     "geomean": math.exp(sum(map(math.log, rel)) / len(rel)) if rel else None}
    complete = [v for v in variants if entries and scores[v]["entries"] == len(entries)]
    default = max(complete, key=lambda v: scores[v]["geomean"], default=None)
    return {"contender": contender, "entries": entries, "scores": scores, "default": default,
            "disagree": disagree, "rule": WINNER_RULE}
