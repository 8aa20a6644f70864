"""Attention patterns of the Sparse Transformer, as boolean masks (NumPy, for reading).

Child et al., 2019, "Generating Long Sequences with Sparse Transformers",
section 4.2 (factorized self-attention) and section 4.3 (the strided and fixed
patterns); section 5.1 (eq. 5-8) for the three ways of combining the two heads;
Longformer (Beltagy et al., 2020) and BigBird (Zaheer et al., 2020), made causal,
as the neighbours the benchmarks compare with. Patterns added since are written one
module each in ``reference.extensions``; ``factorized`` and ``head_masks`` serve them too.

A mask is a bool array of shape (n, n): ``mask[i, j]`` is True where output i may
read input j. Every pattern here is causal (j <= i). Decisions (positions are
0-indexed; the paper's off-by-ones are settled as follows):

* strided, A(1) "local":   0 <= i - j < l -- exactly l positions. The paper's
  ``t = max(0, i - l)`` would give l + 1; the authors' code keeps l, so do we.
* strided, A(2) "column":  (i - j) mod l == 0.
* fixed, A(1) "block":     floor(j / l) == floor(i / l).
* fixed, A(2) "summary":   (j mod l) in [l - c, l): the c positions l-c..l-1 of
  every block of length l. fairseq keeps c + 1 positions and lets a block's
  first query read the whole previous block; both are bugs, not copied. Several
  summary heads read distinct sub-blocks of length c (sec. 4.3, the rank rule
  of ``reference.heads``).
* A row that reads nothing (a multihead summary head before the first summary)
  outputs 0, never NaN (``reference.attention``).

``head_masks`` is the contract: which positions every head of every layer reads,
for every pattern, built from the head roles of ``reference.heads``. The
fast implementations in ``fast/`` must reproduce it. Names and checks live in
``reference.params``. Everything is written for clarity, not speed: masks are
built from index grids.
"""

from __future__ import annotations

import numpy as np

from reference.extensions import EXTENSIONS
from reference.heads import PARTS, head_roles, summary_range
from reference.params import (
    COMBINES,
    FACTORIZED,
    PATTERNS,
    check_dilation,
    check_global_tokens,
    check_n,
    check_n_global,
    check_n_random,
    check_params,
    check_rank_for,
    check_seed,
    check_stride,
    check_summary,
    check_window,
    summary_rank,
)

__all__ = [
    # the masks
    "full", "strided", "fixed", "longformer", "bigbird", "bigbird_random_keys", "union",
    "factorized", "head_masks",
    # re-exported from reference.params and reference.heads (their home)
    "PATTERNS", "FACTORIZED", "COMBINES", "check_n", "check_stride", "check_summary",
    "summary_rank", "summary_range",
]


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row index i and column index j of an (n, n) grid."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return i, j


# ----------------------------------------------------------------------------
# The three patterns of section 4.3 (Figure 3).
# ----------------------------------------------------------------------------

def full(n: int) -> np.ndarray:
    """Dense causal attention: output i reads every j <= i. Shape (n, n)."""
    n = check_n(n)
    i, j = _grid(n)
    return j <= i


def strided(n: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """The strided pattern (sec. 4.3, Fig. 3b): ``(local, column)``, each (n, n).

    local  = A(1): the last l positions, i itself included: 0 <= i - j < l.
             (Paper: t = max(0, i - l) reads l + 1 positions; we keep exactly l,
             as the authors' code does.)
    column = A(2): every l-th position back from i: (i - j) mod l == 0, j <= i.
    """
    n, stride = check_n(n), check_stride(stride)
    i, j = _grid(n)
    back = i - j
    local = (back >= 0) & (back < stride)
    column = (back >= 0) & (back % stride == 0)
    return local, column


def fixed(n: int, stride: int, c: int, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fixed pattern (sec. 4.3, Fig. 3c): ``(block, summary)``, each (n, n).

    block   = A(1): causal attention inside the block of length l that holds i:
              floor(j / l) == floor(i / l), j <= i.
    summary = A(2): the summary positions (j mod l) in [l - c, l) of every block,
              j <= i; the head of summary rank ``head`` reads its own sub-block
              (``reference.heads.summary_range``).
              (fairseq keeps c + 1 positions and lets a block's first query see
              the whole previous block; both are bugs we do not copy.)
    """
    n, stride = check_n(n), check_stride(stride)
    lo, hi = summary_range(stride, c, head)
    i, j = _grid(n)
    causal = j <= i
    block = causal & (j // stride == i // stride)
    summary = causal & (j % stride >= lo) & (j % stride < hi)
    return block, summary


def union(*masks: np.ndarray) -> np.ndarray:
    """The merged head (eq. 7): reads every position that any of ``masks`` reads."""
    if not masks:
        raise ValueError("union needs at least one mask, got none")
    shape = np.shape(masks[0])
    for m in masks:
        if np.shape(m) != shape:
            raise ValueError(f"union needs masks of one shape, got {[np.shape(x) for x in masks]}")
    return np.logical_or.reduce([np.asarray(m, dtype=bool) for m in masks])


# ----------------------------------------------------------------------------
# Neighbours: Longformer and BigBird, causal like everything here.
# ----------------------------------------------------------------------------

def longformer(n: int, window: int, dilation: int = 1, global_tokens=()) -> np.ndarray:
    """Longformer (Beltagy et al., 2020), causal: a (dilated) sliding window plus
    global tokens. Shape (n, n).

    Output i reads the ``window`` positions i, i - r, ..., i - (window - 1) r for
    dilation r (0 <= i - j < window * r and (i - j) mod r == 0). A global token g
    is read by every i >= g and reads every j <= g.
    """
    n, window, dilation = check_n(n), check_window(window), check_dilation(dilation)
    g = np.asarray(check_global_tokens(n, global_tokens), dtype=np.int64)
    i, j = _grid(n)
    back = i - j
    mask = (back >= 0) & (back < window * dilation) & (back % dilation == 0)
    is_global = np.zeros(n, dtype=bool)
    is_global[g] = True
    mask |= (back >= 0) & (is_global[None, :] | is_global[:, None])
    return mask


def bigbird_random_keys(n: int, n_random: int, seed: int = 0) -> np.ndarray:
    """The random keys of BigBird, causal: row i holds ``n_random`` distinct
    positions drawn uniformly from [0, i] (all of them when i + 1 <= n_random),
    padded with -1. Shape (n, n_random). Seeded, so every implementation that
    asks for the same (n, n_random, seed) gets the same keys."""
    n, n_random, seed = check_n(n), check_n_random(n_random), check_seed(seed)
    rng = np.random.default_rng(seed)
    keys = np.full((n, n_random), -1, dtype=np.int64)
    for i in range(n):
        k = min(n_random, i + 1)
        keys[i, :k] = np.sort(rng.choice(i + 1, size=k, replace=False))
    return keys


def bigbird(n: int, window: int, n_random: int, n_global: int, seed: int = 0) -> np.ndarray:
    """BigBird (Zaheer et al., 2020), causal: sliding window of ``window``
    positions (0 <= i - j < window), ``n_random`` seeded random earlier keys per
    query (``bigbird_random_keys``), and the first ``n_global`` positions as
    global tokens (read by all later positions, reading all earlier ones)."""
    n = check_n(n)
    n_global = check_n_global(n, n_global)
    mask = longformer(n, window, 1, range(n_global))
    keys = bigbird_random_keys(n, n_random, seed)
    rows, cols = np.nonzero(keys >= 0)
    mask[rows, keys[rows, cols]] = True
    return mask


# ----------------------------------------------------------------------------
# The contract: which positions every head of a layer reads (eq. 5-8).
# ----------------------------------------------------------------------------

def factorized(pattern: str, n: int, head: int = 0, **params) -> tuple[np.ndarray, ...]:
    """The masks of the parts of ``pattern`` (``reference.heads.PARTS``), in order:
    strided (local, column), fixed (block, summary) as read by the head of summary
    rank ``head``; full, longformer and bigbird have one part: (mask,); a pattern of
    ``reference.extensions`` the masks its module gives.

    ``head`` (a summary rank, ``reference.heads``) chooses keys only for "fixed";
    the heads of the other patterns all read the same keys, so for them it must
    be 0, the default (``reference.params.check_rank_for``).
    """
    params = check_params(pattern, n, 1, "merged", 0, params)
    check_rank_for(pattern, head)
    if pattern == "full":
        return (full(n),)
    if pattern == "strided":
        return strided(n, **params)
    if pattern == "fixed":
        return fixed(n, params["stride"], params["c"], head)
    if pattern == "longformer":
        return (longformer(n, **params),)
    if pattern == "bigbird":
        return (bigbird(n, **params),)
    return tuple(EXTENSIONS[pattern].masks(n, **params))


def head_masks(pattern: str, n: int, n_heads: int, combine: str = "merged",
               layer: int = 0, **params) -> np.ndarray:
    """Which positions each head of layer ``layer`` reads: bool (n_heads, n, n).

    pattern and params: "full"; "strided" (stride); "fixed" (stride, c);
    "longformer" (window, dilation=1, global_tokens=()); "bigbird" (window,
    n_random, n_global, seed=0); the patterns of ``reference.extensions`` -- see
    ``reference.params.PARAMS``.
    combine (sec. 5.1), for a pattern of p parts: "merged" (eq. 7, every head reads
    A(1) | ... | A(p)), "multihead" (eq. 8, head h reads A(h mod p)), "interleaved"
    (eq. 6, every head of layer r reads A(r mod p)). Head h reads the union of the
    parts its ``reference.heads.HeadRole`` names; for "fixed", its summary is the
    sub-block of its rank. full, longformer and bigbird: every head reads the one mask.
    """
    params = check_params(pattern, n, n_heads, combine, layer, params)
    roles = head_roles(pattern, n_heads, combine, layer,
                       stride=params.get("stride"), c=params.get("c"))
    out = np.zeros((n_heads, n, n), dtype=bool)
    parts_of: dict = {}  # summary sub-block -> {part name: mask}; one entry unless fixed
    for role in roles:
        if role.summary not in parts_of:
            masks = factorized(pattern, n, role.rank or 0, **params)
            parts_of[role.summary] = dict(zip(PARTS[pattern], masks))
        out[role.head] = union(*(parts_of[role.summary][p] for p in role.parts))
    return out
