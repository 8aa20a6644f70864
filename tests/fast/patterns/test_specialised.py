"""The specialised fast paths against the registry's rule and against ``reference/``.

Child et al., 2019, sec. 4.3 (strided and fixed), sec. 5.1 (eq. 5-8) and sec. 5.5 (the
transposed grid, the gathered summaries, blocks). The generic paths derive from the pattern
registry (``fast.patterns``); these paths serve the paper's patterns their own way and keep
their own arithmetic, so each is held here to the registry's rule (its mask_mod on the
grid) and to the reference's masks, on odd sizes (n no multiple of the stride or the
block), one head and several, every combine mode:

* the structured backend: the strided transposition (``fast.backends.structured.strided``)
  and the fixed summaries (``fast.backends.structured.fixed``) through PyTorch's fused
  kernel in float64, and through the C kernel (``cpu_window.c``, float32, held to the
  flash-attention rule);
* the Triton layouts in reordered token orders (``fast.layout``, order "structured"), tile
  by tile, and the Triton kernel over them (in its CPU interpreter);
* the stores laid out for decoding (``fast.backends.reads``: rings, summaries, the gathered
  local-and-column piece), step by step: the positions each head reads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import patterns, sparse_attention
from fast.backends import cpu_window, reads
from fast.backends import masks as masks_torch
from fast.backends.naive import masked_attention
from fast.layout import block_layout
from fast.layout.blocks import STRUCTURED
from reference import patterns as reference_patterns
from tests.fast.api_helpers import inputs, run, truth

CASES = [  # the paper's patterns, n odd
    ("full", 23, {}),
    ("strided", 23, {"stride": 4}),
    ("strided", 37, {"stride": 5}),
    ("fixed", 29, {"stride": 6, "c": 2}),
    ("fixed", 19, {"stride": 5, "c": 5}),
]
COMBINE_LAYER = [("merged", 0), ("multihead", 0), ("interleaved", 0), ("interleaved", 1)]


def rule_masks(pattern, n, n_heads, combine, layer, params) -> np.ndarray:
    """bool (H, n, n): the registry's mask_mod on the grid."""
    mod = patterns.get(pattern).mask_mod(n, n_heads, combine, layer, **params)
    h = torch.arange(n_heads)[:, None, None]
    i, j = torch.arange(n)[None, :, None], torch.arange(n)[None, None, :]
    return mod(torch.zeros((), dtype=torch.long), h, i, j).expand(n_heads, n, n).numpy()


def both(pattern, n, n_heads, combine, layer, params) -> np.ndarray:
    """The registry's masks, after checking that they are the reference's."""
    want = reference_patterns.head_masks(pattern, n, n_heads, combine, layer, **params)
    np.testing.assert_array_equal(rule_masks(pattern, n, n_heads, combine, layer, params), want)
    return want


RUNS = [pytest.param(p, n, params, H, combine, layer, id=f"{p}-n{n}-H{H}-{combine}{layer}")
        for p, n, params in CASES for H in (1, 3) for combine, layer in COMBINE_LAYER
        if not (p == "fixed" and H == 3 and combine != "multihead" and n == 19)]


# ----------------------------------------------------------------------------
# The structured backend: the transposition, the summaries, the C kernel.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,n,params,H,combine,layer", RUNS)
def test_structured_backend_in_float64(pattern, n, params, H, combine, layer):
    mask = both(pattern, n, H, combine, layer, params)
    q, k, v, go = inputs(2, H, H, n, n, 48, seed=n + H)
    want = truth(q, k, v, go, mask)
    by_rule = run(lambda q, k, v: masked_attention(
        q, k, v, torch.from_numpy(rule_masks(pattern, n, H, combine, layer, params))), q, k, v, go)
    got = run(lambda q, k, v: sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                               backend="structured", **params), q, k, v, go)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, want, by_rule):
        assert (a - b).abs().max().item() < 1e-10, f"{name} against the reference"
        assert (a - c).abs().max().item() < 1e-10, f"{name} against the registry's rule"


@pytest.mark.parametrize("pattern,n,params,H,combine,layer",
                         [r for r in RUNS if r.values[0] != "full"])
def test_structured_backend_in_float32(pattern, n, params, H, combine, layer, monkeypatch):
    """float32 on the CPU runs the pieces through the C kernel where it is built (its calls
    are seen): its error against float64 at most twice that of plain float32 attention over
    the registry's mask, plus a floor."""
    calls = []
    monkeypatch.setattr(cpu_window, "OBSERVERS", [lambda *a: calls.append(a)])
    mask = both(pattern, n, H, combine, layer, params)
    q, k, v, go = inputs(1, H, H, n, n, 48, seed=2 * n + H)
    want = truth(q, k, v, go, mask)
    f32 = [t.float() for t in (q, k, v, go)]
    plain = run(lambda q, k, v: masked_attention(q, k, v, torch.from_numpy(
        rule_masks(pattern, n, H, combine, layer, params))), *f32)
    got = run(lambda q, k, v: sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                               backend="structured", **params), *f32)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, want, plain):
        err, err_plain = ((x.double() - b).abs().max().item() for x in (a, c))
        print(f"{name}: structured {err:.2e}, plain float32 {err_plain:.2e}")
        assert err <= 2 * err_plain + 1e-5, name
    assert calls or cpu_window.library() is None, "the C kernel was not called"


# ----------------------------------------------------------------------------
# The Triton layouts in reordered orders, and the kernel over them.
# ----------------------------------------------------------------------------

LAYOUT_CASES = CASES + [
    ("longformer", 25, {"window": 3, "dilation": 2, "global_tokens": (0, 11)}),
    ("bigbird", 27, {"window": 3, "n_random": 2, "n_global": 1, "seed": 4}),
]


@pytest.mark.parametrize("block", [4, 5])
@pytest.mark.parametrize("combine,layer", COMBINE_LAYER)
@pytest.mark.parametrize("pattern,n,params", LAYOUT_CASES)
def test_structured_layouts(pattern, n, params, combine, layer, block):
    assert pattern in STRUCTURED
    H = 2 if pattern == "fixed" and n == 19 else 3
    if pattern == "fixed" and n == 19 and combine != "multihead":
        H = 1
    want = both(pattern, n, H, combine, layer, params)
    layout = block_layout(pattern, n, H, combine, layer, block_size=block, **params)
    assert len(layout.parts) > 1 or pattern == "full"
    np.testing.assert_array_equal(layout.to_dense().numpy(), want)
    # the parts are disjoint: their pairs add up to the pattern's
    assert sum(int(p.allowed_pairs().sum()) for p in layout.parts) == int(want.sum())


@pytest.mark.parametrize("pattern,params,combine", [
    ("strided", {"stride": 5}, "merged"), ("fixed", {"stride": 6, "c": 2}, "multihead"),
    ("longformer", {"window": 3, "dilation": 2, "global_tokens": (0, 11)}, "merged")])
def test_triton_kernel_over_the_structured_layouts(pattern, params, combine):
    pytest.importorskip("triton")
    n, H = 37, 2
    mask = both(pattern, n, H, combine, 0, params)
    q, k, v, go = inputs(1, H, H, n, n, 16, seed=5, dtype=torch.float32)
    want = truth(q, k, v, go, mask)
    plain = run(lambda q, k, v: masked_attention(q, k, v, torch.from_numpy(
        rule_masks(pattern, n, H, combine, 0, params))), q, k, v, go)
    got = run(lambda q, k, v: sparse_attention(q, k, v, pattern, combine=combine,
                                               backend="triton", **params), q, k, v, go)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, want, plain):
        err, err_plain = ((x.double() - b).abs().max().item() for x in (a, c))
        print(f"{name}: triton {err:.2e}, plain float32 {err_plain:.2e}")
        assert err <= 2 * err_plain + 1e-5, name


# ----------------------------------------------------------------------------
# The stores laid out for decoding.
# ----------------------------------------------------------------------------

def read_by_head(group, Hg, t, l, c) -> list[list[int]]:
    """The positions each of the Hg heads of ``group`` reads at step t, piece after piece
    (a position twice if two pieces hold it)."""
    out = [[] for _ in range(Hg)]
    for rows, drop in reads.step_pieces(group, t, l, c):
        pos = reads.store_positions(group, rows, t, l, c)
        if isinstance(pos, slice):
            pos = torch.arange(pos.start or 0, pos.stop, pos.step or 1)
        keep = torch.ones(pos.shape[-1], dtype=torch.bool)
        if isinstance(drop, tuple):                                   # ("summary", s)
            keep = reads.summary_mask(group, c, drop[1])[:, 0]        # (Hg, m)
        elif isinstance(drop, slice):
            keep[drop] = False
        pos, keep = pos.expand(Hg, -1), keep.expand(Hg, -1)           # (Hg, m)
        for h in range(Hg):
            out[h] += pos[h][keep[h]].tolist()
    return out


@pytest.mark.parametrize("pattern,n,params,H,combine,layer", RUNS)
def test_laid_out_stores_read_each_row_once(pattern, n, params, H, combine, layer):
    mask = both(pattern, n, H, combine, layer, params)
    l, c = params.get("stride"), params.get("c")
    groups = reads.head_groups(pattern, H, combine, layer, **params)
    assert all(g.rows is None for g in groups) and pattern in reads.LAID_OUT
    for t in range(n):
        for group in groups:
            heads = list(range(H))[group.heads]
            for h, positions in zip(heads, read_by_head(group, len(heads), t, l, c)):
                assert len(positions) == len(set(positions)), f"t={t} h={h}: a key read twice"
                want = np.nonzero(mask[h, t, :t + 1])[0].tolist()
                assert sorted(positions) == want, f"t={t} h={h}"


def test_the_generic_paths_ask_the_registry(monkeypatch):
    """The naive masks, the decoding rows, FlexAttention's mask_mod and the natural layout
    of a pattern come from its registry entry: with the strided column moved by one there
    (on a copy of the registry), all four move with it."""
    entry = patterns.get("strided")
    moved = patterns.Pattern("strided", lambda n, device, stride: {
        "local": entry.parts(n, device, stride=stride)["local"],
        "column": (patterns.Term(lambda i, j: (i + 1) % stride == j % stride,
                                 patterns.Periodic()),)}, entry.cite)
    n, want = 13, reference_patterns.head_masks("strided", 13, 1, stride=4)[0]
    monkeypatch.setattr(patterns, "_LOOKUP", {**patterns._LOOKUP, "strided": moved})   # read by get
    got = {"masks": masks_torch.head_masks("strided", n, 1, stride=4)[0].numpy(),
           "rule": rule_masks("strided", n, 1, "merged", 0, {"stride": 4})[0],
           "natural layout": block_layout("strided", n, 1, block_size=4, order="natural",
                                          stride=4).to_dense()[0].numpy()}
    got["rows"] = np.stack([np.pad(reads.row_mask("strided", n, 1, "merged", 0, t,
                                                  stride=4)[0].numpy(), (0, n - 1 - t))
                            for t in range(n)])
    for name, mask in got.items():
        np.testing.assert_array_equal(mask, got["rule"], err_msg=name)
    assert not np.array_equal(got["rule"], want)
