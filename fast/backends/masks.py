"""Boolean attention masks in PyTorch, from the closed forms (for the naive path).

Child et al., 2019, section 4.3 (the strided and fixed patterns) and section 5.1
(eq. 5-8: merged, multi-head and interleaved heads); Longformer and BigBird as in
``reference/patterns.py``.

Every mask here is the torch twin of a function in ``reference/patterns.py``,
built from index arithmetic on the target device (no NumPy (n, n) grid, no
copy from the host), with the same 0-indexed decisions, for a query at position
i and a key at position j:

* strided local  0 <= i - j < l (exactly l positions), column (i - j) mod l == 0;
* fixed block    floor(j / l) == floor(i / l), summary (j mod l) in [lo, hi) with
  [lo, hi) the head's ``reference.heads.HeadRole.summary``;
* all causal, j <= i.

Masks are built from the positions of the queries and of the keys
(``position_masks``): a query row need not be position i of an (n, n) grid, so the
same closed forms give the last n_q rows of the pattern at n_k keys (queries aligned
to the end) and the masks of a padded batch, whose sequences start at their own
offsets (``fast.backends.padding``). Each condition compares a quantity of the row
with one of the column -- i mod l with j mod l, floor(i / l) with floor(j / l),
j with i - l -- so no integer (n_q, n_k) grid is ever made: a mask costs one byte
per pair, and the guard of the naive path (``fast.backends.naive``) counts that.

Which parts each head reads comes from ``reference.heads.head_roles``; nothing
here re-derives it.

These masks are O(n_q n_k) memory: they serve the obviously-correct "naive" backend
and the tests, never the structured fast path.
"""

from __future__ import annotations

import functools

import torch

from reference.heads import PARTS, HeadRole, head_roles
from reference.params import check_params
from reference.patterns import bigbird_random_keys


def _pairs(qpos: torch.Tensor, kpos: torch.Tensor):
    """Query positions (..., n_q) and key positions (..., n_k) as a column (..., n_q, 1)
    and a row (..., 1, n_k): every mask below broadcasts the two."""
    return qpos[..., :, None], kpos[..., None, :]


def part_masks(pattern: str, qpos: torch.Tensor, kpos: torch.Tensor, role: HeadRole,
               n: int, **params) -> dict[str, torch.Tensor]:
    """The masks of the parts of ``pattern`` (``reference.heads.PARTS``) as ``role`` sees
    them (only a fixed head's summary depends on its role), for queries at positions
    ``qpos`` (..., n_q) and keys at ``kpos`` (..., n_k), int64 on one device, of a
    pattern whose sequence holds n positions (BigBird's random keys and Longformer's
    global tokens are tables over them; a position outside [0, n) reads as 0 there,
    and callers mask such positions out). {name: bool (..., n_q, n_k)}."""
    i, j = _pairs(qpos, kpos)
    causal = j <= i
    if pattern == "full":
        masks = (causal,)
    elif pattern in ("strided", "fixed"):
        l = params["stride"]
        if pattern == "strided":
            masks = (causal & (j > i - l), causal & (i % l == j % l))
        else:
            lo, hi = role.summary
            jmod = j % l
            masks = (causal & (i // l == j // l), causal & (jmod >= lo) & (jmod < hi))
    else:
        masks = (_neighbour_mask(pattern, i, j, causal, n, params),)
    return dict(zip(PARTS[pattern], masks))


def _neighbour_mask(pattern, i, j, causal, n, params):
    """Longformer (window, dilation, global tokens) or BigBird (window, random keys, the
    first n_global positions global), causal, at query column i and key row j."""
    window, dilation = params["window"], params.get("dilation", 1)
    mask = causal & (j > i - window * dilation) & (i % dilation == j % dilation)
    is_global = torch.zeros(n, dtype=torch.bool, device=i.device)
    if pattern == "longformer":
        g = torch.as_tensor(list(params["global_tokens"]), dtype=torch.long, device=i.device)
        is_global[g] = True
    else:
        is_global[:params["n_global"]] = True
    inside = lambda p: p.clamp(0, n - 1)
    mask |= causal & (is_global[inside(j)] | is_global[inside(i)])
    if pattern == "bigbird":
        # row i's random keys, drawn by the reference so that every path reads the same
        keys = torch.as_tensor(bigbird_random_keys(n, params["n_random"], params["seed"]),
                               device=i.device)                           # (n, r), -1 = none
        chosen = keys[inside(i[..., 0])]                                  # (..., n_q, r)
        for r in range(keys.shape[1]):
            mask |= chosen[..., r:r + 1] == j
    return mask


def position_masks(pattern: str, n: int, n_heads: int, combine: str, layer: int,
                   qpos: torch.Tensor, kpos: torch.Tensor, **params) -> torch.Tensor:
    """Which keys each head's queries read: bool (..., n_heads, n_q, n_k) for queries at
    positions ``qpos`` (..., n_q) and keys at positions ``kpos`` (..., n_k) of a sequence
    of n positions (the pattern's parameters are checked at n), equal to
    ``reference.patterns.head_masks(pattern, n, n_heads, combine, layer)[h][qpos, kpos]``
    wherever both positions lie in [0, n). Head h reads the union of the parts its
    ``reference.heads.HeadRole`` names. When every head reads the same mask the result
    is that mask expanded over heads (a view, not n_heads copies)."""
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
            parts_of[role.summary] = part_masks(pattern, qpos, kpos, role, n, **params)
        masks = [parts_of[role.summary][name] for name in role.parts]
        read_by[key] = functools.reduce(torch.logical_or, masks)
    first = next(iter(read_by.values()))                                  # (..., n_q, n_k)
    if len(read_by) == 1:
        return first.unsqueeze(-3).expand(*first.shape[:-2], n_heads, *first.shape[-2:])
    out = first.new_empty(*first.shape[:-2], n_heads, *first.shape[-2:])
    for role in roles:
        out[..., role.head, :, :] = read_by[(role.parts, role.summary)]
    return out


def head_masks(pattern: str, n: int, n_heads: int, combine: str = "merged", layer: int = 0,
               device=None, **params) -> torch.Tensor:
    """Which positions each head reads: bool (n_heads, n, n), equal to
    ``reference.patterns.head_masks`` (``position_masks`` over positions 0..n-1 on both
    sides). Parameters are checked here too (``reference.params.check_params``, a few
    integer comparisons): this is a public entry point, and a mask is O(n^2) anyway."""
    check_params(pattern, n, n_heads, combine, layer, params)
    pos = torch.arange(n, device=device)
    return position_masks(pattern, n, n_heads, combine, layer, pos, pos, **params)
