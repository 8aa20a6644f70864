"""The strided pattern one level deeper: p = 3 parts, for a sequence folded into a cube.

Child et al., 2019, sec. 4.2 (p parts A(1), ..., A(p); the paper explores p = 2 and notes
that the same techniques extend to higher dimensions) and sec. 4.3 (the strided pattern):
for the stride l, a query at position i and a key at j <= i,

* A(1) "local":  0 <= i - j < l, the last l positions, i itself included;
* A(2) "column": (i - j) mod l == 0 and i - j < l^2, every l-th position within the
  last l^2, written as i mod l == j mod l and j > i - l^2;
* A(3) "depth":  (i - j) mod l^2 == 0, every l^2-th position, written as
  i mod l^2 == j mod l^2.

Three hops reach every j <= i, and while n <= l^3 each part reads at most l keys per
query (l close to n^(1/3): O(n^(1/3)) against the O(sqrt(n)) of p = 2). Parameter: the
stride l >= 1. Its reference twin, with the decisions: ``reference.extensions.strided3``.
"""

from __future__ import annotations

from fast.patterns.pattern import Pattern, Periodic, Term


def parts(n, device, *, stride):
    l, m = stride, stride * stride
    return {
        "local": (Term(lambda i, j: j > i - l, Periodic(reach=l)),),
        "column": (Term(lambda i, j: (i % l == j % l) & (j > i - m), Periodic(reach=m)),),
        "depth": (Term(lambda i, j: i % m == j % m, Periodic()),),
    }


PATTERN = Pattern("strided3", parts, cite="Child et al., 2019, sec. 4.2 (p = 3) and sec. 4.3")
