"""What ``backend="auto"`` runs on the CPU: dense masked SDPA below a measured crossover.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for what it
computes, but its pieces cost more per pair than one dense product. At short
sequences that overhead wins: the naive path (SDPA with the pattern's boolean mask,
``fast.backends.naive``) is faster than the structured path; from some n on the
structured path is. Where they cross depends on the pattern, the stride, whether a
backward follows, and the machine, so it is measured, not guessed, by ``python -m fast
bench --crossover`` (``fast.measure.crossover``), and the measured crossovers are
constants of the package (``fast.backends.crossovers``): a benchmark run proposes new
ones, a commit adopts them. Nothing here reads a file: a ``make bench`` on a user's
machine, or a damaged record, changes nothing the library does.

The crossover X of a pattern, stride and pass ("fwd": forward only, "fb":
forward and backward) is where auto switches: the naive path for n < X, the
structured path from X on -- the switch point whose worst slowdown against the
faster of the two, over the measured n, is smallest (``fast.measure.crossover.choose``;
the record keeps that slowdown as the entry's regret, beside the tolerance the
benchmark holds it to, and the command reports every entry over it). X = (largest n
measured) + 1 says that the naive path was the faster one everywhere in the sweep;
beyond it the structured path is taken, whose cost grows as n sqrt(n) against the naive
path's n^2.

How a call picks (``prefer_naive``):

* the pass: "fb" when autograd will need a backward (grad mode on and q, k or v
  requiring grad), else "fwd";
* the stride: the measured stride nearest the call's (in log2); a pattern without a
  measured stride takes the structured path;
* queries shorter than the keys (n_q < n_k): the naive path costs n_q n_k pairs, the
  structured one the whole n_k sqrt(n_k) (it computes every row); with the two equal
  at n_q = n_k = X, the naive path is taken while n_q^2 < X n_k. This extrapolates the
  measured square problems; it is a model, not a measurement.

On CUDA auto takes the Triton kernels (``fast.attention``); no crossover is measured
there.
"""

from __future__ import annotations

import torch

from fast.backends.crossovers import CROSSOVERS

PASSES = ("fwd", "fb")


def crossovers() -> dict:
    """The crossovers in force: {pattern: {stride as text: {"fwd": X, "fb": X}}}
    (``fast.backends.crossovers``)."""
    return CROSSOVERS


def measured(table: dict, pattern: str, backward: bool) -> tuple[tuple[int, int], ...]:
    """((stride, X), ...) of ``pattern`` in ``table`` for the forward+backward ("fb") or
    forward ("fwd") pass, by increasing stride; () when it has none."""
    what = "fb" if backward else "fwd"
    return tuple(sorted((int(s), e[what]) for s, e in table.get(pattern, {}).items()))


def nearest(pairs: tuple[tuple[int, int], ...], stride: int | None) -> int | None:
    """X at the measured stride nearest ``stride`` in log2 distance, ties to the smaller;
    None when nothing is measured. Between neighbours a < b, ``stride`` is nearer a
    (or as near) iff stride^2 <= a b: integer comparisons, so that a stride that
    torch.compile traces as a symbol guards on them instead of breaking the graph."""
    if not pairs or stride is None:
        return None
    for (a, X), (b, _) in zip(pairs, pairs[1:]):
        if stride * stride <= a * b:
            return X
    return pairs[-1][1]


def crossover(table: dict, pattern: str, stride: int | None, backward: bool) -> int | None:
    """X for ``pattern`` at the measured stride nearest ``stride`` (``nearest``) for the
    forward+backward ("fb") or forward ("fwd") pass; None when the pattern has no
    measured crossover."""
    return nearest(measured(table, pattern, backward), stride)


@torch.compiler.assume_constant_result
def in_force(pattern: str, backward: bool) -> tuple[tuple[int, int], ...]:
    """``measured`` of the crossovers in force (``crossovers()``). Under torch.compile a
    constant, computed when the call is traced (the stride, which may be traced as a
    symbol, is not an argument)."""
    return measured(crossovers(), pattern, backward)


def prefer_naive(pattern: str, n_q: int, n_k: int, stride: int | None, backward: bool,
                 table: dict | None = None) -> bool:
    """Whether auto takes the naive path over the structured one for this call on the
    CPU (module docstring); ``table``: the crossovers (None: ``crossovers()``)."""
    pairs = in_force(pattern, backward) if table is None else measured(table, pattern, backward)
    X = nearest(pairs, stride)
    if X is None:
        return False
    return n_q * n_q < X * n_k
