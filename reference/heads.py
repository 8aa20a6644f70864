"""Head roles: which part(s) of a pattern each head of a layer reads.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers",
section 5.1 (eq. 5-8) for the three ways of using the two factorized heads
A(1), A(2) of section 4.2, and section 4.3 for the fixed pattern's summaries.

Every pattern is a tuple of named parts (``PARTS``): strided = (local, column),
fixed = (block, summary), full, longformer and bigbird one part each, and each
pattern of ``reference.extensions`` the parts its module names. A ``HeadRole`` says
which of them head h reads, for every combine mode, with p the number of parts (2
for the factorized patterns of sec. 4.3; eq. 6 writes r mod p):

  combine        eq.  head h of layer r reads
  "merged"       7    every part: A(1) | ... | A(p)
  "multihead"    8    A(h mod p): the heads take the parts in turn, computed in parallel
  "interleaved"  6    A(r mod p): all heads of a layer read the same part

"full", "longformer" and "bigbird" have a single part: every head reads it, and
combine and layer change nothing.

Fixed summaries: "attend to distinct subblocks of length c within the block of
size l was preferable" (sec. 4.3), so the heads that read summaries read distinct
sub-blocks. The summary rank of head h is r = h for "merged" and "interleaved"
and r = h // 2 for "multihead" (``summary_rank``); it reads sub-block
k = r mod (l / c), the positions (j mod l) in [l - (k+1) c, l - k c) of every
block (``summary_range``). Rank 0 reads the last c positions of each block, as
the single-head pattern does. Ranks exist for every head of every layer (not
only those reading A(2) in this layer), so a model's parameters are valid for
all its layers. A head may read nothing in some rows (the summary head of a
multihead layer before the first summary); its output there is 0, never NaN
(``reference.attention``).

This file is pure arithmetic: the masks are built from the roles in
``reference.patterns``, and the fast paths build theirs from the same roles.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.extensions import EXTENSIONS
from reference.params import (
    check_combine,
    check_layer,
    check_n_heads,
    check_pattern,
    check_stride,
    check_summary,
    summary_rank,
)

# The named parts of each pattern: (A(1), A(2)) for the factorized two.
PARTS = {
    "full": ("full",),
    "strided": ("local", "column"),
    "fixed": ("block", "summary"),
    "longformer": ("longformer",),
    "bigbird": ("bigbird",),
    **{name: tuple(module.PARTS) for name, module in EXTENSIONS.items()},
}


def summary_range(stride: int, c: int, rank: int = 0) -> tuple[int, int]:
    """The half-open range [lo, hi) of ``j mod l`` that the head of summary rank
    ``rank`` reads: sub-block k = rank mod (l // c), [l - (k+1) c, l - k c).
    Rank 0 gives [l - c, l) (paper: {t..l} with t = l - c, 0-indexed)."""
    stride = check_stride(stride)
    c = check_summary(stride, c, rank)
    k = rank % (stride // c)
    return stride - (k + 1) * c, stride - k * c


@dataclass(frozen=True)
class HeadRole:
    """What head ``head`` reads.

    parts:   the names of the parts it reads, in ``PARTS`` order;
    rank:    fixed only: its summary rank (``summary_rank``), else None;
    summary: fixed only: [lo, hi) of (j mod l) of its summary sub-block, else
             None (defined whether or not this layer's head reads "summary").
    """
    head: int
    parts: tuple[str, ...]
    rank: int | None = None
    summary: tuple[int, int] | None = None

    def reads(self, part: str) -> bool:
        """True if this head reads the part named ``part``."""
        return part in self.parts


def head_roles(pattern: str, n_heads: int, combine: str = "merged", layer: int = 0, *,
               stride: int | None = None, c: int | None = None) -> tuple[HeadRole, ...]:
    """The role of every head of layer ``layer``, a tuple of ``n_heads`` HeadRoles.

    ``stride`` and ``c`` are the fixed pattern's l and c (needed for its summary
    ranges; the other patterns' roles do not depend on their parameters).
    """
    check_pattern(pattern)
    n_heads = check_n_heads(n_heads)
    check_combine(combine)
    layer = check_layer(layer)
    parts = PARTS[pattern]
    if stride is not None:
        check_stride(stride)          # bounded like every integer (reference.params)
    if pattern == "fixed":
        if stride is None or c is None:
            raise ValueError(f"pattern 'fixed' needs the parameters stride and c for its head "
                             f"roles, got stride={stride!r}, c={c!r}")
        check_summary(stride, c, summary_rank(n_heads - 1, combine))  # the largest rank
    roles = []
    for h in range(n_heads):
        if len(parts) == 1 or combine == "merged":
            reads = parts
        elif combine == "multihead":
            reads = (parts[h % len(parts)],)
        else:  # interleaved
            reads = (parts[layer % len(parts)],)
        if pattern == "fixed":
            rank = summary_rank(h, combine)
            roles.append(HeadRole(h, reads, rank, summary_range(stride, c, rank)))
        else:
            roles.append(HeadRole(h, reads))
    return tuple(roles)
