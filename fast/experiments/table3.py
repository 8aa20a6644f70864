"""Table 3 at CPU scale: bits per byte against the minimum context used in evaluation.

Child et al., 2019, section 7.2 and Table 3: "during evaluation of the test set, we
modified the minimum context length the network could use by evaluating fewer tokens in
parallel. We saw monotonic increases in performance with more tokens used, up to 12,160
out of the 12,288 tokens used for training (see Table 3), which suggests the network is
effectively incorporating long-term dependencies." (``PAPER``: Enwik8, 6,144 to 12,160
tokens, 0.9952 to 0.9908 bits per byte.)

Here the question is asked of Table 2's kept text models (dense, fixed and strided, seed 0,
n = 512: figures/data/models/text_*.pt, ``python -m fast table2``) on the held-out test
split of the stdlib bytes. The paper's minimum contexts are the fractions 0.5 to 0.9896
of its 12,288 training tokens; ours are the same fractions of n, rounded
(``contexts``: 256, 384, 448, 496, 504 and 507 of 512), and, below them, 1, 64 and 128,
where the curve bends.

How one minimum context m is evaluated (``windows``, ``context_bits``): position p of a
window of n bytes predicts the window's byte p + 1 from its bytes 0..p, so it reads
p + 1 bytes. A window scores only its positions p >= m - 1 -- n - m + 1 bytes, each
predicted from at least m bytes -- and the next window starts n - m + 1 bytes later:
sliding windows that score every byte of a stretch exactly once, each with at least m
bytes of context (from m to n). The scored bytes are the same for every m and every
model: ``STRETCHES`` stretches of ``STRETCH`` consecutive bytes evenly spread over the
test split (``stretch_starts``), so the differences between contexts are paired, byte by
byte, and their spread over the stretches says how sure each step is. The cost grows as
1 / (n - m + 1): at m = 507 a window of 512 scores 6 bytes.

    python -m fast table3 [--quick] [--force]

writes figures/data/table3.json and figures/table3_context.png. The evaluation runs in
a child process with the kernels pinned (``fast.experiments.reproducible.child_env``,
``THREADS`` threads), so the numbers repeat on every x86 host with AVX2.
"""

from __future__ import annotations

import math
import os
import platform
import statistics

import numpy as np
import torch

from fast.experiments.cache import resumable
from fast.experiments.paths import DATA, FIGURES, QUICK, named
from fast.experiments.provenance import write_result
from fast.experiments.reproducible import child_env, kernels, weights_digest
from fast.experiments.table2 import dataset
from fast.measure.child import run_child
from fast.plots import table3 as plot_table3
from fast.plots.style import PATTERN_ORDER
from fast.transformer.network.checkpoint import load_model
from fast.transformer.training.loss import LN2, loss_fn

# The paper's Table 3: minimum context (tokens) -> Enwik8 test bits per byte.
PAPER = {6144: 0.9952, 9216: 0.9936, 10752: 0.9932, 11904: 0.9930, 12096: 0.9922,
         12160: 0.9908}
PAPER_N = 12288                  # the paper's training context
BELOW = (1, 64, 128)             # minimum contexts below the paper's smallest fraction
STRETCHES, STRETCH = 12, 512     # the scored bytes: 12 stretches of 512 bytes of the test split
QUICK_STRETCHES = 2
BATCH = 32                       # windows per forward pass
THREADS = 2                      # intra-op threads of the evaluating child (make figures runs
                                 # it alone on the 2-core machine)


def contexts(n: int) -> list[dict]:
    """The minimum contexts evaluated for a model of context n: {"m", "paper_tokens" (None
    below the paper's), "fraction"} in increasing m; the paper's contexts map to
    round(fraction * n)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    rows = {m: {"m": m, "paper_tokens": None, "fraction": m / n} for m in BELOW if m < n}
    for tokens in PAPER:
        m = round(tokens / PAPER_N * n)
        rows[m] = {"m": m, "paper_tokens": tokens, "fraction": tokens / PAPER_N}
    return [rows[m] for m in sorted(rows)]


def stretch_starts(length: int, n: int, count: int, stretch: int) -> np.ndarray:
    """Indices of the first scored byte of ``count`` stretches of ``stretch`` bytes, evenly
    spread over a stream of ``length`` bytes, each with n bytes before it (the longest
    context) and one window after its end."""
    lo, hi = n, length - stretch - n - 1          # room for the first and the last window
    if count < 1 or stretch < 1 or hi < lo:
        raise ValueError(f"a stream of {length} bytes cannot hold {count} stretches of "
                         f"{stretch} bytes with n = {n} bytes of context; allowed: length >= "
                         f"{stretch + 2 * n + 1}, count and stretch >= 1")
    if count == 1:
        return np.array([lo])
    return lo + np.arange(count) * (hi - lo) // (count - 1)


def windows(start: int, stretch: int, n: int, m: int) -> list[tuple[int, int, int]]:
    """The windows that score the bytes start .. start + stretch - 1 with a minimum context
    of m: (first byte of the window, first scored position, scored positions) each.
    Position p predicts the window's byte p + 1 from p + 1 bytes; positions p >= m - 1
    are scored, n - m + 1 per window (fewer in the last one)."""
    if not 1 <= m <= n:
        raise ValueError(f"the minimum context m must lie in [1, n = {n}], got {m}")
    per = n - m + 1
    out = []
    for first in range(start, start + stretch, per):       # the first byte this window scores
        out.append((first - m, m - 1, min(per, start + stretch - first)))
    return out


@torch.no_grad()
def context_bits(model, stream: np.ndarray, m: int, starts, stretch: int,
                 batch: int = BATCH) -> list[float]:
    """Bits per byte of each stretch (``starts``, ``stretch`` bytes each) of ``stream``
    (uint8), every byte predicted from at least m bytes (``windows``)."""
    n = model.cfg.n_ctx
    out = []
    for start in starts:
        spans = windows(int(start), stretch, n, m)
        total, count = 0.0, 0
        for i in range(0, len(spans), batch):
            chunk = spans[i:i + batch]
            rows = np.stack([stream[w:w + n + 1] for w, _, _ in chunk]).astype(np.int64)
            x = torch.from_numpy(rows[:, :-1])                            # (B, n)
            y = torch.from_numpy(rows[:, 1:])                             # (B, n)
            nats = loss_fn(model(x), y, reduction="none").reshape(len(chunk), n)   # (B, n)
            for row, (_, first, scored) in enumerate(chunk):
                total += float(nats[row, first:first + scored].double().sum())
                count += scored
        out.append(total / count / LN2)
    return out


def evaluate_models(spec: dict) -> dict:
    """The child's side: every kept text model of spec["models"] ({pattern: path}) at every
    minimum context, on spec["stretches"] stretches of the test split."""
    torch.set_num_threads(spec["threads"])
    stream = dataset("text").splits["test"]
    out = {"kernels": kernels(), "threads": torch.get_num_threads(), "models": {}}
    for pattern, path in spec["models"].items():
        model = load_model(path)[0]
        n = model.cfg.n_ctx
        starts = stretch_starts(len(stream), n, spec["stretches"], spec["stretch"])
        rows = {}
        for ctx in contexts(n):
            per_stretch = context_bits(model, stream, ctx["m"], starts, spec["stretch"])
            rows[str(ctx["m"])] = {**ctx, "bits": statistics.fmean(per_stretch),
                                   "per_stretch": per_stretch}
            print(f"table3: {pattern} m={ctx['m']}: {rows[str(ctx['m'])]['bits']:.4f}",
                  flush=True)
        out["models"][pattern] = {"n": n, "weights": named(path),
                                  "weights_sha256": weights_digest(model),
                                  "starts": starts.tolist(), "contexts": rows}
    return out


def replay(spec: dict) -> dict:
    """The child's side of the reproduction check: every kept text model of spec["models"]
    ({pattern: path}) at the minimum context spec["m"] on the first of spec["stretches"]
    stretches of spec["stretch"] bytes, on spec["threads"] threads, as ``evaluate_models``
    scores it. {pattern: {"weights_sha256", "bits": [that stretch's bits]}}: the committed
    numbers, bit for bit, or the code (or the kept weights) no longer reproduce them
    (tests/fast/experiments/test_committed_results.py)."""
    torch.set_num_threads(spec["threads"])
    stream = dataset("text").splits["test"]
    out = {}
    for pattern, path in spec["models"].items():
        model = load_model(path)[0]
        starts = stretch_starts(len(stream), model.cfg.n_ctx, spec["stretches"], spec["stretch"])
        out[pattern] = {"weights_sha256": weights_digest(model),
                        "bits": context_bits(model, stream, spec["m"], starts[:1],
                                             spec["stretch"])}
    return out


def paths(quick: bool):
    """(JSON, kept models folder, figures folder) of a full or a --quick run."""
    if quick:
        return QUICK / "table3.json", QUICK / "models", QUICK / "figures"
    return DATA / "table3.json", DATA / "models", FIGURES


def steps(rows: dict) -> list[float]:
    """Per stretch, the change in bits from the paper's smallest minimum context (n / 2)
    to its largest: negative when the longest contexts help."""
    paper = [r for r in rows.values() if r["paper_tokens"]]
    lo = min(paper, key=lambda r: r["m"])
    hi = max(paper, key=lambda r: r["m"])
    return [b - a for a, b in zip(lo["per_stretch"], hi["per_stretch"])]


def run(*, quick: bool = False, force: bool = False) -> dict:
    """Evaluate the kept text models (in a child, ``child_env(THREADS)``), write the JSON and
    draw the figure. A missing model is skipped with a line (run python -m fast table2)."""
    out, models, figdir = paths(quick)
    data = resumable(out, quick, force)
    kept = {p: models / f"text_{p}.pt" for p in PATTERN_ORDER}
    for pattern, path in kept.items():
        if not path.exists():
            print(f"table3: {path} missing (run python -m fast table2); {pattern} skipped",
                  flush=True)
    kept = {p: str(path) for p, path in kept.items() if path.exists()}
    if not kept:
        raise FileNotFoundError(f"table3: no kept text model in {models}; run python -m fast "
                                f"table2 first")
    spec = {"models": kept, "stretches": QUICK_STRETCHES if quick else STRETCHES,
            "stretch": STRETCH, "threads": THREADS}
    result = run_child("fast.experiments.table3:evaluate_models", spec,
                       env=child_env(THREADS))
    if "error" in result:
        raise RuntimeError(f"table3: evaluation {result['error']}\n{result['output']}")
    data.update(result["result"])
    data.update({"quick": quick, "paper": {str(k): v for k, v in PAPER.items()},
                 "paper_n": PAPER_N, "stretches": spec["stretches"], "stretch": STRETCH,
                 "split": "test", "dataset": "stdlib",
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, CPU only",
                 "torch": torch.__version__})
    out.parent.mkdir(parents=True, exist_ok=True)
    write_result(out, data)
    print(f"table3: wrote {plot_table3.plot_context(data, figdir / 'table3_context.png')}",
          flush=True)
    return data


def standard_error(values) -> float:
    """Standard error of the mean of ``values`` (0 for fewer than two)."""
    values = list(values)
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
