"""Boolean attention masks in PyTorch, from the closed forms (for the naive path).

Child et al., 2019, section 4.3 (the strided and fixed patterns) and section 5.1
(eq. 5-8: merged, multi-head and interleaved heads); Longformer and BigBird as in
``reference/patterns.py`` (paper-notes section 7).

Every mask here is the torch twin of a function in ``reference/patterns.py``,
built from index arithmetic on the target device (no NumPy (n, n) grid, no
copy from the host), with the same 0-indexed decisions:

* strided local  0 <= i - j < l (exactly l positions), column (i - j) mod l == 0;
* fixed block    floor(j / l) == floor(i / l), summary (j mod l) in [lo, hi) with
  [lo, hi) = ``reference.patterns.summary_range(l, c, rank)``;
* all causal, j <= i.

These masks are O(n^2) memory: they serve the obviously-correct "naive" backend
and the tests, never the structured fast path.
"""

from __future__ import annotations

import torch

from reference.patterns import bigbird_random_keys, summary_range, summary_rank


def _back(n: int, device) -> torch.Tensor:
    """i - j on an (n, n) grid (rows i = outputs, columns j = inputs)."""
    idx = torch.arange(n, device=device)
    return idx[:, None] - idx[None, :]                                  # (n, n)


def full_mask(n: int, device=None) -> torch.Tensor:
    """Causal: i reads every j <= i. Bool (n, n)."""
    return _back(n, device) >= 0


def strided_masks(n: int, stride: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(local, column) of the strided pattern (sec. 4.3), each bool (n, n)."""
    back = _back(n, device)
    causal = back >= 0
    return causal & (back < stride), causal & (back % stride == 0)


def fixed_masks(n: int, stride: int, c: int, rank: int = 0,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, summary) of the fixed pattern (sec. 4.3), each bool (n, n); the
    summary reads sub-block ``rank`` (``reference.patterns.summary_range``)."""
    lo, hi = summary_range(stride, c, rank)
    idx = torch.arange(n, device=device)
    causal = idx[None, :] <= idx[:, None]                               # (n, n)
    block = causal & ((idx[None, :] // stride) == (idx[:, None] // stride))
    jmod = idx % stride
    is_summary = (jmod >= lo) & (jmod < hi)                              # (n,)
    return block, causal & is_summary[None, :]


def longformer_mask(n: int, window: int, dilation: int = 1, global_tokens=(),
                    device=None) -> torch.Tensor:
    """Causal Longformer: dilated window plus global tokens. Bool (n, n)."""
    back = _back(n, device)
    causal = back >= 0
    mask = causal & (back < window * dilation) & (back % dilation == 0)
    g = torch.as_tensor(list(global_tokens), dtype=torch.long, device=device).reshape(-1)
    is_global = torch.zeros(n, dtype=torch.bool, device=device)
    is_global[g] = True
    return mask | (causal & (is_global[None, :] | is_global[:, None]))


def bigbird_mask(n: int, window: int, n_random: int, n_global: int, seed: int = 0,
                 device=None) -> torch.Tensor:
    """Causal BigBird: window + seeded random keys + the first n_global tokens as
    global tokens. The random keys come from ``reference.patterns.bigbird_random_keys``
    so that every implementation reads the same keys. Bool (n, n)."""
    mask = longformer_mask(n, window, 1, range(n_global), device=device)
    keys = torch.as_tensor(bigbird_random_keys(n, n_random, seed), device=device)  # (n, r)
    rows = torch.arange(n, device=device)[:, None].expand_as(keys)
    ok = keys >= 0
    mask[rows[ok], keys[ok]] = True
    return mask


def head_masks(pattern: str, n: int, n_heads: int, combine: str = "merged", layer: int = 0,
               device=None, **params) -> torch.Tensor:
    """Which positions each head reads: bool (n_heads, n, n), equal to
    ``reference.patterns.head_masks`` (and, for "longformer"/"bigbird", to the
    reference mask repeated over heads). Arguments are assumed valid (see
    ``fast.attention`` for the checks)."""
    if pattern == "longformer":
        return longformer_mask(n, device=device, **params)[None].expand(n_heads, n, n)
    if pattern == "bigbird":
        return bigbird_mask(n, device=device, **params)[None].expand(n_heads, n, n)
    if pattern == "full":
        return full_mask(n, device)[None].expand(n_heads, n, n)
    out = torch.empty(n_heads, n, n, dtype=torch.bool, device=device)
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for h in range(n_heads):
        if pattern == "strided":
            key = 0
            if key not in cache:
                cache[key] = strided_masks(n, params["stride"], device)
        else:  # fixed: the summary sub-block depends on the head's rank
            stride, c = params["stride"], params["c"]
            key = summary_rank(h, combine) % (stride // c) if stride % c == 0 else 0
            if key not in cache:
                cache[key] = fixed_masks(n, stride, c, key, device)
        first, second = cache[key]
        if combine == "merged":
            out[h] = first | second
        elif combine == "multihead":
            out[h] = (first, second)[h % 2]
        else:  # interleaved
            out[h] = (first, second)[layer % 2]
    return out
