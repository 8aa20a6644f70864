"""The fixed pattern: the query's own block of l, and the summaries of every block.

Child et al., 2019, sec. 4.3 and Figure 3c. Two parts, for a query at position i and a
key at position j <= i (0-indexed):

* A(1) "block":   floor(j / l) == floor(i / l): the block of length l that holds i.
* A(2) "summary": (j mod l) in [lo, hi): the summary positions of every block. The
  paper writes {t, ..., l} with t = l - c; 0-indexed that is the c positions l - c ..
  l - 1 (a widely copied port keeps c + 1 and lets a block's first query read the whole
  previous block; both are bugs, not copied). With several heads, "having them attend
  to distinct subblocks of length c within the block of size l was preferable": the
  head of summary rank r reads sub-block k = r mod (l / c), [l - (k+1) c, l - k c)
  (``reference.heads.summary_range``; rank 0 the last c positions). So [lo, hi) is a
  per-head number of this pattern (``head_values``).

Parameters: the stride l >= 1 and the summary width c, 1 <= c <= l, l a multiple of c
when a head has a rank above 0 (``reference.params.check_summary``). It suits text, where
the strided pattern "can fail to properly route information". Its reference twin:
``reference.patterns.fixed``.
"""

from __future__ import annotations

from fast.patterns.pattern import Pattern, Periodic, Term


def parts(n, device, *, stride, c):
    l = stride
    return {
        "block": (Term(lambda i, j: i // l == j // l, Periodic(l, reach=l)),),
        "summary": (Term(lambda i, j, head: (j % l >= head.lo) & (j % l < head.hi),
                         Periodic(l), per_head=True),),
    }


def head_values(role):
    """The summary sub-block [lo, hi) of the head's summary rank (sec. 4.3)."""
    lo, hi = role.summary
    return {"lo": lo, "hi": hi}


PATTERN = Pattern("fixed", parts, cite="Child et al., 2019, sec. 4.3, Figure 3c",
                  head_values=head_values)
