"""The head roles of ``reference.heads`` as a small per-head integer table.

Child et al., 2019, sec. 5.1 (eq. 5-8: merged, multi-head and interleaved heads)
and sec. 4.3 (the fixed pattern's summary sub-blocks). The reordered layouts of the
paper's patterns (``fast.layout.blocks``, order "structured") index per-head behaviour
by h inside tensor code, so the roles become columns of an int64 tensor, with what
their disjoint parts need (which part holds the diagonal, or a head's own block);
equal rows mean equal behaviour (a layout builds once per distinct row). The natural
order and FlexAttention take the registry's ``fast.patterns.Heads`` instead.
"""

from __future__ import annotations

import torch

from reference.heads import HeadRole


def head_table(pattern: str, roles: tuple[HeadRole, ...]) -> torch.Tensor:
    """Per-head behaviour as an int64 table (H, k):

    strided: (reads local, reads column, first column row: 1 if the head also
              reads local, which then holds the diagonal j == i)
    fixed:   (reads block, reads summary, summary lo, summary hi, summary strict:
              1 if the head also reads block, which then holds its own block)
    others:  (0,) -- every head reads the one mask.
    """
    rows = []
    for role in roles:
        if pattern == "strided":
            local = int(role.reads("local"))
            rows.append((local, int(role.reads("column")), local))
        elif pattern == "fixed":
            block = int(role.reads("block"))
            rows.append((block, int(role.reads("summary")), *role.summary, block))
        else:
            rows.append((0,))
    return torch.tensor(rows, dtype=torch.long)                          # (H, k)
