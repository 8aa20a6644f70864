"""Flash attention that also returns the log-sum-exp, forward and backward.

Child et al., 2019, section 5.5 ("The softmax operation is fused into a single
kernel", "The upper triangle of the attention matrix is never computed"): the
structured path cuts a sparse pattern into a few dense pieces -- bands, transposed
columns, gathered summaries -- and runs each piece through a fused attention kernel.
To merge pieces exactly it needs each row's log-sum-exp, which the public
``scaled_dot_product_attention`` does not return.

* CPU: ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` and its
  ``_backward``, a PRIVATE operator. Written and tested against torch 2.13.0
  (schema: (q, k, v, dropout_p, is_causal, *, attn_mask, scale) -> (out, lse)).
  Facts relied on, checked in tests/fast/test_attention.py: inputs may be
  strided views (stride-0 expands included); ``attn_mask`` is additive and of
  q's dtype; ``is_causal`` is top-left aligned (query i reads keys j <= i);
  ``lse`` is float32 for bfloat16/float16 inputs; a fully masked row gives
  out 0 but lse 0 (not -inf), so callers set such rows' lse themselves.
* Anywhere else (CUDA, or a torch without the operator): ``_math_forward`` /
  ``_math_backward``, plain matmul + softmax over the same pieces, query rows in
  chunks of at most ``MATH_CHUNK_ELEMENTS`` scores, so memory stays bounded; it
  is correct but not fast (on CUDA the "triton" backend is the fast path).

Both return/accept ``lse`` in float32 (float64 for float64 inputs,
``fast.core.precision``), shaped like q without its last dimension. A
flash-style backward given the merged output and the merged log-sum-exp
computes each piece's share of the merged gradient exactly, because it
recomputes P = exp(s - lse): with the lse of a *merged* softmax (several pieces
of one row, ``fast.core.merge``), P is this piece's columns of the merged
softmax, and delta = rowsum(dO * O) is the merged one (FlashAttention-2, Dao,
2023, sec. 3.1.2).

``spans``: every kernel call returns new tensors (its output and log-sum-exp,
or its three gradients, zero-filled before it accumulates into them). A new
tensor above the C library's mmap threshold (32 MiB at most, glibc) is mapped
fresh and page-faulted on every call, which costs about as much as the
attention it holds (docs/design.md §5, "Where the time goes on the CPU"); pieces
whose kernel outputs would be that large cut their calls into spans of at most
``SLAB_BYTES``, which also keeps each call's outputs in cache while they are
folded or merged.
"""

from __future__ import annotations

import torch

from fast.core.precision import acc_dtype

_OPS = torch.ops.aten
HAS_CPU_FLASH = (hasattr(_OPS, "_scaled_dot_product_flash_attention_for_cpu")
                 and hasattr(_OPS, "_scaled_dot_product_flash_attention_for_cpu_backward"))


def uses_kernel(q: torch.Tensor) -> bool:
    """The CPU kernel for CPU tensors; "meta" tensors (shapes only) take the same call,
    which runs the kernel's shape function, so that a piece run on meta tensors makes
    the kernel calls a CPU run makes (``fast.measure.kernel_pairs`` counts them)."""
    return HAS_CPU_FLASH and q.device.type in ("cpu", "meta")


# Forward calls made through this module (``attention_forward``), counted so that the
# structured forward knows whether a call of PyTorch's kernel served it: that kernel gives
# a row whose every score overflowed to -inf an output of 0 and a finite lse, which only a
# bound on the scores catches (``fast.backends.structured``, "Precision").
CALLS = [0]


def attention_forward(q, k, v, *, is_causal: bool = False, mask=None, scale: float):
    """(out, lse) of softmax(scale q k^T + mask) v. q: (X, Y, L, d); k, v: (X, Y, S, d),
    any strides; mask: additive, q's dtype, broadcastable to (X, Y, L, S), or None.
    is_causal: query i reads keys j <= i (top-left aligned). Not both."""
    CALLS[0] += 1
    if uses_kernel(q):
        return _OPS._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)
    return _math_forward(q, k, v, is_causal, mask, scale)


def attention_backward(grad_out, q, k, v, out, lse, *, is_causal: bool = False, mask=None,
                       scale: float):
    """(dq, dk, dv) given the (possibly merged) out and lse of every query row.
    A row whose lse is +inf contributes nothing (use it for rows that read nothing)."""
    if uses_kernel(q):
        return _OPS._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale)
    return _math_backward(grad_out, q, k, v, out, lse, is_causal, mask, scale)


# Largest output of one kernel call that a piece plans for (see ``spans``): below
# glibc's largest mmap threshold (32 MiB), so a slab's memory is reused from the heap
# call after call, and large enough to keep the number of calls -- each a parallel
# region that waits for both threads, costly when another process holds a core -- small.
SLAB_BYTES = 24 << 20


def spans(count: int, bytes_each: int, budget: int | None = None) -> list[tuple[int, int]]:
    """[(a, b), ...]: range(count) cut into consecutive runs of at most ``budget``
    bytes (default ``SLAB_BYTES``), ``bytes_each`` per item (at least one item per
    run); [] for count 0."""
    budget = SLAB_BYTES if budget is None else budget
    per = max(1, budget // max(1, bytes_each))
    return [(a, min(count, a + per)) for a in range(0, count, per)]


# The fallback materialises scores for at most this many elements at a time
# (query rows are processed in chunks), so its memory stays O(pieces), not O(n^2).
MATH_CHUNK_ELEMENTS = 1 << 26


def _row_chunks(q, k):
    X, Y, L, _ = q.shape
    rows = max(1, MATH_CHUNK_ELEMENTS // max(1, X * Y * k.shape[-2]))
    return [(a, min(L, a + rows)) for a in range(0, L, rows)]


def _scores(q, k, is_causal, mask, scale, a, b):
    """Scaled scores of query rows [a, b), masked, in the accumulation dtype."""
    acc = acc_dtype(q.dtype)
    s = scale * (q[..., a:b, :].to(acc) @ k.to(acc).transpose(-1, -2))  # (X, Y, b-a, S)
    if mask is not None:
        s = s + (mask[..., a:b, :] if mask.shape[-2] > 1 else mask).to(acc)
    if is_causal:                                  # top-left: row i reads keys j <= i
        i = torch.arange(a, b, device=q.device)[:, None]
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    return s


def _math_forward(q, k, v, is_causal, mask, scale):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=acc_dtype(q.dtype), device=q.device)
    for a, b in _row_chunks(q, k):
        s = _scores(q, k, is_causal, mask, scale, a, b)
        m = torch.logsumexp(s, dim=-1)                                  # (X, Y, b-a)
        p = torch.exp(s - m.masked_fill(torch.isinf(m), 0.0)[..., None])
        out[..., a:b, :] = (p @ v.to(p.dtype)).to(q.dtype)
        lse[..., a:b] = m.masked_fill(m == float("-inf"), 0.0)  # the CPU kernel's convention
    return out, lse


def _math_backward(grad_out, q, k, v, out, lse, is_causal, mask, scale):
    acc = acc_dtype(q.dtype)
    dq = torch.empty(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    for a, b in _row_chunks(q, k):
        s = _scores(q, k, is_causal, mask, scale, a, b)
        p = torch.exp(s - lse[..., a:b].to(acc)[..., None])             # (X, Y, b-a, S)
        go = grad_out[..., a:b, :].to(acc)
        dv += p.transpose(-1, -2) @ go
        dp = go @ v.to(acc).transpose(-1, -2)
        delta = (go * out[..., a:b, :].to(acc)).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq[..., a:b, :] = scale * (ds @ k.to(acc))
        dk += scale * (ds.transpose(-1, -2) @ q[..., a:b, :].to(acc))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
