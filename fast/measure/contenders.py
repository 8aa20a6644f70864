"""The attention benchmark's contenders: who runs, where, and why -- decided here only.

Child et al., 2019, section 5.5 and Table 2: a sparse pattern pays only for the
blocks it computes, and is worth measuring against what a user would otherwise
run. For one pattern (``PATTERN_PARAMS``: strided l = 128, fixed l = 128 c = 32,
merged heads), each contender is a function ``fn(q, k, v) -> out``, q (B, H, n, d):

  dense                 F.scaled_dot_product_attention(is_causal=True): what the
                        pattern is measured against (pattern-free); on the CPU the
                        flash kernel, on CUDA flash or cuDNN (``sdpa_backend`` tells)
  naive                 SDPA with the pattern's boolean mask (``fast.backends.naive``):
                        dense work and an n x n mask, built inside its first call
                        (so it counts in that call's peak memory) and reused after
  flex                  FlexAttention as its documentation says: one
                        torch.compile(flex_attention) for the process, a BlockMask
                        from create_block_mask(mask_mod, ..., _compile=True) once per
                        n (inside the first call), dynamo's cache limit raised so
                        that it never falls back to the unfused path; its block
                        density is recorded
  structured            fast.sparse_attention(backend="structured"): ours, PyTorch
  triton block-sparse   ours, the Triton kernel on the structured layout
  triton natural order  the same kernel on the one-part natural-order layout: a
                        block-sparse kernel without the transposition / gathering

What runs where (``why_not``, ``has_backward``, ``default_names``):

* every contender runs on the CPU and on CUDA, in every dtype its function takes,
  except the Triton kernels, which are compiled on CUDA only; on the CPU they run
  in Triton's interpreter (``TRITON_INTERPRET=1``, float32), which checks them
  but times NumPy, not the kernel;
* FlexAttention has no backward on the CPU ("does not support backward on CPU"):
  forward only there;
* the defaults: on the CPU dense, naive, flex and structured (the interpreted
  kernels are left out: their time says nothing); on CUDA dense, flex,
  structured and both Triton layouts (naive, an n x n mask per point, is left
  out: at the GPU sweep's (B, H) = (4, 16) and n = 65536 it cannot fit, and the
  CPU figure already shows its O(n^2));
* the sweep (``fast.experiments.bench_sweep``) limits the O(n^2) contenders on the
  CPU by n and mask size, and FlexAttention to a few n there (it compiles per n).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile

from fast.attention import sparse_attention
from fast.backends import masks as masks_torch
from fast.backends.flex import mask_mod
from fast.backends.naive import masked_attention
from fast.layout.costs import DEFAULT_BLOCK

D = 64                                            # head dimension of every sweep
PATTERN_PARAMS = {"strided": {"stride": 128}, "fixed": {"stride": 128, "c": 32}}
LONG_PARAMS = {"strided": {"stride": 256}, "fixed": {"stride": 256, "c": 32}}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NAMES = ("dense", "naive", "flex", "structured", "triton block-sparse", "triton natural order")
TRITON = ("triton block-sparse", "triton natural order")
FLEX_BLOCK = 128                                 # FlexAttention's default block
DYNAMO_CACHE_LIMIT = 256                         # recompiles allowed before dynamo gives up

# aten operator of each SDPA backend (the first one found names the backend)
SDPA_OPS = (("cudnn", "_scaled_dot_product_cudnn_attention"),
            ("flash (CPU)", "_scaled_dot_product_flash_attention_for_cpu"),
            ("flash", "_scaled_dot_product_flash_attention"),
            ("efficient", "_scaled_dot_product_efficient_attention"),
            ("math", "_scaled_dot_product_attention_math"))


# ----------------------------------------------------------------------------
# What runs where
# ----------------------------------------------------------------------------

def _check(names, device, dtype) -> None:
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"contenders {unknown} unknown; allowed: {', '.join(NAMES)}")
    if str(device).split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device {str(device)!r}; allowed: cpu, cuda")
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype {dtype}; allowed: {', '.join(DTYPES)}")


def why_not(name: str, device, dtype: torch.dtype) -> str | None:
    """Why contender ``name`` does not run on ``device`` in ``dtype``; None when it does."""
    _check([name], device, dtype)
    if name not in TRITON:
        return None
    try:
        # optional dependency: the kernel module needs Triton
        from fast.kernels.triton_attention import GPU_DTYPES, interpreted
    except ImportError:
        return "the Triton kernels do not run here: Triton is not installed"
    if dtype not in GPU_DTYPES:
        return f"the Triton kernels do not run here: they take {GPU_DTYPES}, not {dtype}"
    if torch.device(device).type == "cuda":
        return ("the Triton kernels do not run here: they were built for the interpreter "
                "(TRITON_INTERPRET=1)") if interpreted() else None
    if not interpreted():
        return "the Triton kernels do not run here: on the CPU only through TRITON_INTERPRET=1"
    if dtype != torch.float32:
        return "the Triton kernels do not run here: the interpreter takes float32 only"
    return None


def has_backward(name: str, device) -> bool:
    """Whether ``name`` has a backward on ``device`` (FlexAttention has none on the CPU)."""
    return not (name == "flex" and torch.device(device).type == "cpu")


def default_names(device) -> tuple[str, ...]:
    """The contenders a sweep on ``device`` runs unless told otherwise (module docstring)."""
    if torch.device(device).type == "cuda":
        return ("dense", "flex", "structured", *TRITON)
    return ("dense", "naive", "flex", "structured")


def mask_bytes(pattern: str, n: int, n_heads: int) -> int:
    """Bytes of the naive contender's bool mask plus SDPA's float copy of it: one
    (n, n) mask when every head reads alike (strided, merged), one per head otherwise
    (fixed: each head its own summary)."""
    heads = 1 if pattern == "strided" else n_heads
    return heads * n * n * 5


# ----------------------------------------------------------------------------
# The contenders
# ----------------------------------------------------------------------------

def build(pattern: str, params: dict, n_heads: int, device, dtype: torch.dtype,
          names=NAMES) -> dict:
    """{name: fn(q, k, v) -> out} for one pattern, of the ``names`` that run on
    ``device`` in ``dtype`` (in the order of ``NAMES``). ``params``: the pattern's
    parameters. A function may carry marks the measurement reads: ``compiles`` (call
    it once before the first call), ``builds_mask`` (its first call builds what later
    calls reuse; ``reset()`` forgets it), ``density`` (FlexAttention's, per n)."""
    _check(names, device, dtype)
    device = torch.device(device)
    out = {}
    for name in NAMES:
        if name not in names or why_not(name, device, dtype) is not None:
            continue
        if name == "dense":
            out[name] = dense
        elif name == "naive":
            out[name] = naive(pattern, params)
        elif name == "flex":
            out[name] = flex(pattern, params, n_heads, device)
        elif name == "structured":
            out[name] = structured(pattern, params)
    if any(name in names for name in TRITON):
        out.update({k: v for k, v in triton_contenders(pattern, params, dtype).items() if k in names
                    and why_not(k, device, dtype) is None})
    return out


def dense(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def structured(pattern: str, params: dict):
    def fn(q, k, v):
        return sparse_attention(q, k, v, pattern, backend="structured", **params)
    return fn


def naive(pattern: str, params: dict):
    """SDPA with the pattern's mask, built on q's device at the first call of each n:
    one (1, n, n) mask when every head reads alike, (H, n, n) otherwise."""
    cache = {}

    def fn(q, k, v):
        n = q.shape[2]
        if n not in cache:
            m = masks_torch.head_masks(pattern, n, q.shape[1], device=q.device, **params)
            cache.clear()
            cache[n] = m[:1] if bool((m == m[:1]).all()) else m           # (1 | H, n, n)
        return masked_attention(q, k, v, cache[n])

    fn.builds_mask, fn.reset = True, cache.clear
    return fn


@functools.lru_cache(maxsize=1)
def compiled_flex():
    """One ``torch.compile(flex_attention)`` for the process; dynamo may recompile for
    new shapes and dtypes up to ``DYNAMO_CACHE_LIMIT`` times (its default, 8, makes a
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


def flex(pattern: str, params: dict, n_heads: int, device):
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

    fn.density, fn.compiles = density, True
    return fn


def block_density(mask) -> float:
    """Blocks FlexAttention computes (partial and full) / all blocks of the n x n square."""
    count = mask.kv_num_blocks.sum()
    if mask.full_kv_num_blocks is not None:
        count = count + mask.full_kv_num_blocks.sum()
    total = mask.kv_num_blocks.numel() * (-(-mask.seq_lengths[1] // mask.BLOCK_SIZE[1]))
    return float(count) / total


def triton_contenders(pattern: str, params: dict, dtype: torch.dtype,
                      block_size: int = DEFAULT_BLOCK) -> dict:
    """The Triton contenders for one pattern: {name: fn(q, k, v) -> out}.

    params: the pattern's parameters, optionally with "combine" and "layer".
    ``dtype`` is the one the caller will pass; a dtype the kernel does not take
    fails here, before any timing.
    """
    # optional dependency: the kernel module needs Triton
    from fast.kernels.triton_attention import GPU_DTYPES, triton_sparse_attention
    if dtype not in GPU_DTYPES:
        raise ValueError(f"dtype must be one of {GPU_DTYPES}, got {dtype}")
    rest = dict(params)
    combine, layer = rest.pop("combine", "merged"), rest.pop("layer", 0)

    def make(order):
        def fn(q, k, v):
            return triton_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                           block_size=block_size, order=order, **rest)
        return fn

    out = {"triton block-sparse": make("structured")}
    if pattern != "full":
        # in natural order the strided and fixed patterns touch almost every causal
        # tile (docs/design.md, sec. 5): the same kernel without the reordering
        out["triton natural order"] = make("natural")
    return out


def sdpa_backend(q, k, v) -> str:
    """Which SDPA backend a causal call on these inputs runs, from the aten operators
    the profiler records (e.g. "flash", "cudnn", "efficient", "math")."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if q.device.type == "cuda":
            torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    for label, op in SDPA_OPS:
        if f"aten::{op}" in names:
            return label
    return "unknown: " + ", ".join(sorted(n for n in names if "attention" in n))
