"""The strided pattern one level deeper: p = 3 parts, for a sequence folded into a cube.

Child et al., 2019, sec. 4.2: "In this work, we explore two factorizations for p=2,
which we describe in the following section, though we note that the same techniques can
be easily extended to higher dimensions." The paper gives no pattern for p = 3; this is
the strided pattern of sec. 4.3 one level deeper, the one notebook 01 draws. For the
stride l, a query at position i and a key at j <= i (0-indexed), write
i - j = d0 + d1 l + d2 l^2 with digits 0 <= d0, d1 < l:

* A(1) "local":  0 <= i - j < l: the last l positions, i itself included (exactly l, as
  the strided pattern's A(1));
* A(2) "column": (i - j) mod l == 0 and i - j < l^2: every l-th position within the
  last l^2;
* A(3) "depth":  (i - j) mod l^2 == 0: every l^2-th position.

Every part holds i itself. Three hops reach every j <= i (j + d0 in A(1), then + d1 l in
A(2), then + d2 l^2 in A(3)), and while n <= l^3 each part reads at most l positions per
query: with l close to n^(1/3), O(n^(1/3)) keys per head, against the O(sqrt(n)) of p = 2.
A multi-head layer gives head h the part A(h mod 3), an interleaved model layer r the part
A(r mod 3) (eq. 6 and 8, ``reference.heads``).

Parameter: the stride l >= 1, checked as the strided pattern's (``reference.params``).
"""

from __future__ import annotations

import numpy as np

PARTS = ("local", "column", "depth")
REQUIRED = ("stride",)
OPTIONAL: dict = {}


def masks(n: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(local, column, depth), each bool (n, n): A(1), A(2), A(3) of the module docstring."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    back = i - j
    l = stride
    local = (back >= 0) & (back < l)
    column = (back >= 0) & (back < l * l) & (back % l == 0)
    depth = (back >= 0) & (back % (l * l) == 0)
    return local, column, depth
