"""The strided pattern: the last l positions, and every l-th position before them.

Child et al., 2019, sec. 4.3 and Figure 3b. Two parts, for a query at position i and a
key at position j <= i (0-indexed):

* A(1) "local":  0 <= i - j < l, exactly l positions, i itself included. The paper
  writes t = max(0, i - l), which would be l + 1 positions; the authors' code keeps l,
  and so do we (docs/design.md, sec. 2).
* A(2) "column": (i - j) mod l == 0, every l-th position back from i, written as
  i mod l == j mod l.

Parameter: the stride l >= 1 (close to sqrt(n), sec. 4.3), checked by
``reference.params.check_stride``. It suits data with a period of l (an image whose rows
are l wide). Its reference twin: ``reference.patterns.strided``.
"""

from __future__ import annotations

from fast.patterns.pattern import Pattern, Periodic, Term


def parts(n, device, *, stride):
    l = stride
    return {
        "local": (Term(lambda i, j: j > i - l, Periodic(reach=l)),),
        "column": (Term(lambda i, j: i % l == j % l, Periodic()),),
    }


PATTERN = Pattern("strided", parts, cite="Child et al., 2019, sec. 4.3, Figure 3b")
