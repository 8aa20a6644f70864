"""Where does a trained model look? Summaries of attention weights over images.

Child et al., 2019, sec. 4.1 and Figure 2 (both in sec. 4): a 128-layer dense
network trained on CIFAR-10 learns attention that is local in early layers (like convolution),
splits into row and column attention in some middle layers, is global and
data-dependent in others, and is very sparse in late layers. Those observations
motivated the strided pattern (sec. 4.3). This file turns attention weights
into the numbers behind such statements, for an image of shape (H, W, C)
flattened in raster order (row, column, channel):

* ``coordinates`` / ``pixel_position`` -- raster position <-> (row, column, channel);
* ``split_start`` -- weights over the model's input positions (key 0 = the start
  token, key j = pixel j - 1) -> weights over pixels, and the start token's mass;
* ``region_masks`` / ``region_mass`` -- for one query pixel, which earlier pixels
  are *local* (within ``window`` rows and columns), in its *row*, in its *column*,
  or *elsewhere* (disjoint, covering every earlier pixel), and the mass in each;
* ``concentration`` -- normalised entropy (1 = uniform over the readable
  positions, 0 = one position) and the mass of the ``k`` largest weights;
* ``image_entropy`` -- the same entropy over the pixels alone (start token left
  out, the rest renormalised), against uniform attention over the pixels the
  query may read (all earlier pixels, or those inside a sparse pattern): is the
  image part spread or concentrated?
* ``data_dependence`` -- how much a head's weights for one query change from
  image to image (0 = a fixed, position-only pattern such as uniform or local
  attention; 1 = disjoint positions in every image): the paper's
  "data-dependent" attention, measured;
* ``pattern_mass`` -- the mass inside a boolean pattern (e.g. the strided pattern
  of ``reference.patterns``), beside what uniform attention would put there;
* ``head_statistics`` -- all of the above for every head, and the same numbers
  for uniform causal attention, the baseline they are read against;
* ``label_head`` -- one word per head from those numbers, by the rule below.

The labelling rule (``label_head``), applied in order; "share" is a fraction of
the mass on pixels (the start token's mass left out), "most" means at least
``MOST`` = 0.5:

1. "start sink"  the start token takes most of the mass (a head that looks
                 nowhere parks its weight there);
2. "local"       most pixel mass lies within ``window`` rows and columns of the
                 query pixel;
3. "row" / "column" / "row+column"  most pixel mass lies on the query's row, on
                 its column, or on the two together (outside the local window);
4. "global"      the pixel mass is spread: image entropy >= ``SPREAD`` = 0.8 of
                 uniform attention's;
5. "concentrated"  image entropy <= ``CONCENTRATED`` = 0.5 of uniform's, i.e. the
                 mass sits on about sqrt(m) of the m readable pixels or fewer (the
                 number one sparse head reads), and they are neither near nor on
                 the query's row or column: the paper's "sparse" layers;
6. "mixed"       none of the above.

Every function takes weights as an array (..., n_query, n) of rows that sum to
1 over j <= i; ``queries`` says which positions the rows belong to.
"""

from __future__ import annotations

import numpy as np

REGIONS = ("local", "row", "column", "elsewhere")
LABELS = ("start sink", "local", "row", "column", "row+column", "global", "concentrated",
          "mixed")
MOST = 0.5          # "most of the mass"
SPREAD = 0.8        # image entropy, as a fraction of uniform attention's, that counts as spread
CONCENTRATED = 0.5  # ... and at most this: about sqrt(m) of m pixels carry the mass


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


def split_start(weights) -> tuple[np.ndarray, np.ndarray]:
    """Position-space weights (..., n) -> (pixel-space weights (..., n), start-token mass (...)).

    The model reads an image shifted right by the start token: key position j
    holds pixel j - 1 and key 0 the start token, so pixel p's weight is column
    p + 1; the last pixel is never read (its column stays 0).
    """
    a = np.asarray(weights)
    pix = np.zeros_like(a)
    pix[..., :-1] = a[..., 1:]
    return pix, a[..., 0]


def _queries(queries, n: int) -> np.ndarray:
    q = np.asarray(queries, dtype=np.int64).reshape(-1)
    if q.size == 0 or q.min() < 0 or q.max() >= n:
        raise ValueError(f"queries must be positions in [0, {n}), got {q.tolist()}")
    return q


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
    q = _queries(queries, rows.size)
    causal = np.arange(rows.size)[None, :] <= q[:, None]                # (Q, n)
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


def _readable(n: int, q: np.ndarray, mask=None) -> np.ndarray:
    """bool (Q, n): the positions each query may read (causal, and inside ``mask``)."""
    causal = np.arange(n)[None, :] <= q[:, None]
    if mask is None:
        return causal
    m = np.asarray(mask, dtype=bool)
    if m.shape != (n, n):
        raise ValueError(f"mask must be (n, n) with n={n}, got {m.shape}")
    return causal & m[q]


def uniform_weights(n: int, queries, mask=None) -> np.ndarray:
    """Uniform attention over what each query may read (causal, inside ``mask`` if given):
    (n_query, n); the baseline every learned number is read against."""
    q = _queries(queries, n)
    readable = _readable(n, q, mask).astype(np.float64)
    count = readable.sum(-1, keepdims=True)
    if (count == 0).any():
        raise ValueError("every query must be able to read at least one position")
    return readable / count


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)


def concentration(weights, queries, k: int = 8, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """(normalised entropy, top-k mass), each (...,) averaged over the queries.

    Entropy is divided by log(m), the entropy of uniform attention over the m
    positions the query may read (i + 1, or fewer inside ``mask``); queries
    with m = 1 are skipped: nothing to spread.
    """
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    a, q = _weights(weights, queries)
    p = np.clip(a, 0.0, None)
    count = _readable(a.shape[-1], q, mask).sum(-1)                    # (Q,)
    keep = count > 1
    if not keep.any():
        raise ValueError("concentration needs at least one query that reads two positions")
    norm_ent = (_entropy(p)[..., keep] / np.log(count[keep])).mean(-1)
    topk = np.sort(p, axis=-1)[..., -k:].sum(-1).mean(-1)
    return norm_ent, topk


def image_entropy(pixel_weights, queries, mask=None) -> np.ndarray:
    """Entropy of the pixel part alone, renormalised, over log(pixels readable): (...,).

    pixel_weights: (..., Q, n) over pixels (``split_start``). Query position i
    may read pixels 0..i-1, or, with a position mask (n, n), the pixels j - 1 of
    the positions j >= 1 it allows. Queries reading fewer than two pixels are
    skipped; rows with no pixel mass count as concentrated (entropy 0).
    """
    a, q = _weights(pixel_weights, queries)
    count = _readable(a.shape[-1], q, mask)[:, 1:].sum(-1)              # (Q,) pixels
    keep = count >= 2
    if not keep.any():
        raise ValueError("image_entropy needs at least one query that reads two pixels")
    p = np.clip(a[..., keep, :], 0.0, None)
    total = p.sum(-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    return (_entropy(p) / np.log(count[keep])).mean(-1)


def data_dependence(weights) -> np.ndarray:
    """Mean total-variation distance between a head's weights on each image and its
    mean weights over the images, for the same query: (...,) from (..., B, Q, n).

    0 when every image gets the same weights (a position-only pattern), up to
    1 - 1/B when each image's weights sit on positions no other image uses.
    """
    a = np.asarray(weights, dtype=np.float64)
    if a.ndim < 3 or a.shape[-3] < 2:
        raise ValueError(f"weights must be (..., B >= 2 images, Q, n), got shape {a.shape}")
    mean = a.mean(-3, keepdims=True)
    return 0.5 * np.abs(a - mean).sum(-1).mean((-1, -2))


def pattern_mass(weights, pattern_mask, queries) -> np.ndarray:
    """Mass inside a boolean (n, n) pattern for the given queries, averaged: (...,)."""
    a, q = _weights(weights, queries)
    m = np.asarray(pattern_mask, dtype=bool)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[1] != a.shape[-1]:
        raise ValueError(f"pattern_mask must be (n, n) with n={a.shape[-1]}, got {m.shape}")
    return (a * m[q]).sum(-1).mean(-1)


def label_head(start, shares, spread) -> str:
    """One word for a head (rules in the module docstring, applied in order).

    start: its mass on the start token; shares: (4,) its pixel mass in REGIONS
    order as fractions of the pixel mass (they sum to 1); spread: its image
    entropy as a fraction of uniform attention's.
    """
    shares = np.asarray(shares, dtype=np.float64)
    if shares.shape != (4,):
        raise ValueError(f"shares must have shape (4,) in {REGIONS} order, got {shares.shape}")
    local, row, column, _ = shares
    if start >= MOST:
        return "start sink"
    if local >= MOST:
        return "local"
    if row >= MOST:
        return "row"
    if column >= MOST:
        return "column"
    if row + column >= MOST:
        return "row+column"
    if spread >= SPREAD:
        return "global"
    if spread <= CONCENTRATED:
        return "concentrated"
    return "mixed"


def measured_heads(labels) -> list[int]:
    """The heads a layer's statistics are taken over, given its heads' labels
    (``label_head``): every head but the start sinks, whose pixel numbers describe only
    the small rest of their mass; every head when all of them are sinks."""
    kept = [h for h, label in enumerate(labels) if label != "start sink"]
    return kept or list(range(len(labels)))


def head_statistics(weights, image_shape, queries, window: int = 1, k: int = 8,
                    mask=None) -> dict:
    """Every number behind a head's label, averaged over the queries; the leading axes
    of ``weights`` (..., Q, n) stay (e.g. (L, H)).

    weights are over the model's input positions (key 0 = start token); mask: the
    (n, n) positions a sparse model may read (entropies are then taken against
    uniform attention inside it). Returns arrays: "start", "mass" (..., 4) over
    pixels in REGIONS order (they sum to 1 - start), "shares" (mass / pixel
    mass), "entropy" (over every readable position, start included),
    "image_entropy", "topk", and "labels" (nested lists of ``label_head``).
    """
    a, q = _weights(weights, queries)
    pix, start = split_start(a)
    mass = region_mass(pix, image_shape, q, window)                    # (..., 4)
    start = start.mean(-1)
    pixel_total = mass.sum(-1, keepdims=True)
    shares = np.divide(mass, pixel_total, out=np.zeros_like(mass), where=pixel_total > 0)
    ent, top = concentration(a, q, k, mask)
    spread = image_entropy(pix, q, mask)
    flat = [label_head(s, sh, sp) for s, sh, sp in
            zip(start.reshape(-1), shares.reshape(-1, 4), spread.reshape(-1))]
    labels = np.array(flat, dtype=object).reshape(start.shape).tolist()
    return {"start": start, "mass": mass, "shares": shares, "entropy": ent,
            "image_entropy": spread, "topk": top, "labels": labels}
