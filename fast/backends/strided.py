"""The two heads of the strided pattern as dense pieces, without any n x n tensor.

Child et al., 2019, section 4.3 (Fig. 3b) and section 5.5 ("a stride-l pattern
is computed by transposing the sequence into an (n/l, l) grid"). Positions
i = r l + s sit at row r, column s of that grid (n padded up to N = M l).

* ``Column`` -- A(2), (i - j) mod l == 0, j <= i. Transposing the grid makes
  every column a contiguous sequence of M rows, and the column head is causal
  attention along it: one batch of (M, M) causal problems over views of q, k,
  v. The kernel lays its outputs out (G, M, l, d): back in the natural order,
  the column's output and gradients cover every row, so the merged head keeps
  them as its own buffers and merges or adds the band into them (no buffer, no
  zero-fill, no copy of its own).
* ``LocalBand`` -- A(1), 0 <= i - j < l; beside the column (the merged head) it
  is ``strict``, 0 < i - j < l, since j = i is the column's: no position is
  counted twice. Block 0 is plain causal attention (for strict, queries [1, l)
  over keys [0, l - 1)). From row l on, queries go in chunks of C rows (C
  divides l); chunk w reads the C + l keys before and at it, a strided window
  of k (no copy), through a fixed (C, C + l) band mask (``band_mask``). Its
  backward gets each chunk's key and value gradients as (C + l)-row windows,
  which overlap J = (C + l) / C times; it chunks by its own, larger C
  (``band_chunk(l, backward=True)``: fewer overlaps), since it recomputes from
  the merged out and lse. It runs the chunks in J classes, chunk w in class
  w mod J: a class's windows are disjoint and adjacent, so each class's
  gradients land in dk and dv by one addition each (no fold), and each class
  (cut further by ``flash_cpu.spans`` when large) is a kernel output small
  enough for the allocator to reuse.

Each piece returns (start_row, out, lse) chunks -- out (G, R, d) in natural row
order, or (G, R1, R2, d) with R1 R2 consecutive rows blocked as the kernel left
them -- and its backward, given the merged out and lse (see
``fast.backends.flash_cpu``), adds its share of the gradient into the group's
buffers [dq, dk, dv] (G, N, d) and returns them; the group's first piece gets
None and returns new ones. ``pairs(n, heads)`` counts the (query, key) pairs
that ``heads`` rows of G read through the piece among the first n positions
(its share of the ideal work). Tensors are (G, N, d), G = batch x heads, rows
of stride d (G may be strided).
"""

from __future__ import annotations

import torch

from fast.backends.flash_cpu import attention_backward, attention_forward, spans

_MASKS: dict = {}


def band_mask(C: int, l: int, strict: bool, dtype, device) -> torch.Tensor:
    """Additive (1, 1, C, C + l) mask: query s of a chunk reads window key t iff
    s < t <= s + l (the window starts l positions before the chunk; t = s + l is
    the query itself), or s < t < s + l if strict."""
    key = ("band", C, l, strict, dtype, device)
    if key not in _MASKS:
        s = torch.arange(C, device=device)[:, None]
        t = torch.arange(C + l, device=device)[None, :]
        allowed = (t > s) & (t < s + l + int(not strict))               # (C, C + l)
        mask = torch.zeros(C, C + l, dtype=dtype, device=device)
        _MASKS[key] = mask.masked_fill_(~allowed, float("-inf"))[None, None]
    return _MASKS[key]


def band_chunk(l: int, backward: bool = False) -> int:
    """Query chunk C of the band: a divisor of l near 32 (near 64 for the backward).
    Small chunks waste less of the (C, C + l) rectangle (the band fills l / (C + l)
    of it); too small ones starve the kernel's tiles. The backward, whose
    gradient windows overlap (C + l) / C times and whose kernel calls come one per
    overlap (``LocalBand.backward``), does better with fewer, larger chunks; it
    recomputes from the merged out and lse, so it need not chunk as the forward did."""
    for C in ((64, 32, 128, 48, 96) if backward else (32, 64, 16, 48, 24, 40, 56)):
        if l % C == 0 and C <= l:
            return C
    return l


def _windows(t: torch.Tensor, l: int, C: int, a: int = 0, b: int | None = None,
             step: int = 1) -> torch.Tensor:
    """Key windows a, a + step, ... (below b), a view: (G, N, d) -> (G, count, C + l, d),
    window w = rows [w C, w C + C + l), the keys of query chunk w (rows l + w C ...)."""
    G, N, d = t.shape
    b = (N - l) // C if b is None else b
    count = len(range(a, b, step))
    return t.as_strided((G, count, C + l, d),
                        (t.stride(0), step * C * t.stride(1), t.stride(1), 1),
                        t.storage_offset() + a * C * t.stride(1))


class LocalBand:
    """A(1) of the strided pattern: the last l positions, i itself included
    (0 <= i - j < l), or without i (``strict``: 0 < i - j < l, beside the column)."""

    def __init__(self, l: int, scale: float, strict: bool = False):
        self.l, self.scale, self.strict = l, scale, strict
        self.C, self.C_back = band_chunk(l), band_chunk(l, backward=True)

    def pairs(self, n: int, heads: int) -> int:
        """Pairs ``heads`` rows of G read among rows < n: sum of min(i + 1, l) each
        (one fewer per row if strict)."""
        l, full = self.l, max(0, n - self.l)
        first = min(n, l)
        return heads * (first * (first + 1) // 2 + full * l - (n if self.strict else 0))

    def _slabs(self, q) -> list[tuple[int, int]]:
        """Ranges of the forward's chunks whose outputs (C rows of (G, d) each) fit a
        slab (``flash_cpu.spans``)."""
        G, N, d = q.shape
        return spans((N - self.l) // self.C, G * self.C * d * q.element_size())

    def _prefix(self, t, keys: bool):
        """Block 0 as one causal problem (G, 1, L, ...): rows [0, l), or, if strict,
        queries [1, l) over keys [0, l - 1) (row i then reads j < i)."""
        l = self.l
        if not self.strict:
            return t[:, :l].unsqueeze(1)
        return (t[:, :l - 1] if keys else t[:, 1:l]).unsqueeze(1)

    def forward(self, q, k, v):
        G, N, d = q.shape
        l, C, p = self.l, self.C, self._prefix
        chunks = []
        if l > int(self.strict):                   # block 0 (rows [1, l) if strict)
            o, lse = attention_forward(p(q, False), p(k, True), p(v, True), is_causal=True,
                                       scale=self.scale)                # (G, 1, L, d)
            chunks.append((int(self.strict), o[:, 0], lse[:, 0]))
        if N > l:
            qb = q[:, l:].unflatten(1, (-1, C))                          # (G, nc, C, d)
            mask = band_mask(C, l, self.strict, q.dtype, q.device)
            for a, b in self._slabs(q):
                o, lse = attention_forward(qb[:, a:b], _windows(k, l, C, a, b),
                                           _windows(v, l, C, a, b), mask=mask,
                                           scale=self.scale)            # (G, b-a, C, d)
                chunks.append((l + a * C, o, lse))  # rows blocked (b-a, C): no copy
        return chunks

    def backward(self, q, k, v, go, out, lse, grads=None):
        G, N, d = q.shape
        l, C, p = self.l, self.C_back, self._prefix
        if grads is None:
            grads = [torch.zeros_like(q) for _ in range(3)]
        dq, dk, dv = grads
        if l > int(self.strict):
            g = attention_backward(p(go, False), p(q, False), p(k, True), p(v, True),
                                   p(out, False), p(lse, False), is_causal=True,
                                   scale=self.scale)                  # (G, 1, L, d) each
            for acc, grad, keys in zip((dq, dk, dv), g, (False, True, True)):
                p(acc, keys).add_(grad)
        if N == l:
            return grads
        rows = lambda t: t[:, l:].unflatten(1, (-1, C))                 # (G, nc, C, ...)
        mask = band_mask(C, l, self.strict, q.dtype, q.device)
        nc, J = (N - l) // C, (C + l) // C
        for r in range(J):
            # chunks r, r + J, ...: their windows (J C = C + l rows each) are disjoint and
            # adjacent, so their gradients land in dk, dv by one addition each
            count = len(range(r, nc, J))
            for a, b in spans(count, G * (C + l) * d * q.element_size()):
                w = slice(r + a * J, r + b * J, J)                     # its chunks a..b-1
                dqb, dkw, dvw = attention_backward(
                    rows(go)[:, w], rows(q)[:, w], _windows(k, l, C, w.start, w.stop, J),
                    _windows(v, l, C, w.start, w.stop, J), rows(out)[:, w], rows(lse)[:, w],
                    mask=mask, scale=self.scale)   # dqb (G, b - a, C, d); dkw (G, b-a, C+l, d)
                rows(dq)[:, w].add_(dqb)
                w0 = w.start
                keys = slice(w0 * C, w0 * C + (b - a) * (C + l))
                dk[:, keys].unflatten(1, (b - a, C + l)).add_(dkw)
                dv[:, keys].unflatten(1, (b - a, C + l)).add_(dvw)
        return grads


def _columns(t: torch.Tensor, l: int) -> torch.Tensor:
    """(G, N, ...) as the transposed grid (G, l, M, ...), a view: column s becomes the
    contiguous-in-index sequence of its M grid rows."""
    return t.unflatten(1, (-1, l)).transpose(1, 2)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Inverse of ``_columns``: (G, l, M, ...) -> (G, N, ...), natural row order (a view
    when the kernel laid t out (G, M, l, ...), as it does)."""
    return t.transpose(1, 2).flatten(1, 2)


# The column splits its (M, M) causal problems in two from this many grid rows on:
# halves of at least 192 rows, which the kernel still takes in query blocks of 64
# (below 192 rows it takes 32, and the smaller products cost more than the quarter
# of the square saved; measured with fast.measure.pieces).
SPLIT_ROWS = 384


class Column:
    """A(2) of the strided pattern: every l-th position, (i - j) mod l == 0, j <= i
    (j = i included: a band beside it is strict). Every grid row reads the rows
    before it in its column, so every row is a query and every row a key, and the
    column is causal attention along the M rows of each column: problems of M rows,
    which the kernel's vector loops take whole when M is a multiple of their width
    (a strict column, M - 1 rows, ran slower).

    The kernel skips the upper triangle only by blocks of 512 keys, so a causal
    problem of at most 512 rows costs a full square. From ``SPLIT_ROWS`` grid rows
    on, the column is three problems instead -- the first h = M // 2 rows causal,
    the last M - h rows causal over their own rows, and those same rows over the
    first h as a plain rectangle (merged with their causal part through the lse)
    -- three quarters of the square."""

    def __init__(self, l: int, scale: float):
        self.l, self.scale = l, scale

    def pairs(self, n: int, heads: int) -> int:
        """Pairs ``heads`` rows of G read among rows < n: floor(i / l) + 1 each."""
        whole, rest = divmod(n, self.l)
        return heads * (self.l * whole * (whole - 1) // 2 + rest * whole + n)

    def _parts(self, N: int):
        """[(query grid rows, key grid rows, causal)] of the column's problems."""
        M = N // self.l
        if M < SPLIT_ROWS:
            return [(slice(0, M), slice(0, M), True)]
        h = M // 2
        return [(slice(0, h), slice(0, h), True), (slice(h, M), slice(0, h), False),
                (slice(h, M), slice(h, M), True)]

    def forward(self, q, k, v):
        c = lambda t, rows: _columns(t, self.l)[:, :, rows]            # (G, l, R, ...)
        chunks = []
        for qr, kr, causal in self._parts(q.shape[1]):
            o, lse = attention_forward(c(q, qr), c(k, kr), c(v, kr), is_causal=causal,
                                       scale=self.scale)                # (G, l, R, d)
            chunks.append((qr.start * self.l, _rows(o), _rows(lse)))
        return chunks

    def backward(self, q, k, v, go, out, lse, grads=None):
        c = lambda t, rows: _columns(t, self.l)[:, :, rows]            # (G, l, R, ...)
        parts = self._parts(q.shape[1])
        fresh = grads is None                 # then the parts write first, add after
        if fresh and len(parts) > 1:
            grads = [torch.empty_like(q) for _ in range(3)]
        written = set()                       # (buffer, first row) of the rows written
        for qr, kr, causal in parts:
            g = attention_backward(c(go, qr), c(q, qr), c(k, kr), c(v, kr), c(out, qr),
                                   c(lse, qr), is_causal=causal,
                                   scale=self.scale)                    # (G, l, R, d) each
            g = [_rows(t) for t in g]              # (G, R l, d), natural order: no copy
            if grads is None:
                return g                           # alone: the kernel's own tensors
            for i, (acc, grad, rows) in enumerate(zip(grads, g, (qr, kr, kr))):
                dst = acc[:, rows.start * self.l:rows.stop * self.l]
                if fresh and (i, rows.start) not in written:   # [0, h) or [h, M), first
                    dst.copy_(grad)
                    written.add((i, rows.start))
                else:
                    dst.add_(grad)
        return grads
