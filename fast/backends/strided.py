"""The two heads of the strided pattern as dense pieces, without any n x n tensor.

Child et al., 2019, section 4.3 (Fig. 3b) and section 5.5 ("a stride-l pattern
is computed by transposing the sequence into an (n/l, l) grid"). Positions
i = r l + s sit at row r, column s of that grid (n padded up to N = M l).

* ``LocalBand`` -- A(1), 0 <= i - j < l. Block 0 (rows [0, l)) is plain causal
  attention (``flash_cpu.causal_prefix_forward``, shared with the fixed merged
  head). From row l on, queries go in chunks of C rows (C divides l); chunk
  w reads the C + l keys before and at it, a strided window of k (no copy),
  through a fixed (C, C + l) band mask  s < t <= s + l  (query s, key t).
  Its backward gets each chunk's key and value gradients as (C + l)-row
  windows, which overlap (C + l) / C times; they are folded back into dk, dv
  slab by slab (``flash_cpu.spans``), so the windows of one slab are small and
  still in cache when folded.
* ``Column`` -- A(2), (i - j) mod l == 0. Transposing the grid makes every
  column a contiguous sequence of M rows, and the column head is causal
  attention along it. With ``strict=True`` the key row r reads only rows < r
  (the diagonal j = i already belongs to the local band), which is what the
  merged head needs so that no position is counted twice. The kernel returns
  the gradients of the transposed problem in natural row order (its outputs
  are laid out (G, R, l, d)), so they are written back in one pass; as the
  first piece of a backward it writes them instead of adding (``init``).

Each piece returns (start_row, out, lse) chunks -- out (G, R, d) in natural row
order, or (G, R1, R2, d) with R1 R2 consecutive rows blocked as the kernel left
them -- and its backward adds its share of the gradient given the merged out and
lse (see ``fast.backends.flash_cpu``); with ``init=True`` the gradient buffers
hold garbage and the piece writes every row of them. ``pairs(n, heads)`` counts
the (query, key) pairs that ``heads`` rows of G read through the piece among the
first n positions (its share of the ideal work).
Tensors are (G, N, d), G = batch x heads, rows of stride d (G may be strided).
"""

from __future__ import annotations

import torch

from fast.backends.flash_cpu import (
    attention_backward,
    attention_forward,
    causal_prefix_backward,
    causal_prefix_forward,
    spans,
)

_MASKS: dict = {}


def band_mask(C: int, l: int, dtype, device) -> torch.Tensor:
    """Additive (1, 1, C, C + l) mask: query s of a chunk reads window key t iff
    s < t <= s + l (the window starts l positions before the chunk)."""
    key = ("band", C, l, dtype, device)
    if key not in _MASKS:
        s = torch.arange(C, device=device)[:, None]
        t = torch.arange(C + l, device=device)[None, :]
        allowed = (t > s) & (t <= s + l)                                # (C, C + l)
        mask = torch.zeros(C, C + l, dtype=dtype, device=device)
        _MASKS[key] = mask.masked_fill_(~allowed, float("-inf"))[None, None]
    return _MASKS[key]


def band_chunk(l: int) -> int:
    """Query chunk C of the band: a divisor of l near 32. Small chunks waste less
    of the (C, C + l) rectangle (the band fills l / (C + l) of it); too small
    ones starve the kernel's tiles."""
    for C in (32, 64, 16, 48, 24, 40, 56):
        if l % C == 0 and C <= l:
            return C
    return l


def _windows(t: torch.Tensor, l: int, C: int, a: int = 0, b: int | None = None) -> torch.Tensor:
    """Overlapping key windows a..b-1, a view: (G, N, d) -> (G, b - a, C + l, d),
    window w = rows [w C, w C + C + l), the keys of query chunk w (rows l + w C ...)."""
    G, N, d = t.shape
    b = (N - l) // C if b is None else b
    return t.as_strided((G, b - a, C + l, d), (t.stride(0), C * t.stride(1), t.stride(1), 1),
                        t.storage_offset() + a * C * t.stride(1))


def _fold_add(dst: torch.Tensor, dwin: torch.Tensor, C: int) -> None:
    """dst (G, R, d) += the overlapping windows dwin (G, nc, C + l, d), window w
    starting at row w C (the inverse of ``_windows``): window w's slice j (rows
    j C .. j C + C) lands at chunk w + j. R = nc C + l."""
    G, R, d = dst.shape
    nc, width = dwin.shape[1], dwin.shape[2]
    chunks = dst.view(G, R // C, C, d)                                  # (G, R/C, C, d)
    for j in range(width // C):
        chunks[:, j:j + nc].add_(dwin[:, :, j * C:(j + 1) * C])


class LocalBand:
    """A(1) of the strided pattern: the last l positions, i itself included."""

    def __init__(self, l: int, scale: float):
        self.l, self.scale, self.C = l, scale, band_chunk(l)

    def pairs(self, n: int, heads: int) -> int:
        """Pairs ``heads`` rows of G read among rows < n: sum of min(i + 1, l) each."""
        l, full = self.l, max(0, n - self.l)
        first = min(n, l)
        return heads * (first * (first + 1) // 2 + full * l)

    def _slabs(self, q, rows: int) -> list[tuple[int, int]]:
        """Chunk ranges whose kernel outputs, ``rows`` rows of (G, d) per chunk (C for
        the forward's output, C + l for the backward's key and value windows), fit
        a slab (``flash_cpu.spans``)."""
        G, N, d = q.shape
        return spans((N - self.l) // self.C, G * rows * d * q.element_size())

    def forward(self, q, k, v):
        G, N, d = q.shape
        l, C = self.l, self.C
        chunks = [(0, *causal_prefix_forward(q, k, v, l, self.scale))]  # block 0: (G, l, d)
        if N > l:
            qb = q[:, l:].unflatten(1, (-1, C))                          # (G, nc, C, d)
            mask = band_mask(C, l, q.dtype, q.device)
            for a, b in self._slabs(q, C):
                o, lse = attention_forward(qb[:, a:b], _windows(k, l, C, a, b),
                                           _windows(v, l, C, a, b), mask=mask,
                                           scale=self.scale)            # (G, b-a, C, d)
                chunks.append((l + a * C, o, lse))  # rows blocked (b-a, C): no copy
        return chunks

    def backward(self, q, k, v, go, out, lse, dq, dk, dv, init: bool = False):
        G, N, d = q.shape
        l, C = self.l, self.C
        if init:
            for g in (dq, dk, dv):
                g.zero_()
        causal_prefix_backward(q, k, v, go, out, lse, dq, dk, dv, l, self.scale)
        if N == l:
            return
        rows = lambda t: t[:, l:].unflatten(1, (-1, C))                 # (G, nc, C, ...)
        mask = band_mask(C, l, q.dtype, q.device)
        for a, b in self._slabs(q, C + l):
            dqb, dkw, dvw = attention_backward(
                rows(go)[:, a:b], rows(q)[:, a:b], _windows(k, l, C, a, b),
                _windows(v, l, C, a, b), rows(out)[:, a:b], rows(lse)[:, a:b], mask=mask,
                scale=self.scale)                   # dqb (G, b-a, C, d); dkw (G, b-a, C+l, d)
            rows(dq)[:, a:b].add_(dqb)
            _fold_add(dk[:, a * C:b * C + l], dkw, C)
            _fold_add(dv[:, a * C:b * C + l], dvw, C)


def _columns(t: torch.Tensor, l: int, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of (G, N, ...) as the transposed grid (G, l, R, ...), a view:
    column s becomes the contiguous-in-index sequence of its R grid rows."""
    return t[:, start:stop].unflatten(1, (-1, l)).transpose(1, 2)


class Column:
    """A(2) of the strided pattern: every l-th earlier position, (i - j) mod l == 0.
    strict=True leaves out j = i (for the merged head)."""

    def __init__(self, l: int, scale: float, strict: bool):
        self.l, self.scale, self.strict = l, scale, strict

    def pairs(self, n: int, heads: int) -> int:
        """Pairs ``heads`` rows of G read among rows < n: floor(i / l) each (+ 1 for
        j = i unless strict)."""
        whole, rest = divmod(n, self.l)
        earlier = self.l * whole * (whole - 1) // 2 + rest * whole
        return heads * (earlier if self.strict else earlier + n)

    def _qkv_rows(self, N: int):
        """(query rows, key rows): grid row r reads key rows <= r, or < r if strict."""
        l = self.l
        return ((l, N), (0, N - l)) if self.strict else ((0, N), (0, N))

    def forward(self, q, k, v):
        G, N, d = q.shape
        (qa, qb), (ka, kb) = self._qkv_rows(N)
        if qb <= qa:
            return []
        o, lse = attention_forward(_columns(q, self.l, qa, qb), _columns(k, self.l, ka, kb),
                                   _columns(v, self.l, ka, kb), is_causal=True,
                                   scale=self.scale)                    # (G, l, R, d)
        return [(qa, o.transpose(1, 2).flatten(1, 2), lse.transpose(1, 2).flatten(1, 2))]

    def backward(self, q, k, v, go, out, lse, dq, dk, dv, init: bool = False):
        G, N, d = q.shape
        (qa, qb), (ka, kb) = self._qkv_rows(N)
        if qb <= qa:
            if init:
                for g in (dq, dk, dv):
                    g.zero_()
            return
        l = self.l
        g = attention_backward(_columns(go, l, qa, qb), _columns(q, l, qa, qb),
                               _columns(k, l, ka, kb), _columns(v, l, ka, kb),
                               _columns(out, l, qa, qb), _columns(lse, l, qa, qb),
                               is_causal=True, scale=self.scale)      # (G, l, R, d) each
        for acc, grad, (a, b) in zip((dq, dk, dv), g, ((qa, qb), (ka, kb), (ka, kb))):
            grad = grad.transpose(1, 2).flatten(1, 2)                   # (G, b - a, d) natural
            if init:
                acc[:, a:b].copy_(grad)
                acc[:, :a].zero_()
                acc[:, b:].zero_()
            else:
                acc[:, a:b].add_(grad)
