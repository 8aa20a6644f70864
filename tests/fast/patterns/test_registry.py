"""The pattern registry (``fast.patterns``): one module per pattern, held to its reference twin.

Child et al., 2019, sec. 4.2-4.3 (the patterns, p parts) and sec. 5.1 (eq. 5-8: how a
layer's heads read them). Every registered pattern has a twin in ``reference/`` and the
same parts; its mask_mod equals ``reference.patterns.head_masks`` for every combine mode
on odd sizes; what each term says about where its pairs lie (the closed forms the block
layouts enumerate tiles from) holds on a grid; the naive masks and the decoding rows
derived from the registry equal the reference; and the modules document themselves.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from fast import patterns
from fast.backends import masks as masks_torch
from fast.backends.reads import row_mask
from reference import params as reference_params
from reference import patterns as reference_patterns
from reference.extensions import EXTENSIONS
from reference.heads import PARTS

# (pattern, params), n odd and no multiple of any stride, several heads below
CASES = [
    ("full", {}),
    ("strided", {"stride": 4}),
    ("fixed", {"stride": 6, "c": 2}),
    ("longformer", {"window": 3, "dilation": 2, "global_tokens": (0, 11)}),
    ("bigbird", {"window": 3, "n_random": 2, "n_global": 1, "seed": 4}),
    ("strided3", {"stride": 3}),
]
COMBINE_LAYER = [("merged", 0), ("multihead", 0), ("interleaved", 0), ("interleaved", 1),
                 ("interleaved", 2)]


def test_the_registry_and_the_reference_name_the_same_patterns():
    assert tuple(patterns.REGISTRY) == reference_params.PATTERNS
    assert {name for name,
            _ in CASES} == set(reference_params.PATTERNS), "a pattern without a case here"
    for name, entry in patterns.REGISTRY.items():
        assert entry.name == name and entry.part_names == PARTS[name]
    paper_and_neighbours = reference_params.FACTORIZED + reference_params.NEIGHBOURS
    assert set(EXTENSIONS) == set(reference_params.PATTERNS) - set(paper_and_neighbours)


@pytest.mark.parametrize("name", reference_params.PATTERNS)
def test_each_module_documents_and_cites_its_pattern(name):
    """A pattern's module says what it is and where it comes from: its docstring cites a
    section, and so does its ``cite``; a reference twin in ``reference.extensions`` too."""
    module = importlib.import_module(f"fast.patterns.{name}")
    assert module.__doc__ and "sec. " in module.__doc__, name
    assert "sec. " in patterns.get(name).cite
    if name in EXTENSIONS:
        assert "sec. " in EXTENSIONS[name].__doc__


def test_an_unknown_pattern_is_refused_as_everywhere():
    with pytest.raises(ValueError) as want:
        reference_params.check_pattern("dense")
    with pytest.raises(ValueError) as got:
        patterns.get("dense")
    assert str(got.value) == str(want.value)


def grid_masks(pattern, n, n_heads, combine, layer, params) -> np.ndarray:
    """The registry's mask_mod on the (H, n, n) grid."""
    mod = patterns.get(pattern).mask_mod(n, n_heads, combine, layer, **params)
    h = torch.arange(n_heads)[:, None, None]
    i, j = torch.arange(n)[None, :, None], torch.arange(n)[None, None, :]
    return mod(torch.zeros((), dtype=torch.long), h, i, j).expand(n_heads, n, n).numpy()


@pytest.mark.parametrize("n,n_heads", [(1, 1), (29, 5), (40, 2)])
@pytest.mark.parametrize("combine,layer", COMBINE_LAYER)
@pytest.mark.parametrize("pattern,params", CASES)
def test_mask_mod_equals_the_reference(pattern, params, combine, layer, n, n_heads):
    if pattern == "longformer":
        params = {**params, "global_tokens": tuple(g for g in params["global_tokens"] if g < n)}
    want = reference_patterns.head_masks(pattern, n, n_heads, combine, layer, **params)
    np.testing.assert_array_equal(grid_masks(pattern, n, n_heads, combine, layer, params), want)
    np.testing.assert_array_equal(
        masks_torch.head_masks(pattern, n, n_heads, combine, layer, **params).numpy(), want)
    for t in sorted({0, n // 2, n - 1}):
        got = row_mask(pattern, n, n_heads, combine, layer, t, **params).numpy()
        np.testing.assert_array_equal(got, want[:, t, :t + 1], err_msg=f"row {t}")


@pytest.mark.parametrize("pattern,params", CASES)
def test_each_term_lies_where_it_says(pattern, params):
    """The claims the layouts trust, checked on a grid of 61 positions: a ``Periodic``
    term repeats along the diagonal with its period and allows nothing at i - j >= its
    reach; a ``Lines`` term's pairs have the query or the key at one of its positions; a
    ``Pairs`` term allows exactly its pairs."""
    n = 61
    entry = patterns.get(pattern)
    params = entry.check(n, 1, "merged", 0, params)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    role = entry.heads(4, "merged", 0, params).roles[3]           # a head of rank 3
    head = patterns.Head(**entry.values(role))
    for part, terms in entry.terms(n, params).items():
        for term in terms:
            rule = (lambda a, b, t=term: t.rule(a, b, head)) if term.per_head else term.rule
            allowed = (rule(i, j) & (j <= i)).expand(n, n)
            where = term.where
            if isinstance(where, patterns.Periodic):
                p = where.period
                assert torch.equal(rule(i[p:], j[:, p:]).expand(n - p, n - p),
                                   rule(i[:-p], j[:, :-p]).expand(n - p, n - p)), part
                if where.reach is not None:
                    assert not allowed[(i - j) >= where.reach].any(), part
            elif isinstance(where, patterns.Lines):
                on = torch.zeros(n, dtype=torch.bool)
                on[where.positions] = True
                assert not (allowed & ~on[:, None] & ~on[None, :]).any(), part
            else:
                want = torch.zeros(n, n, dtype=torch.bool)
                want[where.i, where.j] = True
                assert torch.equal(allowed, want), part


def test_heads_and_layers_that_read_alike():
    """``alike``: every head of a layer reads one mask; ``layer_key``: layers r and r + p
    of an interleaved model read alike (p parts)."""
    get = patterns.get
    assert get("strided").alike(4, "merged") and not get("strided").alike(4, "multihead")
    assert not get("fixed").alike(2, "merged") and get("fixed").alike(1, "multihead")
    assert get("longformer").alike(3, "multihead")
    assert [get("strided").layer_key("interleaved", r) for r in range(3)] == [0, 1, 0]
    assert get("strided").layer_key("multihead", 5) == 0 == get("full").layer_key(
        "interleaved", 3)
