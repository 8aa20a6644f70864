"""Where does a trained dense model look? Summaries of attention weights over images.

Child et al., 2019, section 3 and Figure 2: a 128-layer dense network trained on
CIFAR-10 learns attention that is local in early layers (like convolution),
splits into row and column attention in some middle layers, is global and
data-dependent in others, and is very sparse in late layers. Those observations
motivated the strided pattern (sec. 4.3). This file turns attention weights
into the numbers behind such statements, for an image of shape (H, W, C)
flattened in raster order (row, column, channel):

* ``coordinates`` / ``pixel_position`` -- raster position <-> (row, column, channel);
* ``region_masks`` -- for one query, which earlier positions are *local* (within
  ``window`` rows and columns), in the query's *row*, in its *column*, or
  *elsewhere* (the four are disjoint and cover every j <= i);
* ``region_mass`` -- the attention mass in each region, averaged over queries;
* ``concentration`` -- normalised entropy (1 = uniform over the readable
  positions, 0 = one position) and the mass of the ``k`` largest weights;
* ``pattern_mass`` -- the mass that falls inside a boolean pattern (e.g. the
  strided pattern of ``reference.patterns``), beside what uniform attention
  would put there;
* ``classify_layer`` -- a label from those numbers (rules in its docstring).

Every function takes weights as an array (..., n_query, n) of rows that sum to
1 over j <= i; ``queries`` says which positions the rows belong to.
"""

from __future__ import annotations

import numpy as np

REGIONS = ("local", "row", "column", "elsewhere")


def _check_shape(image_shape) -> tuple[int, int, int]:
    if (not isinstance(image_shape, (tuple, list)) or len(image_shape) != 3
            or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in image_shape)):
        raise ValueError(f"image_shape must be (H, W, C) of positive integers, got {image_shape!r}")
    return tuple(int(s) for s in image_shape)


def coordinates(image_shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row, column and channel of every raster position, each of shape (n,)."""
    h, w, c = _check_shape(image_shape)
    pos = np.arange(h * w * c)
    return pos // (w * c), (pos // c) % w, pos % c


def pixel_position(row: int, col: int, image_shape) -> int:
    """Raster position of pixel (row, col), channel 0, in an image of shape (H, W, C)."""
    h, w, c = _check_shape(image_shape)
    if not (0 <= row < h and 0 <= col < w):
        raise ValueError(f"pixel (row, col) must lie in [0, {h}) x [0, {w}), got ({row}, {col})")
    return (row * w + col) * c


def region_masks(image_shape, queries, window: int = 1) -> np.ndarray:
    """bool (4, n_query, n): local / row / column / elsewhere, each restricted to j <= i.

    local:     |row_j - row_i| <= window and |col_j - col_i| <= window
    row:       row_j == row_i, not local
    column:    col_j == col_i, not local
    elsewhere: every other j <= i
    """
    if not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be an integer >= 0, got {window!r}")
    rows, cols, _ = coordinates(image_shape)
    n = rows.size
    q = np.asarray(queries, dtype=np.int64).reshape(-1)
    if q.size == 0 or q.min() < 0 or q.max() >= n:
        raise ValueError(f"queries must be positions in [0, {n}), got {q.tolist()}")
    causal = np.arange(n)[None, :] <= q[:, None]                       # (Q, n)
    dr = np.abs(rows[None, :] - rows[q][:, None])
    dc = np.abs(cols[None, :] - cols[q][:, None])
    local = causal & (dr <= window) & (dc <= window)
    row = causal & (dr == 0) & ~local
    column = causal & (dc == 0) & ~local
    elsewhere = causal & ~local & ~row & ~column
    return np.stack([local, row, column, elsewhere])


def _weights(weights, queries) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(weights, dtype=np.float64)
    q = np.asarray(queries, dtype=np.int64).reshape(-1)
    if a.ndim < 2 or a.shape[-2] != q.size:
        raise ValueError(f"weights must be (..., n_query={q.size}, n), got shape {a.shape}")
    return a, q


def region_mass(weights, image_shape, queries, window: int = 1) -> np.ndarray:
    """Attention mass per region, averaged over the queries: (..., 4) in REGIONS order."""
    a, q = _weights(weights, queries)
    masks = region_masks(image_shape, q, window).astype(np.float64)    # (4, Q, n)
    if a.shape[-1] != masks.shape[-1]:
        raise ValueError(f"weights cover n={a.shape[-1]} keys, image_shape gives {masks.shape[-1]}")
    per_query = np.einsum("...qn,rqn->...rq", a, masks)                # (..., 4, Q)
    return per_query.mean(-1)


def uniform_weights(n: int, queries) -> np.ndarray:
    """Uniform causal attention for the given queries: (n_query, n); a baseline."""
    q = np.asarray(queries, dtype=np.int64).reshape(-1)
    causal = (np.arange(n)[None, :] <= q[:, None]).astype(np.float64)
    return causal / causal.sum(-1, keepdims=True)


def concentration(weights, queries, k: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(normalised entropy, top-k mass), each (...,) averaged over the queries.

    Entropy is divided by log(i + 1), the entropy of uniform attention over the
    i + 1 readable positions (queries with i = 0 are skipped: nothing to spread).
    """
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    a, q = _weights(weights, queries)
    p = np.clip(a, 0.0, None)
    ent = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)               # (..., Q)
    keep = q > 0
    if not keep.any():
        raise ValueError("concentration needs at least one query at position > 0")
    norm_ent = (ent[..., keep] / np.log(q[keep] + 1.0)).mean(-1)
    topk = np.sort(p, axis=-1)[..., -k:].sum(-1).mean(-1)
    return norm_ent, topk


def pattern_mass(weights, pattern_mask, queries) -> np.ndarray:
    """Mass inside a boolean (n, n) pattern for the given queries, averaged: (...,)."""
    a, q = _weights(weights, queries)
    m = np.asarray(pattern_mask, dtype=bool)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[1] != a.shape[-1]:
        raise ValueError(f"pattern_mask must be (n, n) with n={a.shape[-1]}, got {m.shape}")
    return (a * m[q]).sum(-1).mean(-1)


def classify_layer(mass, topk_mass, uniform_mass) -> str:
    """A one-word description of a layer (or head) from its summaries.

    mass, uniform_mass: (4,) region masses (REGIONS order) of the layer and of
    uniform attention. Every rule is relative to uniform attention, because the
    regions differ in size (a 3x3 window holds a few percent of an image).
    Rules, in order:
      "local"       local mass >= 4x uniform's (and at least 0.1);
      "row/column"  row + column mass >= 3x uniform's;
      "sparse"      top-k mass >= 0.7 (a handful of positions take most weight);
      "global"      otherwise (weight spread widely, above all 'elsewhere').
    """
    mass = np.asarray(mass, dtype=np.float64)
    uni = np.asarray(uniform_mass, dtype=np.float64)
    if mass.shape != (4,) or uni.shape != (4,):
        raise ValueError(f"mass and uniform_mass must have shape (4,), "
                         f"got {mass.shape}, {uni.shape}")
    if mass[0] >= 0.1 and mass[0] >= 4 * uni[0]:
        return "local"
    if mass[1] + mass[2] >= 3 * (uni[1] + uni[2]):
        return "row/column"
    if topk_mass >= 0.7:
        return "sparse"
    return "global"
