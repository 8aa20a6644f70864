"""Contenders timed in turns (A, B, A, B, ...) in one process: what a shared machine allows.

Child et al., 2019, section 5.5 and Table 2 (speed is compared as ratios measured in
the same run on the same hardware) and section 7 (sampling). On a machine other
processes share, the wall clock of one call also counts the time they held the
cores; timing the contenders in alternation spreads that load over all of them, and
the minimum of each (its least disturbed run) is the fairest estimate of its own
cost. ``in_turns`` runs every call once per round, in the same order, with a fixed
number of intra-op threads, and records the conditions beside the times: the
threads, the cores, the load average before and after, and each run's CPU seconds
(the process's; wall >> CPU means the process waited for the cores). It does not
warm up: a call whose first run compiles or allocates is warmed up by the caller,
with a shorter run.
"""

from __future__ import annotations

import os
import time

import torch


def in_turns(calls: dict, rounds: int = 3, threads: int = 1) -> dict:
    """Time every call of ``calls`` ({name: zero-argument callable}) ``rounds`` times,
    in turns, with ``threads`` intra-op torch threads.

    Returns {"rounds", "threads", "cores", "load_average": [before, after] (1, 5 and
    15 minutes), "wall_s": {name: [seconds per round]}, "cpu_s": {name: [...]},
    "min_s": {name: the fastest round}}."""
    if not calls:
        raise ValueError("calls must name at least one callable, got none")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    wall = {name: [] for name in calls}
    cpu = {name: [] for name in calls}
    before_threads, load = torch.get_num_threads(), [list(os.getloadavg())]
    torch.set_num_threads(threads)
    try:
        for _ in range(rounds):
            for name, call in calls.items():
                w, c = time.perf_counter(), time.process_time()
                call()
                wall[name].append(time.perf_counter() - w)
                cpu[name].append(time.process_time() - c)
    finally:
        torch.set_num_threads(before_threads)
    load.append(list(os.getloadavg()))
    return {"rounds": rounds, "threads": threads, "cores": os.cpu_count(),
            "load_average": load, "wall_s": wall, "cpu_s": cpu,
            "min_s": {name: min(times) for name, times in wall.items()}}
