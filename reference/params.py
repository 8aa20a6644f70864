"""Pattern names, their parameters, and the checks every implementation shares.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers":
section 4.3 (the strided pattern, stride l; the fixed pattern, stride l and
summary width c), section 5.1 (eq. 5-8: merged, multi-head and interleaved
heads); Longformer (Beltagy et al., 2020) and BigBird (Zaheer et al., 2020) as
the two neighbours the benchmarks compare with; the patterns added since, one module
each in ``reference.extensions`` (their names, parameters and the checks of parameters
this module does not know by name come from there).

This is the bottom of the contract: ``reference.heads`` (which head reads which
part), ``reference.patterns`` (the masks) and every path in ``fast`` validate
their inputs here, so a bad input gets the same ValueError everywhere, saying
what was given and what is allowed.

Decisions:

* integers are Python or NumPy integers; ``bool`` is rejected (``True`` is not a
  stride);
* every integer is bounded above by ``MAX_INT = 2**31 - 1``: the Triton kernels
  keep positions, strides and windows in int32 tables, and a stride of 2**63
  would otherwise be accepted and give wrong masks;
* fixed: 1 <= c <= l, and when any head has summary rank > 0 (several heads
  read summaries, ``summary_rank``), l must be a multiple of c so that the l/c
  sub-blocks of length c tile each block (sec. 4.3);
* a head's summary rank picks keys only in "fixed"; for every other pattern all
  heads read the same keys, so a rank other than 0 is refused (``check_rank_for``),
  not ignored;
* ``check_params`` drops parameters given as ``None`` (unused keyword defaults),
  fills in the optional ones and reports unexpected and missing names.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from reference.extensions import EXTENSIONS

FACTORIZED = ("full", "strided", "fixed")      # the paper's patterns (sec. 4.3)
NEIGHBOURS = ("longformer", "bigbird")         # written in reference.patterns too
PATTERNS = FACTORIZED + NEIGHBOURS + tuple(EXTENSIONS)
COMBINES = ("merged", "multihead", "interleaved")  # sec. 5.1: eq. 7, eq. 8, eq. 6

# The parameters each pattern takes: (required names, {optional name: default}).
PARAMS = MappingProxyType({
    "full": ((), MappingProxyType({})),
    "strided": (("stride",), MappingProxyType({})),
    "fixed": (("stride", "c"), MappingProxyType({})),
    "longformer": (("window",), MappingProxyType({"dilation": 1, "global_tokens": ()})),
    "bigbird": (("window", "n_random", "n_global"), MappingProxyType({"seed": 0})),
    **{name: (tuple(module.REQUIRED), MappingProxyType(dict(module.OPTIONAL)))
       for name, module in EXTENSIONS.items()},
})
# The parameters checked by name in ``check_params``; an extension's others are integers
# with the smallest value it gives (its ``INTEGERS``).
BY_NAME = ("stride", "c", "window", "dilation", "global_tokens", "n_random", "n_global", "seed")
INTEGERS = MappingProxyType({name: MappingProxyType(dict(getattr(module, "INTEGERS", {})))
                             for name, module in EXTENSIONS.items()})


def _every_parameter_checked(params, integers) -> None:
    """Refuse, when ``reference`` is imported, a module of ``reference.extensions`` that
    takes a parameter no check knows (it names each one in its ``INTEGERS``): ``params``
    as ``PARAMS``, ``integers`` as ``INTEGERS``."""
    for name, (required, optional) in params.items():
        unchecked = set(required) | set(optional)
        unchecked -= set(BY_NAME) | set(integers.get(name, {}))
        if unchecked:
            raise TypeError(f"pattern {name!r} takes {sorted(unchecked)}, which no check "
                            f"knows: give each its smallest value in its module's INTEGERS")


_every_parameter_checked(PARAMS, INTEGERS)
# The same tables in plain dicts, which check_params reads: a traced caller (torch.compile
# of a model whose code mutates a dict, as transformers' models do) cannot read a mapping
# proxy without a graph break.
_LOOKUP = {name: (required, dict(optional)) for name, (required, optional) in PARAMS.items()}
_INTEGER_LOOKUP = {name: dict(integers) for name, integers in INTEGERS.items()}

MAX_INT = 2**31 - 1
_WHY_MAX = "2**31 - 1: the kernels keep positions, strides and windows in int32"


# ----------------------------------------------------------------------------
# Integers.
# ----------------------------------------------------------------------------

def is_int(x) -> bool:
    """True for Python and NumPy integers, False for bool (and everything else)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def check_int(name: str, x, low: int, high: int = MAX_INT, why: str = _WHY_MAX) -> int:
    """``x`` as an int if it is an integer in [low, high], else a ValueError that
    names ``name``, the value given and the allowed range (``why`` the bound)."""
    if not is_int(x) or not low <= x <= high:
        raise ValueError(f"{name} must be an integer >= {low}, got {x!r} "
                         f"(allowed: integers in [{low}, {high}]; at most {why})")
    return int(x)


def check_n(n) -> int:
    """Sequence length n >= 1."""
    return check_int("sequence length n", n, 1)


def check_stride(stride) -> int:
    """Stride l >= 1 of the strided and fixed patterns (sec. 4.3)."""
    return check_int("stride l", stride, 1)


def check_summary(stride, c, head: int = 0) -> int:
    """Summary width c of the fixed pattern for a head of summary rank ``head``:
    1 <= c <= l, and l % c == 0 when ``head`` > 0 (its sub-block must exist)."""
    stride = check_stride(stride)
    c = check_int("summary width c", c, 1)
    if c > stride:
        raise ValueError(f"summary width c must be at most the stride l, got c={c} > l={stride}")
    head = check_int("head index (summary rank)", head, 0)
    if head > 0 and stride % c != 0:
        raise ValueError(
            f"fixed pattern with several heads splits each block of l={stride} into "
            f"l/c distinct summary sub-blocks, so l must be a multiple of c; "
            f"got l={stride}, c={c} and a head of summary rank {head} (every head has a "
            f"rank, h, or h // 2 under multihead, whether or not it reads summaries in "
            f"this layer) (allowed: c dividing l, e.g. c in "
            f"{[d for d in range(1, min(stride, 64) + 1) if stride % d == 0]}, or one "
            f"head: two under multihead)"
        )
    return c


def check_window(window) -> int:
    """Sliding-window width (Longformer, BigBird) >= 1."""
    return check_int("window", window, 1)


def check_dilation(dilation) -> int:
    """Longformer window dilation >= 1."""
    return check_int("dilation", dilation, 1)


def check_global_tokens(n: int, global_tokens) -> tuple[int, ...]:
    """Longformer global token positions in [0, n), as a sorted tuple without repeats."""
    try:
        tokens = list(global_tokens)
    except TypeError:
        raise ValueError(f"global_tokens must be an iterable of integer positions in "
                         f"[0, {n}), got {global_tokens!r}") from None
    bad = [t for t in tokens if not is_int(t)]
    if bad:
        raise ValueError(f"global_tokens: global token positions must be integers, got {bad}")
    out = sorted({int(t) for t in tokens})
    if out and (out[0] < 0 or out[-1] >= n):
        raise ValueError(f"global_tokens: global token positions must lie in [0, n={n}), "
                         f"got {out}")
    return tuple(out)


def check_n_random(n_random) -> int:
    """BigBird random keys per query >= 0."""
    return check_int("n_random", n_random, 0)


def check_n_global(n: int, n_global) -> int:
    """BigBird's number of leading global tokens, in [0, n]."""
    return check_int("n_global", n_global, 0, n, f"n = {n}, the sequence length")


def check_seed(seed) -> int:
    """Seed of BigBird's random keys >= 0."""
    return check_int("seed", seed, 0)


def check_n_heads(n_heads) -> int:
    """Number of heads >= 1."""
    return check_int("n_heads", n_heads, 1)


def check_layer(layer) -> int:
    """Residual block index >= 0 (only "interleaved" looks at it)."""
    return check_int("layer", layer, 0)


# ----------------------------------------------------------------------------
# Names.
# ----------------------------------------------------------------------------

def check_pattern(pattern) -> str:
    """One of ``PATTERNS``."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    return pattern


def check_combine(combine) -> str:
    """One of ``COMBINES``."""
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    return combine


def summary_rank(head: int, combine: str) -> int:
    """The rank of head ``head`` among the heads that read fixed summaries: h for
    "merged" and "interleaved" (every head reads A(2)), h // 2 for "multihead"
    (only the odd heads do). It picks the head's sub-block (``reference.heads``);
    it lives here because the l % c rule of ``check_summary`` depends on it."""
    head = check_int("head index", head, 0)
    return head // 2 if check_combine(combine) == "multihead" else head


def check_rank_for(pattern: str, rank) -> None:
    """Refuse a summary rank that means nothing for ``pattern``.

    The per-pattern masks and counts (``reference.patterns.factorized``,
    ``reference.counts.keys_per_query``) take the summary rank of the head that
    reads them. Only "fixed" has heads that read different keys (distinct summary
    sub-blocks, sec. 4.3; ``check_summary`` checks its rank where the sub-block is
    built); every head of every other pattern reads the same keys, so a rank other
    than 0 (the default) would be silently ignored there, and is refused.
    """
    if pattern != "fixed" and (not is_int(rank) or rank != 0):
        raise ValueError(
            f"head (a summary rank) must be 0 for pattern {pattern!r}, whose heads all read "
            f"the same keys; got head={rank!r} (allowed: 0, the default; only pattern "
            f"'fixed' has heads that read different keys, its summary sub-blocks)"
        )


# ----------------------------------------------------------------------------
# A pattern and all its parameters at once.
# ----------------------------------------------------------------------------

def check_params(pattern, n, n_heads, combine, layer, params: dict) -> dict:
    """Check a pattern, its sizes and its parameters; return the parameters.

    ``params``: the pattern's keyword parameters (``PARAMS``); entries that are
    ``None`` are dropped first. Returns a new dict: required then optional names,
    defaults filled in, values as Python ints (``global_tokens`` a sorted tuple).
    Raises ValueError for an unknown pattern or combine mode, a bad n, n_heads or
    layer, unexpected or missing names, or a bad value.
    """
    check_pattern(pattern)
    n = check_n(n)
    n_heads = check_n_heads(n_heads)
    check_combine(combine)
    check_layer(layer)
    required, optional = _LOOKUP[pattern]
    given = {key: val for key, val in dict(params).items() if val is not None}
    names = list(required) + list(optional)
    extra = sorted(set(given) - set(names))
    if extra:
        raise ValueError(f"pattern {pattern!r} takes parameters {names}, got unexpected {extra}")
    missing = [key for key in required if key not in given]
    if missing:
        raise ValueError(f"pattern {pattern!r} needs the parameter {missing[0]!r}; it needs "
                         f"{list(required)}, missing {missing}")
    out = {**optional, **given}
    if "stride" in out:
        out["stride"] = check_stride(out["stride"])
    if "c" in out:
        # ranks grow with h, so the last head has the largest one
        out["c"] = check_summary(out["stride"], out["c"], summary_rank(n_heads - 1, combine))
    if "window" in out:
        out["window"] = check_window(out["window"])
    if "dilation" in out:
        out["dilation"] = check_dilation(out["dilation"])
    if "global_tokens" in out:
        out["global_tokens"] = check_global_tokens(n, out["global_tokens"])
    if "n_random" in out:
        out["n_random"] = check_n_random(out["n_random"])
    if "n_global" in out:
        out["n_global"] = check_n_global(n, out["n_global"])
    if "seed" in out:
        out["seed"] = check_seed(out["seed"])
    for key, low in _INTEGER_LOOKUP.get(pattern, {}).items():
        out[key] = check_int(key, out[key], low)
    return {key: out[key] for key in names}
