"""Dense causal attention two ways on the CPU: PyTorch's fused kernel against the window kernel.

Child et al., 2019, Table 2 compares dense and sparse attention on the same hardware with the
same kernels (their block-sparse GPU kernels compute the dense pattern too). On the CPU the
sparse patterns run through the project's window kernel (``fast.backends.cpu_window``); dense
attention can run there too, as one causal band of n rows (the "full" plan of
``fast.backends.structured``), or through PyTorch's fused flash kernel (SDPA). Which is
faster depends on the head width and the length: PyTorch's kernel works in large blocks of
general matrix products, which narrow heads fill poorly; the window kernel's 16-row register
tiles do not care. ``dense_times`` measures both, forward and forward + backward, on the
layout a model hands them (q, k, v split from (B, n, H d) projections, the output joined
back: the copy the window kernel's (B, H, n, d) output costs is counted), in turns in one
process (``fast.measure.in_turns``), on one thread, in CPU seconds.
``fast.backends.structured.dense_window`` takes the window kernel where these numbers say it
is faster; ``python -m fast table2 --profile`` records them (figures/data/table2_profile.json,
"dense_kernels"), since Table 2's dense cells (heads of width 16, n = 256 and 512) are where
the choice matters most in this project.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fast.backends.structured import StructuredAttention
from fast.measure.in_turns import in_turns

# (n, head width) points, batch x heads chosen so every point holds about 2^21 query rows'
# worth of work at d = 16 (B H n = 16384 rows).
POINTS = ((128, 16), (256, 16), (512, 16), (1024, 16), (256, 32), (512, 32), (1024, 32),
          (256, 64), (512, 64), (1024, 64))
HEADS = 4
ROWS = 16384                     # B H n of every point


def _calls(n: int, d: int, seed: int = 0) -> dict:
    """{"sdpa" | "window": {"fwd" | "fb": zero-argument call}} at (n, d)."""
    B, H = max(1, ROWS // (HEADS * n)), HEADS
    g = torch.Generator().manual_seed(seed)
    proj = [torch.randn(B, n, H * d, generator=g, requires_grad=True) for _ in range(3)]
    grad = torch.randn(B, n, H * d, generator=g)
    scale = 1.0 / math.sqrt(d)
    split = lambda t: t.view(B, n, H, d).transpose(1, 2)                  # (B, H, n, d)
    join = lambda t: t.transpose(1, 2).reshape(B, n, H * d)                # (B, n, H d)
    attend = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               scale=scale),
        "window": lambda q, k, v: StructuredAttention.apply(q, k, v, "full", "merged", 0, n,
                                                             None, scale)[0],
    }

    def forward(fn):
        def call():
            with torch.no_grad():
                join(fn(*map(split, proj)))
        return call

    def forward_backward(fn):
        def call():
            join(fn(*map(split, proj))).backward(grad)
        return call

    return {name: {"fwd": forward(fn), "fb": forward_backward(fn)} for name, fn in attend.items()}


def dense_times(points=POINTS, rounds: int = 3) -> list[dict]:
    """Per (n, d) of ``points``: the fastest round's CPU seconds of SDPA and of the window
    kernel, forward ("fwd") and forward + backward ("fb"), and window / SDPA, in turns on one
    thread after one warm-up call each. One row per point: {"n", "d", "batch", "heads",
    "sdpa_fwd_s", "window_fwd_s", "fwd_ratio", "sdpa_fb_s", "window_fb_s", "fb_ratio"}."""
    rows = []
    for n, d in points:
        calls = _calls(n, d)
        flat = {f"{name}_{what}": call for name, by in calls.items()
                for what, call in by.items()}
        for call in flat.values():
            call()                                                   # warm-up, not timed
        timed = in_turns(flat, rounds=rounds, threads=1)
        fastest = {name: min(times) for name, times in timed["cpu_s"].items()}
        row = {"n": n, "d": d, "batch": max(1, ROWS // (HEADS * n)), "heads": HEADS}
        for what in ("fwd", "fb"):
            row[f"sdpa_{what}_s"] = fastest[f"sdpa_{what}"]
            row[f"window_{what}_s"] = fastest[f"window_{what}"]
            row[f"{what}_ratio"] = fastest[f"window_{what}"] / fastest[f"sdpa_{what}"]
        rows.append(row)
    return rows
