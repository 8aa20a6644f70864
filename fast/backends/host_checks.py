"""The checks of ``sparse_attention`` that read values on the host, as one operator.

Child et al., 2019, section 4 (eq. 2-4): attention is a function of the values of q, k
and v and of the positions each sequence holds; a NaN or inf in q, k, v, or a length or
offset outside the sequence, would surface far from its cause, so
``fast.sparse_attention`` refuses them (``fast.core.checks.check_finite``,
``fast.backends.padding.check_padding_values``).

Each of those checks ends in a value read on the host (``bool(tensor)``), which
``torch.compile`` cannot trace: it would cut the model's graph in two at every attention
call (a graph break) and make ``fullgraph=True`` fail. So they run inside one custom
operator, ``sparse_transformer::check_inputs`` (``check``), eager or compiled: a compiled
graph holds it as one opaque call, and the same Python runs when the graph runs -- the
same checks at the same point, the same ValueError, no break. They are value checks:
``fast.sparse_attention``'s call plan runs them only where the call asks for them (the
finite check: by default on the CPU only; padding values given on the host: always,
there they cost no wait).

The operator returns nothing, so a compiler would drop it as dead code; it is registered
as having an ordered side effect (``register_effect``, which threads a token through
the graph, as ``print`` is kept), and is kept where it stands. That registration is
torch's private ``torch._library.effects.EffectType`` (written against torch 2.13.0;
tests/fast/backends/test_ops.py::test_compiled_raises_what_eager_raises checks that a
compiled call still raises).
"""

from __future__ import annotations

import torch
from torch._library.effects import EffectType

from fast.backends.padding import check_padding_values
from fast.core.checks import check_finite


def host_checks(q, k, v, finite: bool, lengths, offsets, check_lengths: bool,
                check_offsets: bool) -> None:
    """Raise a ValueError if ``finite`` and q, k or v hold NaN or inf, or if the lengths
    or offsets asked for (``check_lengths``, ``check_offsets``) are outside the n_k keys
    of k: q (B, H, n_q, d), k, v (B, Hkv, n_k, d), lengths and offsets int64 (B,) or
    None."""
    if finite:
        check_finite(q, k, v)
    check_padding_values(lengths, offsets, k.shape[2], check_lengths, check_offsets)


@torch.library.custom_op("sparse_transformer::check_inputs", mutates_args=())
def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, finite: bool,
          lengths: torch.Tensor | None, offsets: torch.Tensor | None, check_lengths: bool,
          check_offsets: bool) -> None:
    """``host_checks`` as one operator, kept in a compiled graph where it stands."""
    host_checks(q, k, v, finite, lengths, offsets, check_lengths, check_offsets)


@check.register_fake
def _(q, k, v, finite, lengths, offsets, check_lengths, check_offsets):
    return None


check.register_effect(EffectType.ORDERED)
