"""Table 2's time column on a GPU (``python -m fast train-time``): its orchestration.

Child et al., 2019, Table 2 (seconds per iteration, dense / fixed / strided). The
script's loop runs here on the CPU at a tiny shape with a wall clock; on a GPU
(``gpu`` marker) it also counts the host-device syncs of a training step.
"""

from __future__ import annotations

import json

import pytest
import torch

from fast.commands import train_time as train_time_command
from fast.experiments import gpu_iteration_time as it
from tests.conftest import tiny_digits
from tests.fast.kernels.triton_helpers import gpu

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
    with pytest.raises(SystemExit) as end:                 # before any work: exit 2, one line
        train_time_command.main(["--device", "cpu"])
    err = capsys.readouterr().err
    assert end.value.code == 2 and "GPU" in err and err.count("\n") == 1
    assert err.startswith("python -m fast train-time: --device cpu is the CPU; allowed: a GPU")


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


@pytest.mark.gpu
@gpu
def test_training_loop_waits_for_the_device_at_most_once_per_step(tmp_path):
    """fast.transformer.training.train itself, fp16 with loss scaling, no logging or evaluation
    inside the steps: the waits of 8 steps minus those of 4 are at most one per step
    (the scaler's), so the loop's timing (StepClock) adds none."""
    import warnings

    from fast.data import load
    from fast.transformer.training import train as training

    data = load("digits")

    def waits(steps: int) -> int:
        m, t = tiny_digits(tmp_path / str(steps), d_model=64, max_iters=steps, warmup_iters=1,
                           log_interval=10_000, precision="fp16", device="cuda",
                           save_checkpoint=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                training.train(m, t, progress=False, dataset=data)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    extra = waits(8) - waits(4)
    print("waits per step", extra / 4)
    assert extra <= 4
