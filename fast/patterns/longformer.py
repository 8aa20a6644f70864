"""Longformer, made causal: a (dilated) sliding window, and global tokens.

Beltagy et al., 2020 (Longformer), sec. 3.1 (sliding, dilated and global attention); a
neighbour of the Sparse Transformer's patterns (Child
et al., 2019, sec. 4.3), causal like all of them. One part, "longformer", read by every
head in every combine mode, the union of two terms, for a query at i and a key at j <= i:

* the window: the ``window`` positions i, i - r, ..., i - (window - 1) r for the dilation
  r: 0 <= i - j < window r and (i - j) mod r == 0;
* global tokens: a global token g is read by every i >= g and reads every j <= g.

Parameters: window >= 1, dilation >= 1 (default 1), global_tokens (positions in [0, n),
default none), checked by ``reference.params``. Its reference twin:
``reference.patterns.longformer``.
"""

from __future__ import annotations

import torch

from fast.patterns.pattern import Lines, Pattern, Periodic, Term


def parts(n, device, *, window, dilation, global_tokens):
    r = dilation
    glob = torch.tensor(global_tokens, dtype=torch.long, device=device)
    is_global = torch.zeros(n, dtype=torch.bool, device=device)
    is_global[glob] = True
    at = lambda p: is_global[p.clamp(0, n - 1)]       # positions outside [0, n): any value
    return {"longformer": (
        Term(lambda i, j: (j > i - window * r) & (i % r == j % r),
             Periodic(reach=(window - 1) * r + 1)),
        Term(lambda i, j: at(i) | at(j), Lines(glob.cpu())),
    )}


PATTERN = Pattern("longformer", parts, cite="Beltagy et al., 2020, sec. 3.1 (made causal)")
