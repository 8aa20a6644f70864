"""Where ``backend="auto"`` switches on the CPU: the naive and the structured path, timed in turns.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for what it
computes, but at short sequences one dense product with the pattern's mask (the
naive path) beats the structured path's several small ones. ``sweep`` times both,
forward and forward+backward, through ``fast.sparse_attention`` (what auto would
run, its checks included) at each (pattern, stride, n), the two paths interleaved
in one process (``fast.measure.in_turns``: A, B, A, B, the fastest round of each,
the load average and CPU seconds recorded); ``choose`` turns the times of one
(pattern, stride, pass) into the crossover X that auto would take: the naive path
for n < X, the structured path from X on. The command (``python -m fast bench
--crossover``) writes them to figures/data/auto_cpu.json, the measurement, and prints
them as the constants of ``fast.backends.crossovers`` (``proposal``), which a commit
adopts: the library reads no record (``read_record`` reads one for the command and
the tests).

``choose`` takes the X (a measured n, or the largest one + 1: the naive path
everywhere) whose worst slowdown against the faster path at any measured n -- the
regret -- is smallest, the smallest such X on a tie; the regret is recorded beside
it, so that a sweep in which no single switch stays within the tolerance (noise, or
paths that cross twice) says so instead of hiding it.
"""

from __future__ import annotations

import json

import torch

from fast.attention import sparse_attention
from fast.core.schema import Int, Map, ShapeError, check
from fast.measure.in_turns import in_turns

TOLERANCE = 0.05                 # auto may be this much slower than the faster path
PASSES = ("fwd", "fb")
SHAPE = {"crossover": Map(Map({"fwd": Int(1), "fb": Int(1)}))}


def read_record(path) -> dict:
    """The crossovers of a record written by ``python -m fast bench --crossover``:
    {pattern: {stride as text: {"fwd": X, "fb": X}}}; a ValueError naming the file and
    the place when it is not such a record."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        check(data, SHAPE)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ShapeError) as err:
        raise ValueError(f"{path} does not hold auto's crossovers ({err}); allowed: the JSON "
                         f"that `python -m fast bench --crossover` writes") from None
    for pattern, strides in data["crossover"].items():
        for stride in strides:
            if not stride.isdigit() or int(stride) < 1:
                raise ValueError(f"{path}: ['crossover'][{pattern!r}] has the stride "
                                 f"{stride!r}; allowed: positive integers as text")
    return {pattern: {stride: {what: entry[what] for what in PASSES}
                      for stride, entry in strides.items()}
            for pattern, strides in data["crossover"].items()}


def proposal(crossover: dict) -> str:
    """The crossovers of a record (its "crossover", or ``read_record``'s) as the Python
    of ``fast.backends.crossovers.CROSSOVERS``, ready to be pasted there."""
    lines = ["CROSSOVERS = {"]
    for pattern, strides in crossover.items():
        lines.append(f'    "{pattern}": {{')
        lines += [f'        "{stride}": {{"fwd": {e["fwd"]}, "fb": {e["fb"]}}},'
                  for stride, e in strides.items()]
        lines.append("    },")
    return "\n".join(lines + ["}"])


def choose(ns: list[int], naive_s: list[float], structured_s: list[float]) -> tuple[int, float]:
    """(X, regret): the switch point with the smallest worst slowdown over the measured
    n (module docstring), and that slowdown (0.05: 5% slower than the faster path at
    some n)."""
    if not (len(ns) == len(naive_s) == len(structured_s)) or not ns:
        raise ValueError(f"ns, naive_s and structured_s must be of one length >= 1, got "
                         f"{len(ns)}, {len(naive_s)}, {len(structured_s)}")
    if list(ns) != sorted(set(ns)):
        raise ValueError(f"ns must increase, got {ns}")
    best = [min(a, b) for a, b in zip(naive_s, structured_s)]
    choices = []
    for X in [*ns, ns[-1] + 1]:
        picked = [a if n < X else b for n, a, b in zip(ns, naive_s, structured_s)]
        choices.append((max(p / m - 1 for p, m in zip(picked, best)), X))
    regret, X = min(choices)
    return X, regret


def _params(pattern: str, stride: int) -> dict:
    """The pattern's parameters at ``stride``: fixed reads c = l / 4 summaries (l / c
    sub-blocks for the heads)."""
    return {"stride": stride} if pattern == "strided" else {"stride": stride,
                                                            "c": max(1, stride // 4)}


def _calls(pattern: str, params: dict, q, k, v, go) -> dict:
    """{"naive fwd", "naive fb", "structured fwd", "structured fb"}: zero-argument calls
    of sparse_attention on q, k, v (B, H, n, d), the "fb" ones with a backward of go."""
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

    def fwd(backend):
        return lambda: sparse_attention(q, k, v, pattern, backend=backend, **params)

    def fb(backend):
        def call():
            out = sparse_attention(*leaves, pattern, backend=backend, **params)
            out.backward(go)
            for t in leaves:
                t.grad = None
        return call

    return {f"{path} {what}": make(path) for path in ("naive", "structured")
            for what, make in (("fwd", fwd), ("fb", fb))}


def sweep(ns=(64, 128, 256, 512, 1024, 2048), strides=(16, 32, 64, 128),
          patterns=("strided", "fixed"), B: int = 1, H: int = 4, d: int = 64,
          dtype=torch.float32, rounds: int = 5, threads: int | None = None,
          log=print) -> dict:
    """Time the naive and the structured path at every (pattern, stride, n): forward
    ("fwd") and forward+backward ("fb"), in turns, ``rounds`` rounds each, with
    ``threads`` intra-op threads (None: torch's current number). Returns the record
    ``python -m fast bench --crossover`` writes: the conditions, every time, and per
    pattern and stride the crossover X and the regret of each pass (``choose``)."""
    threads = torch.get_num_threads() if threads is None else threads
    g = torch.Generator().manual_seed(0)
    results, crossover = [], {}
    for pattern in patterns:
        for stride in strides:
            params = _params(pattern, stride)
            rows = []
            for n in ns:
                q, k, v, go = (torch.randn(B, H, n, d, generator=g, dtype=dtype)
                               for _ in range(4))
                calls = _calls(pattern, params, q, k, v, go)
                for call in calls.values():                          # warm-up, not timed
                    call()
                timed = in_turns(calls, rounds=rounds, threads=threads)
                row = {"pattern": pattern, "stride": stride, "n": n, **params,
                       "load_average": timed["load_average"]}
                for name, times in timed["wall_s"].items():
                    path, what = name.split()
                    row[f"{path}_{what}_s"] = times
                    row[f"{path}_{what}_cpu_s"] = timed["cpu_s"][name]
                rows.append(row)
                log(f"{pattern:8} l={stride:4d} n={n:6d}: naive fwd "
                    f"{min(row['naive_fwd_s']) * 1e3:8.3f} ms, structured "
                    f"{min(row['structured_fwd_s']) * 1e3:8.3f} ms; fwd+bwd "
                    f"{min(row['naive_fb_s']) * 1e3:8.3f} ms, "
                    f"{min(row['structured_fb_s']) * 1e3:8.3f} ms")
            entry = {}
            for what in ("fwd", "fb"):
                X, regret = choose(list(ns), [min(r[f"naive_{what}_s"]) for r in rows],
                                   [min(r[f"structured_{what}_s"]) for r in rows])
                entry[what], entry[f"regret_{what}"] = X, regret
            crossover.setdefault(pattern, {})[str(stride)] = entry
            results += rows
    return {"config": {"B": B, "H": H, "d": d, "dtype": str(dtype).replace("torch.", ""),
                       "combine": "merged", "ns": list(ns), "strides": list(strides),
                       "patterns": list(patterns), "rounds": rounds, "threads": threads,
                       "tolerance": TOLERANCE, "timing": "in turns, one process, fastest "
                       "round of each; warmed up once"},
            "results": results, "crossover": crossover,
            "worst_regret": max(e[f"regret_{w}"] for p in crossover.values()
                                for e in p.values() for w in ("fwd", "fb"))}
