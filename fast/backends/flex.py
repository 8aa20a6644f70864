"""The Sparse Transformer patterns as PyTorch FlexAttention masks.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers", sec. 4.3
(strided and fixed patterns) and sec. 5.1 (merged / multi-head / interleaved heads),
exactly as ``reference.patterns.head_masks`` for every registered pattern.

* ``mask_mod``: the pattern as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx)``: the
  registry's (``fast.patterns``), where each pattern is stated once as closed forms
  (tensor ops only), its parameters checked by ``reference.params.check_params`` and
  what each head reads from ``reference.heads.head_roles`` (small per-head look-up
  tensors; BigBird's random keys from an (n, n_random) table).
* ``block_mask``: a ``BlockMask`` built from the NATURAL-order ``fast.layout``
  (partial tiles -> kv_num_blocks / kv_indices, full tiles -> full_kv_*), via
  ``BlockMask.from_kv_blocks``: no n x n evaluation (``create_block_mask`` would
  run the mask_mod on all n^2 pairs).
* ``flex_sparse_attention``: q, k, v -> output, with the BlockMask and the compiled
  ``flex_attention`` cached: FlexAttention's fastest documented configuration,
  ``torch.compile(flex_attention, dynamic=False)`` (one kernel per shape, its sizes
  constants) on a BlockMask whose full blocks are apart (no mask_mod evaluated in
  them); ``cached_block_mask`` is that BlockMask. The attention benchmark's
  FlexAttention peer calls this function (``fast.measure.contenders``).

FlexAttention sees the natural order, where strided and fixed touch almost every
causal 128-block (at l = 128 every query block reads every earlier key block): it
skips the upper triangle, not more; see ``fast.layout`` for the structured
(transposed / gathered) layouts. PyTorch 2.13 has no FlexAttention backward on
CPU ("does not support backward on CPU").
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from fast import patterns
from fast.backends.padding import check_padding
from fast.core.checks import check_finite as reject_non_finite
from fast.core.checks import check_scale
from fast.core.nonfinite import attention_reach, quarantine
from fast.layout import block_layout
from reference.params import check_params


def mask_mod(pattern: str, n: int, n_heads: int, combine: str = "merged", layer: int = 0,
             *, device="cpu", **params):
    """A FlexAttention mask_mod (b, h, q_idx, kv_idx) -> bool for ``pattern``: the
    registry's (``fast.patterns.Pattern.mask_mod``). Arguments as
    ``fast.layout.block_layout`` (and ``reference.patterns.head_masks``). Its look-up
    tensors live on ``device`` (that of the q, k, v it will mask; ``create_block_mask``
    needs them there too)."""
    return patterns.get(pattern).mask_mod(n, n_heads, combine, layer, device=device,
                                          **params)


def block_mask(pattern: str, n: int, n_heads: int, combine: str = "merged", layer: int = 0,
               *, block_size: int = 128, device="cpu", **params) -> BlockMask:
    """A FlexAttention BlockMask of ``pattern`` (batch dimension 1, broadcast).

    Built from ``fast.layout.block_layout(..., order="natural")``: its partial
    tiles become (kv_num_blocks, kv_indices), where FlexAttention applies the
    mask_mod; its full tiles become (full_kv_num_blocks, full_kv_indices), where
    it does not. The tables are padded to the full block width, as FlexAttention
    derives the transposed (q) tables from that width.
    """
    layout = block_layout(pattern, n, n_heads, combine, layer, block_size=block_size,
                          order="natural", **params)
    part = layout.parts[0]
    nb = layout.n_blocks
    valid = torch.arange(part.kv_index.shape[-1]) < part.kv_count[..., None].long()
    is_full = valid & (part.kv_mask < 0)
    is_partial = valid & (part.kv_mask >= 0)
    partial_count, partial_index = _select(part.kv_index, is_partial, nb)
    full_count, full_index = _select(part.kv_index, is_full, nb)
    mod = mask_mod(pattern, n, n_heads, combine, layer, device=device, **params)
    return BlockMask.from_kv_blocks(
        partial_count[None].to(device), partial_index[None].to(device),    # (1, H, NB[, NB])
        full_count[None].to(device), full_index[None].to(device),
        BLOCK_SIZE=block_size, mask_mod=mod, seq_lengths=(n, n))


def _select(index: torch.Tensor, keep: torch.Tensor, width: int):
    """Keep the entries ``keep`` of each row of ``index`` (H, R, K), in order, as
    (count (H, R), index (H, R, width)) int32, 0-padded."""
    count = keep.sum(-1)
    rank = torch.cumsum(keep.long(), -1) - 1                # slot of each kept entry
    out = torch.zeros(*index.shape[:2], width + 1, dtype=torch.int32)
    out.scatter_(-1, torch.where(keep, rank, width), index.int())  # dropped ones -> column `width`
    return count.int(), out[..., :width].contiguous()


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=32)
def _cached_block_mask(pattern, n, n_heads, combine, layer, device, items):
    return block_mask(pattern, n, n_heads, combine, layer, device=device, **dict(items))


def cached_block_mask(pattern: str, n: int, n_heads: int, combine: str = "merged",
                      layer: int = 0, device="cpu", params: dict | None = None) -> BlockMask:
    """The BlockMask ``flex_sparse_attention`` uses for self-attention over n positions
    (the same object, from the same cache): ``params`` as its keywords (stride, c, ...)."""
    params = check_params(pattern, n, n_heads, combine, layer, dict(params or {}))
    return _cached_block_mask(pattern, n, n_heads, combine, layer, str(torch.device(device)),
                              tuple(sorted(params.items())))


# What torch 2.13.0's compiled FlexAttention takes on the CPU (float64 fails inside
# the compiler with an internal error)
CPU_COMPILED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def flex_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str, *,
                          stride=None, c=None, combine: str = "merged", layer: int = 0,
                          scale=None, compile: bool = True, check_finite: bool | None = None,
                          lengths=None, offsets=None, enable_gqa: bool = False,
                          kernel_options: dict | None = None, **params) -> torch.Tensor:
    """FlexAttention with the pattern's BlockMask: q (B, H, n_q, d), k (B, Hkv, n_k, d),
    v (B, Hkv, n_k, d_v) -> output (B, H, n_q, d_v). Rows that read nothing give 0.

    As ``fast.sparse_attention``: one dtype for q, k, v (compiled on the CPU: float32,
    float16 or bfloat16; eager: any), ``scale`` a finite real number or None
    (1 / sqrt(d)); the queries are the last n_q <= n_k positions; with
    ``enable_gqa`` k and v may have Hkv heads dividing H (FlexAttention's own
    ``enable_gqa``); ``lengths`` and ``offsets`` pad a batch (``fast.backends.padding``:
    each sequence at its own positions, padded keys unread, padded query rows 0), through
    a ``mask_mod`` that reads them per batch element.

    Self-attention of an unpadded batch (n_q = n_k) uses the BlockMask built from the
    natural layout (block 128), cached per (pattern, n, H, combine, layer, params,
    device); any other call builds one with ``create_block_mask``, which evaluates the
    mask_mod on every (query, key) pair: O(n_q n_k), for checking these arguments, not
    for speed. ``compile=True`` uses one cached ``torch.compile(flex_attention)`` (its
    first call compiles, about 25 s on a CPU), ``compile=False`` the eager version
    (slow, materialises the scores; for tests). Forward only on a CPU.

    check_finite: True rejects NaN / inf in q, k, v (ValueError); False keeps the
    promise of ``fast.core.nonfinite`` (a row that reads one outputs NaN, no other row
    sees it; the compiled kernel alone outputs 0 there), at the price of one more
    FlexAttention call when a non-finite value is present (on the CPU; on a GPU every
    call, as it cannot look without waiting); None: True on the CPU, and on a GPU
    FlexAttention as it is (the benchmarks' peer).

    kernel_options: passed to FlexAttention as they are (e.g. ``{"BACKEND": "FLASH"}``
    for its FlashAttention-4 kernel on CUDA, where torch and the flash-attn-4 package
    offer it); None: FlexAttention's defaults.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, n, d), got shapes {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    (B, n_heads, n_q, d), (_, kv_heads, n, _) = q.shape, k.shape
    if (k.shape[:3] != v.shape[:3] or k.shape[0] != B or k.shape[-1] != d or n_q > n
            or n_heads % kv_heads or (kv_heads != n_heads and not enable_gqa)):
        raise ValueError(f"q (B, H, n_q, d), k (B, Hkv, n_k, d) and v (B, Hkv, n_k, d_v) "
                         f"need n_q <= n_k and Hkv = H (or, with enable_gqa=True, dividing "
                         f"H); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if compile and q.device.type == "cpu" and q.dtype not in CPU_COMPILED_DTYPES:
        raise ValueError(f"compiled FlexAttention on the CPU takes {CPU_COMPILED_DTYPES}, got "
                         f"{q.dtype}; allowed: one of those, or compile=False (eager)")
    scale = check_scale(scale, d)
    # checked params hold only ints and tuples of ints (global_tokens), so they can
    # key the cache whatever the caller passed (lists, NumPy arrays, NumPy ints)
    params = check_params(pattern, n, n_heads, combine, layer,
                          {"stride": stride, "c": c, **params})
    if check_finite is None:
        check_finite = True if q.device.type == "cpu" else None
    lengths, offsets = check_padding(lengths, offsets, B, n, q.device, bool(check_finite))
    if n_q == n and lengths is None and offsets is None:
        items = tuple(sorted(params.items()))
        mask = _cached_block_mask(pattern, n, n_heads, combine, layer, str(q.device), items)
    else:
        mask = _aligned_block_mask(pattern, B, n_heads, n_q, n, combine, layer, q.device,
                                   params, lengths, offsets)
    attend = _compiled_flex() if compile else flex_attention
    extra = {"enable_gqa": True} if kv_heads != n_heads else {}
    if kernel_options is not None:
        extra["kernel_options"] = dict(kernel_options)
    run = lambda q, k, v: attend(q, k, v, block_mask=mask, scale=scale, **extra)
    if check_finite:
        reject_non_finite(q, k, v)
    if check_finite is False:
        return quarantine(run, q, k, v, attention_reach(_wide(run)))
    return run(q, k, v)


def _aligned_block_mask(pattern, B, n_heads, n_q, n, combine, layer, device, params,
                        lengths, offsets) -> BlockMask:
    """The BlockMask of queries at the last n_q of n positions, in a batch padded by
    ``lengths`` and ``offsets`` (either may be None): the pattern's mask_mod at each
    sequence's own positions, every pair with a padded position False."""
    inner = mask_mod(pattern, n, n_heads, combine, layer, device=device, **params)
    padded = lengths is not None or offsets is not None
    start = offsets if offsets is not None else torch.zeros(B, dtype=torch.long, device=device)
    length = lengths if lengths is not None else n - start

    def aligned(b, h, q_idx, kv_idx):
        qp, kp = q_idx + (n - n_q) - start[b], kv_idx - start[b]
        ok = (kp >= 0) & (kp < length[b]) & (qp >= 0) & (qp < length[b])
        return ok & inner(b, h, qp.clamp(min=0), kp.clamp(min=0))

    return create_block_mask(aligned, B if padded else None, n_heads, n_q, n, device=device,
                             _compile=False)


def _wide(run, width: int = 16):
    """``run`` for inputs narrower than FlexAttention's smallest head (zero columns
    added to q, k, v; the output cut back): the reach of ``fast.core.nonfinite``
    runs with one column."""
    def wide(q, k, v):
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[-1]))  # (B, H, n, 16)
        return run(pad(q), pad(k), pad(v))[..., :v.shape[-1]]
    return wide


__all__ = ["mask_mod", "block_mask", "cached_block_mask", "flex_sparse_attention"]
