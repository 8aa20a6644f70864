"""The draw of one token from the model's logits: temperature, top-k, top-p.

Child et al., 2019, section 7 (unconditional samples and completions): ancestral
sampling draws each position from the model's distribution, here reshaped by a
temperature and truncated by top-k and top-p (nucleus) before one token per row is
drawn by inverting the cumulative distribution at one uniform number.
"""

from __future__ import annotations

import torch


def draw(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
         top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of logits (B, V) -> LongTensor (B,) on the logits' device.

    The distribution is softmax(logits / temperature); top_k keeps the k most
    likely tokens (and any tied with the k-th); top_p keeps the smallest set of
    most likely tokens whose probability reaches p (the most likely always).
    Each row's token is drawn by inverting its cumulative distribution at one
    uniform number u from ``generator``, drawn on the CPU: a seed gives the same
    tokens on every device, and models sampled with one seed share their u's --
    where their distributions agree they draw the same token."""
    logits = logits.float() if temperature == 1.0 else logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]         # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float64)           # (B, V)
    if top_p is not None and top_p < 1:
        ranked, order = probs.sort(dim=-1, descending=True)              # (B, V)
        drop = (ranked.cumsum(-1) - ranked) >= top_p                     # mass before >= p
        probs = probs.masked_fill(drop.scatter(-1, order, drop), 0.0)
    cdf = probs.cumsum_(-1)                                              # (B, V)
    u = torch.rand(len(cdf), 1, generator=generator, dtype=torch.float64).to(cdf.device)
    token = torch.searchsorted(cdf, u.mul_(cdf[:, -1:]), right=True)     # (B, 1)
    return token.clamp_(max=cdf.shape[-1] - 1)[:, 0]                     # u * total < total
