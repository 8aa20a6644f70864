"""fast.measure.step_profile: where a CPU training step's time goes (Child et al., 2019,
sec. 6 and Table 2's time per iteration), measured by parts that add up."""

import dataclasses

import numpy as np
import pytest

from fast.data import load
from fast.measure import step_profile
from fast.transformer.config import preset


def test_step_profile_measures_every_part_of_a_step():
    """fast.measure.step_profile on a tiny model: every phase timed, the operator shares a
    partition, one per-token time per batch size, and only float32 steps."""
    m, t = preset("digits", d_model=16, n_heads=2, n_layers=1, batch_size=4,
                  precision="fp32", device="cpu")
    out = step_profile.profile_step(m, t, load("digits"), steps=2, warmup=1, batches=(2, 4))
    assert set(out["phases"]) == {"data", "forward", "backward", "clip", "optimizer"}
    assert all(v >= 0 for v in out["phases"].values()) and out["phases"]["backward"] > 0
    assert np.isclose(sum(out["op_shares"].values()), 1.0) and out["op_shares"]["matmul"] > 0
    assert out["op_calls"] > 10 and out["dispatch_s"] > 0 and out["eval_item_s"] > 0
    assert len(out["per_token_s"]) == 2 and out["batches"] == [2, 4]
    assert step_profile.op_kind("aten::_scaled_dot_product_flash_attention_for_cpu") == \
        "attention"
    assert step_profile.op_kind("aten::addmm") == "matmul"
    assert step_profile.op_kind("aten::layer_norm") == "other"
    with pytest.raises(ValueError, match="float32"):
        step_profile.profile_step(m, dataclasses.replace(t, precision="bf16"), load("digits"))
