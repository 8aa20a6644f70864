"""GPU benchmark pieces for the block-sparse Triton kernel (issue 4).

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for the
blocks it computes. Here the "ideal speedup" of a layout over dense causal
FlashAttention is that ratio of block work,

    ideal = (dense causal tiles: nb (nb + 1) / 2 per head) / (tiles in the layout's parts),

nb = ceil(n / block), averaged over heads; a kernel that ran every tile at the
dense kernel's speed would reach it. ``python -m fast.measure.bench --device cuda`` (the
PyTorch engineer's script, with dense SDPA and FlexAttention peers) takes its
Triton contenders from ``contenders`` and reports measured / ideal speedup.

Standalone: ``python -m fast.measure.bench_triton [--json out.json]`` prints forward and
forward+backward times of the Triton kernel against dense causal SDPA on CUDA
(fp16), the measured speedup as a % of the structured layout's ideal, and the
TFLOP/s of the tiles each contender actually computes. It needs a CUDA GPU; it has not been run
on this project's (CPU-only) machine.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import torch.nn.functional as F

DEFAULT_BLOCK = 64


def _params(pattern: str, params: dict) -> dict:
    """Split the pattern parameters into (combine, layer, the rest)."""
    p = dict(params)
    return dict(combine=p.pop("combine", "merged"), layer=p.pop("layer", 0), params=p)


def contenders(pattern: str, params: dict, dtype: torch.dtype,
               block_size: int = DEFAULT_BLOCK) -> dict:
    """Triton contenders for one pattern: {name: fn(q, k, v) -> out}, q (B, H, n, d).

    params: the pattern's parameters (stride, c, window, ...), optionally with
    "combine" and "layer". ``dtype`` is the dtype the caller will pass (the kernel
    takes float32/float16/bfloat16 on CUDA); it is checked here so a bad one fails
    before timing starts.
    """
    from fast.kernels.triton_attention import GPU_DTYPES, triton_sparse_attention
    if dtype not in GPU_DTYPES:
        raise ValueError(f"dtype must be one of {GPU_DTYPES}, got {dtype}")
    sp = _params(pattern, params)

    def make(order):
        def fn(q, k, v):
            return triton_sparse_attention(q, k, v, pattern, combine=sp["combine"],
                                           layer=sp["layer"], block_size=block_size,
                                           order=order, **sp["params"])
        return fn

    out = {"triton block-sparse": make("structured")}
    if pattern != "full":
        # the same kernel on the one-part natural-order layout: what a block-sparse
        # kernel without the transposition / gathering runs (paper-notes sec. 8)
        out["triton natural order"] = make("natural")
    return out


def layout_blocks(pattern: str, n: int, n_heads: int, params: dict,
                  block_size: int = DEFAULT_BLOCK, order: str = "structured") -> float:
    """Tiles computed by the layout's parts, averaged over heads."""
    key = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple, range)) else v)
                       for k, v in params.items()))
    return _layout_blocks(pattern, n, n_heads, key, block_size, order)


@functools.lru_cache(maxsize=None)
def _layout_blocks(pattern, n, n_heads, params_key, block_size, order) -> float:
    from fast.layout import block_layout
    sp = _params(pattern, dict(params_key))
    lay = block_layout(pattern, n, n_heads=n_heads, combine=sp["combine"], layer=sp["layer"],
                       block_size=block_size, order=order, **sp["params"])
    return sum(int(p.kv_count.sum()) for p in lay.parts) / n_heads


def ideal_speedup(pattern: str, n: int, n_heads: int, params: dict,
                  block_size: int = DEFAULT_BLOCK, order: str = "structured") -> float:
    """Dense causal tile work / the layout's tile work (both at ``block_size``)."""
    nb = -(-n // block_size)
    return (nb * (nb + 1) / 2) / layout_blocks(pattern, n, n_heads, params, block_size, order)


def flops(pattern: str, B: int, n: int, n_heads: int, d: int, params: dict,
          block_size: int = DEFAULT_BLOCK, backward: bool = False,
          order: str = "structured") -> float:
    """FLOPs of the computed tiles: 2 matmuls of 2 B^2 d each per tile forward
    (q k^T and p v), 5 backward (recomputed q k^T, dO v^T, p^T dO, ds k, ds^T q)."""
    tiles = layout_blocks(pattern, n, n_heads, params, block_size, order) * n_heads * B
    per_tile = 2 * 2 * block_size * block_size * d
    return tiles * per_tile * (1 + 2.5 if backward else 1)


def _time(fn, backward: bool) -> float:
    """Median milliseconds (triton.testing.do_bench) of fn(), or fn().backward()."""
    import triton
    if not backward:
        return triton.testing.do_bench(fn, return_mode="median")

    def step():
        out = fn()
        out.backward(torch.ones_like(out))
    return triton.testing.do_bench(step, return_mode="median")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fast.measure.bench_triton needs a CUDA GPU (none found); nothing measured")
        return 1
    dtype = getattr(torch, args.dtype)
    cases = [("strided", dict(stride=128)), ("fixed", dict(stride=128, c=32)),
             ("strided", dict(stride=128, combine="multihead")),
             ("longformer", dict(window=256, global_tokens=(0,))),
             ("bigbird", dict(window=192, n_random=3, n_global=2))]
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for n in args.n:
        shape = (1, args.heads, n, args.d)
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=g,
                               requires_grad=True) for _ in range(3))
        for bwd in (False, True):
            dense = _time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), bwd)
            for pattern, params in cases:
                ideal = ideal_speedup(pattern, n, args.heads, params)
                for name, fn in contenders(pattern, params, dtype).items():
                    ms = _time(lambda: fn(q, k, v), bwd)
                    order = "natural" if "natural" in name else "structured"
                    tflops = flops(pattern, 1, n, args.heads, args.d, params,
                                   backward=bwd, order=order) / ms / 1e9
                    row = dict(n=n, pattern=pattern, params={k_: str(v_) for k_, v_ in
                                                             params.items()},
                               contender=name, backward=bwd, ms=ms, dense_ms=dense,
                               speedup=dense / ms, ideal=ideal,
                               pct_ideal=100 * dense / ms / ideal, tflops=tflops)
                    rows.append(row)
                    print(f"n={n:6d} {'fwd+bwd' if bwd else 'fwd    '} {pattern:10s} "
                          f"{name:22s} {ms:8.3f} ms  dense {dense:8.3f} ms  "
                          f"speedup {dense / ms:5.2f}x (ideal {ideal:5.2f}x, "
                          f"{100 * dense / ms / ideal:5.1f}%)  {tflops:6.1f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), dtype=args.dtype,
                           heads=args.heads, d=args.d, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
