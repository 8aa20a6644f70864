"""fast/measure/compile_step.py: the record of a training step timed eager and compiled.

Child et al., 2019, Table 2 (time per iteration, same model, same hardware). What is
checked is the record, never a time: one row per (pattern, n), each round timed for both
contenders, the ratio from their fastest rounds; the compiled twin trains from the same
weights as the eager model.
"""

import pytest

from fast.measure import compile_step

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 11}


def test_config_strides_near_sqrt_n():
    assert [compile_step.config("strided", n).stride for n in (256, 1024, 1000)] == [16, 32, 32]
    cfg = compile_step.config("fixed", 1024, model=TINY)
    assert (cfg.stride, cfg.c, cfg.d_model) == (32, 8, 16)


@pytest.mark.parametrize("pattern", ["strided"])
def test_step_times_record(pattern):
    lines = []
    data = compile_step.step_times(ns=(24,), patterns=(pattern,), batch=1, rounds=2,
                                   threads=1, compiler="aot_eager", model=TINY,
                                   log=lines.append)
    row, = data["results"]
    assert (row["pattern"], row["n"], row["stride"]) == (pattern, 24, 4)
    assert len(row["eager_s"]) == len(row["compiled_s"]) == 2
    assert row["ratio"] == min(row["compiled_s"]) / min(row["eager_s"])
    assert row["compile_s"] > 0 and len(lines) == 1 and "compiled / eager" in lines[0]
    assert data["config"]["d_model"] == 16 and data["config"]["compiler"] == "aot_eager"
