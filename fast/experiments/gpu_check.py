"""What a GPU session runs: the parts of ``make gpu-check``, in order, each a command and its log.

Child et al., 2019, section 5.5 (the block-sparse kernels and their speed against
dense attention) and Table 2 (time per training iteration): what only a GPU can
check, run by one driver so that a machine lent for a short time spends it on
measuring. A lent GPU gives about 15 minutes of device time in all, its start
included, and at most 10 minutes a command, so the session (``SESSION``) is fitted to
9 minutes of commands on an H100 / H200-class GPU; the rest are extra parts, run by
name (``--parts``, or their make targets). Each part is one command of this project,
with what it writes under the output folder and its minutes on an H100 / H200
(``Part.minutes``: measured on an H200 where the docstring of ``parts`` says so,
estimated otherwise; docs/gpu.md keeps the measurements):

The session:

  tests         the tests marked ``gpu`` (``TRITON_INTERPRET=0 pytest -m gpu`` over the
                files that hold them, ``gpu_test_files``), every kernel variant, by
                pytest-xdist workers where it is installed (``test_workers``: compiling
                the kernels is the host's work, and parallel)
  variants      ``python -m fast bench --device cuda --variants`` at the target point
                (4, 16, 16384) only, dense and every kernel variant: the winners
  bench         ``python -m fast bench --device cuda``, float16, the target point
                (4, 16, 16384) first (with FlexAttention), then (1, 4, n) for n = 4096 ..
                65536 (FlexAttention at 16384), no new point after 2.5 minutes
  train-time    ``python -m fast train-time --warm 3 --steps 5``: Table 2's time per
                iteration, with its attention-free floor

The extra parts (longer sweeps, or the tests split for a machine without pytest-xdist):

  tests-0, -1, -2   the gpu tests split by kernel variant (``TEST_GROUPS``): those that
                    take none, then each half of ``VARIANTS``
  variants-all      the variant sweep at every target point, FlexAttention beside it
  bench-all         the whole published benchmark (float16 and bfloat16, every n)
  long              ``python -m fast bench --device cuda --only-long``: n = 2^17 .. 2^20
  layout-time       ``python -m fast layout-time``: the host's part of a first call

``run`` runs the parts named, in ``PART_NAMES``' order, each one's output into its log
and to the terminal as it comes; with a time limit (``minutes``) it starts no part
whose estimate no longer fits, and names the parts left with the command that runs
them. It goes on after a failed part (each part's result means something alone) and
records every part (command, exit status, seconds) in ``gpu-check.json``, rewritten
after each part and marked ``"complete": false`` until the last has run. Every part
prints as it goes and writes its own JSON as it goes (the benchmark after every row,
the training time after every row; a record an interrupted part leaves says
``"complete": false``).
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

from fast.experiments.bench_sweep import VARIANT_POINTS
from fast.experiments.paths import ROOT
from fast.experiments.provenance import write_result
from fast.kernels.variants import VARIANTS

NO_VARIANT = "none"                  # the tests that take no kernel variant (the default's)
_HALF = (len(VARIANTS) + 1) // 2
TEST_GROUPS = {"tests-0": (NO_VARIANT,), "tests-1": tuple(list(VARIANTS)[:_HALF]),
               "tests-2": tuple(list(VARIANTS)[_HALF:])}
TEST_MINUTES = {"tests-0": 1.5, "tests-1": 4.0, "tests-2": 4.0}   # one process each
SESSION = ("tests", "variants", "bench", "train-time")
EXTRA = (*TEST_GROUPS, "variants-all", "bench-all", "long", "layout-time")
PART_NAMES = (*SESSION, *EXTRA)
SESSION_MINUTES = 9.0               # the session's commands on an H100 / H200 at most
MAX_TEST_WORKERS = 16
BENCH_MINUTES = 2.5                 # the session's benchmark: no new point after this
RECORD = "gpu-check.json"
TARGET = VARIANT_POINTS[0]          # (B, H, n) of the speed targets: (4, 16, 16384)
SMALL_NS = (4096, 8192, 16384, 32768, 65536)   # (1, 4, n): the small-shape target


@dataclass(frozen=True)
class Part:
    """One command of a GPU session: ``python ARGV`` from the repository root."""
    name: str
    argv: tuple[str, ...]             # after the Python executable; OUT already in it
    log: str                          # its output, under the output folder
    minutes: float                    # on an H100 / H200 (``parts``: measured or estimated)
    what: str
    writes: tuple[str, ...] = ()      # what it writes under the output folder, besides the log
    env: dict = field(default_factory=dict)


def xdist_installed() -> bool:
    """Whether pytest-xdist (``pytest -n``) is importable here."""
    try:
        import xdist  # noqa: F401  (optional: runs the GPU tests in parallel)
    except ImportError:
        return False
    return True


def test_workers(wanted: int = 0) -> int:
    """pytest-xdist workers for the GPU tests: ``wanted``, or with 0 all the host's cores
    but two (at most ``MAX_TEST_WORKERS``; 14 on the 16-core H200 that ran them in 110 s)
    where pytest-xdist is installed, else 1."""
    if wanted:
        return wanted
    if not xdist_installed():
        return 1
    return max(1, min(MAX_TEST_WORKERS, (os.cpu_count() or 1) - 2))


def test_minutes(workers: int) -> float:
    """Minutes of every gpu test by ``workers`` processes: about 9.5 minutes of compiling
    and running in one process, spread over the workers, plus a minute of start-up,
    collection and the longest test (measured on an H200: 110 s with 14 workers)."""
    return round(1.2 + 9.5 / max(1, workers), 1)


def gpu_test_files(root: Path = ROOT) -> tuple[str, ...]:
    """The test files that hold tests marked ``gpu`` (paths from ``root``). pytest is given
    these only: other test files import the notebook tools (nbformat, nbclient, of the dev
    extra), which a machine with PyTorch alone lacks, and one file that fails to import
    stops pytest before any test runs."""
    return tuple(sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                        if "mark.gpu" in p.read_text()))


def _bhn(point: tuple[int, int, int]) -> str:
    return "x".join(map(str, point))


def parts(out: Path, workers: int = 1, test_args: tuple[str, ...] = ()) -> list[Part]:
    """Every part of a GPU session, in order, writing under ``out``. Minutes measured on
    an H200 (main at 81a3fc0): every gpu test 110 s by 14 workers, the training time
    37 s (6 rows, warm 3, steps 5: 8 rows now); the rest estimated from that run's logs
    (two thirds of the float16 benchmark in 216 s; 7 variants at the target point,
    strided, in 36 s)."""
    files = gpu_test_files()
    xdist = ("-n", str(workers)) if workers > 1 else ()

    def pytest(*more):
        return ("-m", "pytest", *files, "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rA",
                *more, *xdist, *test_args)

    def tests(name):
        group = TEST_GROUPS[name]
        return Part(name, pytest("--kernel-variants", ",".join(group)), f"{name}.log",
                    TEST_MINUTES[name] if workers == 1 else test_minutes(workers),
                    f"the gpu tests of: {', '.join(group)}", env={"TRITON_INTERPRET": "0"})

    bench = ("-m", "fast", "bench", "--device", "cuda")
    B, H, n = TARGET
    small = tuple(_bhn((1, 4, m)) for m in SMALL_NS)
    return [
        Part("tests", pytest(), "tests.log", test_minutes(workers),
             f"every gpu test, every kernel variant ({workers} pytest worker"
             f"{'s' if workers > 1 else ''})", env={"TRITON_INTERPRET": "0"}),
        Part("variants", (*bench, "--variants", "--contenders", "dense", "triton block-sparse",
                          "--shapes", f"{B}x{H}", "--n-min", str(n), "--n-max", str(n),
                          "--out", str(out)), "variants.log", 1.5,
             f"every kernel variant at the target point {TARGET}, against dense; the winners",
             ("data/bench_cuda_variants.json",)),
        Part("bench", (*bench, "--dtypes", "float16", "--shapes", f"{B}x{H}", "--n-min", str(n),
                       "--n-max", str(n), "--points", *small, "--flex-n", str(n),
                       "--max-minutes", str(BENCH_MINUTES), "--out", str(out)),
             "bench.log", BENCH_MINUTES + 0.8,
             "the benchmark at the targets' points against dense causal SDPA and "
             "FlexAttention", ("data/bench_cuda.json", "bench_cuda.png")),
        Part("train-time", ("-m", "fast", "train-time", "--warm", "3", "--steps", "5",
                            "--out", str(out)), "train-time.log", 1.0,
             "Table 2's seconds per training iteration: the attention-free floor, dense, "
             "fixed, strided", ("data/gpu_iteration_time.json",)),
        *(tests(name) for name in TEST_GROUPS),
        Part("variants-all", (*bench, "--variants", "--out", str(out / "variants-all")),
             "variants-all/variants.log", 8.0,
             "every kernel variant at every target point, FlexAttention beside them",
             ("variants-all/data/bench_cuda_variants.json",)),
        Part("bench-all", (*bench, "--max-minutes", "8", "--out", str(out / "bench-all")),
             "bench-all/bench.log", 9.5, "the whole benchmark: float16 and bfloat16, every n",
             ("bench-all/data/bench_cuda.json", "bench-all/bench_cuda.png")),
        Part("long", (*bench, "--only-long", "--out", str(out / "long")), "long/bench.log", 5.0,
             "n = 2^17 .. 2^20: layout build, first call, peak memory",
             ("long/data/bench_cuda.json", "long/bench_cuda.png")),
        Part("layout-time", ("-m", "fast", "layout-time"), "layout-time.log", 1.0,
             "the host's part of a first call at n = 2^20: building the layouts"),
    ]


def plan(chosen: list[Part]) -> list[str]:
    """One line per part: name, minutes, command, what it writes."""
    return [f"{p.name:12} ~{p.minutes:4.1f} min  "
            + " ".join(f"{k}={v}" for k, v in p.env.items()) + (" " if p.env else "")
            + "python " + shlex.join(p.argv) + f"  -> {', '.join((p.log, *p.writes))}"
            for p in chosen]


def warnings_for(chosen: list[Part], workers: int) -> list[str]:
    """What the plan's reader must know before a session: the session over its minutes,
    the tests in one process."""
    out = []
    names = {p.name for p in chosen}
    if workers == 1 and "tests" in names:
        out.append("pytest-xdist is not installed here (or --test-workers 1): every gpu test "
                   f"runs in one process, about {test_minutes(1):g} min; install pytest-xdist, "
                   "or run the parts tests-0, tests-1, tests-2 as one command each")
    total = sum(p.minutes for p in chosen)
    if names == set(SESSION) and total > SESSION_MINUTES:
        out.append(f"the session is estimated at {total:g} min, over its "
                   f"{SESSION_MINUTES:g}: pass --minutes to stop in time")
    return out


def run(chosen: list[Part], out: Path, minutes: float | None = None,
        log: Callable[[str], None] = print, again: str = "") -> dict:
    """Run ``chosen`` in order (module docstring); returns the record also written to
    ``out/gpu-check.json``. ``again``: the command that runs the parts left (their
    names are appended)."""
    t0 = time.time()
    record = {"python": sys.executable, "minutes": minutes, "complete": False,
              "estimate_min": sum(p.minutes for p in chosen), "parts": []}
    write_result(out / RECORD, record, indent=1)
    for i, p in enumerate(chosen):
        entry = {"name": p.name, "argv": list(p.argv), "log": p.log, "estimate_min": p.minutes}
        left = None if minutes is None else minutes - (time.time() - t0) / 60
        if left is not None and p.minutes > left:
            entry.update(status="not started", why=f"estimated {p.minutes:g} min, "
                                                   f"{max(left, 0):.1f} of {minutes:g} left")
            log(f"== {p.name}: not started ({entry['why']})")
        else:
            log(f"== [{(time.time() - t0) / 60:4.1f} min] part {i + 1} of {len(chosen)}: "
                f"{p.name}: {p.what} (estimated {p.minutes:g} min) ==")
            rc, seconds = _run_part(p, out, log)
            entry.update(status="ok" if rc == 0 else "failed", rc=rc, seconds=seconds)
        record["parts"].append(entry)
        record["seconds"] = time.time() - t0
        write_result(out / RECORD, record, indent=1)
    record["seconds"] = time.time() - t0
    record["complete"] = True
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
