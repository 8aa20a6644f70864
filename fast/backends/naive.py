"""The naive backend: scaled_dot_product_attention with a boolean (H, n, n) mask.

Child et al., 2019, section 4 (eq. 2-4): Attend(X, S) with S_i given as a mask.
O(n^2) time and memory -- the obviously-correct path that the structured and
Triton backends are checked against, and the path for patterns without a
structured kernel (Longformer, BigBird).

A row that reads nothing outputs 0 (never NaN) on every SDPA backend: such a row
is given one harmless key (j = 0) so the softmax is defined, and its output is
then multiplied by 0, which also zeroes every gradient that flows through it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fast.backends import masks as masks_torch


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """softmax(scale q k^T restricted to mask) v. q, k, v: (B, H, n, d); mask: bool,
    broadcastable to (B, H, n, n). Returns (B, H, n, d); empty rows give 0."""
    reads_any = mask.any(dim=-1, keepdim=True)                          # (.., n, 1)
    if not bool(reads_any.all()):
        mask = mask.clone()
        mask[..., 0] |= ~reads_any[..., 0]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out * reads_any.to(out.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def naive_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str,
                           *, combine: str = "merged", layer: int = 0,
                           scale: float | None = None, **params) -> torch.Tensor:
    """Sparse attention through a dense boolean mask of the pattern's heads.
    q, k, v: (B, H, n, d), arguments already validated (``fast.attention``)."""
    _, n_heads, n, _ = q.shape
    mask = masks_torch.head_masks(pattern, n, n_heads, combine, layer, device=q.device,
                                  **params)                              # (H, n, n)
    return masked_attention(q, k, v, mask, scale)
