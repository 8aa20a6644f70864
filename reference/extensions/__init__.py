"""Patterns beyond the paper's three and its two neighbours: one module each, found by name.

Child et al., 2019, sec. 4.2: a factorized pattern has p parts A(1), ..., A(p), and "the
same techniques can be easily extended to higher dimensions". ``reference/patterns.py``
writes the patterns of sec. 4.3 and the Longformer and BigBird neighbours by hand; a pattern
added since is one module of this package, the independent truth of that pattern (its twin in
``fast/patterns/`` is the PyTorch rule every fast path derives from). The module's name is the
pattern's name, and it holds, NumPy only (it imports nothing of ``reference``, which finds it):

* ``PARTS``     the names of its parts A(1), A(2), ..., in order (sec. 4.2's p parts; the head
                contract of ``reference.heads`` gives head h of a multi-head layer A(h mod p)
                and every head of layer r of an interleaved model A(r mod p), eq. 6 and 8);
* ``REQUIRED``  its required parameter names, ``OPTIONAL`` {name: default};
* ``INTEGERS``  {name: smallest allowed value} of every parameter that ``reference.params``
                does not already check by name (``stride``, ``c``, ``window``, ...): checked as
                integers bounded like every other one;
* ``masks(n, **params)``: one causal (n, n) bool mask per part, written for reading;
* a docstring citing its source, and its decisions.

Every head reads the same mask of a part (the fixed pattern's per-head summaries are
``reference.heads``' own). ``EXTENSIONS`` maps each name to its module, sorted by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import MappingProxyType

EXTENSIONS = MappingProxyType({
    info.name: importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
})
