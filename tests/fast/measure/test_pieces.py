"""fast.measure.pieces: the structured backend's time, piece by piece, and each piece's share.

Child et al., 2019, section 5.5: the structured path runs a pattern as a few dense pieces;
``piece_times`` times each one and the glue, and counts each piece's (query, key) pairs.
The timings themselves are the machine's; what is tested is that every piece of the plan is
there once, with the pairs the reference masks hold, and that the numbers are real times.
"""

from __future__ import annotations

import json

import pytest
import torch

from fast.backends.structured import plan
from fast.measure.pieces import piece_times
from reference import patterns

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("pattern,combine,params", [
    ("strided", "merged", {"stride": 16}),
    ("fixed", "multihead", {"stride": 16, "c": 4}),
])
def test_piece_times_covers_the_plan_and_its_pairs(pattern, combine, params):
    n, H = 100, 4
    res = piece_times(pattern, n, H=H, d=16, combine=combine, rounds=2, dense=True, ops=True,
                      **params)
    json.dumps(res)                                       # plain numbers, for a JSON file
    want = [(f"heads {heads.start}::{heads.step}", type(p).__name__)
            for heads, pieces in plan(pattern, combine, 0, H, 0.25, params["stride"],
                                      params.get("c")) for p in pieces]
    assert [(r["group"], r["piece"]) for r in res["pieces"]] == want
    mask = patterns.head_masks(pattern, n, H, combine, 0, **params)
    assert res["pairs"]["pattern"] == int(mask.sum())
    assert sum(r["pairs"] for r in res["pieces"]) == int(mask.sum())
    assert abs(sum(r["pair_share"] for r in res["pieces"]) - 1.0) < 1e-12
    assert res["pairs"]["dense"] == H * n * (n + 1) // 2
    for r in res["pieces"]:
        assert 0 < r["fwd_s"] == min(r["fwd_s_all"]) and len(r["fwd_s_all"]) == 2
        assert 0 < r["bwd_s"] == min(r["bwd_s_all"])
        assert len(r["bwd_cpu_s_all"]) == len(r["bwd_faults_all"]) == 2
        assert r["bwd_ops_s"]["kernel"] > 0                 # the backward ran the kernel
    assert set(res["glue"]) >= {"prepare", "grad_prepare", "checks"}
    assert all(t >= 0 for t in res["glue"].values())
    assert res["whole"]["fb_s"] > 0 and res["dense"]["fwd_s"] > 0
    assert res["conditions"]["torch_threads"] == torch.get_num_threads() == 1


def test_piece_times_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError, match="'strided' or 'fixed'"):
        piece_times("full", 64)
    with pytest.raises(ValueError, match="at least the stride"):
        piece_times("strided", 64, stride=128)
