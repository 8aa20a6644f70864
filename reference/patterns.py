"""Attention patterns of the Sparse Transformer, as boolean masks (NumPy, for reading).

Child et al., 2019, "Generating Long Sequences with Sparse Transformers",
section 4.2 (factorized self-attention) and section 4.3 (the strided and fixed
patterns); section 5.1 (eq. 5-8) for the three ways of combining the two heads.

A mask is a bool array of shape (n, n): ``mask[i, j]`` is True where output i may
read input j. Every pattern here is causal (j <= i). Positions are 0-indexed, and
the paper's off-by-ones are decided as in ``shared/paper-notes.md`` section 2:

* strided, head A(1) ("local"):   0 <= i - j < l        -- exactly l positions
  (the paper's ``t = max(0, i - l)`` would give l + 1; the authors' code keeps l);
* strided, head A(2) ("column"):  (i - j) mod l == 0;
* fixed, head A(1) ("block"):     floor(j / l) == floor(i / l);
* fixed, head A(2) ("summary"):   (j mod l) in [l - c, l): the last c positions of
  every block of length l. With several heads, head h reads the distinct
  sub-block k = h mod (l / c), i.e. (j mod l) in [l - (k+1) c, l - k c).

This file is the contract: ``head_masks`` says which positions every head of
every layer reads, and the fast implementations in ``fast/`` must reproduce it.
Everything is written for clarity, not speed: masks are built from index grids.
"""

from __future__ import annotations

import numpy as np

PATTERNS = ("full", "strided", "fixed")
COMBINES = ("merged", "multihead", "interleaved")


# ----------------------------------------------------------------------------
# Argument checks: every bad input gets a ValueError saying what was given and
# what is allowed.
# ----------------------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_n(n) -> int:
    if not _is_int(n) or n < 1:
        raise ValueError(f"sequence length n must be an integer >= 1, got {n!r}")
    return int(n)


def check_stride(stride) -> int:
    if not _is_int(stride) or stride < 1:
        raise ValueError(f"stride l must be an integer >= 1, got {stride!r}")
    return int(stride)


def check_summary(stride: int, c, head: int = 0) -> int:
    """Validate the summary width c of the fixed pattern (and its head's sub-block)."""
    if not _is_int(c) or c < 1:
        raise ValueError(f"summary width c must be an integer >= 1, got {c!r}")
    if c > stride:
        raise ValueError(
            f"summary width c must be at most the stride l, got c={c} > l={stride}"
        )
    if not _is_int(head) or head < 0:
        raise ValueError(f"head index must be an integer >= 0, got {head!r}")
    if head > 0 and stride % c != 0:
        raise ValueError(
            f"fixed pattern with several heads splits each block of l={stride} into "
            f"l/c distinct summary sub-blocks, so l must be a multiple of c; "
            f"got l={stride}, c={c} (allowed: c dividing l, e.g. c in "
            f"{[d for d in range(1, stride + 1) if stride % d == 0]})"
        )
    return int(c)


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


def summary_range(stride: int, c: int, head: int = 0) -> tuple[int, int]:
    """The half-open range [lo, hi) of ``j mod l`` that head ``head`` summarises.

    Head 0 reads the last c positions of each block, [l - c, l) (paper: {t..l}
    with t = l - c, 0-indexed). Head h reads sub-block k = h mod (l // c), the
    positions [l - (k+1) c, l - k c), so that different heads read distinct
    summaries ("attend to distinct subblocks of length c", sec. 4.3).
    """
    stride = check_stride(stride)
    c = check_summary(stride, c, head)
    k = head % (stride // c)
    return stride - (k + 1) * c, stride - k * c


def fixed(n: int, stride: int, c: int, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fixed pattern (sec. 4.3, Fig. 3c): ``(block, summary)``, each (n, n).

    block   = A(1): causal attention inside the block of length l that holds i:
              floor(j / l) == floor(i / l), j <= i.
    summary = A(2): the summary positions (j mod l) in [l - c, l) of every block,
              j <= i; head ``head`` reads its own sub-block (see ``summary_range``).
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
# Neighbours (paper-notes section 7), causal like everything here.
# ----------------------------------------------------------------------------

def _check_globals(n: int, global_tokens) -> np.ndarray:
    try:
        tokens = list(global_tokens)
    except TypeError:
        raise ValueError(f"global_tokens must be an iterable of integer positions in "
                         f"[0, {n}), got {global_tokens!r}") from None
    bad = [t for t in tokens if not _is_int(t)]
    if bad:
        raise ValueError(f"global token positions must be integers, got {bad}")
    g = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if g.size and (g.min() < 0 or g.max() >= n):
        raise ValueError(
            f"global token positions must lie in [0, {n}), got {sorted(set(g.tolist()))}"
        )
    return np.unique(g)


def longformer(n: int, window: int, dilation: int = 1, global_tokens=()) -> np.ndarray:
    """Longformer (Beltagy et al., 2020), causal: a (dilated) sliding window plus
    global tokens. Shape (n, n).

    Output i reads the ``window`` positions i, i - r, ..., i - (window - 1) r for
    dilation r (0 <= i - j < window * r and (i - j) mod r == 0). A global token g
    is read by every i >= g and reads every j <= g.
    """
    n = check_n(n)
    if not _is_int(window) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    if not _is_int(dilation) or dilation < 1:
        raise ValueError(f"dilation must be an integer >= 1, got {dilation!r}")
    g = _check_globals(n, global_tokens)
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
    n = check_n(n)
    if not _is_int(n_random) or n_random < 0:
        raise ValueError(f"n_random must be an integer >= 0, got {n_random!r}")
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
    if not _is_int(n_global) or n_global < 0 or n_global > n:
        raise ValueError(f"n_global must be an integer in [0, n={n}], got {n_global!r}")
    mask = longformer(n, window, 1, range(n_global))
    keys = bigbird_random_keys(n, n_random, seed)
    rows, cols = np.nonzero(keys >= 0)
    mask[rows, keys[rows, cols]] = True
    return mask


# ----------------------------------------------------------------------------
# The contract: which positions every head of a layer reads (eq. 5-8).
# ----------------------------------------------------------------------------

def factorized(pattern: str, n: int, head: int = 0, **params) -> tuple[np.ndarray, ...]:
    """The factorized heads (A(1), A(2)) of ``pattern`` as seen by head ``head``
    (only the fixed summary depends on the head). ``full`` has one: (A,)."""
    if pattern == "full":
        _no_extra(pattern, params, ())
        return (full(n),)
    if pattern == "strided":
        _no_extra(pattern, params, ("stride",))
        return strided(n, _need(params, "stride", pattern))
    if pattern == "fixed":
        _no_extra(pattern, params, ("stride", "c"))
        return fixed(n, _need(params, "stride", pattern), _need(params, "c", pattern), head)
    raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")


def head_masks(pattern: str, n: int, n_heads: int, combine: str = "merged",
               layer: int = 0, **params) -> np.ndarray:
    """Which positions each head of layer ``layer`` reads: bool (n_heads, n, n).

    pattern: "full", "strided" (needs ``stride``) or "fixed" (needs ``stride``, ``c``).
    combine (sec. 5.1):
      "merged"      (eq. 7)  every head reads the union A(1) | A(2);
      "multihead"   (eq. 8)  head h reads A(h mod 2): heads alternate between
                             the two factorized patterns, computed in parallel;
      "interleaved" (eq. 6)  every head of layer r reads A(r mod 2).
    For "fixed", the heads that read a summary read distinct sub-blocks: the
    r-th such head reads sub-block r mod (l / c), where r = h for "merged" and
    "interleaved" (every head reads A(2)) and r = h // 2 for "multihead" (only
    the odd heads do), so head 0 -- or head 1 in "multihead" -- reads the last c
    positions of each block, as in the single-head pattern.
    "full" has a single pattern: every head reads all j <= i in every mode.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if not _is_int(n_heads) or n_heads < 1:
        raise ValueError(f"n_heads must be an integer >= 1, got {n_heads!r}")
    if not _is_int(layer) or layer < 0:
        raise ValueError(f"layer must be an integer >= 0, got {layer!r}")
    n = check_n(n)
    out = np.zeros((n_heads, n, n), dtype=bool)
    for h in range(n_heads):
        parts = factorized(pattern, n, summary_rank(h, combine), **params)
        if len(parts) == 1 or combine == "merged":
            out[h] = union(*parts)
        elif combine == "multihead":
            out[h] = parts[h % 2]
        else:  # interleaved
            out[h] = parts[layer % 2]
    return out


def summary_rank(head: int, combine: str) -> int:
    """Which summary sub-block head ``head`` reads under ``combine`` (see head_masks)."""
    return head // 2 if combine == "multihead" else head


def _need(params: dict, name: str, pattern: str) -> int:
    if params.get(name) is None:
        raise ValueError(f"pattern {pattern!r} needs the parameter {name!r}, got {sorted(params)}")
    return params[name]


def _no_extra(pattern: str, params: dict, allowed: tuple[str, ...]) -> None:
    extra = sorted(k for k, v in params.items() if k not in allowed and v is not None)
    if extra:
        raise ValueError(
            f"pattern {pattern!r} takes parameters {list(allowed)}, got unexpected {extra}"
        )
