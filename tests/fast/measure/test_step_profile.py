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


def test_the_window_kernels_calls_count_as_attention():
    """The CPU window kernel is a C library the profiler sees by the names it records; its
    time is attention (a profile that left it out put Table 2's sparse cells at 0%)."""
    for name in ("cpu_window_forward", "cpu_window_backward", "cpu_window_prefix_forward"):
        assert step_profile.op_kind(name) == "attention" and step_profile._counted(name)
    assert not step_profile._counted("autograd::engine::evaluate_function: AddmmBackward0")


def test_step_seconds_times_configurations_in_turns_on_the_same_batches():
    """``step_seconds``: one step of each configuration per round, a context entered around
    one of them (a kernel choice), every configuration's median CPU seconds."""
    m, t = preset("digits", d_model=16, n_heads=2, n_layers=1, batch_size=4,
                  precision="fp32", device="cpu")
    entered = []

    class Marked:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    out = step_profile.step_seconds({"plain": m, "marked": (m, Marked)}, t, load("digits"),
                                    steps=3, warmup=1)
    assert set(out) == {"plain", "marked"} and all(v > 0 for v in out.values())
    assert len(entered) == 4                                        # warm-up + 3 steps


@pytest.mark.slow
def test_the_compiled_step_is_timed_beside_eager_with_what_compiling_cost():
    """``compiled_step``: the compiled and the eager step in turns, and the CPU seconds
    compiling took in this process (inductor's worker count put back after); traced by
    aot_eager here (inductor's C++ build takes minutes on a shared 2-core machine)."""
    from torch._inductor import config as inductor_config

    m, t = preset("digits", d_model=16, n_heads=2, n_layers=1, batch_size=4,
                  precision="fp32", device="cpu")
    workers = inductor_config.compile_threads
    out = step_profile.compiled_step(m, t, load("digits"), steps=2, backend="aot_eager")
    assert out["step_s"] > 0 and out["eager_step_s"] > 0 and out["compile_s"] > 0
    assert out["compile_wall_s"] > 0 and inductor_config.compile_threads == workers
