"""Values ``torch.compile`` may read once, when it traces a call: marked without importing
``torch._dynamo``.

Child et al., 2019, sec. 5 computes each pattern's look-up tables once, outside the
attention itself; under ``torch.compile`` the same holds for the few host facts a call
reads (which crossovers are in force, whether a compiled kernel is there): they are taken
as constants when the call is traced, so that reading them is no graph break.

``torch.compiler.assume_constant_result(fn)`` does exactly that, but it imports
``torch._dynamo`` first, only to set one attribute on ``fn``: 1.6 s of a 2-core CPU, a
third of ``import fast`` and paid again by every child process the benchmarks and
experiments start. ``constant_when_traced`` sets the same attribute and imports nothing;
tests/fast/core/test_traced.py checks that it marks a function exactly as
``torch.compiler.assume_constant_result`` does, so a PyTorch that changes the mark fails
that test rather than silently compiling a graph break.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

MARK = "_dynamo_marked_constant"     # what torch._dynamo.assume_constant_result sets


def constant_when_traced(fn: F) -> F:
    """``fn``, marked as ``torch.compiler.assume_constant_result`` marks it: under
    ``torch.compile`` its result is computed once, when the call is traced, and used as a
    constant. Only for functions whose result cannot change while a compiled graph lives."""
    setattr(fn, MARK, True)
    return fn
