"""How many keys each query reads, from closed forms (no n x n mask).

Child et al., 2019, "Generating Long Sequences with Sparse Transformers",
section 4.2: with l about sqrt(n), a factorized head reads about sqrt(n) keys
per query instead of n, so a layer costs O(n sqrt n). ``keys_per_query`` gives
the exact counts of the masks of ``reference.patterns`` for every row, so it
runs at n = 16,384 and beyond (tests/reference/test_patterns.py checks it
against the masks; notebook 01 plots it).
"""

from __future__ import annotations

import numpy as np

from reference.heads import summary_range
from reference.params import FACTORIZED, check_params, check_rank_for

PARTS_COUNTED = ("A1", "A2", "merged")


def keys_per_query(pattern: str, n: int, part: str = "merged", stride: int | None = None,
                   c: int | None = None, head: int = 0) -> np.ndarray:
    """Number of keys each row i = 0..n-1 reads, as an int64 array of shape (n,).

    part: "A1" (strided local / fixed block), "A2" (strided column / fixed
    summary of the head of summary rank ``head``) or "merged" (their union).
    ``full`` reads i + 1; it is one part, not factorized, so its only part is
    "merged" (the default). ``head`` chooses keys only for "fixed" (its summary
    sub-block): for "full" and "strided", whose heads all read the same keys, it
    must be 0, the default (``reference.params.check_rank_for``).
      strided  A1: min(i+1, l)        A2: floor(i/l) + 1   merged: min(i+1, l) + floor(i/l)
      fixed    A1: (i mod l) + 1      A2: summaries [lo, hi) of every j <= i
               merged: (i mod l) + 1 + floor(i/l) * c   (own block, earlier blocks' summaries)
    """
    if part not in PARTS_COUNTED:
        raise ValueError(f"part must be one of {PARTS_COUNTED}, got {part!r}")
    if pattern not in FACTORIZED:
        raise ValueError(f"pattern must be one of {FACTORIZED}, got {pattern!r}")
    if pattern == "full" and part != "merged":
        raise ValueError(f"pattern 'full' has one part (every j <= i), not the two heads A1, "
                         f"A2 of a factorized pattern; got part={part!r} (allowed: 'merged', "
                         f"the default)")
    params = check_params(pattern, n, 1, "merged", 0, {"stride": stride, "c": c})
    check_rank_for(pattern, head)
    i = np.arange(n, dtype=np.int64)
    if pattern == "full":
        return i + 1
    l = params["stride"]
    if pattern == "strided":
        a1, a2 = np.minimum(i + 1, l), i // l + 1
        return {"A1": a1, "A2": a2, "merged": a1 + a2 - 1}[part]  # they share only j = i
    lo, hi = summary_range(l, params["c"], head)
    whole, rest = np.divmod(i + 1, l)
    a1 = i % l + 1
    a2 = whole * (hi - lo) + np.clip(rest - lo, 0, hi - lo)
    return {"A1": a1, "A2": a2, "merged": a1 + (i // l) * (hi - lo)}[part]
