"""``constant_when_traced`` marks a function as ``torch.compiler.assume_constant_result``
does, without importing ``torch._dynamo`` (fast/core/traced.py)."""

import subprocess
import sys

import pytest
import torch

from fast.core.traced import constant_when_traced


def test_the_mark_is_the_one_torch_compiler_sets():
    def ours():
        return 1

    def theirs():
        return 1

    assert constant_when_traced(ours) is ours
    assert torch.compiler.assume_constant_result(theirs) is theirs
    assert vars(ours) == vars(theirs) and vars(ours)      # the same attributes, not none


def test_a_marked_function_is_read_once_when_traced_not_a_graph_break():
    def limit() -> int:              # reads a file: torch.compile cannot trace it
        with open(__file__, encoding="utf-8") as f:
            return 3 + 0 * len(f.read(1))

    def f_of(limit):
        return lambda x: x[..., :limit()] * 2

    x = torch.arange(8.0)
    torch.compiler.reset()
    with pytest.raises(RuntimeError):   # unmarked: a graph break (dynamo's Unsupported)
        torch.compile(f_of(limit), backend="eager", fullgraph=True)(x)
    torch.compiler.reset()
    compiled = torch.compile(f_of(constant_when_traced(limit)), backend="eager",
                             fullgraph=True)
    assert torch.equal(compiled(x), x[:3] * 2)


def test_importing_the_package_does_not_import_dynamo():
    code = ("import sys, fast, fast.attention, fast.transformer, fast.experiments.table2; "
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
