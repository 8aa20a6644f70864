"""Timing a call: CUDA events on a GPU, a wall clock on the CPU; the first call apart.

Child et al., 2019, section 5.5 and Table 2 (sparse attention pays only for what
it computes): speed is compared as ratios of steady-state times measured in one
run. The rules, written once here and used by every benchmark:

* the **first call** (compilation, layout build, allocator growth) is timed and
  its peak memory measured apart (``first_call``), never counted as steady state;
* the **steady state** (``steady``): ``warmup`` further calls, then repetitions
  until ``target_s`` seconds have passed (at least ``min_reps``, at most
  ``max_reps``); the median is reported and every repetition kept;
* on CUDA each repetition is timed by a pair of CUDA events around the call on
  the current stream (the GPU's own clock; the host is not in the measurement),
  read after one synchronisation at the end; on the CPU by ``time.perf_counter``.
  The CPU timer lets the GPU benchmark's orchestration run, and be tested, on a
  machine without a GPU.

The cost of a measurement is bounded by its parameters: at most
``first + (warmup + max(min_reps, target_s / t)) t`` for a call of t seconds,
which is how ``fast.experiments.bench_gpu`` estimates a sweep before running it.
"""

from __future__ import annotations

import statistics
import time

import torch

from fast.measure.memory import peak_memory


def synchronize(device) -> None:
    """Wait for the device (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def first_call(call, device) -> tuple[float, int | None]:
    """Seconds (wall clock, device synchronised) and peak bytes above the start of
    the first call: compilation, caches, masks and allocations included."""
    with peak_memory(device) as peak:
        synchronize(device)
        t = time.perf_counter()
        call()
        synchronize(device)
        seconds = time.perf_counter() - t
    return seconds, peak["peak_bytes"]


def _repeat_cuda(call, reps: int) -> list[float]:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def _repeat_wall(call, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return times


def steady(call, device, *, warmup: int = 2, min_reps: int = 5, max_reps: int = 200,
           target_s: float = 0.2) -> dict:
    """The steady-state time of ``call()`` on ``device``.

    Returns {"median_s", "times_s" (every repetition), "reps", "timer"}. The number
    of repetitions comes from a probe (the median of ``min_reps`` calls): enough
    for ``target_s`` seconds, within [min_reps, max_reps].
    """
    cuda = torch.device(device).type == "cuda"
    repeat = _repeat_cuda if cuda else _repeat_wall
    for _ in range(warmup):
        call()
    synchronize(device)
    times = repeat(call, min_reps)
    probe = max(statistics.median(times), 1e-6)
    more = min(max_reps, max(min_reps, int(target_s / probe))) - min_reps
    if more > 0:
        times += repeat(call, more)
    return {"median_s": statistics.median(times), "times_s": times, "reps": len(times),
            "timer": "cuda events" if cuda else "perf_counter"}


def estimate_s(call_s: float, *, first_s: float = 0.0, warmup: int = 2, min_reps: int = 5,
               max_reps: int = 200, target_s: float = 0.2) -> float:
    """Upper estimate of what ``first_call`` + ``steady`` cost for a call of ``call_s``."""
    reps = min(max_reps, max(min_reps, int(target_s / max(call_s, 1e-6))))
    return first_s + (warmup + reps) * call_s
