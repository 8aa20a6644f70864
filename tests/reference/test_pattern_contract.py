"""Every fast path reads exactly what reference.patterns.head_masks says, and checks alike.

Child et al., 2019, sec. 4.3 (patterns) and sec. 5.1 (eq. 5-8, head roles). One
contract lives in reference/ (params: names and checks; heads: head roles;
patterns: masks); the torch masks of the naive path, the block layouts of the
Triton kernels, the FlexAttention mask_mod and the structured backend's plan all
derive from it. Here they are compared with it for every pattern (the added p = 3
one too), the three combine modes, several layers and odd n, and every path must
reject the same bad input with the same message (integers bounded by 2**31 - 1
included).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import sparse_attention
from fast.backends import masks as masks_torch
from fast.backends.flex import mask_mod
from fast.backends.structured import plan
from fast.backends.structured.fixed import BlockCausal, Summary
from fast.backends.structured.strided import Column, LocalBand
from fast.layout import block_layout
from fast.transformer.config import ModelConfig
from reference import patterns as ref
from reference.heads import head_roles

CASES = [  # (pattern, n, n_heads, params): odd n, one head and several
    ("full", 21, 3, {}),
    ("strided", 23, 5, {"stride": 4}),
    ("strided", 9, 1, {"stride": 12}),
    ("fixed", 29, 5, {"stride": 6, "c": 2}),
    ("fixed", 19, 2, {"stride": 5, "c": 2}),     # c does not divide l: one summary rank
    ("longformer", 25, 3, {"window": 3, "dilation": 2, "global_tokens": (0, 11)}),
    ("bigbird", 27, 2, {"window": 3, "n_random": 2, "n_global": 1, "seed": 4}),
    ("strided3", 31, 4, {"stride": 3}),          # p = 3: n > l^3, four heads
]
COMBINE_LAYER = [("merged", 0), ("multihead", 0), ("interleaved", 0), ("interleaved", 1),
                 ("interleaved", 2)]




def valid(case, combine) -> bool:
    """c not dividing l allows one summary rank only: one head, or two in multihead."""
    pattern, _, n_heads, params = case
    if pattern != "fixed" or params["stride"] % params["c"] == 0:
        return True
    return n_heads <= (2 if combine == "multihead" else 1)


RUNS = [pytest.param(case, combine, layer, id=f"{case[0]}-n{case[1]}-H{case[2]}-{combine}{layer}")
        for case in CASES for combine, layer in COMBINE_LAYER if valid(case, combine)]


@pytest.mark.parametrize("case,combine,layer", RUNS)
def test_every_mask_path_equals_reference(case, combine, layer):
    pattern, n, n_heads, params = case
    want = ref.head_masks(pattern, n, n_heads, combine, layer, **params)
    torch_masks = masks_torch.head_masks(pattern, n, n_heads, combine, layer, **params)
    np.testing.assert_array_equal(torch_masks.numpy(), want, err_msg="fast.backends.masks")
    mod = mask_mod(pattern, n, n_heads, combine, layer, **params)
    h = torch.arange(n_heads)[:, None, None]
    i, j = torch.arange(n)[None, :, None], torch.arange(n)[None, None, :]
    got = mod(torch.zeros((), dtype=torch.long), h, i, j).expand(n_heads, n, n)  # (H, n, n)
    np.testing.assert_array_equal(got.numpy(), want, err_msg="fast.backends.flex.mask_mod")
    for order in ("structured", "natural"):
        layout = block_layout(pattern, n, n_heads, combine, layer, block_size=4, order=order,
                              **params)
        np.testing.assert_array_equal(layout.to_dense().numpy(), want, err_msg=order)


@pytest.mark.parametrize("case,combine,layer",
                         [r for r in RUNS if r.values[0][0] in ("strided", "fixed")])
def test_structured_plan_follows_the_head_roles(case, combine, layer):
    """Each head is in one group, and its group's pieces compute its role's parts."""
    pattern, _, n_heads, params = case
    l, c = params["stride"], params.get("c")
    roles = head_roles(pattern, n_heads, combine, layer, stride=l, c=c)
    groups = plan(pattern, combine, layer, n_heads, 0.5, l, c)
    seen = [h for heads, _ in groups for h in range(n_heads)[heads]]
    assert sorted(seen) == list(range(n_heads))
    for heads, pieces in groups:
        members = list(range(n_heads)[heads])
        for h in members:
            role = roles[h]
            kinds = [type(p) for p in pieces]
            if pattern == "strided":
                assert (LocalBand in kinds) == role.reads("local") or params["stride"] == 1
                assert (Column in kinds) == role.reads("column")
                # j = i is the column's: a band beside it leaves it out
                assert all(p.strict == role.reads("column") for p in pieces
                           if isinstance(p, LocalBand))
                continue
            summaries = [p for p in pieces if isinstance(p, Summary)]
            block = BlockCausal in kinds or any(p.block for p in summaries)
            assert block == role.reads("block")
            assert bool(summaries) == role.reads("summary")
            for p in summaries:
                assert p.los[members.index(h)] == role.summary[0]
                assert p.own == (not role.reads("block"))


@pytest.mark.parametrize("n", [1, 6, 23, 40])
@pytest.mark.parametrize("case,combine,layer",
                         [r for r in RUNS if r.values[0][0] in ("strided", "fixed")]
                         + [pytest.param(("strided", 23, 2, {"stride": 1}), "merged", 0,
                                         id="strided-l1-merged0")])
def test_structured_pieces_count_each_pair_once(case, combine, layer, n):
    """The pairs a group's pieces read add up to the pairs its heads' masks hold: no
    position read twice, none left out (the pieces' shares in fast.measure.pieces)."""
    pattern, _, n_heads, params = case
    l, c = params["stride"], params.get("c")
    masks = ref.head_masks(pattern, n, n_heads, combine, layer, **params)
    for heads, pieces in plan(pattern, combine, layer, n_heads, 0.5, l, c):
        members = list(range(n_heads)[heads])
        got = sum(p.pairs(n, len(members)) for p in pieces)
        assert got == int(masks[members].sum()), [type(p).__name__ for p in pieces]


BAD = [  # (pattern, params, words of the message)
    ("strided", {"stride": 2**31}, "2**31 - 1"),
    ("strided", {"stride": 2**63}, "2**31 - 1"),
    ("strided", {"stride": True}, "stride l must be an integer >= 1, got True"),
    ("fixed", {"stride": 4, "c": 5}, "c=5 > l=4"),
    ("fixed", {"stride": 6, "c": 4}, "multiple of c"),
    ("longformer", {"window": 2**31}, "window must be an integer >= 1, got 2147483648"),
    ("longformer", {"window": 2, "global_tokens": np.array([12])}, "global_tokens"),
    ("bigbird", {"window": 2, "n_random": 1, "n_global": 13}, "n_global must be"),
    ("full", {"stride": 3}, "got unexpected ['stride']"),
    ("strided3", {"stride": 0}, "stride l must be an integer >= 1, got 0"),
    ("strided3", {"stride": 3, "c": 1}, "got unexpected ['c']"),
]


@pytest.mark.parametrize("pattern,params,words", BAD)
def test_every_path_rejects_bad_input_alike(pattern, params, words):
    n, n_heads = 12, 2
    with pytest.raises(ValueError) as want:
        ref.head_masks(pattern, n, n_heads, **params)
    assert words in str(want.value), str(want.value)
    q = torch.zeros(1, n_heads, n, 4)
    calls = {
        "sparse_attention": lambda: sparse_attention(q, q, q, pattern, **params),
        "block_layout": lambda: block_layout(pattern, n, n_heads, **params),
        "flex mask_mod": lambda: mask_mod(pattern, n, n_heads, **params),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError) as got:
            call()
        assert str(got.value) == str(want.value), name


def test_model_config_checks_like_attention():
    with pytest.raises(ValueError, match=r"stride l must be .*2\*\*31 - 1"):
        ModelConfig(n_ctx=16, d_model=8, n_heads=2, stride=2**31)
    with pytest.raises(ValueError, match="multiple of c"):
        ModelConfig(n_ctx=16, d_model=8, n_heads=2, pattern="fixed", stride=6, c=4)
    # multihead with two heads: one block head and one summary head, both of rank 0,
    # which sparse_attention accepts, so the config does too
    cfg = ModelConfig(n_ctx=16, d_model=8, n_heads=2, pattern="fixed", combine="multihead",
                      stride=6, c=4)
    q = torch.zeros(1, 2, 16, 4)
    sparse_attention(q, q, q, "fixed", combine="multihead", **cfg.pattern_params())
