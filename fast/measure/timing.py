"""How a call is timed: the first call apart, then repetitions by one of two methods.

Child et al., 2019, section 5.5 and Table 2 (sparse attention pays only for what
it computes): speed is compared as ratios of steady-state times measured in one
run. The rules, written once here and used by every measurement that times work
(the attention benchmark, ``fast.measure.bench_point``; decoding,
``fast.measure.generation``; a training step, ``fast.measure.model_memory``):

* **the clock** is the device's own (``fast.core.clock.Clock``): the wall clock on
  the CPU, a pair of CUDA events on CUDA read after one wait at the end. On the
  CPU each repetition also records the process's CPU seconds and minor page
  faults (``cpu_times``): on a shared machine the wall clock also counts the
  time other processes held the cores, and page faults show memory being
  touched for the first time;
* **the first call** (compilation, a layout or mask build, allocator growth, the
  first touch of every page) is timed by the wall clock with the device
  synchronised, and its peak memory measured, apart (``first_call``): never part
  of the steady state;
* **the steady state** (``steady``) follows a ``Method``:

  ======================  ==========================  ===========================
                          ``FRESH`` (the CPU sweep)   ``SAME`` (GPU; ``--same-process``)
  ======================  ==========================  ===========================
  where                   a fresh process per point   every point in one process
                          (``fast.measure.child``)
  warm-up                 the first call              the first call and 2 more
  repetitions sized by    the first call's time       the median of ``min_reps`` calls
  repetitions             ~``target_s`` = 1 s of      ~0.1 s of calls, 5 .. 200
                          calls, 3 .. 20 (1 .. 20 for
                          calls over 0.3 s); a first
                          call over 2 s is the only one
  statistic               the minimum                 the median
  ======================  ==========================  ===========================

  A fresh process per point isolates each peak memory (a process high-water mark)
  and keeps one contender's leftovers from another's time; the minimum is the
  least disturbed repetition on a shared machine. One process is what a GPU
  needs (a CUDA context and the compiled kernels are made once) and what a
  training loop is. The two give different times on the CPU for the same call
  (glibc's allocator gives large freed blocks back, so the first calls of a process,
  and every call that allocates large scratch, fault fresh pages in; the fresh
  method times a long call once and keeps the best of many short ones; two threads
  on shared cores wait for each other): docs/design.md, sec. 7 says what was
  measured, and the CPU sweep reports its target n measured both ways.

A contender's measurement at one point may be capped (``Method.cap_s``): one process
cannot interrupt a compilation or a kernel, so the cap is checked between the phases
(compilation, the forward, the forward + backward): past it no new phase starts, and the
record says what was left out (``fast.measure.bench_point.measure``).

The cost of a measurement follows from its method: at most the first call plus
``(warmup + max(min_reps, target_s / t))`` calls of t seconds (``estimate_s``),
which is how the GPU sweep estimates itself before it starts.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, replace

try:
    import resource  # Unix: CPU seconds and page faults of this process
except ImportError:   # Windows: cpu_times reports None
    resource = None

import torch

from fast.core.clock import Clock
from fast.measure.memory import peak_memory

STATISTICS = ("min", "median")
PROCESSES = ("fresh", "same")


@dataclass(frozen=True)
class Method:
    """How the steady state of a call is timed (module docstring)."""
    process: str          # "fresh": each point in a new process; "same": all in this one
    statistic: str        # "min" or "median" of the repetitions
    target_s: float       # repeat until about this many seconds of calls (0: min_reps only)
    warmup: int           # untimed calls after the first call
    min_reps: int         # at least this many repetitions of a call shorter than short_s
    max_reps: int         # at most this many
    short_s: float | None = None  # a call at least this long gets at least one (None: never)
    alone_s: float | None = None  # a first call longer than this is the only repetition
    probe_first: bool = False   # size the repetitions by the first call's time (no probe
                                # calls spent), or by the median of min_reps timed calls
    cap_s: float | None = None  # a contender's seconds at one point, compilation included,
                                # after which no new phase of it starts (None: no cap)

    def __post_init__(self):
        if self.process not in PROCESSES:
            raise ValueError(f"process must be one of {PROCESSES}, got {self.process!r}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {self.statistic!r}")
        if not (math.isfinite(self.target_s) and self.target_s >= 0):
            raise ValueError(f"target_s must be a finite number >= 0, got {self.target_s!r}")
        if self.cap_s is not None and not (math.isfinite(self.cap_s) and self.cap_s > 0):
            raise ValueError(f"cap_s must be a finite number > 0 or None, got {self.cap_s!r}")
        if not 1 <= self.min_reps <= self.max_reps or self.warmup < 0:
            raise ValueError(f"repetitions must satisfy 1 <= min_reps <= max_reps and "
                             f"warmup >= 0, got min_reps={self.min_reps}, max_reps="
                             f"{self.max_reps}, warmup={self.warmup}")

    def with_(self, **changes) -> Method:
        """This method with some fields changed (``None`` values keep the field)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def describe(self) -> str:
        where = "a fresh process per point" if self.process == "fresh" else "one process"
        cap = "" if self.cap_s is None else f"; each contender capped at {self.cap_s:g} s a point"
        return (f"{where}; first call apart; {self.statistic} of steady-state repetitions "
                f"(~{self.target_s:g} s of calls, {self.min_reps}..{self.max_reps}, "
                f"{self.warmup} warm-up calls after the first){cap}")


FRESH = Method("fresh", "min", target_s=1.0, warmup=0, min_reps=3, max_reps=20, short_s=0.3,
               alone_s=2.0, probe_first=True)
SAME = Method("same", "median", target_s=0.1, warmup=2, min_reps=5, max_reps=200)


def synchronize(device) -> None:
    """Wait for the device (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def cpu_times() -> dict:
    """CPU seconds (user, system) and minor page faults of this process so far;
    ``None`` values where the platform does not report them."""
    if resource is None:
        return {"cpu_user_s": None, "cpu_sys_s": None, "minor_faults": None}
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_user_s": r.ru_utime, "cpu_sys_s": r.ru_stime, "minor_faults": r.ru_minflt}


def since(start: dict) -> dict:
    """``cpu_times()`` now minus ``start``, field by field."""
    now = cpu_times()
    return {k: None if now[k] is None else now[k] - start[k] for k in now}


def counted(before: dict) -> dict:
    """{"cpu_s": CPU seconds (user + system), "faults": minor page faults} of this process
    since ``before`` (a ``cpu_times()``); None values where the platform has none."""
    d = since(before)
    return {"cpu_s": None if d["cpu_user_s"] is None else d["cpu_user_s"] + d["cpu_sys_s"],
            "faults": d["minor_faults"]}


def repeat(call, device, reps: int, counters: bool = True) -> dict:
    """Time ``reps`` calls of ``call()`` on the device's clock. Returns {"s": seconds of
    each}, and on the CPU (with ``counters``) also "cpu_s" and "faults": each call's
    process CPU seconds and minor page faults (two system calls per call: leave them out
    for calls of microseconds)."""
    clock = Clock(device)
    if clock.cuda or not counters:
        pairs = []
        for _ in range(reps):
            start = clock.mark()
            call()
            pairs.append((start, clock.mark()))
        return {"s": clock.elapsed(pairs)}
    out: dict = {"s": [], "cpu_s": [], "faults": []}
    for _ in range(reps):
        before = cpu_times()
        start = clock.mark()
        call()
        stop = clock.mark()
        used = counted(before)
        out["s"].append(clock.seconds(start, stop))
        out["cpu_s"].append(used["cpu_s"])
        out["faults"].append(used["faults"])
    return out


def first_call(call, device) -> dict:
    """The first call: {"s": seconds (wall clock, the device synchronised before and
    after: its host work, compilation and builds, counts), "peak_bytes": peak memory
    above the start (``fast.measure.memory.peak_memory``)}, and on the CPU "cpu_s" and
    "faults" as ``repeat``'s."""
    with peak_memory(device) as peak:
        synchronize(device)
        before = cpu_times()
        t = time.perf_counter()
        call()
        synchronize(device)
        seconds = time.perf_counter() - t
        used = counted(before)
    out = {"s": seconds, "peak_bytes": peak["peak_bytes"]}
    if torch.device(device).type != "cuda":
        out.update(used)
    return out


def repetitions(method: Method, call_s: float) -> int:
    """How many repetitions a call of ``call_s`` seconds gets in all."""
    short = method.short_s is None or call_s < method.short_s
    floor = method.min_reps if short else 1
    return max(floor, min(method.max_reps, math.ceil(method.target_s / max(call_s, 1e-6))))


def steady(call, device, method: Method, first: dict | None = None) -> dict:
    """The steady-state time of ``call()`` on ``device`` by ``method``.

    first: ``first_call``'s result when the first call was a clean timing of the
    call (None when it built something later calls reuse, a mask: then one timed
    call takes its place). Returns {"s": the method's statistic, "times_s": every
    repetition, "reps", "timer"}, and on the CPU "cpu_s_all" and "faults_all".
    """
    timer = "cuda events" if torch.device(device).type == "cuda" else "perf_counter"
    alone = math.inf if method.alone_s is None else method.alone_s
    if first is not None and first["s"] > alone:
        times = {"s": [first["s"]]}
        if "cpu_s" in first:
            times.update(cpu_s=[first["cpu_s"]], faults=[first["faults"]])
        return _summary(times, method, "the first call (wall clock)")
    for _ in range(method.warmup):
        call()
    synchronize(device)
    if first is not None and method.probe_first:
        times, probe = {"s": []}, first["s"]
    else:
        times = repeat(call, device, 1 if first is None else method.min_reps)
        probe = statistics.median(times["s"])
        if first is None and probe > alone:
            return _summary(times, method, timer)
    more = repetitions(method, probe) - len(times["s"])
    if more > 0:
        extra = repeat(call, device, more)
        times = {k: times.get(k, []) + v for k, v in extra.items()}
    return _summary(times, method, timer)


def _summary(times: dict, method: Method, timer: str) -> dict:
    pick = min if method.statistic == "min" else statistics.median
    out = {"s": pick(times["s"]), "times_s": times["s"], "reps": len(times["s"]),
           "timer": timer}
    if "cpu_s" in times:
        out.update(cpu_s_all=times["cpu_s"], faults_all=times["faults"])
    return out


def estimate_s(call_s: float, method: Method, first_s: float = 0.0) -> float:
    """Upper estimate of what ``first_call`` + ``steady`` cost for a call of ``call_s``."""
    return first_s + (method.warmup + repetitions(method, call_s)) * call_s
