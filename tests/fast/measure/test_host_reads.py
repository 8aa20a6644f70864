"""The host-read counter (``fast.measure.host_reads``): every read of a value by the host is
recorded with the line that asked, on the CPU, where no GPU is needed to find a GPU's waits
(Child et al., 2019, sec. 5.5 and 6: a training step that waits once)."""

from __future__ import annotations

import pytest
import torch

from fast.backends.naive import masked_attention
from fast.measure import host_reads
from fast.transformer.network.model import check_token_ids


def test_every_kind_of_read_is_recorded_at_the_line_that_asked():
    t = torch.arange(6.0)

    def reads():
        t.sum().item()                                   # item
        bool(t.max() > 3)                                # bool
        int(t[2])                                        # int
        torch.equal(t, t)                                # equal
        t.nonzero()                                      # sized by the values
        t.add(1).mul(2)                                  # no read

    got = host_reads.host_reads(reads)
    assert [r.op for r in got] == ["item", "item", "item", "equal", "nonzero"]
    assert all(r.device == "cpu" for r in got)
    lines = [int(r.where.split(":")[1].split()[0]) for r in got]
    first = reads.__code__.co_firstlineno
    assert lines == [first + n for n in (1, 2, 3, 4, 5)], [r.where for r in got]
    assert all(r.where.startswith("tests/fast/measure/test_host_reads.py:") for r in got)
    text = host_reads.describe(got, "reads")
    assert text.startswith("reads: 5\n  [0] item of a cpu tensor at tests/fast/measure/")
    assert "t.sum().item()" in text and "torch.equal(t, t)" in text


def test_tensors_kept_on_the_host_are_left_out():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    steps = host_reads.host_state(opt)
    assert len(steps) == 2 and all(s.dim() == 0 for s in steps)     # weight and bias
    assert len(host_reads.host_reads(opt.step)) == 2                         # AdamW reads each step
    assert host_reads.host_reads(opt.step, steps) == []
    assert host_reads.host_state(None) == []
    assert host_reads.host_state(torch.optim.AdamW(model.parameters(), capturable=True)) == []


def test_a_copy_counts_only_from_a_device_to_the_cpu():
    t = torch.ones(3)
    assert host_reads.host_reads(lambda: (t.cpu(), t.to("cpu", copy=True), t.clone())) == []
    meta = torch.empty(3, device="meta")
    mode = host_reads.HostReads()
    with mode, pytest.raises(NotImplementedError):
        meta.to("cpu")                              # nothing to copy, but asked: recorded
    assert [(r.op, r.device) for r in mode.reads] == [("copy to cpu", "meta")]


def test_the_reads_made_on_the_cpu_only_are_told_apart():
    ids = torch.tensor([[1, 2, 3]])
    got = host_reads.host_reads(lambda: check_token_ids(ids, 10))
    assert len(got) == 2 and all(host_reads.on_the_cpu_only(r) for r in got)
    assert "on the CPU only" in host_reads.describe(got)
    # off the CPU the same check reads nothing (a read of a meta tensor would raise)
    assert host_reads.host_reads(lambda: check_token_ids(ids.to("meta"), 10)) == []
    # the naive path likewise looks for rows that read nothing on the CPU only
    q, mask = torch.randn(1, 2, 5, 4), torch.ones(5, 5, dtype=torch.bool).tril()
    got = host_reads.host_reads(lambda: masked_attention(q, q, q, mask))
    assert len(got) == 1 and "naive path" in host_reads.on_the_cpu_only(got[0])
    meta = host_reads.host_reads(lambda: masked_attention(q.to("meta"), q.to("meta"), q.to("meta"),
                                                 mask.to("meta")))
    assert meta == []
    other = host_reads.host_reads(lambda: torch.ones(2).sum().item())
    assert host_reads.on_the_cpu_only(other[0]) is None
    assert host_reads.summary(other) == [{"op": "item", "device": "cpu", "where": other[0].where,
                                 "origin": other[0].where, "cpu_only": False}]


def test_device_waits_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the gpu tests use device_waits")
    with pytest.raises(ValueError, match="device_waits needs CUDA"):
        host_reads.device_waits(lambda: None)
