"""How fast a sample is drawn: the re-run sampler, a dense cache and the sparse cache.

Child et al., 2019, section 4.3 (a factorized head reads about sqrt(n) keys) and
section 7 (samples of 3072-byte images and 12,288-byte texts). Sampling draws
one token at a time; what a step costs is the question:

* ``rerun_seconds``     one step of ``sample(cache=False)`` at prefix length t: a
                        forward pass over t tokens and a draw -- O(t) layers' work;
* ``decode_timeline``   a whole sample through a ``fast.transformer.decoding.decode.Decoder``
                        with the sparse or the dense cache, every step timed (the
                        fastest of ``repeats`` samples, as the re-run steps are),
                        on the decoder's ``engine`` ("auto": the compiled step for
                        float32 on the CPU; "torch": the PyTorch step);
* ``warm_up``           the seconds of a decoder's first steps, which compile the
                        compiled step (or load it from Numba's disk cache): paid
                        once per process, and kept out of the timings above;
* ``decode_window``     ``steps`` decoding steps starting at position t (after a
                        prefill of t positions), for points of a long run that are
                        too slow to reach step by step;
* ``cache_bytes``       the cache's size for a sample of n positions;
* ``engine_steps``      steps from position t on each decoder engine alone, the
                        two alternating in turns (the compiled step against PyTorch's);
* ``keys_read``         keys a step at position t reads per head;
* ``rerun_total``       the re-run sampler's time for a whole sample, summed from
                        step times measured at a few prefix lengths (linear
                        interpolation between them: the step's cost grows with t);
* ``pattern_costs``     keys a step reads and bytes each cache holds, for a model
                        shape and its pattern.

Every function returns plain numbers; ``fast.experiments.generation`` runs them
for its models and writes the JSON. Times are read from the model's device's
clock (``fast.measure.timing``: wall-clock seconds on the CPU); the CPU seconds of
the process are kept beside them, because on a shared machine the wall clock also
counts the time other processes held the cores (contenders are measured in the
same run, and what counts are their ratios). Per-step times leave the CPU
counters out (a step takes microseconds; ``timing.repeat(counters=False)``).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch

from fast.backends.reads import row_mask
from fast.core.clock import Clock
from fast.measure.timing import counted, cpu_times, repeat
from fast.transformer.decoding.decode import Decoder
from fast.transformer.decoding.draw import draw
from fast.transformer.network.model import SparseTransformer


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _prompt(model, t: int, generator: torch.Generator) -> torch.Tensor:
    """t positions of input: the start token then random tokens for an image model,
    random bytes for a text model. (1, t)."""
    cfg = model.cfg
    idx = torch.randint(cfg.vocab_size, (1, t), generator=generator)
    if cfg.embedding == "image":
        idx[0, 0] = cfg.vocab_size
    return idx.to(_device(model))


@torch.no_grad()
def rerun_seconds(model, t: int, repeats: int = 3, seed: int = 0, threads=(1,)) -> dict:
    """Seconds of one re-run sampling step at prefix length t: ``model`` over t
    positions and a draw from the last one. {"wall": the minimum over ``repeats``
    and over the intra-op thread counts ``threads`` (a long forward pass may gain
    from a second core; the re-run sampler is credited with its best), "cpu": the
    process's CPU seconds of that fastest repetition}."""
    gen = torch.Generator().manual_seed(seed)
    idx = _prompt(model, t, gen)
    before, best = torch.get_num_threads(), {"wall": float("inf"), "cpu": float("inf")}
    try:
        for count in threads:
            torch.set_num_threads(count)
            model(idx[:, :min(t, 8)])                                   # warm-up
            got = repeat(lambda: draw(model(idx)[:, -1], generator=gen), _device(model),
                         repeats)
            fastest = int(np.argmin(got["s"]))
            if got["s"][fastest] < best["wall"]:
                best = {"wall": got["s"][fastest], "cpu": got.get("cpu_s", [None])[fastest]}
    finally:
        torch.set_num_threads(before)
    return best


def rerun_total(ts, seconds, n: int) -> float:
    """Seconds of a whole n-token re-run sample: the sum over t = 1..n of the step
    time, interpolated linearly between the measured (ts, seconds)."""
    ts, seconds = np.asarray(ts, dtype=float), np.asarray(seconds, dtype=float)
    if ts[0] > 1 or ts[-1] < n:
        raise ValueError(f"measured prefix lengths must span [1, {n}], got {ts[0]}..{ts[-1]}")
    return float(np.interp(np.arange(1, n + 1), ts, seconds).sum())


@torch.no_grad()
def warm_up(model, kind: str, engine: str = "auto", steps: int = 4) -> float:
    """Seconds of a decoder's prefill and first ``steps`` steps in a fresh process
    state: for the "numba" engine, mostly compiling its step (or loading it from
    the disk cache) -- once per process, after which every decoder reuses it."""
    gen = torch.Generator().manual_seed(0)
    clock = Clock(_device(model))
    start = clock.mark()
    dec = Decoder(model, steps + 1, kind, engine=engine)
    logits = dec.prefill(_prompt(model, 1, gen))
    for _ in range(steps):
        logits = dec.step(draw(logits, generator=gen))
    return clock.seconds(start, clock.mark())


@torch.no_grad()
def decode_timeline(model, kind: str, length: int | None = None, seed: int = 0,
                    repeats: int = 1, engine: str = "auto") -> dict:
    """Sample ``length`` positions (default n_ctx) with a ``kind`` cache, timing
    every step; ``repeats`` whole samples, the fastest kept -- as the re-run
    sampler's steps are credited with the fastest of their repetitions. Returns
    {"t": positions decoded, "seconds": each step's wall time (a draw and a
    decoder step), "total_s" (wall, prefill included), "total_cpu_s" (the
    process's CPU time), "prefill_s", "cache_bytes", "engine": the decoder's,
    "steps": the steps each engine ran, "totals_s": every repetition's total}."""
    runs = [_timeline(model, kind, length, seed, engine) for _ in range(repeats)]
    best = min(runs, key=lambda r: r["total_s"])
    return {**best, "totals_s": [r["total_s"] for r in runs]}


def _timeline(model, kind: str, length: int | None, seed: int, engine: str) -> dict:
    length = model.cfg.n_ctx if length is None else length
    gen = torch.Generator().manual_seed(seed)
    clock = Clock(_device(model))
    before, start = cpu_times(), clock.mark()
    dec = Decoder(model, length, kind, engine=engine)
    logits = dec.prefill(_prompt(model, 1, gen))
    prefilled = clock.mark()

    def step():
        nonlocal logits
        logits = dec.step(draw(logits, generator=gen))

    seconds = repeat(step, clock.device, length - 1, counters=False)["s"]
    draw(logits, generator=gen)
    prefill, total = clock.elapsed([(start, prefilled), (start, clock.mark())])
    return {"t": list(range(1, length)), "seconds": seconds,
            "total_s": total, "total_cpu_s": counted(before)["cpu_s"], "prefill_s": prefill,
            "cache_bytes": dec.nbytes(), "engine": dec.engine, "steps": dict(dec.steps)}


@torch.no_grad()
def decode_window(model, kind: str, t: int, steps: int, seed: int = 0,
                  engine: str = "auto", counts: dict | None = None) -> list[float]:
    """Seconds of each of ``steps`` decoding steps from position t on, after a
    prefill of positions 0..t-1 (not timed); ``counts`` (a dict) adds up the
    steps each engine ran."""
    gen = torch.Generator().manual_seed(seed)
    dec = Decoder(model, t + steps, kind, engine=engine)
    logits = dec.prefill(_prompt(model, t, gen))

    def step():
        nonlocal logits
        logits = dec.step(draw(logits, generator=gen))

    out = repeat(step, _device(model), steps, counters=False)["s"]
    if counts is not None:
        for name, n in dec.steps.items():
            counts[name] = counts.get(name, 0) + n
    return out


@torch.no_grad()
def engine_steps(model, kind: str, t: int, steps: int, rounds: int = 6,
                 seed: int = 0) -> dict[str, list[float]]:
    """Seconds of decoding steps from position t on for each engine alone ("numba",
    "torch"): two decoders prefilled alike, then ``rounds`` turns of
    ``steps // rounds`` steps each, the engines alternating, so that both see the same
    machine load. {engine: every step's seconds}."""
    gen = torch.Generator().manual_seed(seed)
    prompt = _prompt(model, t, gen)
    decoders = {engine: Decoder(model, t + steps, kind, engine=engine)
                for engine in ("numba", "torch")}
    logits = {engine: dec.prefill(prompt) for engine, dec in decoders.items()}
    token = draw(logits["torch"], generator=gen)
    out: dict = {engine: [] for engine in decoders}
    for _ in range(rounds):
        for engine, dec in decoders.items():
            out[engine] += repeat(partial(dec.step, token), _device(model), steps // rounds,
                                  counters=False)["s"]
    return out


@torch.no_grad()
def cache_bytes(model, kind: str, n: int) -> int:
    """Bytes of keys and values a ``kind`` cache holds for a sample of n positions."""
    dec = Decoder(model, n, kind)
    dec.prefill(_prompt(model, 1, torch.Generator().manual_seed(0)))
    return dec.nbytes()


def window_rate(seconds, window: int) -> tuple[list[int], list[float]]:
    """(window ends, tokens per second) of consecutive windows of step times: the
    median step of each window, so that one disturbed step does not move it."""
    s = np.asarray(seconds, dtype=float)
    ends = list(range(window, len(s) + 1, window))
    return ends, [float(1.0 / np.median(s[e - window:e])) for e in ends]


def keys_read(cfg, t: int) -> float:
    """Keys a step at position t reads per head, averaged over heads and blocks
    (``fast.backends.reads.row_mask``)."""
    return float(np.mean([row_mask(cfg.pattern, cfg.n_ctx, cfg.n_heads, cfg.combine, layer, t,
                                   **cfg.pattern_params()).sum(1).float().mean().item()
                          for layer in range(cfg.n_layers)]))


def pattern_costs(cfg, t: int | None = None) -> dict:
    """What a step at position t (default the last, n - 1) of a model shaped like
    ``cfg`` costs with each cache: {"keys_read": mean over heads and blocks of the
    keys row t reads (``fast.backends.reads.row_mask``), "dense_keys": t + 1, "sparse_bytes"
    and "dense_bytes": the caches' sizes for a sample of n_ctx positions}."""
    t = cfg.n_ctx - 1 if t is None else t
    torch.manual_seed(0)
    model = SparseTransformer(cfg).eval()
    return {"keys_read": keys_read(cfg, t), "dense_keys": t + 1,
            "sparse_bytes": cache_bytes(model, "sparse", cfg.n_ctx),
            "dense_bytes": cache_bytes(model, "dense", cfg.n_ctx)}
