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
