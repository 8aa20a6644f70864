"""The draw of one token from the model's logits: temperature, top-k, top-p.

Child et al., 2019, section 7 (unconditional samples and completions): ancestral
sampling draws each position from the model's distribution, here reshaped by a
temperature and truncated by top-k and top-p (nucleus) before one token per row is
drawn by inverting the cumulative distribution at one uniform number.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def draw(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
         top_p: float | None = None,
         generator: torch.Generator | Sequence[torch.Generator] | None = None) -> torch.Tensor:
    """One token per row of logits (B, V) -> LongTensor (B,) on the logits' device.

    The distribution is softmax(logits / temperature); top_k keeps the k most
    likely tokens (and any tied with the k-th); top_p keeps the smallest set of
    most likely tokens whose probability reaches p (the most likely always).
    Each row's token is drawn by inverting its cumulative distribution at one
    uniform number u from ``generator``, drawn on the CPU: a seed gives the same
    tokens on every device, and models sampled with one seed share their u's --
    where their distributions agree they draw the same token. ``generator`` may be
    one per row (a sequence of B generators): row b's u then comes from its own
    stream, whatever rows are drawn beside it (``row_generators``)."""
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
    if isinstance(generator, Sequence):
        if len(generator) != len(cdf):
            raise ValueError(f"one generator per row: got {len(generator)} generators for "
                             f"{len(cdf)} rows of logits")
        u = torch.cat([torch.rand(1, 1, generator=g, dtype=torch.float64)
                       for g in generator]).to(cdf.device)                # (B, 1)
    else:
        u = torch.rand(len(cdf), 1, generator=generator, dtype=torch.float64).to(cdf.device)
    token = torch.searchsorted(cdf, u.mul_(cdf[:, -1:]), right=True)     # (B, 1)
    return token.clamp_(max=cdf.shape[-1] - 1)[:, 0]                     # u * total < total


def row_generators(num: int, generator: torch.Generator | None = None) -> list[torch.Generator]:
    """``num`` CPU generators, one per sample, seeded from ``generator`` (torch's global
    one when None) by one draw of ``num`` seeds: sample r's uniform numbers come from
    generator r alone, so a seed gives the same samples however they are batched."""
    seeds = torch.randint(0, 2 ** 62, (num,), generator=generator, dtype=torch.int64)
    return [torch.Generator().manual_seed(int(s)) for s in seeds]
