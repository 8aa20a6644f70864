"""Who sees an operator's call: the operator where anything watches, its kernel where nothing does.

Child et al., 2019, section 5.5: the fast paths run as custom operators
(``sparse_transformer::triton``, ``sparse_transformer::structured`` and their backwards)
so that torch.compile, fake tensors, op counters and the profiler see one named, opaque
call; a plain eager call, which none of them sees, runs the operator's one kernel
directly (``fast.core.autograd.operator_call``). These tests hold both halves: every
watcher listed in ``fast.core.autograd``'s docstring gets the operator, the plain call
gets the kernel, and the two give the same bits through ``sparse_attention``, forward and
backward.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fast.attention  # noqa: F401  (registers the operators)
from fast import sparse_attention
from fast.core.autograd import operator_call, watched


class _Seen(TorchDispatchMode):
    """Records every op dispatched under it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _Subclass(torch.Tensor):
    """A tensor subclass: it could intercept what the dispatcher does with it."""


def _recorder():
    took = []
    call = operator_call(lambda *a: took.append("operator") or a[0],
                         lambda *a: took.append("kernel") or a[0])
    return call, took


def test_a_plain_eager_call_runs_the_kernel():
    call, took = _recorder()
    x = torch.randn(3)
    assert not watched((x, "text", 1.0))
    assert call(x, "text", 1.0) is x
    with torch.no_grad():
        call(x, "text", 1.0)
    assert took == ["kernel", "kernel"]


@contextlib.contextmanager
def _profiling():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        yield


WATCHERS = {
    "dispatch mode": _Seen,
    "torch-function mode": TorchFunctionMode,
    "profiler": _profiling,
}


@pytest.mark.parametrize("watcher", WATCHERS, ids=list(WATCHERS))
def test_every_watcher_gets_the_operator(watcher):
    call, took = _recorder()
    x = torch.randn(3)
    with WATCHERS[watcher]():
        assert watched((x,))
        call(x)
    assert took == ["operator"]


def test_a_tensor_subclass_among_the_arguments_gets_the_operator():
    call, took = _recorder()
    x = torch.randn(3)
    call(x, x.as_subclass(_Subclass))
    call(x, torch.nn.Parameter(x))          # a Parameter intercepts nothing
    assert took == ["operator", "kernel"]


def test_a_torch_func_transform_gets_the_operator():
    call, took = _recorder()
    torch.func.vmap(lambda t: call(t) * 1)(torch.randn(2, 3))
    assert took == ["operator"]


def test_jit_trace_gets_the_operator():
    call, took = _recorder()
    with warnings.catch_warnings():     # deprecated in newer torch; still people's tool
        warnings.simplefilter("ignore")
        torch.jit.trace(lambda t: call(t) * 1, torch.randn(3), check_trace=False)
    assert took == ["operator"]


def test_torch_compile_gets_the_operator():
    call, took = _recorder()
    compiled = torch.compile(lambda t: call(t) * 1, backend="eager", fullgraph=False)
    compiled(torch.randn(3))
    assert "operator" in took and "kernel" not in took


BACKENDS = [("triton", "sparse_transformer.triton"),
            ("structured", "sparse_transformer.structured")]


@pytest.mark.parametrize("backend,operator", BACKENDS, ids=[b for b, _ in BACKENDS])
def test_both_ways_give_the_same_bits_forward_and_backward(backend, operator):
    """n = 37 (not a multiple of the block or the stride), d = 48, three heads: the plain
    call (the kernels directly) and the same call under a dispatch mode (the operators,
    which the mode sees by name) agree bit for bit."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 48, generator=g) for _ in range(3))
    go = torch.randn(2, 3, 37, 48, generator=g)

    def run():
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = sparse_attention(*leaves, "strided", stride=5, backend=backend)
        out.backward(go)
        return out.detach(), *(t.grad for t in leaves)

    plain = run()
    with _Seen() as seen:
        watched_run = run()
    assert any(op.startswith(operator + ".") for op in seen.ops)
    assert any(op.startswith(operator + "_backward.") for op in seen.ops)
    for a, b in zip(plain, watched_run):
        assert torch.equal(a, b)
