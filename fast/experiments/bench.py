"""The attention benchmark's run: measuring a ``Sweep``, its record, the JSON, the figure.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute). ``run`` measures what a ``fast.experiments.bench_sweep.Sweep``
asks for, point after point (``fast.measure.bench_point``: in a fresh process per
point or in this one, by the sweep's method), then the CPU sweep's long-lived
check and the long sweep; every row gets its speed-up over dense measured in the
same run, the ideal, the % of ideal and the floor (``fast.measure.bench.derive``),
and the record its targets. The JSON is rewritten after every row, so an
interrupted run keeps what it measured; the record says whether its sweep ended:
"complete" is false while it runs (and so in what an interrupted run leaves), true once
every part is measured (a record from before the key counts as complete).
``python -m fast bench --replot`` and ``python -m fast results`` say in one line when
a record is incomplete (``incomplete``) instead of using it silently.
``measure_and_save`` writes the record to
``<out>/data/bench_<device>[_same_process].json`` and draws ``<out>/bench_<...>.png``
(``fast.plots.bench``); ``report`` is the text a run prints.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fast.backends.crossovers import CROSSOVERS
from fast.core.schema import Map, OneOf, Optional
from fast.experiments.bench_sweep import (
    ASSUME_TFLOPS,
    COPY_MIB,
    LONG_LIVED,
    LONG_SHAPE,
    Sweep,
    config,
    estimate,
    points,
    skip_reason,
)
from fast.experiments.provenance import write_result
from fast.layout.costs import DEFAULT_BLOCK, ideal_speedup, tile_flops
from fast.measure import bench, bench_point, compile_step, contenders, crossover, host_cost
from fast.measure.child import run_child
from fast.measure.contenders import DTYPES, LONG_PARAMS, PATTERN_PARAMS, D
from fast.measure.timing import FRESH, SAME, synchronize
from fast.plots.bench import plot, plot_gpu

# ----------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------

def _row(name, pattern, dtype, B, H, n, variant=None) -> dict:
    row = {"contender": name, "pattern": pattern, "dtype": dtype, "B": B, "H": H, "n": n}
    if variant is not None:
        row["variant"] = variant
    return row


def _name(row: dict) -> str:
    """The contender, and its kernel variant where it has one."""
    return row["contender"] + (f" ({row['variant']})" if row.get("variant") else "")


def _derived(row: dict, dense: dict | None, params: dict, copy_bps: float) -> None:
    """Add the ideal, speed-up, % of ideal, floor (and TFLOP/s of Triton's tiles)."""
    B, H, n, pattern = row["B"], row["H"], row["n"], row["pattern"]
    natural = row["contender"] == "triton natural order"
    tiles = row["contender"].startswith("triton")       # what it computes in: tiles or pairs
    work = "tiles" if tiles else "pairs"
    ideal = (1.0 if pattern is None else ideal_speedup(pattern, n, H, params) if tiles
             else bench.keys_read_ideal(pattern, n, **params))
    row["ideal"], row["ideal_by"] = ideal, work
    if natural:
        row["ideal_natural_order"] = ideal_speedup(pattern, n, H, params, order="natural")
    for what, key, backward in (("fwd", "fwd_s", False), ("fb", "fb_s", True)):
        if row.get(key):
            dense_s = dense.get(key) if dense else None
            row[what] = bench.derive(row[key], dense_s, ideal,
                                     bench.io_bytes(B, H, n, D, DTYPES[row["dtype"]], backward),
                                     copy_bps, work)
            if row["contender"].startswith("triton"):
                row[what]["tflops"] = tile_flops(pattern, B, n, H, D, params, backward=backward,
                                                 order="natural" if natural else "structured"
                                                 ) / row[key] / 1e12


def say(row: dict, t0: float) -> str:
    """One line for one measured (or skipped) row."""
    head = (f"[{time.time() - t0:5.0f} s] {row['dtype']} B={row['B']} H={row['H']} "
            f"n={row['n']:6d} {row['pattern'] or '':8} {_name(row):30}")
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']}"
    cells = []
    for what, key in (("fwd", "fwd_s"), ("fwd+bwd", "fb_s")):
        if row.get(key):
            d = row.get("fwd" if key == "fwd_s" else "fb", {})
            sp = f" {d['speedup']:.2f}x ({d['pct_ideal']:.0f}% of {d['ideal']:.1f}x)" \
                if d.get("speedup") and row["pattern"] else ""
            floor = (f", floor {d['floor_s'] * 1e3:.3f} ms ({d['floor_by']}) "
                     f"{d['x_floor']:.1f}x" if d.get("floor_s") else "")
            cells.append(f"{what} {row[key] * 1e3:9.3f} ms{sp}{floor}")
    if row.get("bwd_over_fwd"):
        cells.append(f"bwd/fwd {row['bwd_over_fwd']:.2f}")
    capped = f"; capped: {row['capped']}" if row.get("capped") else ""
    return f"{head} {'; '.join(cells)}; first call {row['first_fwd_s']:.2f} s{capped}"


@dataclass
class _Run:
    """What every step of a running sweep shares."""
    sweep: Sweep
    copy_bps: float                 # the copy bandwidth measured at the start
    log: Callable[[str], None]
    t0: float = dataclasses.field(default_factory=time.time)
    emit: Callable[[dict], None] = lambda row: None   # a measured row: into the record
    capped: dict = dataclasses.field(default_factory=dict)  # (contender, ...) -> row capped

    def spent(self) -> str | None:
        """Why no new point starts: the time budget is spent; None while it is not."""
        minutes = self.sweep.max_minutes
        if minutes and time.time() > self.t0 + 60 * minutes:
            return f"--max-minutes {minutes} spent before this point"
        return None

    def skip(self, name: str, pattern: str | None, dtype: str, H: int, n: int,
             B: int = 1, variant: str | None = None) -> str | None:
        """``skip_reason``, the time budget spent, or the contender's time cap passed at a
        smaller n of this dtype, shape and pattern (a longer call would pass it too)."""
        why = skip_reason(self.sweep, name, pattern, dtype, H, n) or self.spent()
        capped = self.capped.get((name, variant, pattern, dtype, B, H))
        if why is None and capped is not None:
            why = (f"capped at n={capped['n']} ({capped['capped']}): not run at a larger n")
        return why

    def say(self, row: dict, suffix: str = "") -> None:
        self.log(say(row, self.t0) + suffix)


def run(sweep: Sweep, save=None, log=print) -> dict:
    """Measure the sweep; returns the record the JSON holds. ``save(data)`` is called
    after every row with what is measured so far; ``log`` gets one line per row (and,
    in one process, one as each measurement starts)."""
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
    data = {"machine": info, "config": config(sweep), "estimate": cost, "complete": False,
            "calibration": {"copy": copy, "sdpa_backend": {}}, "results": [], "long": []}

    def keep():
        if sweep.variants:
            data["winners"] = bench.winners(data["results"])
        if save is not None:
            save(data)

    def emit(row):
        data["results"].append(row)
        keep()

    state = _Run(sweep, copy["bytes_per_s"], log, t0, emit)
    for dt, B, H, n in points(sweep):
        if dt not in data["calibration"]["sdpa_backend"]:
            q, k, v, _ = bench_point.inputs(B, H, n, D, sweep.device, DTYPES[dt])
            data["calibration"]["sdpa_backend"][dt] = contenders.sdpa_backend(q, k, v)
            del q, k, v
        run_point(state, dt, B, H, n)
    for key, part, wanted in (("same_process", run_long_lived, sweep.long_lived_ns),
                              ("pieces", run_pieces, sweep.long_lived_ns
                               and "structured" in sweep.contenders),
                              ("long", run_long, sweep.long_ns)):
        if wanted:
            keep()
            data[key] = part(state)
    info["loadavg_end"] = os.getloadavg()
    info["wall_s"] = time.time() - t0
    data["targets"] = targets(data)
    if sweep.variants:
        data["winners"] = bench.winners(data["results"])
    data["complete"] = True
    return data


def incomplete(data: dict) -> str | None:
    """Words saying that ``data`` is the record of a sweep that did not end (an
    interrupted run: "complete" false), or None."""
    if data.get("complete") is False:
        return ("incomplete (\"complete\": false): its run was interrupted, only part of "
                "the sweep was measured and it has no targets; run python -m fast bench "
                "again for a whole record")
    return None


def run_point(state: _Run, dt: str, B: int, H: int, n: int) -> list[dict]:
    """Every contender at one (dtype, B, H, n): dense first, then each pattern's (a
    Triton contender once per kernel variant, ``Sweep.variants_of``); a row each,
    measured by the sweep's method or skipped with the reason, given to ``state.emit``
    as it is done (the JSON is rewritten then). Returns the rows. A row whose
    measurement passed the method's time cap (``capped``) keeps that contender from the
    larger n of its dtype, shape and pattern."""
    sweep, rows, dense = state.sweep, [], None
    for pattern, params in [(None, {})] + list(PATTERN_PARAMS.items()):
        for name in sweep.contenders:
            if (name == "dense") != (pattern is None):
                continue
            check = _Agreement(sweep, name, pattern, params, dt, B, H, n)
            for variant in sweep.variants_of(name):
                row = _row(name, pattern, dt, B, H, n, variant)
                reason = state.skip(name, pattern, dt, H, n, B, variant)
                if reason is not None:
                    row["skipped"] = reason
                else:
                    if sweep.method.process == "same":
                        state.log(f"[{time.time() - state.t0:5.0f} s] {dt} B={B} H={H} "
                                  f"n={n:6d} {pattern or '':8} {_name(row):30} started")
                    start = time.time()
                    row.update(bench_point.run(bench_point.spec(
                        name, pattern, params, B, H, n, sweep.device, dt, sweep.method,
                        variant), sweep.method, timeout=sweep.point_timeout_s))
                    row["wall_s"] = time.time() - start
                    if "skipped" not in row:
                        _derived(row, row if name == "dense" else dense, params,
                                 state.copy_bps)
                        check(row)
                    why = row.get("capped") or (row["skipped"] if str(
                        row.get("skipped", "")).startswith("capped: ") else None)
                    if why is not None:
                        state.capped[(name, variant, pattern, dt, B, H)] = {"n": n,
                                                                            "capped": why}
                if name == "dense":
                    dense = row
                rows.append(row)
                state.say(row)
                state.emit(row)
    return rows


class _Agreement:
    """The variant sweep's check that every kernel variant computes what the first one
    measured does (``reference``; the baseline when it is swept): each variant's output
    and q, k, v gradients on the point's inputs against the reference's, as
    ``row["agreement"] = {"reference", "max_rel_diff"}`` (``bench_point.max_rel_diff``;
    ``fast.measure.bench.winners`` leaves out a variant past ``AGREE``). A sanity check at
    the measured shape; the proof is the gpu tests' (docs/gpu.md)."""

    def __init__(self, sweep: Sweep, name, pattern, params, dt, B, H, n):
        self.on = len(sweep.variants_of(name)) > 1
        self.contender = (pattern, params, H, sweep.device, DTYPES[dt], name)
        self.shape = (B, H, n)
        self.reference = None                       # (variant, its outputs)

    def __call__(self, row: dict) -> None:
        if not self.on:
            return
        pattern, params, H, device, dtype, name = self.contender
        try:
            fn = contenders.build(pattern, params, H, device, dtype, names=[name],
                                  variant=row["variant"])[name]
            got = bench_point.outputs(fn, *bench_point.inputs(*self.shape, D, device, dtype))
        except Exception as err:                    # recorded: the variant is left out
            row["agreement"] = {"reference": None, "error": f"{type(err).__name__}: {err}"[:200]}
            return
        if self.reference is None:
            self.reference = (row["variant"], got)
        row["agreement"] = {"reference": self.reference[0],
                            "max_rel_diff": bench_point.max_rel_diff(got, self.reference[1])}


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


def run_pieces(state: _Run) -> list[dict]:
    """Where the structured path's time goes at ``long_lived_ns``: each pattern's pieces,
    glue and whole call beside dense (``fast.measure.pieces.piece_times``: minimum of
    interleaved rounds), all in ONE fresh process after the sweep (docs/design.md §5)."""
    sweep = state.sweep
    specs = [dict(pattern=pattern, n=n, B=B, H=H, d=D, stride=params["stride"],
                  c=params.get("c"), dtype=dt)
             for dt in sweep.dtypes for (B, H) in sweep.shapes for n in sweep.long_lived_ns
             for pattern, params in PATTERN_PARAMS.items()]
    out = run_child("fast.measure.pieces:measure_specs", specs,
                    timeout=sweep.point_timeout_s * len(specs))
    if "error" in out:
        state.log(f"pieces: skipped ({out['error']})")
        return [{**spec, "skipped": out["error"]} for spec in specs]
    rows = [{**spec, **times} for spec, times in zip(specs, out["result"])]
    for r in rows:
        state.log(f"pieces: {r['dtype']} B={r['B']} H={r['H']} n={r['n']} {r['pattern']}: "
                  + ", ".join(f"{p['piece']} fwd {p['fwd_s'] * 1e3:.1f} ms bwd "
                              f"{p['bwd_s'] * 1e3:.1f} ms" for p in r["pieces"])
                  + f"; whole fwd {r['whole']['fwd_s'] * 1e3:.1f} ms fwd+bwd "
                    f"{r['whole']['fb_s'] * 1e3:.1f} ms")
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
            row = _row(name, pattern, dt, B, H, n, sweep.variants_of(name)[0])
            row["qkvo_bytes"] = 4 * q.numel() * q.element_size()
            if pattern is None and n > sweep.long_dense_n_max:
                why = f"dense past the long sweep's {sweep.long_dense_n_max}"
            else:
                why = contenders.why_not(name, sweep.device, dtype) or state.spent()
            if why is not None:
                row["skipped"] = why
            else:
                fn = contenders.build(pattern or "strided", params, H, sweep.device, dtype,
                                      names=[name], variant=row.get("variant"))[name]
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


# What the figures read from a record (``--replot`` checks a saved JSON against it first,
# ``fast.core.schema``): every row names its contender, pattern, n and dtype.
RECORD = {"machine": Map(object), "config": Map(object), "complete": Optional(bool),
          "results": [{"contender": str, "pattern": OneOf(str, None), "n": int, "dtype": str}]}


def draw(sweep: Sweep, data: dict, png: Path) -> Path:
    """The figure of a record of ``sweep``'s kind: the CPU's time panels for a
    fresh-process run, the GPU's (times, speed-up against the ideal, the long sweep)
    for a one-process run."""
    return (plot_gpu if sweep.method.process == "same" else plot)(data, png)


def measure_and_save(sweep: Sweep, out: Path, log=print) -> tuple[dict, Path, Path | None]:
    """``run`` the sweep, rewriting its JSON under ``out`` as it goes; then the figure
    (none for the variant sweep: its table and winners are printed). Returns (the record,
    the JSON's path, the figure's path or None)."""
    path, png = paths(sweep, out)
    data = run(sweep, save=lambda d: write_result(path, d, indent=1), log=log)
    write_result(path, data, indent=1)
    if sweep.variants:
        return data, path, None
    draw(sweep, data, png)
    return data, path, png


def measure_crossover(out: Path, quick: bool = False, log=print) -> tuple[dict, Path]:
    """auto's crossover on the CPU (``fast.measure.crossover.sweep``: the naive and the
    structured path in turns at short n, every stride and pattern), with the machine and
    the load average before and after, written to ``<out>/data/auto_cpu.json`` -- the
    measurement behind the constants of ``fast.backends.crossovers``, which
    ``crossover_report`` proposes. ``quick``: two rounds instead of five. Returns (the
    record, its path)."""
    info = bench.machine_info("cpu")
    info["loadavg_start"] = os.getloadavg()
    t0 = time.time()
    data = {"machine": info, **crossover.sweep(rounds=2 if quick else 5, log=log)}
    info["loadavg_end"], info["wall_s"] = os.getloadavg(), time.time() - t0
    path = out / "data" / "auto_cpu.json"
    write_result(path, data, indent=1)
    return data, path


def crossover_report(data: dict) -> str:
    """The crossovers of a ``measure_crossover`` record, one line per pattern and stride."""
    lines = [f"auto on the CPU: the naive path below n = X, the structured path from X on "
             f"(B={data['config']['B']}, H={data['config']['H']}, d={data['config']['d']}, "
             f"{data['config']['dtype']}, {data['config']['threads']} threads; regret: how "
             f"much slower than the faster path auto is at its worst measured n)"]
    for pattern, strides in data["crossover"].items():
        for stride, e in strides.items():
            lines.append(f"  {pattern:8} l={stride:>4}: forward X = {e['fwd']:5d} (regret "
                         f"{e['regret_fwd']:.1%}), forward+backward X = {e['fb']:5d} (regret "
                         f"{e['regret_fb']:.1%})")
    tolerance = data["config"]["tolerance"]
    over = [f"{pattern} l={stride} {what} ({e['regret_' + what]:.1%})"
            for pattern, strides in data["crossover"].items()
            for stride, e in strides.items() for what in ("fwd", "fb")
            if e["regret_" + what] > tolerance]
    proposed = {p: {s: {w: e[w] for w in crossover.PASSES} for s, e in strides.items()}
                for p, strides in data["crossover"].items()}
    if proposed == CROSSOVERS:
        lines.append("  the same as auto's constants (fast/backends/crossovers.py)")
    else:
        lines.append("  auto's constants (fast/backends/crossovers.py) differ: to adopt these, "
                     "commit this record with")
        lines += ["    " + line for line in crossover.proposal(proposed).splitlines()]
    lines.append(f"  over the tolerance of {tolerance:.0%}: " + (", ".join(over) or "none"))
    return "\n".join(lines)


def measure_compile(out: Path, quick: bool = False, log=print) -> tuple[dict, Path]:
    """A small GPT's training step eager against ``torch.compile`` on the CPU
    (``fast.measure.compile_step.step_times``: in turns, one process), with the machine
    and the load average before and after, written to ``<out>/data/compile_cpu.json``
    with the ratios compiled / eager per pattern and n. ``quick``: n = 256 only, two
    rounds. One intra-op thread: on a shared machine two threads spin while they wait for
    each other's core, and a step's time then follows the other jobs more than its own
    work (table2's profile runs one thread for the same reason). Returns (the record,
    its path)."""
    info = bench.machine_info("cpu")
    info["loadavg_start"] = os.getloadavg()
    t0 = time.time()
    timed = compile_step.step_times(ns=(256,) if quick else (256, 1024),
                                    rounds=2 if quick else 7, threads=1, log=log)
    ratios: dict = {}
    for row in timed["results"]:
        ratios.setdefault(row["pattern"], {})[str(row["n"])] = row["ratio"]
    data = {"machine": info, **timed, "ratios": ratios}
    info["loadavg_end"], info["wall_s"] = os.getloadavg(), time.time() - t0
    path = out / "data" / "compile_cpu.json"
    write_result(path, data, indent=1)
    return data, path


def compile_report(data: dict) -> str:
    """The ratios of a ``measure_compile`` record, one line per pattern."""
    c = data["config"]
    lines = [f"a training step compiled / eager on the CPU (d={c['d_model']}, "
             f"{c['n_layers']} layers, {c['n_heads']} heads, batch {c['batch']}, backend "
             f"{c['backend']!r}, {c['threads']} threads, {c['compiler']}; below 1: compiled "
             f"is faster)"]
    for pattern, by_n in data["ratios"].items():
        lines.append(f"  {pattern:8} " + ", ".join(f"n={n}: {r:.3f}" for n, r in by_n.items()))
    return "\n".join(lines)


def measure_host_cost(out: Path, quick: bool = False, log=print) -> tuple[dict, Path]:
    """The host's cost per attention call (``fast.measure.host_cost``: Triton's launches
    stubbed, ops counted), measured in a fresh process with TRITON_INTERPRET=1 (set before
    Triton is imported, as the interpreter needs), with the machine and the load average
    before and after, written to ``<out>/data/host_cost_cpu.json``. ``quick``: 300 timed
    calls per measurement instead of 2000. Returns (the record, its path)."""
    info = bench.machine_info("cpu")
    info["loadavg_start"] = os.getloadavg()
    t0 = time.time()
    log("host cost per call: the Triton path with its launches stubbed, the structured "
        "path, dense SDPA and the model's attention layer (a fresh process)")
    got = run_child("fast.measure.host_cost:measure", {"calls": 300 if quick else 2000},
                    timeout=1800, env={"TRITON_INTERPRET": "1"})
    if "error" in got:
        raise RuntimeError(f"the host-cost measurement {got['error']}\n{got['output']}")
    data = {"machine": info, **got["result"]}
    info["loadavg_end"], info["wall_s"] = os.getloadavg(), time.time() - t0
    path = out / "data" / "host_cost_cpu.json"
    write_result(path, data, indent=1)
    return data, path


host_cost_report = host_cost.report


def report(data: dict) -> str:
    """What a run prints at its end: per dtype and shape, each contender's time,
    speed-up over dense and backward / forward ratio for every n (the variant sweep:
    ``variant_report``); then the targets."""
    lines = []
    rows = data["results"]
    if data["config"].get("variants"):
        lines += variant_report(data)
    else:
        lines += _tables(rows, data["config"], "")
    if data.get("same_process"):
        lines += _tables(data["same_process"], data["config"], ": the same points in ONE "
                                                               "process (the median after "
                                                               "warm-up calls)")
    t = data.get("targets", {})
    if data["config"]["device"] == "cuda":
        lines += ["", "targets (float16, Triton block-sparse vs dense causal SDPA, same run):"]
        for key, g in t.items():
            got = "not measured" if g["speedup"] is None else (
                f"{g['speedup']:.2f}x ({g['pct_ideal']:.0f}% of ideal, {g['x_floor']:.1f}x "
                f"floor)")
            by = f" ({g['variant']})" if g.get("variant") else ""
            lines.append(f"  {key:34} goal >= {g['goal']:>4}x: {got}{by}")
    elif not data["config"].get("variants"):          # the CPU's targets need its sweep
        for dt, values in t.items():
            lines += ["", f"targets ({dt}):"]
            lines += [f"  {k:44} {v if v is None else round(v, 3)}" for k, v in values.items()]
    cal = data["calibration"]
    lines += [f"dense SDPA backend: {cal['sdpa_backend']}; copy bandwidth "
              f"{cal['copy']['bytes_per_s'] / 1e9:.3g} GB/s",
              "Read % of ideal (Triton: its tile count; others: the pairs the pattern reads) "
              "and x floor (bytes at the copy bandwidth, that work at dense's rate); first "
              "calls (compile, layout, mask) are apart in first_fwd_s."]
    return "\n".join(lines)


def _tables(rows: list[dict], config: dict, title: str) -> list[str]:
    """One ``_table`` per dtype and shape of the sweep (``config``), each of its own rows
    only (a speed-up divides by the dense row of the same dtype, B and H)."""
    lines = []
    for dt in config["dtypes"]:
        for B, H in config["shapes"]:
            sel = [r for r in rows if r["dtype"] == dt and (r.get("B"), r.get("H")) in
                   ((B, H), (None, None))]
            if sel:
                lines += _table(sel, f"{dt}, B={B}, H={H}{title}")
    return lines


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


def variant_report(data: dict) -> list[str]:
    """The variant sweep's table: per point and pattern, each contender (the Triton
    ones per kernel variant) forward and forward+backward: time, speed-up over dense,
    % of ideal, floor (ms, and what sets it) and time / floor, the first call, and the
    largest relative difference from the reference variant ("vs ref"); then the
    winners per point, pattern and part, the variants left out, and the variant to make
    the default (``bench.winners``)."""
    rows, lines = data["results"], []
    keys = list(dict.fromkeys((r["dtype"], r["B"], r["H"], r["n"]) for r in rows))
    head = (f"  {'contender (variant)':36} " + " | ".join(
        f"{what + ' ms':>10} {'speed-up':>8} {'% ideal':>7} {'floor ms':>15} {'x floor':>7}"
        for what in ("fwd", "fwd+bwd")) + f" | {'first s':>7} | {'vs ref':>7}")
    for dt, B, H, n in keys:
        here = [r for r in rows if (r["dtype"], r["B"], r["H"], r["n"]) == (dt, B, H, n)]
        for pattern in PATTERN_PARAMS:
            sel = [r for r in here if r["pattern"] in (None, pattern)]
            ideals = {(r.get("ideal_by", "tiles"), r["ideal"]) for r in sel
                      if r["pattern"] and r.get("ideal")}       # tiles (Triton), pairs
            settings = ", ".join(f"{k}={v}" for k, v in PATTERN_PARAMS[pattern].items())
            lines += ["", f"{dt}, B={B}, H={H}, n={n}, {pattern} ({settings}); ideal "
                          + (", ".join(f"{i:.1f}x ({by})" for by, i in sorted(ideals))
                             or "-") + ":", head]
            for r in sel:
                lines.append(f"  {_name(r):36} " + _variant_cells(r))
    w = data.get("winners") or {}
    lines += ["", f"winners ({w.get('contender')}; {w.get('rule')}):",
              f"  {'dtype':8} {'B':>2} {'H':>3} {'n':>6} {'pattern':8} {'part':4} "
              f"{'variant':10} {'ms':>9} {'speed-up':>8} {'% ideal':>7} {'x floor':>7} "
              f"{'runner-up':>18} {'x baseline':>10}"]
    for e in w.get("entries", []):
        second = (f"{e['runner_up']} +{100 * e['margin']:.1f}%" if e["runner_up"] else "-")
        lines.append(f"  {e['dtype']:8} {e['B']:>2} {e['H']:>3} {e['n']:>6} {e['pattern']:8} "
                     f"{e['part']:4} {e['variant']:10} {e['s'] * 1e3:9.3f} "
                     f"{_num(e['speedup'], 'x'):>8} {_num(e['pct_ideal'], '%', 0):>7} "
                     f"{_num(e['x_floor'], 'x'):>7} {second:>18} "
                     f"{_num(e['over_baseline'], 'x'):>10}")
    for x in w.get("disagree", []):
        why = x.get("error") or f"max relative difference {x['max_rel_diff']:.1e}"
        lines.append(f"  left out: {x['variant']} at {x['dtype']} B={x['B']} H={x['H']} "
                     f"n={x['n']} {x['pattern']}, disagrees with {x['reference']} ({why})")
    for v, sc in w.get("scores", {}).items():
        lines.append(f"  {v:10} wins {sc['wins']} of {sc['of']}, measured at {sc['entries']}, "
                     f"geometric mean {_num(sc['geomean'], '', 3)}")
    if w.get("default"):
        lines.append(f"default: {w['default']} -- to make it the default, set "
                     f"DEFAULT = {w['default']!r} in fast/kernels/variants.py "
                     f"(docs/gpu.md, 'A GPU session', step 3)")
    else:
        lines.append("default: none (no variant was measured at every entry)")
    return lines


def _variant_cells(r: dict) -> str:
    """One row of the variant table (``variant_report``)."""
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    cells = []
    for what in ("fwd", "fb"):
        d = r.get(what) or {}
        if not r.get(f"{what}_s"):
            cells.append(f"{'-':>10} {'':>8} {'':>7} {'':>15} {'':>7}")
            continue
        floor = f"{d['floor_s'] * 1e3:.3f} ({d['floor_by']})"
        cells.append(f"{r[what + '_s'] * 1e3:10.3f} {_num(d.get('speedup'), 'x'):>8} "
                     f"{_num(d.get('pct_ideal'), '%', 0):>7} {floor:>15} "
                     f"{_num(d.get('x_floor'), 'x'):>7}")
    check = r.get("agreement")
    said = ("" if check is None else "error" if "error" in check
            else "ref" if check["reference"] == r["variant"] else f"{check['max_rel_diff']:.0e}")
    return " | ".join(cells) + f" | {r.get('first_fwd_s', 0):7.2f} | {said:>7}"


def _num(x, unit: str, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"
