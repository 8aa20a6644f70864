"""Tests of fast.measure.memory and fast.measure.model_memory: bytes saved for backward
(Child et al., 2019, sec. 5.4), peak RSS, and the fresh process that measures it."""

import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from fast.measure.child import call, run_child
from fast.measure.memory import (
    count_saved,
    format_bytes,
    graph_saved,
    peak_memory,
    peak_rss,
    saved_bytes,
)
from fast.measure.model_memory import measure, per_layer
from fast.plots import memory as plot_memory
from fast.transformer.config import ModelConfig
from fast.transformer.network.model import SparseTransformer


def test_counts_activations_and_parameters_apart():
    w = torch.nn.Parameter(torch.randn(37))
    x = torch.randn(5, 37, requires_grad=True)
    _, log = saved_bytes(lambda: (x * w).sum(), parameters=[w])
    # mul saves both operands: x is an activation, w a parameter
    assert log.activation_bytes == x.numel() * 4
    assert log.parameter_bytes == w.numel() * 4
    assert log.n_saved == 2


def test_storage_shared_by_views_is_counted_once():
    x = torch.randn(6, 10, requires_grad=True)
    with count_saved() as log:
        y = x * 2.0           # saves nothing (scalar multiply)
        a = y.view(60)
        b = y[:, :5]
        z = (a * a).sum() + (b * b).sum()
    assert log.n_saved == 4   # a twice, b twice
    assert log.n_storages == 1
    assert log.activation_bytes == 60 * 4
    z.backward()              # our hooks hand the tensors back unchanged
    expected = 8.0 * x.detach()
    expected[:, :5] *= 2      # the first five columns are read through a and b
    assert torch.allclose(x.grad, expected)


def _stack(depth: int, d: int):
    torch.manual_seed(0)
    return torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                            torch.nn.Linear(4 * d, d))
        for _ in range(depth)
    )


def _run(blocks, x, recompute: bool):
    for blk in blocks:
        if recompute:
            x = x + checkpoint(blk, x, use_reentrant=False)
        else:
            x = x + blk(x)
    return x.sum()


@pytest.mark.slow
def test_recomputation_keeps_only_block_inputs_and_gives_same_grads():
    depth, d, B = 6, 24, 7
    blocks = _stack(depth, d)
    x = torch.randn(B, d, requires_grad=True)
    grads = {}
    logs = {}
    for recompute in (False, True):
        with count_saved(blocks.parameters()) as log:
            loss = _run(blocks, x, recompute)
        loss.backward()
        grads[recompute] = [p.grad.clone() for p in blocks.parameters()]
        blocks.zero_grad()
        logs[recompute] = log
    # with recomputation only each block's input (B, d) is kept
    assert logs[True].activation_bytes == depth * B * d * 4
    # without it each block keeps at least its normed input, two (B, 4d) and more
    assert logs[False].activation_bytes >= depth * B * d * 4 * (1 + 1 + 4 + 4)
    for a, b in zip(grads[False], grads[True]):
        assert torch.allclose(a, b, atol=1e-6)


def test_tags_split_bytes_per_block():
    blocks = _stack(3, 16)
    x = torch.randn(4, 16, requires_grad=True)
    with count_saved(blocks.parameters()) as log:
        for i, blk in enumerate(blocks):
            log.tag = f"block{i}"
            x = x + blk(x)
    assert set(log.tags) == {"block0", "block1", "block2"}
    assert len(set(log.tags.values())) == 1          # identical blocks, identical bytes
    assert sum(log.tags.values()) == log.activation_bytes


def large_temporary_peak(mib: int) -> dict:
    """Peak RSS of a ``mib`` MiB temporary (the child side of the test below)."""
    with peak_rss() as r:
        t = torch.ones(mib * 2**20 // 4)   # touched
        del t
    return r


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux only")
def test_peak_rss_sees_a_large_temporary():
    # In a fresh process: in this one, pages an earlier test left resident can be
    # reused by the temporary, and then RSS does not grow.
    out = run_child("tests.fast.measure.test_memory:large_temporary_peak", 64, timeout=300)
    assert "result" in out, out
    r = out["result"]
    assert r["peak_bytes"] is not None
    assert r["peak_bytes"] >= 60 * 2**20


def test_peak_memory_on_the_cpu_is_peak_rss():
    with peak_memory("cpu") as r:
        pass
    assert set(r) == {"peak_bytes", "start_bytes"}
    if sys.platform.startswith("linux"):
        assert r["peak_bytes"] is not None and r["peak_bytes"] >= 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_peak_memory_sees_a_cuda_temporary():
    with peak_memory("cuda") as r:
        t = torch.ones(16 * 2**20 // 4, device="cuda")   # 16 MiB
        del t
    assert r["peak_bytes"] >= 16 * 2**20


@pytest.mark.slow
def test_child_reports_errors_instead_of_raising():
    out = run_child("fast.measure.memory:format_bytes", "not a number", timeout=300)
    assert out["error"].startswith("failed: ") and "TypeError" in out["output"]
    assert call("fast.measure.memory:format_bytes", 1536) == "1.5 KiB"
    with pytest.raises(ValueError, match="package.module:name"):
        run_child("fast.measure.memory.format_bytes", 1)
    assert run_child("time:sleep", 60, timeout=2)["error"] == "timed out after 2 s"


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2**30) == "3.0 GiB"
    assert format_bytes(None) == "n/a"


def test_memory_report_measures_one_block_input_per_layer_with_recomputation():
    base = dict(d=32, heads=2, stride=8, c=4, batch=1, pattern="strided", impl="sparse",
                what="saved", n=64)
    rows = {}
    for recompute in (False, True):
        small, large = ({**base, "recompute": recompute, "layers": L} for L in (1, 3))
        rows[recompute] = per_layer({**small, **measure(small)}, {**large, **measure(large)})
    assert rows[True] == 64 * 32 * 4                 # the block input, fp32
    assert rows[False] >= 10 * rows[True]            # norms, q, k, v, attention, ff, ...


def test_tensors_of_a_dropped_branch_are_not_counted():
    # An input check run with gradients on (min and max of q, read once) packs q, but
    # its branch of the graph is freed at once: q is not kept for backward.
    x = torch.randn(8, 5, requires_grad=True)
    with count_saved() as log:
        q = x * 3.0                                    # saves nothing (scalar multiply)
        assert bool(torch.isfinite(torch.stack(torch.aminmax(q))).all())
        assert log.activation_bytes == 0 and log.n_saved == 0
        kept = torch.sigmoid(q).sum()                  # sigmoid keeps its output
        assert log.activation_bytes == 8 * 5 * 4
    assert log.n_packed > log.n_saved == 1 and log.n_storages == 1
    assert log.activation_bytes == 8 * 5 * 4          # frozen when the block exited
    kept.backward()
    s = torch.sigmoid(x.detach() * 3.0)
    assert torch.allclose(x.grad, 3.0 * s * (1 - s))


def test_graph_saved_lists_what_count_saved_counts():
    torch.manual_seed(0)
    for pattern in ("strided", "full"):
        model = SparseTransformer(ModelConfig(n_ctx=40, d_model=16, n_heads=2, n_layers=1,
                                              pattern=pattern, stride=8)).train()
        h = torch.randn(1, 37, 16, requires_grad=True)
        with count_saved(model.parameters()) as log:
            out = model.blocks[0](h)
        rows = graph_saved(out, model.parameters())
        assert sum(r[4] for r in rows) == log.activation_bytes
        assert len(rows) == log.n_storages
        ops = [r[0] for r in rows]
        assert ops[0] == "NativeLayerNormBackward0" and "SigmoidBackward0" in ops


def test_strided_keeps_one_block_input_more_than_dense_the_heads_copy():
    # What memory_length.png and notebook 07 say, measured live (the structured backend, as
    # fast.measure.model_memory runs it): per block, strided attention
    # keeps exactly one n x d fp32 tensor more than dense (W_p keeps the copy made when the
    # structured path's (B, H, n, d) output is put side by side). At an n that is not a
    # multiple of the stride, the structured path also keeps out (B, H, n', d) and lse
    # (B, H, n') padded to n' = the next multiple of l; q, k, v it keeps as given (its
    # backward pads them again; before it became an operator it kept padded copies, 3 more
    # pad rows of (B, H, ., d)); and one byte, its float64 decision, which the backward is
    # handed instead of reading the log-sum-exp back again.
    d, heads, stride = 16, 2, 8
    for n in (40, 37):
        kept = {}
        for pattern in ("strided", "full"):
            torch.manual_seed(0)
            model = SparseTransformer(ModelConfig(n_ctx=40, d_model=d, n_heads=heads,
                                                  n_layers=1, pattern=pattern,
                                                  stride=stride,
                                                  attention_backend="structured")).train()
            h = torch.randn(1, n, d, requires_grad=True)
            with count_saved(model.parameters()) as log:
                out = model.blocks[0](h)                                 # (1, n, d)
            kept[pattern] = log.activation_bytes
            assert out.shape == (1, n, d)
        pad = -n % stride
        padding = (pad * d + heads * pad) * 4                            # out; lse
        print(f"n = {n}: bytes kept by one block {kept}, padding {padding}")
        assert kept["strided"] - kept["full"] == n * d * 4 + padding + 1


def test_a_timed_step_records_its_runs_and_cpu_seconds():
    spec = dict(d=16, heads=2, stride=8, c=4, batch=1, pattern="fixed", impl="sparse",
                what="step", n=32, layers=1, recompute=True, repeats=2)
    out = measure(spec)
    assert len(out["runs"]) == 2
    for run in out["runs"]:
        assert run["total_s"] >= run["forward_s"] > 0
        if sys.platform.startswith("linux"):
            assert run["cpu_user_s"] + run["cpu_sys_s"] > 0 and run["minor_faults"] >= 0


def _synthetic_memory_json(layers=8, d=16):
    """A memory.json shaped like ``python -m fast memory``'s, with strided keeping exactly
    one n x d fp32 tensor per block more than dense."""
    length = []
    for n in (64, 128, 256):
        for rc in (False, True):
            dense = (layers * 20 if not rc else layers) * n * d * 4
            length.append({"n": n, "d": d, "pattern": "full", "recompute": rc,
                           "saved_bytes": dense})
            extra = 0 if rc else layers * n * d * 4
            length.append({"n": n, "d": d, "pattern": "strided", "recompute": rc,
                           "saved_bytes": dense + extra})
    depth = [{"layers": L, "recompute": rc, "n": 64, "d": d, "pattern": "strided",
              "saved_bytes": (L * (1 if rc else 21) + 2) * 64 * d * 4,
              "block_tensors": [[[1, 64, d], "float32", 64 * d * 4]] * 21}
             for L in (1, 2, 4) for rc in (False, True)]
    return {"quick": True, "depth": {"n": 64, "rows": depth},
            "length": {"layers": layers, "rows": length}}


@pytest.mark.slow
def test_memory_figures_are_drawn_and_the_strided_extra_is_measured_per_block(tmp_path):
    data = _synthetic_memory_json()
    assert plot_memory.extra_per_block(data["length"]) == [1.0, 1.0, 1.0]
    paths = plot_memory.make_all(data, tmp_path)
    assert [p.name for p in paths] == ["fig4_dataflow.png", "memory_depth.png",
                                       "memory_length.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    # Figure 4 draws the feed-forward branch's output node
    assert any(text.startswith("b = dropout(W_2 f") for text, _, _ in plot_memory.DATAFLOW)
