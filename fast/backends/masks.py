"""Boolean attention masks in PyTorch, from the closed forms (for the naive path).

Child et al., 2019, section 4.3 (the strided and fixed patterns) and section 5.1
(eq. 5-8: merged, multi-head and interleaved heads); Longformer and BigBird as in
``reference/patterns.py``.

Every mask here is the torch twin of a function in ``reference/patterns.py``,
built from index arithmetic on the target device (no NumPy (n, n) grid, no
copy from the host), with the same 0-indexed decisions:

* strided local  0 <= i - j < l (exactly l positions), column (i - j) mod l == 0;
* fixed block    floor(j / l) == floor(i / l), summary (j mod l) in [lo, hi) with
  [lo, hi) the head's ``reference.heads.HeadRole.summary``;
* all causal, j <= i.

Which parts each head reads comes from ``reference.heads.head_roles``; nothing
here re-derives it.

These masks are O(n^2) memory: they serve the obviously-correct "naive" backend
and the tests, never the structured fast path.
"""

from __future__ import annotations

import functools

import torch

from reference.heads import PARTS, HeadRole, head_roles
from reference.params import check_params
from reference.patterns import bigbird_random_keys


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


def fixed_masks(n: int, stride: int, lo: int, hi: int,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, summary) of the fixed pattern (sec. 4.3), each bool (n, n); the
    summary reads (j mod l) in [lo, hi), a head's ``HeadRole.summary``."""
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


def part_masks(pattern: str, n: int, role: HeadRole, device=None,
               **params) -> dict[str, torch.Tensor]:
    """The masks of the parts of ``pattern`` (``reference.heads.PARTS``) as ``role``
    sees them (only a fixed head's summary depends on its role): {name: bool (n, n)}."""
    if pattern == "full":
        masks = (full_mask(n, device),)
    elif pattern == "strided":
        masks = strided_masks(n, params["stride"], device)
    elif pattern == "fixed":
        masks = fixed_masks(n, params["stride"], *role.summary, device=device)
    elif pattern == "longformer":
        masks = (longformer_mask(n, device=device, **params),)
    else:
        masks = (bigbird_mask(n, device=device, **params),)
    return dict(zip(PARTS[pattern], masks))


def head_masks(pattern: str, n: int, n_heads: int, combine: str = "merged", layer: int = 0,
               device=None, **params) -> torch.Tensor:
    """Which positions each head reads: bool (n_heads, n, n), equal to
    ``reference.patterns.head_masks``: head h reads the union of the parts its
    ``reference.heads.HeadRole`` names. When every head reads the same mask the
    result is that mask expanded over heads (a view, not n_heads copies).
    Parameters are checked here too (``reference.params.check_params``, a few integer
    comparisons): this is a public entry point, and a mask is O(n^2) anyway."""
    params = check_params(pattern, n, n_heads, combine, layer, params)
    roles = head_roles(pattern, n_heads, combine, layer,
                       stride=params.get("stride"), c=params.get("c"))
    parts_of: dict = {}   # summary sub-block -> {part name: mask}; one entry unless fixed
    read_by: dict = {}    # (parts read, summary sub-block) -> the head's mask
    for role in roles:
        key = (role.parts, role.summary)
        if key in read_by:
            continue
        if role.summary not in parts_of:
            parts_of[role.summary] = part_masks(pattern, n, role, device, **params)
        masks = [parts_of[role.summary][name] for name in role.parts]
        read_by[key] = functools.reduce(torch.logical_or, masks)
    if len(read_by) == 1:
        return next(iter(read_by.values()))[None].expand(n_heads, n, n)
    out = torch.empty(n_heads, n, n, dtype=torch.bool, device=device)
    for role in roles:
        out[role.head] = read_by[(role.parts, role.summary)]
    return out
