"""The attention benchmark's sweep: what to measure (``Sweep``), measuring it, the JSON, the figure.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute), and the long sequences of the paper's title. A ``Sweep`` says
what one run measures: the device, the timing method (``fast.measure.timing``:
a fresh process per point and the minimum, or one process and the median), the
dtypes, the (B, H) shapes, the n, the contenders (``fast.measure.contenders``)
and the limits. ``Sweep.defaults(device, same_process)`` gives the three runs
``python -m fast bench`` makes:

* the CPU (``make bench``): float32, (B, H) = (1, 4), d = 64, n = 1024 .. 65536,
  dense, naive, FlexAttention and the structured path, a fresh process per point
  (``FRESH``), so that each peak memory is that point's alone; dense only up to
  n = 32768 (at 65536 one forward + backward takes minutes), naive up to 8192
  and while its mask fits in 3 GiB, FlexAttention at n = 4096 and 16384 only (it
  compiles per n). At n = 16384 dense and the structured path are measured again
  in ONE long-lived process (``SAME``), the process a training loop is: the
  speed-ups and backward / forward ratios of both are reported (docs/design.md,
  sec. 7, says why they differ);
* the same in one process (``--same-process``): every point with ``SAME``;
* CUDA (``make gpu-bench``): float16 and bfloat16, (B, H) = (1, 4) and (4, 16),
  dense, FlexAttention, the structured path and the Triton kernels, with
  ``SAME`` (CUDA events), and one more point, (B, H, n) = (1, 16, 65536), for the
  long-n target; the run starts no new point after 9 minutes. The long sweep
  (``long_ns``, ``make gpu-long``): B = 1, H = 8, l = 256, n = 2^17 .. 2^20, the
  layout build, the first call and the peak memory against the bytes of q, k, v, o.

Every row gets its speed-up over dense measured in the same run, the ideal, the
% of ideal and the floor (``fast.measure.bench.derive``). The run's cost is
estimated before it starts (``estimate``); the JSON is rewritten after every
(dtype, shape), so an interrupted run keeps what it measured. ``run`` returns the
record; ``save`` writes it to ``<out>/data/bench_<device>[_same_process].json``
and draws ``<out>/bench_<...>.png`` (``fast.plots.bench``); ``report`` is the
text a run prints.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fast.core.files import write_json
from fast.layout.costs import DEFAULT_BLOCK, ideal_speedup, tile_flops
from fast.measure import bench, bench_point, contenders
from fast.measure.contenders import DTYPES, LONG_PARAMS, PATTERN_PARAMS, D
from fast.measure.timing import FRESH, SAME, Method, estimate_s, synchronize
from fast.plots.bench import plot, plot_gpu

TARGET_POINT = (1, 16, 65536)     # CUDA: one more point, for the long-n target
LONG_SHAPE = (1, 8)               # (B, H) of the long sweep
ASSUME_TFLOPS = {"cpu": 0.05, "cuda": 300.0}   # dense throughput the estimate assumes
COPY_MIB = {"cpu": 64, "cuda": 1024}           # MiB copied to measure the bandwidth
LONG_LIVED = SAME.with_(min_reps=3)            # the CPU sweep's one-process check


def powers(lo: int, hi: int) -> tuple[int, ...]:
    """The powers of 2 from lo to hi (both rounded down to a power of 2)."""
    return tuple(2 ** e for e in range(int(math.log2(lo)), int(math.log2(hi)) + 1))


@dataclass(frozen=True)
class Sweep:
    """What one benchmark run measures (module docstring); checked when made."""
    device: str = "cpu"                               # "cpu" or "cuda"
    method: Method = FRESH                            # how each point is timed
    dtypes: tuple[str, ...] = ("float32",)            # names of contenders.DTYPES
    shapes: tuple[tuple[int, int], ...] = ((1, 4),)   # (B, H) of the sweep
    ns: tuple[int, ...] = powers(1024, 65536)         # sequence lengths
    contenders: tuple[str, ...] = contenders.default_names("cpu")
    dense_n_max: int | None = 32768                   # None: no limit
    naive_n_max: int | None = 8192
    mask_gb: float = 3.0                              # the naive mask's largest size
    flex_ns: tuple[int, ...] | None = (4096, 16384)   # n FlexAttention runs at (None: all)
    target_points: tuple[tuple[int, int, int], ...] = ()  # (B, H, n) added, first dtype
    same_process_ns: tuple[int, ...] = (16384,)      # FRESH: n measured again in one process
    long_ns: tuple[int, ...] = ()                     # the long sweep (same process only)
    long_dense_n_max: int = 2 ** 19
    max_minutes: float | None = None                  # start no point after this
    point_timeout_s: float = 600.0                    # FRESH: seconds a point may take

    def __post_init__(self):
        def bad(what, given, allowed):
            raise ValueError(f"{what} {given!r}; allowed: {allowed}")

        if self.device not in ("cpu", "cuda"):
            bad("device", self.device, "cpu, cuda")
        if not isinstance(self.method, Method):
            bad("method", self.method, "a fast.measure.timing.Method")
        if not self.dtypes or any(d not in DTYPES for d in self.dtypes):
            bad("dtypes", self.dtypes, f"one or more of {', '.join(DTYPES)}")
        if any(len(s) != 2 or min(s) < 1 for s in self.shapes) or not self.shapes:
            bad("shapes", self.shapes, "(B, H) pairs of positive integers")
        for name in ("ns", "long_ns", "same_process_ns"):
            ns = getattr(self, name)
            if any(n < 1 for n in ns) or list(ns) != sorted(set(ns)):
                bad(name, ns, "positive n in ascending order, each once")
        if not self.contenders or any(c not in contenders.NAMES for c in self.contenders):
            bad("contenders", self.contenders, f"one or more of {', '.join(contenders.NAMES)}")
        if not (self.ns or self.long_ns):
            bad("ns", self.ns, "at least one n (or a long sweep)")
        if self.long_ns and self.method.process != "same":
            bad("long_ns with the method", self.method.process, "the long sweep runs in one "
                "process only: the same-process method")
        if not self.mask_gb >= 0 or (self.max_minutes is not None and not self.max_minutes > 0):
            bad("limits mask_gb, max_minutes", (self.mask_gb, self.max_minutes),
                "mask_gb >= 0 and max_minutes > 0 or None")

    @classmethod
    def defaults(cls, device: str = "cpu", same_process: bool = False, **changes) -> Sweep:
        """The run ``python -m fast bench`` makes on ``device`` (CUDA: always one
        process), with ``changes`` (fields; None keeps the default)."""
        if device == "cuda":
            base = cls(device="cuda", method=SAME, dtypes=("float16", "bfloat16"),
                       shapes=((1, 4), (4, 16)), contenders=contenders.default_names("cuda"),
                       dense_n_max=None, naive_n_max=None, flex_ns=None,
                       target_points=(TARGET_POINT,), same_process_ns=(), max_minutes=9.0)
        elif same_process:
            base = cls(method=SAME, same_process_ns=())
        else:
            base = cls(device=device)
        return dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})

    @property
    def long_lived_ns(self) -> tuple[int, ...]:
        """The n measured again in one process: ``same_process_ns`` among ``ns``, with
        the fresh-process method (the other method measures every n in one process)."""
        if self.method.process != "fresh":
            return ()
        return tuple(n for n in self.same_process_ns if n in self.ns)

    def file_name(self) -> str:
        """bench_cpu, bench_cpu_same_process or bench_cuda."""
        same = self.method.process == "same" and self.device == "cpu"
        return f"bench_{self.device}" + ("_same_process" if same else "")


# ----------------------------------------------------------------------------
# What the sweep measures, and what it costs
# ----------------------------------------------------------------------------

def points(sweep: Sweep) -> list[tuple]:
    """(dtype name, B, H, n) of the sweep, in the order measured."""
    out = [(dt, B, H, n) for dt in sweep.dtypes for (B, H) in sweep.shapes for n in sweep.ns]
    return out + [(sweep.dtypes[0], *p) for p in sweep.target_points]


def skip_reason(sweep: Sweep, name: str, pattern: str | None, dtype: str, H: int,
                n: int) -> str | None:
    """Why the sweep does not measure ``name`` at this point, or None when it does."""
    why = contenders.why_not(name, sweep.device, DTYPES[dtype])
    if why is not None:
        return why
    if name == "dense" and sweep.dense_n_max is not None and n > sweep.dense_n_max:
        return (f"dense causal attention is O(n^2): past --dense-n-max "
                f"{sweep.dense_n_max} one call takes minutes here")
    if name == "naive" and sweep.naive_n_max is not None and n > sweep.naive_n_max:
        return (f"the naive path is O(n^2) and runs the full square: past --naive-n-max "
                f"{sweep.naive_n_max} it would take most of the run")
    if name == "naive" and contenders.mask_bytes(pattern, n, H) > sweep.mask_gb * 2**30:
        return (f"the n x n mask needs {contenders.mask_bytes(pattern, n, H) / 2**30:.1f}"
                f" GiB > --mask-gb {sweep.mask_gb}")
    if name == "flex" and sweep.flex_ns is not None and n not in sweep.flex_ns:
        return "FlexAttention compiles per n (~25 s on a CPU): only run at --flex-n"
    return None


def estimate(sweep: Sweep) -> dict:
    """Measurements and an upper estimate of the sweep's seconds, from its size: each
    measurement at most its first call plus (warm-up + repetitions) calls of t
    seconds, t from the FLOPs at ``ASSUME_TFLOPS``, every contender at most 3x dense
    (3.5x more with the backward), plus 20 s of compilation per dtype and contender."""
    tflops = ASSUME_TFLOPS[sweep.device]
    total = 20.0 * len(sweep.dtypes) * len(sweep.contenders)
    count = 0
    per_point = 1 + len(PATTERN_PARAMS) * (len(sweep.contenders) - 1)
    for _, B, H, n in points(sweep):
        fwd = 2 * B * H * n * n * D / (tflops * 1e12)                      # causal half
        for t in (3 * fwd, 3 * 3.5 * fwd):
            total += per_point * estimate_s(t, sweep.method, first_s=t)
            count += per_point
    for n in sweep.long_ns:
        fwd = 2 * LONG_SHAPE[1] * n * n * D / (tflops * 1e12)
        total += 2 * estimate_s(4.5 * fwd, sweep.method, first_s=5.0)
        count += 4
    return {"measurements": count, "estimate_s": total}


def config(sweep: Sweep) -> dict:
    """The sweep as the JSON records it."""
    out = {k: v for k, v in dataclasses.asdict(sweep).items() if k != "method"}
    B, H = sweep.shapes[0]
    cpu_memory = ("peak RSS above the inputs, fresh process per point"
                  if sweep.method.process == "fresh" else
                  "peak RSS above the inputs, in-process (under-counts)")
    out.update({
        "B": B, "H": H, "d": D, "block": DEFAULT_BLOCK, "patterns": PATTERN_PARAMS,
        "combine": "merged", "long_params": LONG_PARAMS, "long_shape": list(LONG_SHAPE),
        "target_s": sweep.method.target_s,
        "timing": {**dataclasses.asdict(sweep.method), "method": sweep.method.describe()},
        "same_process_timing": ({**dataclasses.asdict(LONG_LIVED),
                                 "method": LONG_LIVED.describe()}
                                if sweep.long_lived_ns else None),
        "memory": ("torch.cuda.max_memory_allocated above the inputs" if sweep.device == "cuda"
                   else cpu_memory)})
    return json.loads(json.dumps(out))               # tuples as lists, as read back


# ----------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------

def _row(name, pattern, dtype, B, H, n) -> dict:
    return {"contender": name, "pattern": pattern, "dtype": dtype, "B": B, "H": H, "n": n}


def _derived(row: dict, dense: dict | None, params: dict, copy_bps: float) -> None:
    """Add the ideal, speed-up, % of ideal, floor (and TFLOP/s of Triton's tiles)."""
    B, H, n, pattern = row["B"], row["H"], row["n"], row["pattern"]
    natural = row["contender"] == "triton natural order"
    ideal = 1.0 if pattern is None else ideal_speedup(pattern, n, H, params)
    row["ideal"] = ideal
    if natural:
        row["ideal_natural_order"] = ideal_speedup(pattern, n, H, params, order="natural")
    for what, key, backward in (("fwd", "fwd_s", False), ("fb", "fb_s", True)):
        if row.get(key):
            dense_s = dense.get(key) if dense else None
            row[what] = bench.derive(row[key], dense_s, ideal,
                                     bench.io_bytes(B, H, n, D, DTYPES[row["dtype"]], backward),
                                     copy_bps)
            if row["contender"].startswith("triton"):
                row[what]["tflops"] = tile_flops(pattern, B, n, H, D, params, backward=backward,
                                                 order="natural" if natural else "structured"
                                                 ) / row[key] / 1e12


def say(row: dict, t0: float) -> str:
    """One line for one measured (or skipped) row."""
    head = (f"[{time.time() - t0:5.0f} s] {row['dtype']} B={row['B']} H={row['H']} "
            f"n={row['n']:6d} {row['pattern'] or '':8} {row['contender']:21}")
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']}"
    cells = []
    for what, key in (("fwd", "fwd_s"), ("fwd+bwd", "fb_s")):
        if row.get(key):
            d = row.get("fwd" if key == "fwd_s" else "fb", {})
            sp = f" {d['speedup']:.2f}x ({d['pct_ideal']:.0f}% of {d['ideal']:.1f}x)" \
                if d.get("speedup") and row["pattern"] else ""
            cells.append(f"{what} {row[key] * 1e3:9.3f} ms{sp}, {d.get('x_floor', 0):.1f}x floor")
    if row.get("bwd_over_fwd"):
        cells.append(f"bwd/fwd {row['bwd_over_fwd']:.2f}")
    return f"{head} {'; '.join(cells)}; first call {row['first_fwd_s']:.2f} s"


@dataclass
class _Run:
    """What every step of a running sweep shares."""
    sweep: Sweep
    copy_bps: float                 # the copy bandwidth measured at the start
    log: Callable[[str], None]
    t0: float = dataclasses.field(default_factory=time.time)

    def spent(self) -> str | None:
        """Why no new point starts: the time budget is spent; None while it is not."""
        minutes = self.sweep.max_minutes
        if minutes and time.time() > self.t0 + 60 * minutes:
            return f"--max-minutes {minutes} spent before this point"
        return None

    def skip(self, name: str, pattern: str | None, dtype: str, H: int, n: int) -> str | None:
        """``skip_reason``, or the time budget spent."""
        return skip_reason(self.sweep, name, pattern, dtype, H, n) or self.spent()

    def say(self, row: dict, suffix: str = "") -> None:
        self.log(say(row, self.t0) + suffix)


def run(sweep: Sweep, save=None, log=print) -> dict:
    """Measure the sweep; returns the record the JSON holds. ``save(data)`` is called
    after every (dtype, shape) with what is measured so far; ``log`` gets one line per
    row."""
    t0 = time.time()
    info = bench.machine_info(sweep.device)
    info["loadavg_start"] = os.getloadavg()
    info["timer"] = "cuda events" if sweep.device == "cuda" else "perf_counter"
    try:
        import triton  # optional dependency
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    cost = estimate(sweep)
    log(f"sweep: {len(points(sweep))} points, {cost['measurements']} measurements, "
        f"{sweep.method.describe()}; estimated at most {cost['estimate_s'] / 60:.1f} min "
        f"(dense at {ASSUME_TFLOPS[sweep.device]} TFLOP/s, every contender at most 3x dense)")
    copy = bench_point.copy_bandwidth(sweep.device, COPY_MIB[sweep.device] * 2**20, SAME)
    state = _Run(sweep, copy["bytes_per_s"], log, t0)
    data = {"machine": info, "config": config(sweep), "estimate": cost,
            "calibration": {"copy": copy, "sdpa_backend": {}}, "results": [], "long": []}
    last = None
    for dt, B, H, n in points(sweep):
        if save is not None and last not in (None, (dt, B, H)):
            save(data)
        last = (dt, B, H)
        if dt not in data["calibration"]["sdpa_backend"]:
            q, k, v, _ = bench_point.inputs(B, H, n, D, sweep.device, DTYPES[dt])
            data["calibration"]["sdpa_backend"][dt] = contenders.sdpa_backend(q, k, v)
            del q, k, v
        data["results"] += run_point(state, dt, B, H, n)
    for key, part, wanted in (("same_process", run_long_lived, sweep.long_lived_ns),
                              ("long", run_long, sweep.long_ns)):
        if wanted:
            if save is not None:
                save(data)
            data[key] = part(state)
    info["loadavg_end"] = os.getloadavg()
    info["wall_s"] = time.time() - t0
    data["targets"] = targets(data)
    return data


def run_point(state: _Run, dt: str, B: int, H: int, n: int) -> list[dict]:
    """Every contender at one (dtype, B, H, n): dense first, then each pattern's; a row
    each, measured by the sweep's method or skipped with the reason."""
    sweep, rows, dense = state.sweep, [], None
    for pattern, params in [(None, {})] + list(PATTERN_PARAMS.items()):
        for name in sweep.contenders:
            if (name == "dense") != (pattern is None):
                continue
            row = _row(name, pattern, dt, B, H, n)
            reason = state.skip(name, pattern, dt, H, n)
            if reason is not None:
                row["skipped"] = reason
            else:
                start = time.time()
                row.update(bench_point.run(bench_point.spec(
                    name, pattern, params, B, H, n, sweep.device, dt, sweep.method),
                    sweep.method, timeout=sweep.point_timeout_s))
                row["wall_s"] = time.time() - start
                if "skipped" not in row:
                    _derived(row, row if name == "dense" else dense, params, state.copy_bps)
            if name == "dense":
                dense = row
            rows.append(row)
            state.say(row)
    return rows


def run_long_lived(state: _Run) -> list[dict]:
    """Dense and the structured path (those of them the sweep measures) at
    ``long_lived_ns``, every one in ONE fresh process, one after another
    (``LONG_LIVED``): the state of a process that has run attention before, as a
    training loop's is."""
    sweep, rows, specs = state.sweep, [], []
    for dt in sweep.dtypes:
        for (B, H) in sweep.shapes:
            for n in sweep.long_lived_ns:
                for pattern, params in [(None, {})] + list(PATTERN_PARAMS.items()):
                    name = "dense" if pattern is None else "structured"
                    if name not in sweep.contenders:
                        continue
                    row = _row(name, pattern, dt, B, H, n)
                    reason = state.skip(name, pattern, dt, H, n)
                    if reason is not None:
                        row["skipped"] = reason
                    else:
                        specs.append((row, bench_point.spec(
                            name, pattern, params, B, H, n, sweep.device, dt, LONG_LIVED)))
                    rows.append(row)
    if specs:
        measured = bench_point.run([s for _, s in specs], FRESH,
                                   timeout=sweep.point_timeout_s * len(specs))
        for (row, _), res in zip(specs, measured):
            row.update(res)
    for row in rows:
        if "skipped" not in row:
            dense = bench.find(rows, contender="dense", dtype=row["dtype"], B=row["B"],
                               H=row["H"], n=row["n"])
            _derived(row, dense, PATTERN_PARAMS.get(row["pattern"], {}), state.copy_bps)
        state.say(row, " (one process)")
    return rows


def run_long(state: _Run) -> list[dict]:
    """B = 1, H = 8, l = 256: the layout build, first call, steady times and peak memory
    of the Triton kernel (and dense up to ``long_dense_n_max``) at ``long_ns``."""
    sweep, rows = state.sweep, []
    B, H = LONG_SHAPE
    dt = sweep.dtypes[0]
    dtype = DTYPES[dt]
    for n in sweep.long_ns:
        q, k, v, g = bench_point.inputs(B, H, n, D, sweep.device, dtype)
        dense = None
        for pattern, params in [(None, {})] + list(LONG_PARAMS.items()):
            name = "dense" if pattern is None else "triton block-sparse"
            row = _row(name, pattern, dt, B, H, n)
            row["qkvo_bytes"] = 4 * q.numel() * q.element_size()
            if pattern is None and n > sweep.long_dense_n_max:
                why = f"dense past the long sweep's {sweep.long_dense_n_max}"
            else:
                why = contenders.why_not(name, sweep.device, dtype) or state.spent()
            if why is not None:
                row["skipped"] = why
            else:
                fn = contenders.build(pattern or "strided", params, H, sweep.device, dtype,
                                      names=[name])[name]
                if pattern is not None:
                    row["layout_s"] = _layout_seconds(pattern, n, H, params, sweep.device)
                row.update(bench_point.measure(fn, q, k, v, g, sweep.method))
                if "skipped" not in row:
                    _derived(row, row if pattern is None else dense, params, state.copy_bps)
                    if row.get("peak_fb_bytes") is not None:
                        row["peak_fb_over_qkvo"] = row["peak_fb_bytes"] / row["qkvo_bytes"]
            if pattern is None:
                dense = row
            rows.append(row)
            state.say(row)
        del q, k, v, g
    return rows


def _layout_seconds(pattern, n, H, params, device) -> float:
    """Seconds to build the kernel's layout and write its tables on ``device`` (the
    cache emptied before and after: the first call builds it again)."""
    from fast.kernels.triton_attention import cached_layout, clear_layout_cache  # optional

    clear_layout_cache()
    synchronize(device)
    t = time.perf_counter()
    cached_layout(pattern, n, H, "merged", 0, params, DEFAULT_BLOCK, device)
    synchronize(device)
    seconds = time.perf_counter() - t
    clear_layout_cache()
    return seconds


def targets(data: dict) -> dict:
    """The CPU targets per dtype (``fast.measure.bench.summarize``; with the one-process
    check's speed-ups and backward / forward ratios beside them, keys ending in
    "_same_process"), or on CUDA the GPU goals (``fast.measure.bench.gpu_targets``)."""
    if data["config"]["device"] == "cuda":
        return bench.gpu_targets(data["results"])
    out = {}
    for dt in data["config"]["dtypes"]:
        out[dt] = bench.summarize(data["results"], dt)
        if data.get("same_process"):
            once = bench.summarize(data["same_process"], dt)
            out[dt].update({f"{k}_same_process": v for k, v in once.items()
                            if k.endswith("_16384")})
    return out


# ----------------------------------------------------------------------------
# The record: JSON, figure, text
# ----------------------------------------------------------------------------

def paths(sweep: Sweep, out: Path) -> tuple[Path, Path]:
    """(the JSON, the figure) a sweep writes under ``out``."""
    return out / "data" / f"{sweep.file_name()}.json", out / f"{sweep.file_name()}.png"


def draw(sweep: Sweep, data: dict, png: Path) -> Path:
    """The figure of a record of ``sweep``'s kind: the CPU's time panels for a
    fresh-process run, the GPU's (times, speed-up against the ideal, the long sweep)
    for a one-process run."""
    return (plot_gpu if sweep.method.process == "same" else plot)(data, png)


def measure_and_save(sweep: Sweep, out: Path, log=print) -> tuple[dict, Path, Path]:
    """``run`` the sweep, rewriting its JSON under ``out`` as it goes; then the figure.
    Returns (the record, the JSON's path, the figure's path)."""
    path, png = paths(sweep, out)
    data = run(sweep, save=lambda d: write_json(path, d, indent=1), log=log)
    write_json(path, data, indent=1)
    draw(sweep, data, png)
    return data, path, png


def report(data: dict) -> str:
    """What a run prints at its end: per dtype and shape, each contender's time,
    speed-up over dense and backward / forward ratio for every n; then the targets."""
    lines = []
    rows = data["results"]
    for dt in data["config"]["dtypes"]:
        for B, H in data["config"]["shapes"]:
            sel = [r for r in rows if r["dtype"] == dt and (r.get("B"), r.get("H")) in
                   ((B, H), (None, None))]
            if sel:
                lines += _table(sel, f"{dt}, B={B}, H={H}")
    if data.get("same_process"):
        lines += _table(data["same_process"], "the same points in ONE process (the median "
                                              "after warm-up calls)")
    t = data.get("targets", {})
    if data["config"]["device"] == "cuda":
        lines += ["", "targets (float16, Triton block-sparse vs dense causal SDPA, same run):"]
        for key, g in t.items():
            got = "not measured" if g["speedup"] is None else (
                f"{g['speedup']:.2f}x ({g['pct_ideal']:.0f}% of ideal, {g['x_floor']:.1f}x "
                f"floor)")
            lines.append(f"  {key:34} goal >= {g['goal']:>4}x: {got}")
    else:
        for dt, values in t.items():
            lines += ["", f"targets ({dt}):"]
            lines += [f"  {k:44} {v if v is None else round(v, 3)}" for k, v in values.items()]
    cal = data["calibration"]
    lines += [f"dense SDPA backend: {cal['sdpa_backend']}; copy bandwidth "
              f"{cal['copy']['bytes_per_s'] / 1e9:.3g} GB/s",
              "Read % of ideal (tile count) and x floor (bytes at the copy bandwidth, tiles at "
              "dense's throughput); first calls (compile, layout, mask) are apart in "
              "first_fwd_s."]
    return "\n".join(lines)


def _table(rows: list[dict], title: str) -> list[str]:
    """Time (ms) and speed-up over dense, one column per n; the backward / forward time
    ratio and the peak memory (MiB, forward+backward or forward) below."""
    ns = sorted({r["n"] for r in rows})
    out = ["", f"{title}: time (ms) and speed-up over dense causal SDPA; bwd/fwd = "
               f"(fwd+bwd - fwd) / fwd; peak memory MiB (forward+backward, or forward)",
           f"{'pattern':8} {'contender':32} " + " ".join(f"{n:>17}" for n in ns)]
    for pattern in PATTERN_PARAMS:
        for name in bench.contender_names(rows, pattern):
            for what in ("fwd_s", "fb_s", "bwd_over_fwd", "peak"):
                cells = []
                for n in ns:
                    r = bench.entry(rows, name, pattern, n) or {}
                    d = bench.find(rows, contender="dense", n=n) or {}
                    if what == "peak":
                        m = r.get("peak_fb_bytes") or r.get("peak_fwd_bytes")
                        cells.append(f"{m / 2**20:17.0f}" if m is not None else f"{'-':>17}")
                    elif not r.get(what) or "skipped" in r:
                        cells.append(f"{'-':>17}")
                    elif what == "bwd_over_fwd":
                        cells.append(f"{r[what]:17.2f}")
                    else:
                        sp = f"{d[what] / r[what]:5.1f}x" if d.get(what) else "   -  "
                        cells.append(f"{r[what] * 1e3:9.1f} {sp:>7}")
                label = {"fwd_s": "fwd", "fb_s": "fwd+bwd", "bwd_over_fwd": "bwd/fwd",
                         "peak": "peak MiB"}[what]
                out.append(f"{pattern:8} {name + ' ' + label:32} " + " ".join(cells))
    return out
