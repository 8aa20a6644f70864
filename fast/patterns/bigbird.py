"""BigBird, made causal: a sliding window, random earlier keys, and leading global tokens.

Zaheer et al., 2020 (BigBird), sec. 2 (window, random and global attention); a
neighbour of the Sparse Transformer's patterns (Child et
al., 2019, sec. 4.3), causal like all of them. One part, "bigbird", read by every head in
every combine mode, the union of three terms, for a query at i and a key at j <= i:

* the window: 0 <= i - j < window;
* global tokens: the first n_global positions, read by every later position and reading
  every earlier one;
* random keys: n_random distinct positions drawn uniformly from [0, i] for each i, with a
  seed, by the reference (``reference.patterns.bigbird_random_keys``), so every path
  reads the same keys.

Parameters: window >= 1, n_random >= 0, 0 <= n_global <= n, seed >= 0 (default 0),
checked by ``reference.params``. Its reference twin: ``reference.patterns.bigbird``.
"""

from __future__ import annotations

import numpy as np
import torch

from fast.patterns.pattern import Lines, Pairs, Pattern, Periodic, Term
from reference.patterns import bigbird_random_keys


def parts(n, device, *, window, n_random, n_global, seed):
    keys = torch.from_numpy(np.asarray(bigbird_random_keys(n, n_random, seed),
                                       dtype=np.int64))                  # (n, r), -1 = none
    rows = torch.arange(n)[:, None].expand_as(keys)
    drawn = keys >= 0
    columns = [keys[:, r].contiguous().to(device) for r in range(keys.shape[1])]  # (n,) each
    at = lambda p: p.clamp(0, n - 1)                  # positions outside [0, n): any value
    none = torch.zeros((), dtype=torch.bool, device=device)

    def random(i, j):                                 # j is one of the keys drawn for i
        out = none
        for column in columns:
            hit = column[at(i)] == j
            out = hit if out is none else out | hit
        return out
    return {"bigbird": (
        Term(lambda i, j: j > i - window, Periodic(reach=window)),
        Term(lambda i, j: (i < n_global) | (j < n_global), Lines(torch.arange(n_global))),
        Term(random, Pairs(rows[drawn], keys[drawn])),
    )}


PATTERN = Pattern("bigbird", parts, cite="Zaheer et al., 2020, sec. 2 (made causal)")
