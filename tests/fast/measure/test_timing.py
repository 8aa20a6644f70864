"""The clock (fast.core.clock), the timing rules (fast.measure.timing) and the tile costs the
benchmarks compare with (fast.layout.costs).

Child et al., 2019, section 5.5 and Table 2: speed is compared as ratios of steady-state
times. Checked: a mark waits for nothing and an interval reads what passed; each method
makes the calls its rules say (the first call apart, warm-ups, how many repetitions, which
statistic); on the CPU every repetition's CPU seconds and page faults are counted; the
ideal speed-up is the ratio of tile counts. Times themselves are not checked (noisy).
"""

from __future__ import annotations

import math
import mmap
import statistics
import time

import pytest
import torch

from fast.core.clock import Clock
from fast.layout import block_layout
from fast.layout.costs import ideal_speedup, layout_tiles, tile_flops
from fast.measure import timing
from fast.measure.timing import FRESH, SAME, Method


def test_cpu_clock_reads_intervals_between_marks():
    clock = Clock("cpu")
    a = clock.mark()
    time.sleep(0.02)
    b = clock.mark()
    time.sleep(0.01)
    c = clock.mark()
    assert clock.seconds(a, b) >= 0.02 and clock.seconds(b, c) >= 0.01
    assert clock.elapsed([(a, b), (b, c), (a, c)]) == [b - a, c - b, c - a]
    assert clock.elapsed([]) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_clock_marks_without_waiting():
    """Marks around GPU work never make the host wait; reading them waits once."""
    clock = Clock("cuda")
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")         # any host-device wait raises
    try:
        pairs = []
        for _ in range(3):
            start = clock.mark()
            x = x @ x / 2048
            pairs.append((start, clock.mark()))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    seconds = clock.elapsed(pairs)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)


class Calls:
    """A call that counts itself and takes ``seconds`` of wall clock."""

    def __init__(self, seconds: float = 0.0):
        self.n, self.seconds = 0, seconds

    def __call__(self):
        self.n += 1
        if self.seconds:
            time.sleep(self.seconds)


def test_repetitions_follow_each_method():
    # the fresh-process method: ~1 s of calls, at least 3 of a call under 0.3 s, at most 20
    assert [timing.repetitions(FRESH, t) for t in (0.001, 0.1, 0.2, 0.5, 1.5)] == [20, 10, 5,
                                                                                   2, 1]
    assert timing.repetitions(FRESH.with_(target_s=0.3), 0.2) == 3
    assert timing.repetitions(FRESH.with_(target_s=0.0), 0.5) == 1
    # the same-process method: ~0.1 s of calls, 5 .. 200, whatever the call's length
    assert [timing.repetitions(SAME, t) for t in (1e-5, 1e-3, 0.05, 10.0)] == [200, 100, 5, 5]


def test_fresh_method_sizes_repetitions_by_the_first_call():
    """No warm-up beyond the first call, no probe calls; the minimum is reported."""
    call = Calls()
    t = timing.steady(call, "cpu", FRESH.with_(target_s=0.2), {"s": 0.05})
    assert call.n == t["reps"] == 4 and t["s"] == min(t["times_s"])
    assert len(t["cpu_s_all"]) == len(t["faults_all"]) == 4 and t["timer"] == "perf_counter"
    # a first call over alone_s (2 s) is the only repetition: no more calls
    call = Calls()
    t = timing.steady(call, "cpu", FRESH, {"s": 3.0, "cpu_s": 2.5, "faults": 7})
    assert call.n == 0 and t["times_s"] == [3.0] and t["faults_all"] == [7]
    # a first call that built something (None): one timed call sizes the rest
    call = Calls(0.03)
    t = timing.steady(call, "cpu", FRESH.with_(target_s=0.05), None)
    assert call.n == t["reps"] == 3 and len(t["times_s"]) == 3


def test_same_method_warms_up_probes_and_reports_the_median():
    call = Calls()
    method = SAME.with_(target_s=0.0, min_reps=4)
    t = timing.steady(call, "cpu", method, {"s": 1.0})
    assert call.n == 2 + 4 and t["reps"] == 4                  # 2 warm-ups, 4 timed
    assert t["s"] == statistics.median(t["times_s"])
    call = Calls(0.01)
    t = timing.steady(call, "cpu", SAME.with_(target_s=0.1, warmup=0), {"s": 0.01})
    assert 5 <= t["reps"] <= 11 and call.n == t["reps"]       # ~0.1 s of 0.01 s calls


def _touch_fresh_pages(size: int = 64 << 20) -> None:
    """Map ``size`` bytes of fresh anonymous memory (no huge pages) and write one byte per
    4 KiB page: a page fault each, whatever the allocator did before in this process
    (a ``torch.empty`` of 64 MiB may come from memory malloc kept, and fault nothing)."""
    with mmap.mmap(-1, size) as m:
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
            m.madvise(mmap.MADV_NOHUGEPAGE)
        for offset in range(0, size, 4096):
            m[offset] = 1


def test_cpu_repetitions_count_page_faults_and_cpu_seconds():
    """A call that touches 64 MiB of fresh memory faults its pages in (4 KiB each)."""
    got = timing.repeat(_touch_fresh_pages, "cpu", 2)
    print(f"faults per call: {got['faults']}, CPU seconds {got['cpu_s']}")
    assert len(got["s"]) == 2 and all(c >= 0 for c in got["cpu_s"])
    assert max(got["faults"]) > 1000
    first = timing.first_call(_touch_fresh_pages, "cpu")
    assert first["s"] > 0 and first["faults"] > 1000
    assert first["peak_bytes"] is None or first["peak_bytes"] >= 0


def test_estimate_and_method_checks():
    assert timing.estimate_s(0.01, SAME, first_s=1.0) == pytest.approx(1.0 + (2 + 10) * 0.01)
    assert timing.estimate_s(3.0, FRESH) == pytest.approx(3.0)
    assert "fresh process" in FRESH.describe() and "median" in SAME.describe()
    for bad, says in [(dict(process="forked"), "process must be one of"),
                      (dict(statistic="mean"), "statistic must be one of"),
                      (dict(target_s=math.nan), "target_s must be a finite number"),
                      (dict(min_reps=0), "1 <= min_reps <= max_reps")]:
        with pytest.raises(ValueError, match=says):
            Method(**{**dict(process="same", statistic="median", target_s=0.1, warmup=0,
                             min_reps=1, max_reps=2), **bad})


def test_ideal_speedup_is_the_ratio_of_tile_counts():
    params = {"stride": 16}
    lay = block_layout("strided", 1000, n_heads=2, block_size=32, stride=16)
    tiles = sum(int(p.kv_count.sum()) for p in lay.parts) / 2
    nb = math.ceil(1000 / 32)
    assert layout_tiles("strided", 1000, 2, params, block_size=32) == tiles
    assert ideal_speedup("strided", 1000, 2, params, block_size=32) == pytest.approx(
        nb * (nb + 1) / 2 / tiles)
    assert ideal_speedup("full", 1000, 2, {}, block_size=32) == pytest.approx(1.0)
    assert tile_flops("strided", 3, 1000, 2, 48, params, block_size=32) == tiles * 2 * 3 * (
        4 * 32 * 32 * 48)
    assert tile_flops("strided", 3, 1000, 2, 48, params, block_size=32, backward=True) == \
        pytest.approx(3.5 * tile_flops("strided", 3, 1000, 2, 48, params, block_size=32))
