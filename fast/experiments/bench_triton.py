"""The Triton kernel against dense causal SDPA on a GPU, and against its ideal speed-up.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for the
blocks it computes. For each n and pattern (strided, fixed, strided multi-head,
Longformer, BigBird), prints forward and forward+backward times of the Triton
contenders (``fast.measure.bench_triton.contenders``) against dense causal SDPA
on CUDA (fp16 by default), the measured speed-up as a % of the layout's ideal
(``ideal_speedup``), and the TFLOP/s of the tiles each contender computes:

    python -m fast.experiments.bench_triton [--n 4096 16384] [--json out.json]

It needs a CUDA GPU; without one it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from fast.core.files import write_json
from fast.measure.bench_triton import contenders, flops, ideal_speedup, time_ms

# (pattern, parameters) of every row of the table
CASES = (("strided", dict(stride=128)), ("fixed", dict(stride=128, c=32)),
         ("strided", dict(stride=128, combine="multihead")),
         ("longformer", dict(window=256, global_tokens=(0,))),
         ("bigbird", dict(window=192, n_random=3, n_global=2)))


def run(ns, heads: int, d: int, dtype: torch.dtype) -> list[dict]:
    """One row per (n, forward or forward+backward, case, contender)."""
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for n in ns:
        shape = (1, heads, n, d)                                          # (B, H, n, d)
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=g,
                               requires_grad=True) for _ in range(3))
        for bwd in (False, True):
            dense = time_ms(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True), bwd)
            for pattern, params in CASES:
                ideal = ideal_speedup(pattern, n, heads, params)
                for name, fn in contenders(pattern, params, dtype).items():
                    ms = time_ms(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), bwd)
                    order = "natural" if "natural" in name else "structured"
                    tflops = flops(pattern, 1, n, heads, d, params,
                                   backward=bwd, order=order) / ms / 1e9
                    rows.append(dict(n=n, pattern=pattern,
                                     params={k_: str(v_) for k_, v_ in params.items()},
                                     contender=name, backward=bwd, ms=ms, dense_ms=dense,
                                     speedup=dense / ms, ideal=ideal,
                                     pct_ideal=100 * dense / ms / ideal, tflops=tflops))
                    print(f"n={n:6d} {'fwd+bwd' if bwd else 'fwd    '} {pattern:10s} "
                          f"{name:22s} {ms:8.3f} ms  dense {dense:8.3f} ms  "
                          f"speedup {dense / ms:5.2f}x (ideal {ideal:5.2f}x, "
                          f"{100 * dense / ms / ideal:5.1f}%)  {tflops:6.1f} TFLOP/s")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fast.experiments.bench_triton needs a CUDA GPU (none found); nothing measured")
        return 1
    rows = run(args.n, args.heads, args.d, getattr(torch, args.dtype))
    if args.json:
        write_json(args.json, dict(device=torch.cuda.get_device_name(), dtype=args.dtype,
                                   heads=args.heads, d=args.d, rows=rows), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
