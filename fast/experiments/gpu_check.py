"""What a GPU session runs: the parts of ``make gpu-check``, in order, each a command and its log.

Child et al., 2019, section 5.5 (the block-sparse kernels and their speed against
dense attention) and Table 2 (time per training iteration): what only a GPU can
check, run by one driver so that a machine lent for a short time spends it on
measuring. Each part is one command of this project, also run alone (``--parts``,
or its make target); ``PARTS`` lists them in the order a session needs them, each
with what it writes under the output folder and its estimated minutes on an H100
(estimates, not yet measured there; docs/gpu.md keeps the measured ones):

  tests-0, -1, -2   the tests marked ``gpu`` (``TRITON_INTERPRET=0 pytest -m gpu`` over
                    the files that hold them, ``gpu_test_files``),
                    split by kernel variant (``TEST_GROUPS``): the tests that take
                    no variant (they run the default one: the training step, the
                    decoder, ``sparse_attention``), then each half of ``VARIANTS``
                    over every pattern, combine mode and dtype, so that each group
                    fits a 10-minute command and the first is what a change of the
                    default re-runs; by pytest-xdist workers where it is installed
                    (compiling the kernels is the host's work, and parallel)
  variants          ``python -m fast bench --device cuda --variants``: every kernel
                    variant at the targets' points, the winners
  bench             ``python -m fast bench --device cuda --max-minutes 8``: the
                    published benchmark, stopped early enough to end within 10 minutes
  long              ``python -m fast bench --device cuda --only-long``: n = 2^17 .. 2^20
  train-time        ``python -m fast train-time``: Table 2's time per iteration
  layout-time       ``python -m fast layout-time``: the host's part of a first call

``run`` runs the parts named, in ``PARTS``' order, each one's output into its log
and to the terminal as it comes; with a time limit (``minutes``) it starts no part
whose estimate no longer fits, and names the parts left with the command that runs
them. It goes on after a failed part (each part's result means something alone)
and records every part (command, exit status, seconds) in ``gpu-check.json``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fast.experiments.paths import ROOT
from fast.experiments.provenance import write_result
from fast.kernels.variants import VARIANTS

NO_VARIANT = "none"                  # the tests that take no kernel variant (the default's)
_HALF = (len(VARIANTS) + 1) // 2
TEST_GROUPS = {"tests-0": (NO_VARIANT,), "tests-1": tuple(list(VARIANTS)[:_HALF]),
               "tests-2": tuple(list(VARIANTS)[_HALF:])}
TEST_MINUTES = {"tests-0": 1.5, "tests-1": 4.0, "tests-2": 4.0}
PART_NAMES = (*TEST_GROUPS, "variants", "bench", "long", "train-time", "layout-time")
MAX_TEST_WORKERS = 8
BENCH_MINUTES = 8    # the benchmark's own limit here: its last point and figure within 10
RECORD = "gpu-check.json"


@dataclass(frozen=True)
class Part:
    """One command of a GPU session: ``python ARGV`` from the repository root."""
    name: str
    argv: tuple[str, ...]             # after the Python executable; OUT already in it
    log: str                          # its output, under the output folder
    minutes: float                    # estimated on an H100
    what: str
    writes: tuple[str, ...] = ()      # what it writes under the output folder, besides the log
    env: dict = field(default_factory=dict)


def test_workers(wanted: int = 0) -> int:
    """pytest-xdist workers for the GPU tests: ``wanted``, or with 0 as many as the host
    has cores (at most ``MAX_TEST_WORKERS``) where pytest-xdist is installed, else 1."""
    if wanted:
        return wanted
    try:
        import xdist  # noqa: F401  (optional: runs the GPU tests in parallel)
    except ImportError:
        return 1
    return max(1, min(MAX_TEST_WORKERS, os.cpu_count() or 1))


def gpu_test_files(root: Path = ROOT) -> tuple[str, ...]:
    """The test files that hold tests marked ``gpu`` (paths from ``root``). pytest is given
    these only: other test files import the notebook tools (nbformat, nbclient, of the dev
    extra), which a machine with PyTorch alone lacks, and one file that fails to import
    stops pytest before any test runs."""
    return tuple(sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                        if "mark.gpu" in p.read_text()))


def parts(out: Path, workers: int = 1, test_args: tuple[str, ...] = ()) -> list[Part]:
    """Every part of a GPU session, in order, writing under ``out``."""
    files = gpu_test_files()

    def tests(name):
        group = TEST_GROUPS[name]
        xdist = ("-n", str(workers)) if workers > 1 else ()
        return Part(name, ("-m", "pytest", *files, "-m", "gpu", "-p", "no:cacheprovider", "-q",
                           "-rA", "--kernel-variants", ",".join(group), *xdist, *test_args),
                    f"{name}.log", TEST_MINUTES[name], f"the gpu tests of: {', '.join(group)}",
                    env={"TRITON_INTERPRET": "0"})

    bench = ("-m", "fast", "bench", "--device", "cuda")
    return [
        *(tests(name) for name in TEST_GROUPS),
        Part("variants", (*bench, "--variants", "--out", str(out)), "variants.log", 8.0,
             "every kernel variant at the targets' points; the winners",
             ("data/bench_cuda_variants.json",)),
        Part("bench", (*bench, "--max-minutes", str(BENCH_MINUTES), "--out", str(out)),
             "bench.log", BENCH_MINUTES + 1.5,
             "the benchmark against dense causal SDPA and FlexAttention; the targets",
             ("data/bench_cuda.json", "bench_cuda.png")),
        Part("long", (*bench, "--only-long", "--out", str(out / "long")), "long/bench.log", 5.0,
             "n = 2^17 .. 2^20: layout build, first call, peak memory",
             ("long/data/bench_cuda.json", "long/bench_cuda.png")),
        Part("train-time", ("-m", "fast", "train-time", "--out", str(out)), "train-time.log",
             4.0, "Table 2's seconds per training iteration, dense / fixed / strided",
             ("data/gpu_iteration_time.json",)),
        Part("layout-time", ("-m", "fast", "layout-time"), "layout-time.log", 1.0,
             "the host's part of a first call at n = 2^20: building the layouts"),
    ]


def plan(chosen: list[Part]) -> list[str]:
    """One line per part: name, estimate, command, what it writes."""
    return [f"{p.name:12} ~{p.minutes:4.1f} min  "
            + " ".join(f"{k}={v}" for k, v in p.env.items()) + (" " if p.env else "")
            + "python " + shlex.join(p.argv) + f"  -> {', '.join((p.log, *p.writes))}"
            for p in chosen]


def run(chosen: list[Part], out: Path, minutes: float | None = None,
        log: Callable[[str], None] = print, again: str = "") -> dict:
    """Run ``chosen`` in order (module docstring); returns the record also written to
    ``out/gpu-check.json``. ``again``: the command that runs the parts left (their
    names are appended)."""
    t0 = time.time()
    record = {"python": sys.executable, "minutes": minutes, "parts": []}
    for p in chosen:
        entry = {"name": p.name, "argv": list(p.argv), "log": p.log, "estimate_min": p.minutes}
        left = None if minutes is None else minutes - (time.time() - t0) / 60
        if left is not None and p.minutes > left:
            entry.update(status="not started", why=f"estimated {p.minutes:g} min, "
                                                   f"{max(left, 0):.1f} of {minutes:g} left")
            log(f"== {p.name}: not started ({entry['why']})")
        else:
            log(f"== {p.name}: {p.what} (estimated {p.minutes:g} min) ==")
            rc, seconds = _run_part(p, out, log)
            entry.update(status="ok" if rc == 0 else "failed", rc=rc, seconds=seconds)
        record["parts"].append(entry)
        write_result(out / RECORD, record, indent=1)
    record["seconds"] = time.time() - t0
    write_result(out / RECORD, record, indent=1)
    log(summary(record, again))
    return record


def _run_part(p: Part, out: Path, log: Callable[[str], None]) -> tuple[int, float]:
    """Run one part from the repository root; its output line by line into its log and
    ``log``. Returns (exit status, seconds)."""
    path = out / p.log
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **p.env}
    start = time.time()
    with open(path, "w") as f:
        f.write(f"$ {' '.join(f'{k}={v}' for k, v in p.env.items())} "
                f"{sys.executable} {shlex.join(p.argv)}\n")
        proc = subprocess.Popen([sys.executable, *p.argv], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
        for line in proc.stdout:
            f.write(line)
            f.flush()
            log(line.rstrip("\n"))
        rc = proc.wait()
    return rc, time.time() - start


def summary(record: dict, again: str = "") -> str:
    """The table a session reads last: each part's status, time and log; then the parts
    not run and the command that runs them."""
    lines = ["", "gpu-check:"]
    for e in record["parts"]:
        took = f"{e['seconds'] / 60:5.1f} min" if "seconds" in e else f"{'-':>9}"
        said = e["status"] + (f" (exit {e['rc']})" if e.get("rc") else "")
        lines.append(f"  {e['name']:12} {said:18} {took} (estimated {e['estimate_min']:g})  "
                     f"{e['log']}")
    left = [e["name"] for e in record["parts"] if e["status"] == "not started"]
    if left:
        lines.append(f"not started: {' '.join(left)}; next: {again} --parts {' '.join(left)}")
    return "\n".join(lines)
