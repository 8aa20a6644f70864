"""The naive backend: scaled_dot_product_attention with a boolean (H, n_q, n_k) mask.

Child et al., 2019, section 4 (eq. 2-4): Attend(X, S) with S_i given as a mask.
O(n_q n_k) time and memory -- the obviously-correct path that the structured and
Triton backends are checked against, the path for patterns without a structured
kernel (Longformer, BigBird, the patterns added to ``fast.patterns``), and the one
that honours every argument of ``fast.sparse_attention``: queries aligned to the end
of the keys, padded batches (``fast.backends.padding``), grouped key/value heads, an
``attn_mask`` of the user's ANDed with the pattern, and dropout.

A row that reads nothing outputs 0 (never NaN) on every SDPA backend: such a row
is given one harmless key (j = 0) so the softmax is defined, and its output is
then multiplied by 0, which also zeroes every gradient that flows through it. A row
that reads keys whose scores may overflow (finite inputs near 1e20 in float32:
``fast.core.precision.overflow_rows``) outputs NaN: SDPA would give 0 where every
score it reads overflowed to -inf, as for a row that reads nothing.

Dropout (``dropout_p`` > 0) drops each (query, key) weight after the softmax with
probability p and scales the kept ones by 1 / (1 - p), as SDPA does; the mask is
drawn here (``dropout_keep``: one Bernoulli draw per pair, from the default generator
of q's device, so ``torch.manual_seed`` repeats it) and the attention is written out
(scores, softmax, weights times the mask, values) so that the backward goes through
the same mask. The scores are then an (B, H, n_q, n_k) tensor in the accumulation
dtype.

Size: the masks and SDPA's float copy of them take about n_q n_k bytes per head and
batch element that differ, times (1 + the element size); a call that would need more
than half the memory available on its device is refused before anything is allocated
(``check_size``), naming the path to use instead.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from fast import patterns
from fast.backends import masks as masks_torch
from fast.backends import padding
from fast.core.precision import acc_dtype, may_overflow, overflow_rows
from reference.params import FACTORIZED


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """softmax(scale q k^T restricted to mask) v. q (B, H, n_q, d), k, v (B, Hkv, n_k, d)
    (Hkv = H, or dividing H with ``enable_gqa``); mask: bool, broadcastable to
    (B, H, n_q, n_k). Returns (B, H, n_q, d); empty rows give 0."""
    gqa = {"enable_gqa": True} if enable_gqa else {}
    reads_any = mask.any(dim=-1, keepdim=True)                          # (.., n_q, 1)
    scale_ = q.shape[-1] ** -0.5 if scale is None else scale
    # Eager calls on the CPU look first (one read on the host, which costs no wait there)
    # and skip the fixes when every row reads something and no score can overflow; a
    # compiled graph cannot look without breaking, a GPU only by waiting for the device,
    # and "meta" tensors (shapes only) not at all, so they always apply the fixes, which
    # change nothing in such a row (the same numbers).
    if (torch.compiler.is_compiling() or q.device.type != "cpu"
            or not bool(reads_any.all() & ~may_overflow(q, k, scale_))):
        first = torch.arange(mask.shape[-1], device=mask.device) == 0    # (n_k,)
        mask = mask | (first & ~reads_any)             # an empty row reads key 0 ...
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)
        out = out * reads_any.to(out.dtype)            # ... and outputs 0
        return out.masked_fill(overflow_rows(q, k, scale_), float("nan"))  # never 0: NaN
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **gqa)


def dropout_keep(shape, p: float, device) -> torch.Tensor:
    """Which weights dropout keeps: bool ``shape``, each True with probability 1 - p, one
    Bernoulli draw per element from the default generator of ``device``."""
    return torch.empty(shape, device=device).bernoulli_(1.0 - p).bool()


def dropout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float, dropout_p: float) -> torch.Tensor:
    """``masked_attention`` with dropout on the weights (module docstring), written out in
    the accumulation dtype: q (B, H, n_q, d), k, v (B, Hkv, n_k, d), Hkv dividing H;
    mask broadcastable to (B, H, n_q, n_k). Returns (B, H, n_q, d) in q's dtype."""
    B, H, n_q, d = q.shape
    Hkv, n_k = k.shape[1], k.shape[2]
    acc = acc_dtype(q.dtype)
    mask = mask.expand(B, H, n_q, n_k).unflatten(1, (Hkv, H // Hkv))    # (B, Hkv, G, n_q, n_k)
    qg = q.to(acc).unflatten(1, (Hkv, H // Hkv))                         # (B, Hkv, G, n_q, d)
    s = (qg @ k.to(acc).unsqueeze(2).transpose(-1, -2)) * scale          # (B, Hkv, G, n_q, n_k)
    reads_any = mask.any(dim=-1, keepdim=True)
    s = s.masked_fill(~mask, float("-inf")).masked_fill(~reads_any, 0.0)
    w = torch.softmax(s, dim=-1) * reads_any
    keep = dropout_keep((B, H, n_q, n_k), dropout_p, q.device).unflatten(1, (Hkv, H // Hkv))
    w = w * keep / (1.0 - dropout_p)
    out = w @ v.to(acc).unsqueeze(2)                                     # (B, Hkv, G, n_q, d)
    return out.flatten(1, 2).to(q.dtype)                                 # (B, H, n_q, d)


def available_bytes(device: torch.device) -> int | None:
    """Memory that can still be allocated on ``device``: CUDA's free memory, the CPU's
    MemAvailable (Linux); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def naive_bytes(B: int, H: int, n_q: int, n_k: int, dtype: torch.dtype, mask_batch: int,
                mask_heads: int, dropout: bool) -> int:
    """About what the naive path holds at once, beyond q, k, v: the pattern's part masks
    and their union (bool, ``mask_batch`` x ``mask_heads`` of them), SDPA's float copy of
    the mask, and with dropout the scores, weights and dropout mask of every head."""
    pairs = n_q * n_k
    size = torch.finfo(dtype).bits // 8
    total = pairs * mask_batch * (3 + mask_heads * (1 + size))
    if dropout:
        total += pairs * B * H * (3 * (torch.finfo(acc_dtype(dtype)).bits // 8) + 1)
    return total


# Below this many bytes the naive path is not checked against the memory available
# (reading it costs a file read on the CPU).
SMALL = 64 << 20


def too_big(B: int, H: int, n_q: int, n_k: int, dtype: torch.dtype, device: torch.device,
            mask_batch: int, mask_heads: int, dropout: bool) -> tuple[int, int] | None:
    """(bytes needed, bytes available) when a naive call needs more than half the memory
    available on ``device`` (``naive_bytes``), else None."""
    need = naive_bytes(B, H, n_q, n_k, dtype, mask_batch, mask_heads, dropout)
    if need <= SMALL:
        return None
    free = available_bytes(device)
    return None if free is None or need <= free / 2 else (need, free)


def instead(pattern: str, attn_mask: bool, dropout: bool) -> str:
    """What to use where the naive path cannot hold a call."""
    if attn_mask or dropout:
        what = " and ".join(a for a, on in (("attn_mask", attn_mask), ("dropout_p", dropout))
                            if on)
        return (f"{what} are honoured by the naive path only: drop {what}, or shorten "
                f"the sequence")
    if pattern in FACTORIZED:                            # what the structured backend serves
        return "use backend='structured' (no n_q x n_k tensor), or 'triton' on a GPU"
    return ("use backend='triton' on a GPU (block-sparse), or "
            "fast.backends.flex.flex_sparse_attention")


def check_size(B: int, H: int, n_q: int, n_k: int, dtype: torch.dtype, device: torch.device,
               mask_batch: int, mask_heads: int, dropout: bool, why_not: str) -> None:
    """Refuse, before anything is allocated, a naive call that needs more than half the
    memory available on ``device`` (``too_big``); ``why_not`` says what to use instead."""
    big = too_big(B, H, n_q, n_k, dtype, device, mask_batch, mask_heads, dropout)
    if big is not None:
        need, free = big
        raise ValueError(f"backend 'naive' would hold about {need / 2**30:.1f} GiB of masks "
                         f"(O(n_q n_k): n_q={n_q}, n_k={n_k}, B={B}, H={H}, {dtype}), more "
                         f"than half the {free / 2**30:.1f} GiB available on {device}; "
                         f"{why_not}")


def mask_heads(pattern: str, combine: str, n_heads: int) -> int:
    """How many head masks ``fast.backends.masks.position_masks`` holds: 1 when every head
    reads the same (``fast.patterns.Pattern.alike``), else one per head (multi-head layers
    of a pattern of several parts, and fixed layers whose heads read their own summary
    sub-blocks)."""
    return 1 if patterns.get(pattern).alike(n_heads, combine) else n_heads


def naive_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str,
                           *, combine: str = "merged", layer: int = 0,
                           scale: float | None = None, attn_mask: torch.Tensor | None = None,
                           lengths: torch.Tensor | None = None,
                           offsets: torch.Tensor | None = None, dropout_p: float = 0.0,
                           **params) -> torch.Tensor:
    """Sparse attention through a dense boolean mask of the pattern's heads: q (B, H, n_q,
    d), the last n_q positions of k, v (B, Hkv, n_k, d) (Hkv dividing H); ``attn_mask``
    bool broadcastable to (B, H, n_q, n_k), ANDed with the pattern; ``lengths``,
    ``offsets`` (B,) int64 (``fast.backends.padding``). Arguments already validated
    (``fast.attention``); the size is checked here (``check_size``)."""
    B, n_heads, n_q, _ = q.shape
    n_k = k.shape[2]
    padded = lengths is not None or offsets is not None
    check_size(B, n_heads, n_q, n_k, q.dtype, q.device,
               B if padded or (attn_mask is not None and attn_mask.dim() == 4) else 1,
               n_heads if attn_mask is not None else mask_heads(pattern, combine, n_heads),
               dropout_p > 0, instead(pattern, attn_mask is not None, dropout_p > 0))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    index = torch.arange(n_k, device=q.device)
    qpos = padding.positions(index[n_k - n_q:], offsets)                 # (n_q) or (B, n_q)
    kpos = padding.positions(index, offsets)                             # (n_k) or (B, n_k)
    mask = masks_torch.position_masks(pattern, n_k, n_heads, combine, layer, qpos, kpos,
                                      **params)                          # ([B,] H, n_q, n_k)
    keys = padding.inside(index, lengths, offsets, n_k)                  # (B, n_k) or None
    if keys is not None:
        rows = keys[:, n_k - n_q:]                                       # (B, n_q)
        mask = mask & keys[:, None, None, :] & rows[:, None, :, None]    # (B, H, n_q, n_k)
    if attn_mask is not None:
        mask = mask & attn_mask
    if dropout_p > 0:
        return dropout_attention(q, k, v, mask, scale, dropout_p)
    return masked_attention(q, k, v, mask, scale, enable_gqa=k.shape[1] != n_heads)
