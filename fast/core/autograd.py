"""Hand-written backward passes are differentiable once: a clear error, never a wrong answer.

Child et al., 2019, section 5.5: the fast attention paths (the structured pieces, the
Triton kernels) run their own fused backward, which autograd cannot differentiate
again. ``torch.autograd.function.once_differentiable`` alone is not enough: when the
incoming gradient does not itself require grad (``(out * g).sum()`` with a constant
``g``), it returns a first derivative without a graph, and a later second derivative
through it is silently missing. So ``once_differentiable(what)`` raises as soon as a
backward runs with ``create_graph=True`` (autograd runs backward with grad mode on
exactly then), naming the path and the way out: the naive backend, plain SDPA, is
twice differentiable.

``Function`` is the autograd Function the operators' formulas subclass: torch's, with
``setup_context`` apart from ``forward`` (as torch.func's transforms require), whose
``apply`` skips what torch does on every call of such a Function when no torch.func
transform is active -- binding the arguments to ``forward``'s signature through
``inspect.signature``, several times the cost of the rest of ``apply``
(``python -m fast bench --host-cost``, "operator") -- and, when nothing will be
differentiated, the context and graph node too. Its forwards take no default arguments,
so there is nothing to bind; torch.compile traces the Function as any other.

``operator_call(operator, body)`` is how those Functions call their operators: the
operator (a ``torch.library`` operator whose one kernel is the Python function ``body``)
wherever something besides autograd sees the call -- torch.compile or export tracing it,
a dispatch mode (fake tensors, ``make_fx``, a counter of ops), a torch-function mode, a
torch.func transform, ``torch.jit.trace``, the profiler, a tensor subclass among the
arguments -- so each of them sees one named, opaque operator; and ``body`` itself where
nothing does, the plain eager call, which then skips the dispatcher's parsing and boxing
of every argument and output, in and out of Python. Both run the same Python function on
the same tensors, so they give the same bits; what differs is only who can see the call.
"""

from __future__ import annotations

import functools

import torch
from torch._functorch.utils import unwrap_dead_wrappers
from torch.autograd.function import once_differentiable as _torch_once_differentiable


def refuse_second_derivative(what: str) -> None:
    """Raise the RuntimeError of ``once_differentiable`` when a backward runs with
    create_graph=True (grad mode on): for backward formulas that are not an autograd
    Function's own (a custom operator's ``register_autograd``)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{what} is once_differentiable: its backward is written by hand, so a "
            f"second derivative (create_graph=True) is not available; use "
            f"sparse_attention(..., backend='naive'), which is twice differentiable")


def once_differentiable(what: str):
    """Decorator for ``torch.autograd.Function.backward``: torch's once_differentiable,
    and a RuntimeError naming ``what`` when a second derivative is asked for."""

    def wrap(backward):
        inner = _torch_once_differentiable(backward)

        @functools.wraps(backward)
        def run(ctx, *grads):
            refuse_second_derivative(what)
            return inner(ctx, *grads)

        return run

    return wrap


_PLAIN = (torch.Tensor, torch.nn.Parameter)   # tensors nothing intercepts


def watched(args: tuple) -> bool:
    """Whether anything besides autograd sees a call on ``args`` (module docstring): then
    the call must go through the operator, which those see; torch.compile's test first,
    so a trace reads nothing else."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled()
            or torch._C._are_functorch_transforms_active()
            or torch._C._get_tracing_state() is not None
            or torch.autograd._profiler_enabled()):
        return True
    for a in args:
        if isinstance(a, torch.Tensor) and type(a) not in _PLAIN:
            return True
    return False


def operator_call(operator, body):
    """A call of ``operator``, whose kernel is ``body``: ``operator(*args)`` where
    something watches the call (``watched``), ``body(*args)`` where nothing does."""
    def call(*args):
        return operator(*args) if watched(args) else body(*args)
    return call


class Function(torch.autograd.Function):
    """``torch.autograd.Function`` for a ``forward`` without default arguments and a
    ``setup_context`` apart (module docstring): ``apply`` calls ``forward`` alone when
    nothing will be differentiated (grad mode off, or no input requiring grad: what
    torch's ``apply`` returns then, without making a context and a graph node), the
    autograd machinery directly otherwise, and torch's own ``apply`` under a torch.func
    transform."""

    @classmethod
    def apply(cls, *args):
        if torch._C._are_functorch_transforms_active():
            return super().apply(*args)
        if not (torch.is_grad_enabled() and torch._C._any_requires_grad(*args)):
            return cls.forward(*args)     # nothing to differentiate: no node, no context
        # torch's Function.apply without its signature binding (nothing to bind)
        return super(torch.autograd.Function, cls).apply(*unwrap_dead_wrappers(args))


def keep_for_backward(ctx, inputs, output) -> None:
    """``setup_context`` of an operator's Function whose inputs are (q, k, v, *attributes):
    q, k, v and every output kept for the backward, the first output differentiable and
    the others not (row statistics, flags: no zeros made for their absent gradients), the
    attributes kept as Python values."""
    q, k, v, *attributes = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.attributes = attributes
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)


def backward_through(operator, what: str):
    """``backward`` of such a Function: (dq, dk, dv) from ``operator(grad_out, q, k, v,
    *outputs, *attributes)``, a second derivative refused by naming ``what``."""
    def backward(ctx, grad_out, *_):
        refuse_second_derivative(what)
        q, k, v, *outputs = ctx.saved_tensors
        dq, dk, dv = operator(grad_out, q, k, v, *outputs, *ctx.attributes)
        return dq, dk, dv, *(None for _ in ctx.attributes)
    return backward
