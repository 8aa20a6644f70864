"""Table 2's time column on a GPU (``python -m fast train-time``): its orchestration.

Child et al., 2019, Table 2 (seconds per iteration, dense / fixed / strided) against the
attention-free floor. The script's loop runs here on the CPU at a tiny shape with a wall
clock, and the host reads of a training step are counted and named here too; on a GPU
(``gpu`` marker) the waits of a step are counted by the CUDA runtime, each named by its
stack when there are too many.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from fast.commands import train_time as train_time_command
from fast.experiments import gpu_iteration_time as it
from fast.measure.host_reads import describe, device_waits, on_the_cpu_only
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


def test_the_attention_free_floor_is_measured_first_and_every_row_read_against_it():
    saved = []
    data = it.run(TINY, it.ROWS, 2, torch.device("cpu"), warm=1, steps=2, precision="fp32",
                  save=lambda d: saved.append(json.loads(json.dumps(d))), log=lambda _: None)
    rows = {r["pattern"]: r for r in data["rows"]}
    assert [r["pattern"] for r in data["rows"]] == ["none", "full", "fixed", "strided"]
    assert [len(d["rows"]) for d in saved] == [1, 2, 3, 4, 4]        # JSON after every row
    assert [d["complete"] for d in saved] == [False] * 4 + [True]
    floor, dense = rows["none"]["s_per_iter"], rows["full"]["s_per_iter"]
    assert rows["none"]["backend"] is None and rows["none"]["above_floor_s"] is None
    for p in ("full", "fixed", "strided"):
        assert math.isclose(rows[p]["above_floor_s"], rows[p]["s_per_iter"] - floor)
    for p in ("fixed", "strided"):
        above = rows[p]["above_floor_s"]
        want = (dense - floor) / above if above > 0 else None
        assert rows[p]["attention_speedup_vs_dense"] == want
    s = data["summary"]["tiny"]
    assert s["floor_s"] == floor and s["dense_s"] == dense
    assert math.isclose(s["max_speedup_vs_dense"], dense / floor)
    assert s["paper_speedup_vs_dense"] == {}                 # no paper number at this shape
    assert it.derive([])["max_speedup_vs_dense"] is None


def test_the_floor_is_the_same_model_without_attention_work():
    """NoAttention: the output is v, its gradient v's; q and k get zeros of their shape, so
    every parameter of the model gets a gradient as with attention."""
    q, k = torch.randn(2, 3, 5, 4, requires_grad=True), torch.randn(2, 3, 5, 4,
                                                                   requires_grad=True)
    v = torch.randn(2, 3, 5, 8, requires_grad=True)
    out = it.NoAttention.apply(q, k, v)
    assert torch.equal(out, v) and out.data_ptr() == v.data_ptr()          # no copy
    g = torch.randn_like(out)
    out.backward(g)
    assert torch.equal(v.grad, g) and not q.grad.any() and q.grad.shape == q.shape
    assert k.grad.shape == k.shape and not k.grad.any()
    cell = it.build_cell(TINY["tiny"], it.FLOOR, 2, torch.device("cpu"), precision="fp32")
    assert cell.config.pattern == "full" and cell.config.recompute
    cell.step()
    assert all(p.grad is not None for p in cell.model.parameters())
    with pytest.raises(ValueError, match="no attention weights"):
        cell.model(torch.zeros(1, 8, dtype=torch.long), return_attention=True)


def _one_read_per_step(pattern):
    """One training step on the CPU as a GPU takes it (the Triton path, interpreted; loss
    scaling): the host reads a value once, in the loss scaler's check for inf. The reads
    sparse_attention and the model make on the CPU only (their checks of values) are told
    apart; every other read is one a GPU waits for, and is printed with its stack."""
    small = dict(n=32, d=32, heads=2, layers=1, stride=8, c=4, image=None)
    reads = it.step_reads(small, pattern, 2, torch.device("cpu"), precision="fp32",
                          loss_scaling=True, backend=None if pattern == it.FLOOR else "triton")
    waits = [r for r in reads if on_the_cpu_only(r) is None]
    print(describe(reads, f"host reads of one {pattern} step"))
    assert len(waits) == 1 and waits[0].origin.startswith("torch/amp/grad_scaler.py"), \
        describe(waits, "reads a GPU would wait for")


def test_a_training_step_reads_the_host_once_the_loss_scalers():
    _one_read_per_step("strided")


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["fixed", "full", it.FLOOR])
def test_a_training_step_reads_the_host_once_every_pattern(pattern):
    _one_read_per_step(pattern)


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
    cell = it.build_cell(small, pattern, 2, torch.device("cuda"))
    for _ in range(2):
        cell.step()
    waits = device_waits(cell.step)
    print(describe(waits, f"waits of one {pattern} step"))
    assert len(waits) <= 1, describe(waits, f"waits of one {pattern} step")


@pytest.mark.gpu
@gpu
def test_training_loop_waits_for_the_device_at_most_once_per_step(tmp_path):
    """fast.transformer.training.train itself, fp16 with loss scaling, no logging or evaluation
    inside the steps: the waits of 8 steps minus those of 4 are at most one per step
    (the scaler's), so the loop's timing (StepClock) adds none. A first run warms the
    process (kernels compiled, layouts built and written to the device, cuBLAS set up:
    waits a run makes once), so that the two counted runs differ by their steps only."""
    from fast.data import load
    from fast.transformer.training import train as training

    data = load("digits")

    def waits(steps: int) -> list:
        m, t = tiny_digits(tmp_path / str(steps), d_model=64, max_iters=steps, warmup_iters=1,
                           log_interval=10_000, precision="fp16", device="cuda",
                           save_checkpoint=False)
        return device_waits(lambda: training.train(m, t, progress=False, dataset=data))

    waits(2)                                               # the process's one-time waits
    four, eight = waits(4), waits(8)
    print("waits per step", (len(eight) - len(four)) / 4)
    assert len(eight) - len(four) <= 4, (describe(four, "waits of 4 steps") + "\n"
                                         + describe(eight, "waits of 8 steps"))
