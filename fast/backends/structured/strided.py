"""The two heads of the strided pattern as dense pieces, without any n x n tensor.

Child et al., 2019, section 4.3 (Fig. 3b) and section 5.5 ("attention with a
stride of k can be computed by transposing the matrix and computing a local
window"; the matrix here is the sequence folded into an (n/l, l) grid). Positions
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

In float32 on the CPU both pieces go through the CPU window kernel
(``fast.backends.cpu_window``, where a C compiler built it): the column as l sequences of M
rows, l rows apart, whose output and gradients it writes in natural order; the band as
one window of l keys per row, merged into the column's output in place
(``LocalBand.forward_into``) and adding into its gradients. What follows describes the
pieces through PyTorch's kernel, which serves every other call.

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

import functools

import torch

from fast.backends import cpu_window
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
    """Query chunk C of the band. Forward: the largest divisor of l up to
    max(8, 2048 / l), so that C l is near 2048 (the smallest divisor from 8 on where
    that one is below 8: a prime l is one chunk); backward: near 64. Small chunks waste
    less of the (C, C + l) rectangle (the band fills l / (C + l) of it); too small ones
    starve the kernel's tiles. Measured with one process, candidates in turns (B = 1,
    H = 4, d = 64, float32, n = 16384; the forward's time for C = 8 / 16 / 32 / 64):
    l = 32: 15.9 / 14.8 / 14.0 ms; l = 64: 22.9 / 20.2 / 19.9 / 25.8; l = 128: 16 and 32
    25.1 / 26.1; l = 256: 51.1 / 58.9 / 57.9 / 63.0. The backward, whose gradient
    windows overlap (C + l) / C times and whose kernel calls come one per overlap
    (``LocalBand.backward``), does better with fewer, larger chunks (l = 128: C = 32 /
    64 / 128 took 130 / 113 / 120 ms); it recomputes from the merged out and lse, so it
    need not chunk as the forward did."""
    if backward:
        for C in (64, 32, 128, 48, 96):
            if l % C == 0 and C <= l:
                return C
        return l
    divisors = [C for C in range(1, l + 1) if l % C == 0]
    C = max(C for C in divisors if C <= max(8, 2048 // l))
    return C if C >= min(8, l) else min(C for C in divisors if C >= 8)   # l = 97: 97


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


WINDOW_KERNEL_MAX = cpu_window.WINDOW_MAX     # the longest band the CPU window kernel takes


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

    def _window(self, *tensors) -> bool:
        """Whether the CPU window kernel takes this call (``cpu_window.usable``; the band of
        the "full" plan, l = N, up to ``WINDOW_KERNEL_MAX`` rows)."""
        return self.l <= WINDOW_KERNEL_MAX and cpu_window.usable(*tensors)

    def forward_into(self, q, k, v, out, lse) -> bool:
        """Merge the band into the group's out (G, N, d) and lse (G, N) in place through
        the CPU window kernel; False (nothing done) where it does not serve the call."""
        if not (self._window(q, k, v, out) and lse.stride(1) == 1):
            return False
        cpu_window.forward(q, k, v, out, lse, window=self.l, scale=self.scale,
                           strict=self.strict, merge=True)
        return True

    def forward(self, q, k, v):
        G, N, d = q.shape
        l, C, p = self.l, self.C, self._prefix
        if self._window(q, k, v):                # every row at once (a strict row 0: lse -inf)
            out, lse = q.new_empty(G, N, d), q.new_empty(G, N)
            cpu_window.forward(q, k, v, out, lse, window=l, scale=self.scale, strict=self.strict)
            return [(0, out, lse)]
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
        if self._window(q, k, v, go, out, *grads) and lse.stride(1) == 1:
            cpu_window.backward(q, k, v, go, out, lse, *grads, window=l, scale=self.scale,
                                strict=self.strict)
            return grads
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


def grid_columns(t: torch.Tensor, l: int) -> torch.Tensor:
    """(G, N, ...) as the transposed grid (G, l, M, ...), a view: column s becomes the
    contiguous-in-index sequence of its M grid rows."""
    return t.unflatten(1, (-1, l)).transpose(1, 2)


def grid_rows(t: torch.Tensor) -> torch.Tensor:
    """Inverse of ``grid_columns``: (G, l, M, ...) -> (G, N, ...), natural row order (a view
    when the kernel laid t out (G, M, l, ...), as it does)."""
    return t.transpose(1, 2).flatten(1, 2)


# From this many grid rows on, the column's (M, M) causal problems split in two: halves
# of at least 192 rows, which the kernel still takes in query blocks of 64 (below 192
# rows it takes 32, and the smaller products cost more than the quarter of the square
# saved; measured with fast.measure.pieces).
SPLIT_ROWS = 384


def corner_rows(M: int) -> int:
    """Grid rows per part of the column's forward below ``SPLIT_ROWS`` (``Column``): 32,
    or M itself (one problem) up to 32 rows. Measured with one process, candidates in
    turns (B = 1, H = 4, d = 64, float32, l = 128; the kernel's time for every column of
    the layer, one causal problem against parts): M = 64: 6.7 against 5.5 ms (parts of
    32); M = 128: 21.0 against 16.7 (32) and 18.0 (64); M = 256: 72.4 against 56.6 (32)
    and 55.5 (64); M = 32: 2.2 against 2.1 (16), too little to cut. In whole calls at
    n = 16384 the forward took 47-49 ms against 50-52 before; the backward gained
    nothing from parts (their gradients need buffers of their own), so it keeps one
    problem."""
    return M if M <= 32 else 32


@functools.lru_cache(maxsize=64)
def corner_mask(R: int, S: int, dtype, device) -> torch.Tensor:
    """Additive (1, 1, R, S) causal mask aligned to the bottom-right corner: query r (the
    key row S - R + r) reads keys t <= S - R + r."""
    r = torch.arange(R, device=device)[:, None] + (S - R)
    t = torch.arange(S, device=device)[None, :]
    mask = torch.zeros(R, S, dtype=dtype, device=device)
    return mask.masked_fill_(t > r, float("-inf"))[None, None]


class Column:
    """A(2) of the strided pattern: every l-th position, (i - j) mod l == 0, j <= i
    (j = i included: a band beside it is strict). Every grid row reads the rows
    before it in its column, so every row is a query and every row a key, and the
    column is causal attention along the M rows of each column: problems of M rows,
    which the kernel's vector loops take whole when M is a multiple of their width
    (a strict column, M - 1 rows, ran slower).

    The kernel skips the upper triangle only by blocks of 512 keys, so a causal
    problem of at most 512 rows costs a full square. So:

    * below ``SPLIT_ROWS`` grid rows, the forward runs in parts of P =
      ``corner_rows(M)`` rows: part u, query rows [u P, (u + 1) P), reads key rows
      [0, (u + 1) P) -- the first plainly causal, the others through a causal mask
      aligned to their last key (``corner_mask``). Every query row is in one part, so
      the parts need no merging among themselves; four parts cost 5/8 of the square.
      The backward stays one problem (``corner_rows``).
    * from ``SPLIT_ROWS`` grid rows on, forward and backward are three problems -- the
      first h = M // 2 rows causal, the last M - h rows causal over their own rows, and
      those same rows over the first h as a plain rectangle (merged with their causal
      part through the lse) -- three quarters of the square.

    Outputs and gradients come back in natural row order (the kernel lays them out
    (G, R, l, d)): a problem over every row gives the group's buffers as they are."""

    def __init__(self, l: int, scale: float):
        self.l, self.scale = l, scale

    def pairs(self, n: int, heads: int) -> int:
        """Pairs ``heads`` rows of G read among rows < n: floor(i / l) + 1 each."""
        whole, rest = divmod(n, self.l)
        return heads * (self.l * whole * (whole - 1) // 2 + rest * whole + n)

    def _parts(self, N: int, backward: bool) -> list[tuple[slice, slice, str]]:
        """[(query grid rows, key grid rows, "causal" | "corner" | "all")]."""
        M = N // self.l
        if M >= SPLIT_ROWS:
            h = M // 2
            return [(slice(0, h), slice(0, h), "causal"), (slice(h, M), slice(0, h), "all"),
                    (slice(h, M), slice(h, M), "causal")]
        P = M if backward else corner_rows(M)
        return [(slice(a, min(M, a + P)), slice(0, min(M, a + P)), "corner" if a else "causal")
                for a in range(0, M, P)]

    def _call(self, kernel, query_side, key_side, qr: slice, kr: slice, kind: str, *after):
        """``kernel`` on one problem: ``query_side`` tensors (G, N, ...) at grid rows qr,
        ``key_side`` at kr, then ``after`` (query side), as (G, l, R, ...) views."""
        c = lambda t, rows: grid_columns(t, self.l)[:, :, rows]            # (G, l, R, ...)
        q = query_side[-1]
        mask = corner_mask(qr.stop - qr.start, kr.stop, q.dtype, q.device) \
            if kind == "corner" else None
        return kernel(*(c(t, qr) for t in query_side), *(c(t, kr) for t in key_side),
                      *(c(t, qr) for t in after), is_causal=kind == "causal", mask=mask,
                      scale=self.scale)

    def forward(self, q, k, v):
        G, N, d = q.shape
        if cpu_window.usable(q, k, v):        # l sequences of M rows, l rows apart
            out, lse = q.new_empty(G, N, d), q.new_empty(G, N)
            cpu_window.forward(q, k, v, out, lse, window=N // self.l, scale=self.scale,
                               sequences=self.l, rows=N // self.l, step=self.l, seqoff=1)
            return [(0, out, lse)]
        chunks = []
        for qr, kr, kind in self._parts(q.shape[1], backward=False):
            o, lse = self._call(attention_forward, (q,), (k, v), qr, kr, kind)  # (G, l, R, d)
            chunks.append((qr.start * self.l, grid_rows(o), grid_rows(lse)))
        return chunks

    def backward(self, q, k, v, go, out, lse, grads=None):
        G, N, d = q.shape
        if (cpu_window.usable(q, k, v, go, out, *(grads or ())) and lse.stride(1) == 1):
            # fresh: the kernel writes every row once (init), which packed sequences alone
            # allow (l >= 2); at l = 1 the column is one sequence, added into zeros
            fresh = grads is None and self.l > 1
            if grads is None:
                grads = [q.new_empty(G, N, d) if fresh else q.new_zeros(G, N, d)
                         for _ in range(3)]
            cpu_window.backward(q, k, v, go, out, lse, *grads, window=N // self.l,
                                scale=self.scale, init=fresh, sequences=self.l,
                                rows=N // self.l, step=self.l, seqoff=1)
            return grads
        parts = self._parts(q.shape[1], backward=True)
        fresh = grads is None                 # then the parts write first, add after
        if fresh and len(parts) > 1:
            grads = [torch.empty_like(q) for _ in range(3)]
        written = set()                       # (buffer, first row) of the rows written
        for qr, kr, kind in parts:
            g = self._call(attention_backward, (go, q), (k, v), qr, kr, kind, out, lse)
            g = [grid_rows(t) for t in g]              # (G, R l, d), natural order: no copy
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
