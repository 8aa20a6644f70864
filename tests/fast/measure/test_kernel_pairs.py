"""The pairs the CPU flash kernel computes (fast.measure.kernel_pairs): its block rule on
problems worked by hand, every kernel call of the structured forward recorded, never
fewer pairs than a pattern reads, and the ceiling the bench and the README report."""

from __future__ import annotations

import pytest
import torch

from fast.backends import cpu_window, structured
from fast.backends.structured import fixed, strided
from fast.measure import bench
from fast.measure.kernel_pairs import computed_pairs, forward_calls, kernel_ceiling, problem_pairs


def test_problem_pairs_follow_the_kernels_blocks():
    assert problem_pairs(16, 144, causal=False) == 16 * 144           # a masked problem: whole
    assert problem_pairs(128, 128, causal=True) == 128 * 128          # <= 512 keys: whole
    # 1024 causal rows: query blocks of 256 reach 256, 512, 768, 1024 keys, in key blocks
    # of 512: 512, 512, 1024, 1024 keys computed
    assert problem_pairs(1024, 1024, causal=True) == 256 * (512 + 512 + 1024 + 1024)
    # 200 rows take query blocks of 64 (the last of 8 rows); one key block of 200
    assert problem_pairs(200, 200, causal=True) == 200 * 200
    assert problem_pairs(40, 1100, causal=True) == 40 * 512           # keys beyond 40 skipped


def test_window_kernel_pairs_by_hand():
    """The CPU window kernel's 16-row blocks, counted by hand."""
    assert cpu_window.pairs(16, 16) == 16 * 16                        # one block, every key
    assert cpu_window.pairs(40, 8) == 16 * (16 + 23 + 15)            # keys 0-15, 9-31, 25-39
    # prefix mode, blocks of 24 rows reading 5 more keys each: 16-row blocks at 0, 16, 32, 48
    # whose last rows (15, 31, 47, 49) lie in blocks 0, 1, 1, 2
    assert cpu_window.prefix_pairs(50, 24, 5) == 16 * (0 + 5 + 5 + 10)


# (pattern, params, combine, heads); c not dividing l: one head (SummaryEarlier)
CASES = [("strided", {"stride": 7}, "merged", 4), ("strided", {"stride": 5}, "multihead", 4),
         ("strided", {"stride": 4}, "interleaved", 4),
         ("fixed", {"stride": 8, "c": 2}, "merged", 4),
         ("fixed", {"stride": 6, "c": 3}, "multihead", 4),
         ("fixed", {"stride": 5, "c": 2}, "merged", 1)]


@pytest.mark.parametrize("pattern,params,combine,H", CASES)
@pytest.mark.parametrize("n", [61, 300])
def test_every_call_is_recorded_and_covers_every_pair_read(pattern, params, combine, H, n,
                                                          monkeypatch):
    """The recorded calls are the forward's: as many as a real forward makes (counted by
    wrapping the kernel), and their pairs are at least the pairs the pieces read."""
    l = params["stride"]
    calls = forward_calls(pattern, n, H, combine, **params)
    made = []
    real = strided.attention_forward

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)
    for module in (strided, fixed):
        monkeypatch.setattr(module, "attention_forward", counting)
    for name in ("forward", "prefix_forward"):          # the CPU window kernel's two modes
        real_call = getattr(cpu_window, name)
        monkeypatch.setattr(cpu_window, name,
                            lambda *a, _real=real_call, **kw: made.append(1) or _real(*a, **kw))
    N = -(-n // l) * l
    for heads, pieces in structured.plan(pattern, combine, 0, H, 1.0, l, params.get("c")):
        t = torch.randn(len(range(H)[heads]), N, 16)
        for piece in pieces:
            piece.forward(t, t, t)
    assert len(calls) == len(made) > 0
    read = sum(p.pairs(N, len(range(H)[heads]))
               for heads, pieces in structured.plan(pattern, combine, 0, H, 1.0, l,
                                                    params.get("c")) for p in pieces)
    assert computed_pairs(pattern, n, H, combine=combine, **params) >= read


def test_ceiling_lies_between_the_dense_rate_and_the_keys_read_ideal():
    """Above 1, and at most dense's computed pairs over the pairs the pattern reads (the
    keys-read ideal times dense's own waste: the pattern's kernels may waste less than
    dense's, as the CPU window kernel's prefix mode does for the fixed summaries)."""
    n = 16384
    dense_waste = computed_pairs("full", n, heads=1) / (n * (n + 1) / 2)
    assert dense_waste > 1
    for pattern, params in bench.PATTERN_PARAMS.items():
        ceiling = kernel_ceiling(pattern, n, **params)
        assert 1 < ceiling <= bench.keys_read_ideal(pattern, n, **params) * dense_waste
    assert computed_pairs("full", 1024, heads=2) == 2 * problem_pairs(1024, 1024, True)


def test_bench_summary_carries_the_ceiling():
    t = bench.summarize([])
    for pattern, params in bench.PATTERN_PARAMS.items():
        assert t[f"{pattern}_kernel_ceiling_16384"] == kernel_ceiling(pattern, 16384, **params)


@pytest.mark.parametrize("call,says", [
    (lambda: kernel_ceiling("strided", 1024), "needs the parameter 'stride'"),
    (lambda: kernel_ceiling("fixed", 1024, stride=128), "needs the parameter 'c'"),
    (lambda: kernel_ceiling("strided", 0, stride=128), "sequence length n must be an integer "
                                                       ">= 1, got 0"),
    (lambda: computed_pairs("strided", 1024, stride=0), "got 0"),
    (lambda: computed_pairs("full", 0), "sequence length n must be an integer >= 1, got 0"),
    (lambda: computed_pairs("full", 64, heads=0), "n_heads must be an integer >= 1, got 0"),
    (lambda: forward_calls("strided", 64, d=0, stride=8), "head dimension d"),
])
def test_bad_input_is_one_line_naming_it(call, says):
    """A missing or bad size or parameter is a ValueError naming what was given and what
    is allowed (it was a KeyError, a ZeroDivisionError or range()'s own error)."""
    with pytest.raises(ValueError) as err:
        call()
    print(err.value)
    assert says in str(err.value) and "\n" not in str(err.value)
