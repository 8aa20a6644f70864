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
  flex                  FlexAttention in its fastest documented configuration,
                        by calling ``fast.backends.flex.flex_sparse_attention``:
                        one torch.compile(flex_attention, dynamic=False) (a kernel
                        per shape, no dynamic sizes in it), the BlockMask built from
                        the natural-order layout with its full blocks apart (no
                        mask_mod evaluated inside them), cached per n; its block
                        density is recorded
  flex flash            the same with kernel_options={"BACKEND": "FLASH"}:
                        FlexAttention's FlashAttention-4 (CuTe DSL) kernel, on CUDA
                        only and where torch offers that backend and the
                        flash-attn-4 package (``flash_attn.cute``) is installed;
                        elsewhere it is recorded as skipped with the reason
  structured            fast.sparse_attention(backend="structured"): ours, PyTorch
  triton block-sparse   ours, the Triton kernel on the structured layout
  triton natural order  the same kernel on the one-part natural-order layout: a
                        block-sparse kernel without the transposition / gathering

Both Triton contenders run one kernel variant (``fast.kernels.variants``, the speed
levers of docs/gpu.md): ``build(..., variant=name)``, the default one otherwise; the
variant sweep (``python -m fast bench --variants``) builds them once per variant.

What runs where (``why_not``, ``has_backward``, ``default_names``):

* every contender runs on the CPU and on CUDA, in every dtype its function takes,
  except the Triton kernels and FlexAttention's FLASH backend, which are compiled on
  CUDA only; on the CPU the Triton kernels run
  in Triton's interpreter (``TRITON_INTERPRET=1``, float32), which checks them
  but times NumPy, not the kernel;
* FlexAttention has no backward on the CPU ("does not support backward on CPU"):
  forward only there; its FLASH backend runs on CUDA only (``flash_why_not``);
* the defaults: on the CPU dense, naive, flex and structured (the interpreted
  kernels are left out: their time says nothing); on CUDA dense, flex, flex
  flash, structured and both Triton layouts (naive, an n x n mask per point, is left
  out: at the GPU sweep's (B, H) = (4, 16) and n = 65536 it cannot fit, and the
  CPU figure already shows its O(n^2));
* the sweep (``fast.experiments.bench_sweep``) limits the O(n^2) contenders on the
  CPU by n and mask size, and FlexAttention to a few n there (it compiles per n).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import FlexKernelOptions
from torch.profiler import ProfilerActivity, profile

from fast.attention import sparse_attention
from fast.backends import masks as masks_torch
from fast.backends.flex import cached_block_mask, flex_sparse_attention
from fast.backends.naive import masked_attention
from fast.kernels.variants import resolve
from fast.layout.costs import DEFAULT_BLOCK

D = 64                                            # head dimension of every sweep
PATTERN_PARAMS = {"strided": {"stride": 128}, "fixed": {"stride": 128, "c": 32}}
LONG_PARAMS = {"strided": {"stride": 256}, "fixed": {"stride": 256, "c": 32}}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NAMES = ("dense", "naive", "flex", "flex flash", "structured", "triton block-sparse",
         "triton natural order")
TRITON = ("triton block-sparse", "triton natural order")
FLEX = {"flex": None, "flex flash": {"BACKEND": "FLASH"}}   # name -> kernel_options
DYNAMO_CACHE_LIMIT = 256                         # recompiles allowed before dynamo gives up
# What a record's "flex" rows ran (its config's "flex_peer"): this peer; "first peer" marks
# the records of the first GPU run, whose FlexAttention compiled with dynamic shapes on a
# create_block_mask BlockMask (about 4x slower than this peer on an H200).
FLEX_PEER = "flex_sparse_attention"

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
    if name == "flex flash":
        return flash_why_not(device)
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


def flash_why_not(device) -> str | None:
    """Why FlexAttention's FLASH backend does not run here, or None: it runs on CUDA, with a
    torch whose FlexAttention takes ``kernel_options={"BACKEND": "FLASH"}`` and the
    flash-attn-4 package (``flash_attn.cute``) it compiles into."""
    if torch.device(device).type != "cuda":
        return "FlexAttention's FLASH backend runs on CUDA only"
    if "BACKEND" not in getattr(FlexKernelOptions, "__annotations__", {}):
        return (f"torch {torch.__version__} has no FlexAttention backend choice "
                f"(kernel_options BACKEND)")
    try:
        found = importlib.util.find_spec("flash_attn.cute") is not None
    except ImportError:
        found = False
    if not found:
        return ("FlexAttention's FLASH backend needs the flash-attn-4 package (flash_attn.cute),"
                " which is not installed here")
    return None


def has_backward(name: str, device) -> bool:
    """Whether ``name`` has a backward on ``device`` (FlexAttention has none on the CPU)."""
    return not (name in FLEX and torch.device(device).type == "cpu")


def default_names(device) -> tuple[str, ...]:
    """The contenders a sweep on ``device`` runs unless told otherwise (module docstring)."""
    if torch.device(device).type == "cuda":
        return ("dense", "flex", "flex flash", "structured", *TRITON)
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
          names=NAMES, variant: str | None = None) -> dict:
    """{name: fn(q, k, v) -> out} for one pattern, of the ``names`` that run on
    ``device`` in ``dtype`` (in the order of ``NAMES``). ``params``: the pattern's
    parameters; ``variant``: the Triton contenders' kernel variant (a name in
    ``fast.kernels.variants.VARIANTS``; None: the default), given only with a Triton
    contender among ``names``. A function may carry marks the measurement reads:
    ``compiles`` (call it once before the first call), ``builds_mask`` (its first call
    builds what later calls reuse; ``reset()`` forgets it), ``density``
    (FlexAttention's, per n)."""
    _check(names, device, dtype)
    if variant is not None:
        resolve(variant)                             # a name it knows, before any work
        if not any(name in TRITON for name in names):
            raise ValueError(f"variant {variant!r} with contenders {list(names)}; allowed: "
                             f"a variant with one of {', '.join(TRITON)}")
    device = torch.device(device)
    out = {}
    for name in NAMES:
        if name not in names or why_not(name, device, dtype) is not None:
            continue
        if name == "dense":
            out[name] = dense
        elif name == "naive":
            out[name] = naive(pattern, params)
        elif name in FLEX:
            out[name] = flex(pattern, params, n_heads, device, FLEX[name])
        elif name == "structured":
            out[name] = structured(pattern, params)
    if any(name in names for name in TRITON):
        out.update({k: v for k, v in triton_contenders(pattern, params, dtype, variant=variant
                                                       ).items()
                    if k in names and why_not(k, device, dtype) is None})
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


def flex(pattern: str, params: dict, n_heads: int, device, kernel_options: dict | None = None):
    """FlexAttention as ``fast.backends.flex.flex_sparse_attention`` runs it (module
    docstring): this contender calls it, so the benchmark's peer is what the project
    offers, compiled and masked alike. ``kernel_options`` go to FlexAttention (the
    FLASH backend). ``fn.density`` records {n: fraction of blocks computed}, of the
    BlockMask the call uses (``fast.backends.flex.cached_block_mask``); ``fn.compiles``:
    its first call compiles. On the CPU ``flex_sparse_attention`` checks q, k, v for NaN
    and inf first (one pass over each); on a GPU it reads nothing."""
    density = {}
    allow_recompiles()

    def fn(q, k, v):
        n = q.shape[2]
        if n not in density:
            mask = cached_block_mask(pattern, n, n_heads, "merged", 0, q.device, params)
            density[n] = block_density(mask)
        return flex_sparse_attention(q, k, v, pattern, kernel_options=kernel_options,
                                     **params)

    fn.density, fn.compiles = density, True
    return fn


def allow_recompiles() -> None:
    """Let dynamo compile FlexAttention for every shape of a sweep: compiled with
    ``dynamic=False`` it compiles once per (B, H, n, dtype, pattern, with or without a
    backward), and past dynamo's default limit of 8 it would fall back to the unfused
    path (the n x n scores: out of memory at n = 32768). Raised to ``DYNAMO_CACHE_LIMIT``
    for the process, never lowered."""
    config = torch._dynamo.config
    config.cache_size_limit = max(config.cache_size_limit, DYNAMO_CACHE_LIMIT)
    config.accumulated_cache_size_limit = max(config.accumulated_cache_size_limit,
                                              DYNAMO_CACHE_LIMIT)


def block_density(mask) -> float:
    """Blocks FlexAttention computes (partial and full) / all blocks of the n x n square."""
    count = mask.kv_num_blocks.sum()
    if mask.full_kv_num_blocks is not None:
        count = count + mask.full_kv_num_blocks.sum()
    total = mask.kv_num_blocks.numel() * (-(-mask.seq_lengths[1] // mask.BLOCK_SIZE[1]))
    return float(count) / total


def triton_contenders(pattern: str, params: dict, dtype: torch.dtype,
                      block_size: int = DEFAULT_BLOCK, variant: str | None = None) -> dict:
    """The Triton contenders for one pattern: {name: fn(q, k, v) -> out}.

    params: the pattern's parameters, optionally with "combine" and "layer".
    ``dtype`` is the one the caller will pass; a dtype the kernel does not take
    fails here, before any timing. ``variant``: the kernel variant both contenders
    run (``fast.kernels.variants``; None: its ``DEFAULT``).
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
                                           block_size=block_size, order=order,
                                           variant=variant, **rest)
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
