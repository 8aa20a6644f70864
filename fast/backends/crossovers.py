"""Where ``backend="auto"`` switches from the naive path to the structured one on the CPU.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for what it
computes, but its pieces cost more per pair than one dense product, so at short n the
dense masked product wins. ``CROSSOVERS[pattern][stride][pass]`` is the n from which the
structured path is taken ("fwd": a forward alone, "fb": a forward and its backward);
``fast.backends.auto`` says how a call is matched to them.

These are constants of the package, not read from a file: what the library does changes
with a commit, never with a benchmark run. They were measured by ``python -m fast bench
--crossover`` (``fast.measure.crossover``) on the project's 2-core AMD EPYC machine
(Linux, torch 2.13.0, 2 threads; B = 1, H = 4, d = 64, float32), committed on 2026-11-24;
that measurement, with its machine, its timings and each crossover's regret, is
figures/data/auto_cpu.json. The command prints the constants it would propose beside the
record it writes, and ``tests/fast/test_attention_api.py`` fails when these and the
committed record differ: re-measured, they are copied here in the same commit.
"""

from __future__ import annotations

CROSSOVERS = {
    "strided": {
        "16": {"fwd": 64, "fb": 128},
        "32": {"fwd": 128, "fb": 256},
        "64": {"fwd": 128, "fb": 256},
        "128": {"fwd": 256, "fb": 256},
    },
    "fixed": {
        "16": {"fwd": 64, "fb": 256},
        "32": {"fwd": 128, "fb": 256},
        "64": {"fwd": 64, "fb": 256},
        "128": {"fwd": 128, "fb": 256},
    },
}
