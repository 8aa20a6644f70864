"""Same-process benchmark points (the GPU's method): contenders, calibration, floors.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for the
blocks it computes. On a GPU every contender family is timed in ONE process
(``fast.experiments.bench_gpu`` drives the sweep), with ``fast.measure.timing``:
the first call (compilation, layout or block-mask build) apart, then medians of
CUDA-event times. The peers, for one pattern at one n:

  dense               F.scaled_dot_product_attention(is_causal=True); which SDPA
                      backend ran is recorded (``sdpa_backend``)
  flex                FlexAttention as its documentation says: one
                      torch.compile(flex_attention) for the whole run, a BlockMask
                      from create_block_mask(mask_mod, ..., _compile=True) once per
                      (pattern, n, H) (built inside the first call), dynamo's cache
                      limit raised so that it never falls back to the unfused path;
                      its block density (blocks computed / all blocks) is recorded
  structured          fast.sparse_attention(backend="structured") (PyTorch pieces)
  triton block-sparse ours, and "triton natural order" (the same kernel without
                      the transposition / gathering), ``fast.measure.bench_triton``

For every point ``derive`` gives the speed-up over dense, the ideal (dense causal
tiles / the layout's tiles, ``fast.measure.bench_triton.ideal_speedup``), the %
of ideal, and the floor: the larger of the bytes that must move (``io_bytes``) at
the copy bandwidth measured in the same run (``copy_bandwidth``) and the tiles at
the dense kernel's measured throughput (dense time / ideal).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile

from fast.attention import sparse_attention
from fast.backends.flex import mask_mod
from fast.measure.bench_triton import DEFAULT_BLOCK, contenders, ideal_speedup
from fast.measure.timing import first_call, steady, synchronize

D = 64
SHAPES = ((1, 4), (4, 16))                      # (B, H) of the default sweep
PATTERN_PARAMS = {"strided": {"stride": 128}, "fixed": {"stride": 128, "c": 32}}
LONG_PARAMS = {"strided": {"stride": 256}, "fixed": {"stride": 256, "c": 32}}
LONG_SHAPE = (1, 8)
FLEX_BLOCK = 128                                 # FlexAttention's default block
DYNAMO_CACHE_LIMIT = 256                         # recompiles allowed before dynamo gives up

# aten operator of each SDPA backend (the first one found names the backend)
SDPA_OPS = (("cudnn", "_scaled_dot_product_cudnn_attention"),
            ("flash (CPU)", "_scaled_dot_product_flash_attention_for_cpu"),
            ("flash", "_scaled_dot_product_flash_attention"),
            ("efficient", "_scaled_dot_product_efficient_attention"),
            ("math", "_scaled_dot_product_attention_math"))


# ----------------------------------------------------------------------------
# The peers
# ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def compiled_flex():
    """One ``torch.compile(flex_attention)`` for the run; dynamo may recompile for new
    shapes and dtypes up to ``DYNAMO_CACHE_LIMIT`` times (its default, 8, makes a
    sweep fall back to the unfused path, which materialises the n x n scores)."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit,
                                                DYNAMO_CACHE_LIMIT)
    torch._dynamo.config.accumulated_cache_size_limit = max(
        torch._dynamo.config.accumulated_cache_size_limit, DYNAMO_CACHE_LIMIT)
    return torch.compile(flex_attention)


_MASK_MODS: dict = {}


def _mask_mod(pattern, n, n_heads, device, items):
    """One mask_mod per (pattern, H, device, parameters): those of full, strided and fixed
    do not depend on n, so one function serves every n of the run (a new function object
    at every n would make dynamo compile flex_attention again)."""
    key = (pattern, n_heads, device, items) + (() if pattern in ("full", "strided", "fixed")
                                               else (n,))
    if key not in _MASK_MODS:
        _MASK_MODS[key] = mask_mod(pattern, n, n_heads, device=device, **dict(items))
    return _MASK_MODS[key]


def flex_peer(pattern: str, params: dict, n_heads: int, device):
    """FlexAttention with the pattern's mask_mod (``fast.backends.flex.mask_mod``), its
    BlockMask made by ``create_block_mask(_compile=True)`` on the first call at each n
    (cached). ``fn.density`` records {n: fraction of blocks computed}."""
    masks, density = {}, {}

    def fn(q, k, v):
        n = q.shape[2]
        if n not in masks:
            mod = _mask_mod(pattern, n, n_heads, str(device), tuple(sorted(params.items())))
            masks.clear()
            masks[n] = create_block_mask(mod, None, n_heads, n, n, device=device,
                                         BLOCK_SIZE=FLEX_BLOCK, _compile=True)
            density[n] = block_density(masks[n])
        return compiled_flex()(q, k, v, block_mask=masks[n])

    fn.density = density
    return fn


def block_density(mask) -> float:
    """Blocks FlexAttention computes (partial and full) / all blocks of the n x n square."""
    count = mask.kv_num_blocks.sum()
    if mask.full_kv_num_blocks is not None:
        count = count + mask.full_kv_num_blocks.sum()
    total = mask.kv_num_blocks.numel() * (-(-mask.seq_lengths[1] // mask.BLOCK_SIZE[1]))
    return float(count) / total


def registry(pattern: str, params: dict, n_heads: int, device, dtype, *,
             flex: bool = True, triton: bool = True) -> dict:
    """{name: fn(q, k, v) -> out} for one pattern (dense first); q (B, H, n, d)."""
    def dense(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def structured(q, k, v):
        return sparse_attention(q, k, v, pattern, backend="structured", **params)

    out = {"dense": dense}
    if flex:
        out["flex"] = flex_peer(pattern, params, n_heads, device)
    out["structured"] = structured
    if triton:
        out.update(contenders(pattern, params, dtype))
    return out


def sdpa_backend(q, k, v) -> str:
    """Which SDPA backend a causal call on these inputs runs, from the aten operators
    the profiler records (e.g. "flash", "cudnn", "efficient", "math")."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        synchronize(q.device)
    names = {e.name for e in prof.events()}
    for label, op in SDPA_OPS:
        if f"aten::{op}" in names:
            return label
    return "unknown: " + ", ".join(sorted(n for n in names if "attention" in n))


# ----------------------------------------------------------------------------
# Calibration and floors
# ----------------------------------------------------------------------------

def copy_bandwidth(device, nbytes: int, **timing) -> dict:
    """Bytes per second of a device-to-device copy (read + write) of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    t = steady(lambda: dst.copy_(src), device, **timing)
    return {"bytes": nbytes, "seconds": t["median_s"], "bytes_per_s": 2 * nbytes / t["median_s"]}


def io_bytes(B: int, H: int, n: int, d: int, dtype, backward: bool) -> int:
    """Bytes any attention must move: read q, k, v and write o (4 tensors); with the
    backward also read q, k, v, o, dO and write dq, dk, dv (12 in all)."""
    return (12 if backward else 4) * B * H * n * d * torch.tensor([], dtype=dtype).element_size()


def derive(time_s: float, dense_s: float | None, ideal: float, bytes_moved: int,
           copy_bps: float) -> dict:
    """Speed-up over dense, % of the ideal speed-up, the floor and how far above it."""
    floor_bytes = bytes_moved / copy_bps
    floor_tiles = dense_s / ideal if dense_s else None
    floor = max(floor_bytes, floor_tiles or 0.0)
    speedup = dense_s / time_s if dense_s else None
    return {"speedup": speedup, "ideal": ideal,
            "pct_ideal": 100 * speedup / ideal if speedup else None,
            "floor_s": floor, "floor_bytes_s": floor_bytes, "floor_tiles_s": floor_tiles,
            "floor_by": "bytes" if floor == floor_bytes else "tiles",
            "x_floor": time_s / floor}


def ideal(pattern: str, n: int, n_heads: int, params: dict, order: str = "structured") -> float:
    return ideal_speedup(pattern, n, n_heads, params, block_size=DEFAULT_BLOCK, order=order)


# ----------------------------------------------------------------------------
# One point: first calls apart, then steady-state medians
# ----------------------------------------------------------------------------

def measure(fn, q, k, v, grad, *, backward: bool = True, **timing) -> dict:
    """First forward (time, peak bytes), steady forward; then the same for forward +
    backward. Running out of memory is recorded (``skipped``), not raised."""
    device = q.device
    res = {}
    try:
        def fwd():
            with torch.no_grad():
                fn(q, k, v)

        res["first_fwd_s"], res["peak_fwd_bytes"] = first_call(fwd, device)
        t = steady(fwd, device, **timing)
        res["fwd_s"], res["fwd_s_all"] = t["median_s"], t["times_s"]
        if backward:
            qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

            def fb():
                for x in (qg, kg, vg):
                    x.grad = None
                fn(qg, kg, vg).backward(grad)

            res["first_fb_s"], res["peak_fb_bytes"] = first_call(fb, device)
            t = steady(fb, device, **timing)
            res["fb_s"], res["fb_s_all"] = t["median_s"], t["times_s"]
            del qg, kg, vg
    except torch.cuda.OutOfMemoryError as err:
        res = {"skipped": f"out of memory: {str(err).splitlines()[0][:160]}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


def inputs(B: int, H: int, n: int, d: int, device, dtype, seed: int = 0):
    """Seeded q, k, v and an output gradient, (B, H, n, d) each."""
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(B, H, n, d, device=device, dtype=dtype, generator=g) for _ in range(4)]
