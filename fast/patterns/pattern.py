"""What the registry holds of a pattern: its parts as rules on positions, and its heads.

Child et al., 2019, sec. 4.2 (eq. 2-4: output i attends to the set S_i; a factorized
pattern is p parts A(1), ..., A(p)) and sec. 5.1 (eq. 5-8: the heads of a layer read the
parts merged, in turn, or layer by layer). A pattern is stated once, as FlexAttention
states one (a ``mask_mod(b, h, q_idx, kv_idx)``), and every generic path derives what it
needs from that statement: the naive backend's boolean masks, FlexAttention's mask_mod
and BlockMask, the natural-order block layout, the row a decoding step reads.

A pattern module of ``fast.patterns`` holds ``PATTERN = Pattern(name, parts, cite=...,
head_values=...)`` (its name is the module's), and its docstring says the pattern, its
decisions and its source. It gives:

* ``parts(n, device, **params)`` -> {part name: (Term, ...)}: each part of the head
  contract (``reference.heads.PARTS``, in order) as the union of its terms. A term is

  - a **rule** ``rule(i, j)`` -> bool, or ``rule(i, j, head)`` (``per_head=True``) when it
    reads numbers that differ between heads (``head.lo``: the fixed pattern's summary
    sub-block; a term whose rule does not is built once for all heads), on query
    positions i and key positions j that broadcast (index grids, FlexAttention's scalars,
    a layout's tiles). Every pattern is causal: j <= i is added here, not in the rule.
    A rule compares a quantity of the row with one of the column (``i % l == j % l``, not
    ``(i - j) % l == 0``), so that on an (n_q, 1) column and a (1, n_k) row no integer
    (n_q, n_k) grid is made: a naive mask costs one byte per pair. Tables (global
    tokens, random keys) are made by ``parts`` on ``device``, for positions 0..n-1.
    ``every`` is the rule of a term that allows every earlier position (full attention).
  - **where** its pairs lie, in closed form, so that a block layout finds its candidate
    tiles without an n x n mask (``fast.layout.natural``): ``Periodic`` (the rule repeats
    along the diagonal, with a reach), ``Lines`` (rows and columns of a few positions),
    ``Pairs`` (an explicit list).

* ``head_values(role)`` (optional) -> {name: int}: the numbers a per-head rule reads for a
  head of that ``reference.heads.HeadRole`` (the fixed summary's [lo, hi)).

The parameters and their checks are the reference's (``reference.params.check_params``:
one message from every entry point); which parts a head reads is the head contract's
(``reference.heads.head_roles``). ``Heads`` turns the roles into tensors a rule indexes by
h; ``Pattern.rule`` and ``Pattern.mask_mod`` put the parts, the heads and causality together.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from reference.heads import PARTS, HeadRole, head_roles
from reference.params import check_params


class Periodic(NamedTuple):
    """A term whose rule repeats along the diagonal: rule(i + period, j + period) ==
    rule(i, j) for all positions, and which allows no pair with i - j >= reach (None: no
    bound). Natural-order tiles with one block offset and one phase of their first query
    in ``period`` then have one mask, and only tiles within ``reach`` are candidates."""
    period: int = 1
    reach: int | None = None


class Lines(NamedTuple):
    """A term whose every pair has its query or its key at one of ``positions`` (int64,
    sorted): global tokens. Its candidate tiles are those positions' rows and columns."""
    positions: torch.Tensor


class Pairs(NamedTuple):
    """A term that allows exactly the pairs (i[m], j[m]), each with j <= i (int64 (M,)):
    BigBird's random keys. A layout scatters them into their tiles."""
    i: torch.Tensor
    j: torch.Tensor


def every(i, j):
    """The rule of a term that allows every pair, causality alone (full attention): a
    naive mask is then the causal mask itself, with no pass of its own."""
    return torch.ones((), dtype=torch.bool, device=i.device)


class Term(NamedTuple):
    """One term of a part: its rule, where its pairs lie (module docstring), and whether
    the rule reads per-head numbers: then it takes (i, j, head), else (i, j)."""
    rule: Callable
    where: Periodic | Lines | Pairs
    per_head: bool = False


class Head:
    """The per-head numbers a rule reads, as attributes (``head.lo``): Python ints for one
    head (the naive masks), tensors indexed by h for all of them (a mask_mod, a layout)."""

    def __init__(self, **values):
        self.__dict__.update(values)


@dataclass(frozen=True)
class Heads:
    """The roles of a layer's heads (``reference.heads.head_roles``) as tensors a rule can
    index by h: ``reads[part]`` bool (H,), head h reads that part; ``values[name]`` int64
    (H,), the numbers its per-head rules read. Equal rows of ``table()``, equal masks."""
    roles: tuple[HeadRole, ...]
    reads: dict
    values: dict

    def table(self) -> torch.Tensor:
        """int64 (H, parts + values): what makes one head's mask differ from another's."""
        cols = [r.long() for r in self.reads.values()] + list(self.values.values())
        return torch.stack(cols, 1)                                      # (H, k)

    def select(self, index: torch.Tensor) -> Heads:
        """Heads ``index`` (int64 (K,)), renumbered 0..K-1."""
        return Heads(tuple(self.roles[int(h)] for h in index),
                     {p: r[index] for p, r in self.reads.items()},
                     {k: v[index] for k, v in self.values.items()})


@dataclass(frozen=True)
class Pattern:
    """A registered pattern (module docstring): its name, its module's ``parts`` and
    ``head_values``, and where it comes from (``cite``)."""
    name: str
    parts: Callable
    cite: str
    head_values: Callable | None = None

    @property
    def part_names(self) -> tuple[str, ...]:
        """Its parts, in order (the head contract's ``reference.heads.PARTS``)."""
        return PARTS[self.name]

    def check(self, n, n_heads, combine: str, layer, params: dict) -> dict:
        """The parameters, checked as every path checks them (``reference.params``)."""
        return check_params(self.name, n, n_heads, combine, layer, params)

    def values(self, role: HeadRole) -> dict:
        """The per-head numbers of a head of role ``role`` ({} for most patterns)."""
        return {} if self.head_values is None else dict(self.head_values(role))

    def heads(self, n_heads: int, combine: str, layer: int, params: dict) -> Heads:
        """The roles of layer ``layer``'s heads, as ``Heads``."""
        roles = head_roles(self.name, n_heads, combine, layer, stride=params.get("stride"),
                           c=params.get("c"))
        reads = {p: torch.tensor([r.reads(p) for r in roles]) for p in self.part_names}
        rows = [self.values(r) for r in roles]
        values = {k: torch.tensor([row[k] for row in rows], dtype=torch.long) for k in rows[0]}
        return Heads(roles, reads, values)

    def alike(self, n_heads: int, combine: str) -> bool:
        """Whether every head of a layer reads the same mask."""
        if n_heads == 1:
            return True
        return self.head_values is None and (len(self.part_names) == 1
                                             or combine != "multihead")

    def layer_key(self, combine: str, layer: int) -> int:
        """The layers whose heads read alike share this number: layer r of an interleaved
        model reads A(r mod p); every other layer reads as layer 0."""
        p = len(self.part_names)
        return layer % p if combine == "interleaved" and p > 1 else 0

    def terms(self, n: int, params: dict, device="cpu") -> dict:
        """{part: (Term, ...)} at sequence length n on ``device``; ``params`` checked.
        Built once per (n, params, device) (tables such as BigBird's random keys); when
        traced (torch.compile, where a parameter may be a symbol) built in the graph."""
        if torch.compiler.is_compiling():
            return _build(self, n, params, torch.device(device))
        items = tuple(sorted(params.items()))
        return _terms(self, int(n), items, str(torch.device(device)))

    def rule(self, n: int, params: dict, heads: Heads, device="cpu", *,
             without: type | None = None) -> Callable:
        """The pattern as one rule (h, i, j) -> bool over broadcasting tensors: head h
        reads key j at query i. Parts no head reads are left out, and the per-head look-up
        is skipped for parts every head reads. ``without``: leave out the terms that lie
        where this says (``Pairs``: a layout scatters them instead)."""
        terms = self.terms(n, params, device)
        gates = []
        for part in self.part_names:
            reads = heads.reads[part]
            kept = [t for t in terms[part] if without is None or not isinstance(t.where, without)]
            if kept and bool(reads.any()):
                gates.append((None if bool(reads.all()) else reads.to(device), kept))
        values = {k: v.to(device) for k, v in heads.values.items()}
        none = torch.zeros((), dtype=torch.bool, device=device)

        def rule(h, i, j):
            head = Head(**{k: v[h] for k, v in values.items()})
            allowed = none
            for gate, part in gates:
                x = functools.reduce(torch.logical_or, [
                    t.rule(i, j, head) if t.per_head else t.rule(i, j) for t in part])
                allowed = allowed | (x if gate is None else x & gate[h])
            return (j <= i) & allowed
        return rule

    def mask_mod(self, n: int, n_heads: int, combine: str = "merged", layer: int = 0, *,
                 device="cpu", **params) -> Callable:
        """The pattern as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` -> bool for the
        heads of layer ``layer``, its tables on ``device`` (where the q, k, v it masks are).
        Parameters checked (``check``)."""
        params = self.check(n, n_heads, combine, layer, params)
        rule = self.rule(n, params, self.heads(n_heads, combine, layer, params), device)

        def mask_mod(b, h, q_idx, kv_idx):
            return rule(h, q_idx, kv_idx)
        return mask_mod


@functools.lru_cache(maxsize=64)
def _terms(pattern: Pattern, n: int, items: tuple, device: str) -> dict:
    return _build(pattern, n, dict(items), torch.device(device))


def _build(pattern: Pattern, n: int, params: dict, device: torch.device) -> dict:
    terms = pattern.parts(n, device, **params)
    if tuple(terms) != pattern.part_names:
        raise TypeError(f"pattern {pattern.name!r}: its parts() gives the parts {tuple(terms)}, "
                        f"its reference twin {pattern.part_names} (reference.heads.PARTS): the "
                        f"same names, in the same order")
    return {part: tuple(ts) for part, ts in terms.items()}
