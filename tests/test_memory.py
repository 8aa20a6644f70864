"""Tests of fast/memory.py: bytes saved for backward (sec. 5.4) and peak RSS."""

import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from fast.measure.memory import count_saved, format_bytes, peak_rss, saved_bytes


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux only")
def test_peak_rss_sees_a_large_temporary():
    with peak_rss() as r:
        t = torch.ones(64 * 2**20 // 4)   # 64 MiB, touched
        del t
    assert r["peak_bytes"] is not None
    assert r["peak_bytes"] >= 60 * 2**20


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2**30) == "3.0 GiB"
    assert format_bytes(None) == "n/a"


def test_memory_report_measures_one_block_input_per_layer_with_recomputation():
    from fast.experiments.memory_report import measure, per_layer
    base = dict(d=32, heads=2, stride=8, c=4, batch=1, pattern="strided", impl="sparse",
                what="saved", n=64)
    rows = {}
    for recompute in (False, True):
        small, large = ({**base, "recompute": recompute, "layers": L} for L in (1, 3))
        rows[recompute] = per_layer({**small, **measure(small)}, {**large, **measure(large)})
    assert rows[True] == 64 * 32 * 4                 # the block input, fp32
    assert rows[False] >= 10 * rows[True]            # norms, q, k, v, attention, ff, ...
