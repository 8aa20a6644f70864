"""Table 2's time column on a GPU (``python -m fast train-time``): its orchestration.

Child et al., 2019, Table 2 (seconds per iteration, dense / fixed / strided). The
script's loop runs here on the CPU at a tiny shape with a wall clock; on a GPU
(``gpu`` marker) it also counts the host-device syncs of a training step.
"""

from __future__ import annotations

import json

import pytest
import torch
from triton_helpers import gpu

from fast.experiments import gpu_iteration_time as it

TINY = {"tiny": dict(n=48, d=32, heads=2, layers=2, stride=8, c=4, image=None)}


def test_iteration_time_on_the_cpu_at_a_tiny_shape():
    data = it.run(TINY, it.PATTERNS, 2, torch.device("cpu"), warm=1, steps=2, precision="fp32")
    rows = data["rows"]
    assert [r["pattern"] for r in rows] == list(it.PATTERNS)
    for r in rows:
        assert r["s_per_iter"] > 0 and len(r["times_s"]) == 2 and r["warm_steps"] == 1
        assert r["n"] == 48 and r["layers"] == 2 and r["syncs_per_step"] is None
    assert rows[0]["speedup_vs_dense"] is None
    assert rows[1]["speedup_vs_dense"] == rows[0]["s_per_iter"] / rows[1]["s_per_iter"]
    json.dumps(data)                                   # the JSON the script writes


def test_paper_shapes_are_valid_models():
    for name, shape in it.SHAPES.items():
        for pattern in it.PATTERNS:
            cfg = it.model_config(shape, pattern)
            assert (cfg.n_ctx, cfg.n_layers, cfg.recompute) == (shape["n"], shape["layers"], True)
        assert set(it.PAPER_S[name]) == set(it.PATTERNS)


def test_command_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert it.main(["--device", "cpu"]) == 1
    assert "GPU" in capsys.readouterr().out


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("pattern", ["strided", "fixed", "full"])
def test_gpu_training_step_waits_for_the_device_at_most_once(pattern):
    """fp16 with loss scaling: the scaler's check for inf is the one wait a step needs."""
    small = {"small": dict(n=1000, d=128, heads=4, layers=2, stride=32, c=8, image=None)}
    data = it.run(small, [pattern], 2, torch.device("cuda"), warm=2, steps=2)
    row = data["rows"][0]
    print(row["syncs_per_step"], row["s_per_iter"])
    assert row["syncs_per_step"] <= 1
