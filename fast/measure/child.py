"""Run one measurement in a fresh Python process: its own peak memory, a time limit.

Child et al., 2019, sections 5.4 (memory) and 5.5 (speed). Peak memory is a
high-water mark of a whole process (Linux VmHWM, or CUDA's allocator maximum): a
measurement that follows another in the same process can reuse pages the first
left resident and under-count, or start from a level the first inflated. So the
benchmark (``fast.measure.bench_point``) and the memory report
(``fast.measure.model_memory``) measure every point here:

    run_child("fast.measure.bench_point:measure_spec", spec, timeout=600)

starts ``python -m fast.measure.child fast.measure.bench_point:measure_spec '<spec as JSON>'``
from the repository root; the child imports the module, calls the function on
the decoded spec and prints the JSON of its result as the last line of stdout.
A child that fails or runs out of time is recorded, not raised: the caller
decides whether one lost point stops the run.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]      # the repository root: `-m fast...` runs there


def _split(function: str) -> tuple[str, str]:
    module, _, name = str(function).partition(":")
    if not module or not name.isidentifier():
        raise ValueError(f"function must be 'package.module:name', got {function!r}")
    return module, name


def call(function: str, spec):
    """``function(spec)`` for ``function`` = "package.module:name", in this process."""
    module, name = _split(function)
    return getattr(importlib.import_module(module), name)(spec)


def run_child(function: str, spec, *, timeout: float | None = None,
              env: dict | None = None) -> dict:
    """``function(spec)`` in a fresh ``python -m fast.measure.child`` process.

    spec: anything JSON can carry; the result must be too. env: variables added
    to this process's environment for the child. Returns {"result": the
    function's result}, or {"error": "timed out after 600 s" | "failed: <the
    child's last line of output>", "output": the last 3000 characters of its
    stderr} when it ran past ``timeout`` seconds or exited with an error.
    """
    _split(function)
    cmd = [sys.executable, "-m", "fast.measure.child", function, json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr or ""
        stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        return {"error": f"timed out after {timeout:.0f} s", "output": stderr[-3000:]}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return {"error": f"failed: {tail[0][:200]}", "output": proc.stderr[-3000:]}
    return {"result": json.loads(proc.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    """The child's side: ``python -m fast.measure.child MODULE:FUNCTION SPEC_JSON``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) != 2:
        raise SystemExit(f"usage: python -m fast.measure.child MODULE:FUNCTION SPEC_JSON, "
                         f"got {len(argv)} arguments")
    print(json.dumps(call(argv[0], json.loads(argv[1]))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
