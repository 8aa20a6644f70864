"""The two heads of the fixed pattern as dense pieces, without any n x n tensor.

Child et al., 2019, section 4.3 (Fig. 3c) and section 5.5 ("fixed positions are
gathered and computed in blocks"). Blocks of length l (n padded up to N = M l);
the summary positions of a head are [lo, hi) = ``summary_range(l, c, rank)``
inside every block, hi - lo = c.

* ``BlockCausal``  -- A(1): causal attention inside each block, one batch of M
  (l, l) causal problems.
* ``SummaryEarlier`` -- the summaries of strictly earlier blocks: query block
  b >= 1 reads the gathered keys of blocks 0 .. b-1 (b c keys, a prefix of the
  gathered sequence, so no mask at all: one call per query block).
  This is all the merged head needs from A(2): its own block's summary
  positions j <= i are already in A(1), so nothing is counted twice.
* ``SummaryOwn``   -- the summary positions of the query's own block that it
  may read (lo + u <= s for query s): needed when A(2) stands alone (multihead,
  interleaved). One batch of M (l, c) problems with a fixed (l, c) mask; rows
  s < lo read nothing there (lse set to -inf).

Pieces return (start_row, out, lse) chunks in natural order and add their share
of the gradient given the merged out and lse. Tensors are (G, N, d), contiguous.
"""

from __future__ import annotations

import torch

from fast.flash_cpu import attention_backward, attention_forward

_MASKS: dict = {}


def _summary_positions(M: int, l: int, lo: int, c: int, device) -> torch.Tensor:
    """Positions of the summaries of blocks 0..M-1, block-major: (M c,)."""
    return (torch.arange(M, device=device)[:, None] * l + lo
            + torch.arange(c, device=device)[None, :]).flatten()


def own_mask(l: int, lo: int, c: int, dtype, device) -> torch.Tensor:
    """Additive (1, 1, l, c) mask: query s reads its block's summary u iff lo + u <= s."""
    key = (l, lo, c, dtype, device)
    if key not in _MASKS:
        s = torch.arange(l, device=device)[:, None]
        u = torch.arange(c, device=device)[None, :]
        mask = torch.zeros(l, c, dtype=dtype, device=device)
        _MASKS[key] = mask.masked_fill_(lo + u > s, float("-inf"))[None, None]
    return _MASKS[key]


class BlockCausal:
    """A(1) of the fixed pattern: floor(j / l) == floor(i / l), j <= i."""

    def __init__(self, l: int, scale: float):
        self.l, self.scale = l, scale

    def _blocks(self, t):
        return t.unflatten(1, (-1, self.l)).flatten(0, 1).unsqueeze(1)   # (G M, 1, l, ...)

    def forward(self, q, k, v):
        G, N, d = q.shape
        o, lse = attention_forward(self._blocks(q), self._blocks(k), self._blocks(v),
                                   is_causal=True, scale=self.scale)    # (G M, 1, l, d)
        return [(0, o.reshape(G, N, d), lse.reshape(G, N))]

    def backward(self, q, k, v, go, out, lse, dq, dk, dv):
        b = self._blocks
        g = attention_backward(b(go), b(q), b(k), b(v), b(out), b(lse), is_causal=True,
                               scale=self.scale)
        for acc, grad in zip((dq, dk, dv), g):
            b(acc).add_(grad)


class SummaryEarlier:
    """Summary positions [lo, lo + c) of the blocks before the query's block."""

    def __init__(self, l: int, c: int, lo: int, scale: float):
        self.l, self.c, self.lo, self.scale = l, c, lo, scale

    def _gather(self, t, M):
        pos = _summary_positions(M - 1, self.l, self.lo, self.c, t.device)
        return pos, t.index_select(1, pos)                              # (G, (M-1) c, d)

    def forward(self, q, k, v):
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        if M < 2:
            return []
        _, ks = self._gather(k, M)
        _, vs = self._gather(v, M)
        out = torch.empty(G, N - l, d, dtype=q.dtype, device=q.device)
        lse = torch.empty(G, N - l, dtype=torch.float64 if q.dtype == torch.float64
                          else torch.float32, device=q.device)
        for b in range(1, M):                                           # query block b
            rows = slice(b * l, (b + 1) * l)
            o, s = attention_forward(q[:, None, rows], ks[:, None, :b * c], vs[:, None, :b * c],
                                     scale=self.scale)                  # (G, 1, l, d)
            out[:, rows.start - l:rows.stop - l] = o[:, 0]
            lse[:, rows.start - l:rows.stop - l] = s[:, 0]
        return [(l, out, lse)]

    def backward(self, q, k, v, go, out, lse, dq, dk, dv):
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        if M < 2:
            return
        pos, ks = self._gather(k, M)
        _, vs = self._gather(v, M)
        dks = torch.zeros(G, (M - 1) * c, d, dtype=dk.dtype, device=dk.device)
        dvs = torch.zeros_like(dks)
        for b in range(1, M):
            rows = slice(b * l, (b + 1) * l)
            gq, gk, gv = attention_backward(
                go[:, None, rows], q[:, None, rows], ks[:, None, :b * c], vs[:, None, :b * c],
                out[:, None, rows], lse[:, None, rows], scale=self.scale)
            dq[:, rows].add_(gq[:, 0])
            dks[:, :b * c].add_(gk[:, 0])
            dvs[:, :b * c].add_(gv[:, 0])
        dk.index_add_(1, pos, dks)
        dv.index_add_(1, pos, dvs)


class SummaryOwn:
    """Summary positions lo + u <= s of the query's own block (A(2) standing alone)."""

    def __init__(self, l: int, c: int, lo: int, scale: float):
        self.l, self.c, self.lo, self.scale = l, c, lo, scale

    def _gather(self, t):
        G, N, d = t.shape
        M = N // self.l
        pos = _summary_positions(M, self.l, self.lo, self.c, t.device)
        return pos, t.index_select(1, pos).view(G * M, 1, self.c, d)   # (G M, 1, c, d)

    def _blocks(self, t):
        return t.unflatten(1, (-1, self.l)).flatten(0, 1).unsqueeze(1)   # (G M, 1, l, ...)

    def forward(self, q, k, v):
        G, N, d = q.shape
        _, ks = self._gather(k)
        _, vs = self._gather(v)
        o, lse = attention_forward(self._blocks(q), ks, vs, scale=self.scale,
                                   mask=own_mask(self.l, self.lo, self.c, q.dtype, q.device))
        lse = lse.reshape(G, N // self.l, self.l)
        lse[:, :, :self.lo] = float("-inf")                              # rows s < lo: empty
        return [(0, o.reshape(G, N, d), lse.reshape(G, N))]

    def backward(self, q, k, v, go, out, lse, dq, dk, dv):
        G, N, d = q.shape
        b = self._blocks
        pos, ks = self._gather(k)
        _, vs = self._gather(v)
        gq, gk, gv = attention_backward(
            b(go), b(q), ks, vs, b(out), b(lse), scale=self.scale,
            mask=own_mask(self.l, self.lo, self.c, q.dtype, q.device))
        b(dq).add_(gq)
        dk.index_add_(1, pos, gk.reshape(G, -1, d).to(dk.dtype))
        dv.index_add_(1, pos, gv.reshape(G, -1, d).to(dv.dtype))
