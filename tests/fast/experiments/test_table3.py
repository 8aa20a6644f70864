"""Table 3 (fast.experiments.table3): bits per byte against the minimum context of
evaluation (Child et al., 2019, sec. 7.2). The sliding windows score every byte of a
stretch exactly once, each with at least m bytes of context, and the bits equal a
byte-by-byte computation from windows built by hand."""

import json

import numpy as np
import pytest
import torch

from fast.commands import results as results_command
from fast.experiments import table3 as T3
from fast.transformer.config import ModelConfig
from fast.transformer.network.model import SparseTransformer
from fast.transformer.training.loss import LN2


def test_the_papers_contexts_map_to_the_same_fractions_of_n():
    rows = T3.contexts(512)
    ms = [r["m"] for r in rows]
    assert ms == sorted(ms) and ms[:3] == [1, 64, 128]
    paper = [r for r in rows if r["paper_tokens"]]
    assert [r["m"] for r in paper] == [256, 384, 448, 496, 504, 507]
    assert [r["paper_tokens"] for r in paper] == sorted(T3.PAPER)
    assert T3.PAPER[12160] == 0.9908 and T3.PAPER[6144] == 0.9952 and T3.PAPER_N == 12288
    with pytest.raises(ValueError, match="n must be"):
        T3.contexts(1)


@pytest.mark.parametrize("m", [1, 5, 17, 30, 31])
def test_windows_score_every_byte_once_with_at_least_m_bytes_before_it(m):
    n, start, stretch = 31, 100, 47            # odd sizes: the last window is partial
    scored = []
    for first, p0, count in T3.windows(start, stretch, n, m):
        assert first >= 0 and p0 == m - 1 and 1 <= count <= n - m + 1
        for p in range(p0, p0 + count):
            assert p < n                       # inside the window
            assert p + 1 >= m                  # position p reads bytes 0..p of its window
            scored.append(first + p + 1)       # ... and predicts the window's byte p + 1
    assert sorted(scored) == list(range(start, start + stretch))      # each byte exactly once
    with pytest.raises(ValueError, match="minimum context"):
        T3.windows(start, stretch, n, n + 1)


def test_stretches_leave_room_for_the_longest_context():
    starts = T3.stretch_starts(10_000, 64, 5, 100)
    assert starts[0] == 64 and starts[-1] + 100 + 64 + 1 <= 10_000
    assert np.all(np.diff(starts) > 100)                              # disjoint, spread
    with pytest.raises(ValueError, match="cannot hold"):
        T3.stretch_starts(200, 64, 5, 100)


def test_context_bits_equal_byte_by_byte_predictions():
    """Each scored byte's loss taken from a window built by hand that gives it exactly the
    context the sliding windows give it: the same bits."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, n_ctx=24, d_model=16, n_heads=2, n_layers=1,
                      pattern="fixed", stride=6, c=2)
    model = SparseTransformer(cfg).eval()
    stream = np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)
    starts, stretch, m = [40, 150], 29, 10
    got = T3.context_bits(model, stream, m, starts, stretch, batch=3)
    with torch.no_grad():
        want = _by_hand(model, stream, starts, stretch, m)
    print(got, want)
    assert np.allclose(got, want, rtol=0, atol=1e-5)
    # a context of 1 byte scores other predictions than a context of 10
    assert not np.allclose(T3.context_bits(model, stream, 1, starts, stretch), got)


def _by_hand(model, stream, starts, stretch, m):
    want = []
    for start in starts:
        nats = []
        for first, p0, count in T3.windows(start, stretch, 24, m):
            for p in range(p0, p0 + count):
                x = torch.from_numpy(stream[first:first + p + 1].astype(np.int64))[None]
                logp = torch.log_softmax(model(x)[0, -1].double(), -1)
                nats.append(-float(logp[stream[first + p + 1]]))
        want.append(np.mean(nats) / LN2)
    return want


def test_table3_results_state_the_change_and_the_papers(tmp_path, capsys):
    def model(bits):
        rows = {}
        for ctx, b in zip(T3.contexts(512), bits):
            rows[str(ctx["m"])] = {**ctx, "bits": b, "per_stretch": [b - 0.01, b + 0.01]}
        return {"n": 512, "contexts": rows}
    falling = [4.0, 3.99, 3.98, 3.97, 3.96, 3.95, 3.94, 3.93, 3.92]
    rising = falling[::-1]
    t3 = {"models": {"full": model(falling), "fixed": model(rising)}, "machine": "CPU",
          "torch": "2.13.0", "stretches": 2, "stretch": 512, "dataset": "stdlib",
          "split": "test", "paper": {str(k): v for k, v in T3.PAPER.items()}, "paper_n": 12288}
    (tmp_path / "table3.json").write_text(json.dumps(t3))
    assert results_command.main(["--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 507 | 0.990 | 3.9200 | 4.0000 | 12,160 | 0.9908 |" in out
    assert "| 1 | 0.002 | 4.0000 | 3.9200 | - | - |" in out
    assert "dense: from m = 256 to 507 the bits change by -0.0500" in out
    assert "they fall at every step of the paper's contexts." in out.split("fixed:")[0]
    assert "fixed: from m = 256 to 507 the bits change by +0.0500" in out
    assert "they do not fall at every step" in out.split("fixed:")[1]
    assert "Paper: from 6,144 to 12,160 tokens the bits change by -0.0044" in out

