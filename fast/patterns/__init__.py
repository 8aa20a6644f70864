"""The pattern registry: each pattern stated once, as rules on positions (sec. 4.2-4.3, 5.1).

Child et al., 2019, sec. 4.2 (factorized self-attention: p parts A(1) .. A(p)), sec. 4.3
(the strided and fixed patterns) and sec. 5.1 (eq. 5-8: how a layer's heads read them);
Longformer (Beltagy et al., 2020) and BigBird (Zaheer et al., 2020) as neighbours.

One module per pattern, named for it (``full``, ``strided``, ``fixed``, ``longformer``,
``bigbird``, and any added since), each holding ``PATTERN``: its parts as rules and where
their pairs lie, the per-head numbers its rules read, its documentation and citation
(``fast.patterns.pattern`` says what a module gives). The generic paths derive everything
from it: the naive backend's masks (``fast.backends.masks``), FlexAttention's mask_mod and
BlockMask (``fast.backends.flex``), the natural-order block layout (``fast.layout.natural``)
and the rows a decoding step reads (``fast.backends.reads``). The specialised fast paths
(the structured backend, the C kernel, the Triton layouts in reordered orders, the sparse
decoding stores) serve the paper's patterns and are tested against the same rules.

Every registered pattern has its independent truth in ``reference/`` (``reference.patterns``
for the paper's patterns and the neighbours, one module of ``reference.extensions`` for each
pattern added since), with its parameters and their checks; a module here without one, or
a reference pattern without a module here, is refused when this package is imported. So a
pattern is added in two files: ``fast/patterns/NAME.py`` and ``reference/extensions/NAME.py``.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import MappingProxyType

from fast.patterns.pattern import Head, Heads, Lines, Pairs, Pattern, Periodic, Term, every
from reference.params import PATTERNS, check_pattern


def _discover() -> MappingProxyType:
    """{name: Pattern} of every module of this package that holds a ``PATTERN``, in the
    order of ``reference.params.PATTERNS``."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        entry = getattr(importlib.import_module(f"{__name__}.{info.name}"), "PATTERN", None)
        if entry is None:                              # the machinery, not a pattern
            continue
        if entry.name != info.name:
            raise TypeError(f"fast/patterns/{info.name}.py registers the pattern "
                            f"{entry.name!r}: a pattern's module is named for it")
        found[info.name] = entry
    if set(found) != set(PATTERNS):
        raise TypeError(f"the registry and the reference must name the same patterns: only in "
                        f"fast/patterns/ {sorted(set(found) - set(PATTERNS))} (each needs its "
                        f"reference twin, reference/extensions/NAME.py), only in reference/ "
                        f"{sorted(set(PATTERNS) - set(found))} (each needs fast/patterns/NAME.py)")
    return MappingProxyType({name: found[name] for name in PATTERNS})


REGISTRY = _discover()
# The same table as a plain dict, which ``get`` reads: a traced caller (torch.compile of a
# model whose code mutates a dict, as transformers' models do) cannot read a mapping proxy
# without a graph break (as reference.params' lookups).
_LOOKUP = dict(REGISTRY)


def get(name) -> Pattern:
    """The registered pattern ``name``; a ValueError naming the patterns otherwise (the
    message of ``reference.params.check_pattern``, as from every entry point)."""
    return _LOOKUP[check_pattern(name)]


__all__ = ["REGISTRY", "get", "Pattern", "Term", "Periodic", "Lines", "Pairs", "Head", "Heads",
           "every"]
