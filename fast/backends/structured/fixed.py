"""The two heads of the fixed pattern as dense pieces, without any n x n tensor.

Child et al., 2019, section 4.3 (Fig. 3c) and section 5.5 ("Fixed attention
positions can be aggregated and computed in blocks"). Blocks of length l (n padded up to N = M l).
Every head reads its own summary sub-block: positions [lo, lo + c) of each block,
lo = ``summary_range(l, c, rank)[0]``; ``los`` lists lo for the heads of a
group, and row g of a (G, N, d) tensor (G = batch x heads) is head g mod len(los).

* ``BlockCausal``    -- A(1): causal attention inside each block, one batch of M
  (l, l) causal problems.
* ``Summary``        -- A(2): the summaries of strictly earlier blocks, as a
  causal "fold" plus a (l, c) "tail" (see the class), and, when A(2) stands
  alone (multihead, interleaved), the query's own block's summaries
  lo + u <= s. The merged head takes only the earlier blocks: its own block's
  summary positions j <= i are already in A(1), so nothing is counted twice.
* ``SummaryEarlier`` -- the same earlier-block summaries by one call per query
  block (a prefix of the gathered keys, no mask): the fallback when c does not
  divide l.

Pieces return (start_row, out, lse) chunks and add their share of the gradient
given the merged out and lse (see ``fast.backends.structured.strided`` for the chunk format).

In float32 on the CPU, where a C compiler built it, the CPU window kernel
(``fast.backends.cpu_window``) serves A(1) (``BlockCausal``: M sequences of l rows, l
apart, each a window of l) and the summaries of earlier blocks (its prefix mode: row i
reads the first floor(i / l) c gathered summaries, for any c), so the fold, the tail and
``SummaryEarlier``'s loop run only where it does not (float64, CUDA, d not a multiple of 8,
no compiler). The merged head is then two calls into one out and lse -- the prefix mode
writes every row (block 0 reads nothing: lse -inf), A(1) merges into it in place -- and
its backward two more, the prefix mode's key gradients summed over its segments
(``cpu_window.prefix_segments``) and added into dk and dv through the gather index. The
own block's summaries (``own=True``) stay with PyTorch's kernel, merged as a chunk.
"""

from __future__ import annotations

import torch

from fast.backends import cpu_window
from fast.backends.flash_cpu import attention_backward, attention_forward
from fast.core.precision import acc_dtype


def _lo_rows(los: list[int], G: int, device) -> torch.Tensor:
    """lo of every row g of a (G, ...) tensor: head g mod len(los)."""
    los_t = torch.as_tensor(los, device=device)
    return los_t.repeat(G // len(los))                                   # (G,)


def gather_index(G: int, M: int, l: int, c: int, los: list[int], device) -> torch.Tensor:
    """Positions of the summaries of blocks 0..M-1 for every row: (G, M c)."""
    lo = _lo_rows(los, G, device)[:, None, None]                         # (G, 1, 1)
    blocks = torch.arange(M, device=device)[None, :, None] * l           # (1, M, 1)
    return (blocks + lo + torch.arange(c, device=device)[None, None, :]).flatten(1)


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t (G, N, d) at positions idx (G, S) -> (G, S, d)."""
    return t.gather(1, idx[..., None].expand(*idx.shape, t.shape[-1]))


def _scatter_add(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    dst.scatter_add_(1, idx[..., None].expand(*idx.shape, dst.shape[-1]), src.to(dst.dtype))


def _tri(m: int) -> int:
    return m * (m + 1) // 2


def _block_pairs(n: int, l: int) -> int:
    """Pairs of A(1) among rows < n: sum over i < n of (i mod l) + 1."""
    whole, rest = divmod(n, l)
    return whole * _tri(l) + _tri(rest)


def _earlier_pairs(n: int, l: int, c: int) -> int:
    """Pairs of one head's summaries of earlier blocks among rows < n: c floor(i / l)."""
    whole, rest = divmod(n, l)
    return c * (l * whole * (whole - 1) // 2 + rest * whole)


def _own_pairs(n: int, l: int, c: int, lo: int) -> int:
    """Pairs of one head's summaries [lo, lo + c) of its own block, j <= i, rows < n."""
    def block(r):            # rows s < r of one block: sum of clip(s + 1 - lo, 0, c)
        m = max(0, r - lo)
        return _tri(min(m, c)) + max(0, m - c) * c
    whole, rest = divmod(n, l)
    return whole * block(l) + block(rest)


def _first(t: torch.Tensor, l: int) -> torch.Tensor:
    """Rows [0, l) of (G, N, ...) as one attention problem: (G, 1, l, ...), a view."""
    return t[:, :l].unsqueeze(1)


def causal_prefix_forward(q, k, v, l: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (G, l, d), lse (G, l)) of plain causal attention over rows [0, l) of
    q, k, v (G, N, d): the first block, where no row reads anything before it."""
    o, lse = attention_forward(_first(q, l), _first(k, l), _first(v, l), is_causal=True,
                               scale=scale)                             # (G, 1, l, d)
    return o.squeeze(1), lse.squeeze(1)


def causal_prefix_backward(q, k, v, go, out, lse, dq, dk, dv, l: int, scale: float) -> None:
    """Add the gradient of ``causal_prefix_forward`` into rows [0, l) of dq, dk, dv
    (G, N, d), given the merged out and lse of those rows."""
    g = attention_backward(*(_first(t, l) for t in (go, q, k, v, out, lse)), is_causal=True,
                           scale=scale)
    for acc, grad in zip((dq, dk, dv), g):
        acc[:, :l].add_(grad.squeeze(1))



class BlockCausal:
    """A(1) of the fixed pattern: floor(j / l) == floor(i / l), j <= i."""

    def __init__(self, l: int, scale: float):
        self.l, self.scale = l, scale

    def pairs(self, n: int, heads: int) -> int:
        """Pairs ``heads`` rows of G read among rows < n: sum of (i mod l) + 1 each."""
        return heads * _block_pairs(n, self.l)

    def _blocks(self, t):
        return t.unflatten(1, (-1, self.l))                              # (G, M, l, ...) view

    # -- the CPU window kernel: M sequences of l rows, l apart, each a window of l ----------
    def kernel(self, *tensors) -> bool:
        """Whether the CPU window kernel takes these (G, N, d) tensors
        (``cpu_window.usable``, blocks of at most ``cpu_window.WINDOW_MAX`` rows)."""
        return self.l <= cpu_window.WINDOW_MAX and cpu_window.usable(*tensors)

    def kernel_forward(self, q, k, v, out, lse, merge: bool) -> None:
        """Write (``merge``: merge into) out (G, N, d) and lse (G, N) through the kernel."""
        cpu_window.forward(q, k, v, out, lse, window=self.l, scale=self.scale, merge=merge,
                           sequences=q.shape[1] // self.l, rows=self.l, seqoff=self.l)

    def kernel_backward(self, q, k, v, go, out, lse, dq, dk, dv) -> None:
        """Add the gradient into dq, dk, dv (G, N, d) through the kernel."""
        cpu_window.backward(q, k, v, go, out, lse, dq, dk, dv, window=self.l, scale=self.scale,
                            sequences=q.shape[1] // self.l, rows=self.l, seqoff=self.l)

    def forward(self, q, k, v):
        if self.kernel(q, k, v):
            out, lse = q.new_empty(q.shape), q.new_empty(q.shape[:2])    # (G, N, d), (G, N)
            self.kernel_forward(q, k, v, out, lse, merge=False)
            return [(0, out, lse)]
        b = self._blocks
        o, lse = attention_forward(b(q), b(k), b(v), is_causal=True,
                                   scale=self.scale)                    # (G, M, l, d)
        return [(0, o, lse)]

    def backward(self, q, k, v, go, out, lse, grads=None):
        if self.kernel(q, k, v, go, out, *(grads or ())) and lse.stride(1) == 1:
            grads = [torch.zeros_like(q) for _ in range(3)] if grads is None else grads
            self.kernel_backward(q, k, v, go, out, lse, *grads)
            return grads
        b = self._blocks
        g = attention_backward(b(go), b(q), b(k), b(v), b(out), b(lse), is_causal=True,
                               scale=self.scale)                        # (G, M, l, d) each
        if grads is None:                            # it covers every row: write, not add
            return [grad.flatten(1, 2).contiguous() for grad in g]       # (G, N, d)
        for acc, grad in zip(grads, g):
            b(acc).add_(grad)
        return grads


class SummaryEarlier:
    """Summary positions [lo, lo + c) of the blocks before the query's block."""

    def __init__(self, l: int, c: int, los: list[int], scale: float):
        self.l, self.c, self.los, self.scale = l, c, los, scale

    def pairs(self, n: int, heads: int) -> int:
        return heads * _earlier_pairs(n, self.l, self.c)

    def forward(self, q, k, v):
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        if M < 2:
            return []
        idx = gather_index(G, M - 1, l, c, self.los, q.device)
        ks, vs = _gather(k, idx), _gather(v, idx)                        # (G, (M-1) c, d)
        out = torch.empty(G, N - l, d, dtype=q.dtype, device=q.device)
        lse = torch.empty(G, N - l, dtype=acc_dtype(q.dtype), device=q.device)
        for b in range(1, M):                     # query block b reads key blocks 0..b-1
            o, s = attention_forward(q[:, None, b * l:(b + 1) * l], ks[:, None, :b * c],
                                     vs[:, None, :b * c], scale=self.scale)  # (G, 1, l, d)
            out[:, (b - 1) * l:b * l] = o[:, 0]
            lse[:, (b - 1) * l:b * l] = s[:, 0]
        return [(l, out, lse)]

    def backward(self, q, k, v, go, out, lse, grads=None):
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        grads = [torch.zeros_like(q) for _ in range(3)] if grads is None else grads
        dq, dk, dv = grads
        if M < 2:
            return grads
        idx = gather_index(G, M - 1, l, c, self.los, q.device)
        ks, vs = _gather(k, idx), _gather(v, idx)
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
        _scatter_add(dk, idx, dks)
        _scatter_add(dv, idx, dvs)
        return grads


class Summary:
    """A(2) of the fixed pattern in three batched pieces (no per-block loop):

    * fold: the rows of blocks 1.. are regrouped as l / c sequences (query s of
      block b goes to sequence s div c, slot (b-1) c + s mod c), each read by
      causal attention over the gathered summaries of blocks 0..M-2. Slot
      (b-1) c + u reads blocks < b-1 and the first u+1 summaries of block b-1.
    * tail: the rest of block b-1's summaries, u' > s mod c: one batch of (l, c)
      problems with a fixed mask (rows with s mod c = c-1 read nothing here).
    * own (``own=True``, A(2) alone): the query's own block, lo + u <= s.
    * ``block=True`` (the merged head): the tail and A(1) share one call -- each
      block's queries read [block b-1's summaries | block b] (c + l keys, one
      copy) through a fixed (l, c + l) mask; block 0 is plain causal
      (``causal_prefix_forward``).

    fold + tail = the summaries of all earlier blocks, exactly once. Needs c | l;
    otherwise (one summary head only, see reference.patterns.check_summary)
    ``SummaryEarlier``'s per-block loop stands in for fold + tail (and the plan
    adds ``BlockCausal`` itself).
    """

    def __init__(self, l: int, c: int, los: list[int], scale: float, own: bool,
                 block: bool = False):
        self.l, self.c, self.los, self.scale, self.own = l, c, los, scale, own
        self.loop = SummaryEarlier(l, c, los, scale) if l % c else None
        if block and (own or self.loop is not None):
            raise ValueError("block=True is the merged head: c must divide l and own=False")
        self.block = block
        self.blocks = BlockCausal(l, scale)          # A(1) beside the prefix mode (block=True)

    def pairs(self, n: int, heads: int) -> int:
        """Pairs ``heads`` rows of G (row g is head g mod len(los)) read among rows < n."""
        l, c = self.l, self.c
        total = heads * _earlier_pairs(n, l, c)
        if self.own:
            total += heads // len(self.los) * sum(_own_pairs(n, l, c, lo) for lo in self.los)
        if self.block:
            total += heads * _block_pairs(n, l)
        return total

    # -- masks --------------------------------------------------------------
    def _tail_mask(self, dtype, device):
        s = torch.arange(self.l, device=device)[:, None] % self.c
        u = torch.arange(self.c, device=device)[None, :]
        mask = torch.zeros(self.l, self.c, dtype=dtype, device=device)
        return mask.masked_fill_(u <= s, float("-inf"))[None, None]    # (1, 1, l, c)

    def block_tail_mask(self, dtype, device):
        """(1, 1, l, c + l): summary u' of block b-1 iff u' > s mod c, then own block t <= s."""
        s = torch.arange(self.l, device=device)[:, None]
        t = torch.arange(self.c + self.l, device=device)[None, :]
        allowed = torch.where(t < self.c, t > s % self.c, t - self.c <= s)
        mask = torch.zeros(self.l, self.c + self.l, dtype=dtype, device=device)
        return mask.masked_fill_(~allowed, float("-inf"))[None, None]

    def _block_tail_keys(self, t, sums, M):
        """[summaries of block b-1 | block b] for b = 1..M-1: (G, M-1, c + l, d), a copy."""
        S = (M - 1) * self.c
        return torch.cat([sums[:, :S].unflatten(1, (M - 1, self.c)),
                          t[:, self.l:].unflatten(1, (M - 1, self.l))], dim=2)

    def _own_mask(self, G: int, dtype, device):
        lo = _lo_rows(self.los, G, device)[:, None, None]               # (G, 1, 1)
        s = torch.arange(self.l, device=device)[None, :, None]
        u = torch.arange(self.c, device=device)[None, None, :]
        mask = torch.zeros(G, self.l, self.c, dtype=dtype, device=device)
        return mask.masked_fill_(lo + u > s, float("-inf"))[:, None]    # (G, 1, l, c)

    # -- layouts ------------------------------------------------------------
    def fold(self, t, M):
        """Rows [l, N) of (G, N, ...) -> (G, l/c, (M-1) c, ...), a copy."""
        g, c = self.l // self.c, self.c
        t = t[:, self.l:].unflatten(1, (M - 1, g, c))                   # (G, M-1, g, c, ...)
        return t.transpose(1, 2).flatten(2, 3)                          # (G, g, (M-1) c, ...)

    def unfold(self, t, M):
        """Inverse of fold as a view: (G, g, (M-1) c, ...) -> (G, M-1, g, c, ...)."""
        return t.unflatten(2, (M - 1, self.c)).transpose(1, 2)

    # -- the CPU window kernel's prefix mode (any c; with ``block``, A(1) goes through
    # ``BlockCausal``, kernel or not) --------------------------------------------------
    def forward_into(self, q, k, v, out, lse) -> bool:
        """Merge the summaries of earlier blocks into the group's out (G, N, d) and lse
        (G, N) in place through the kernel (beside ``BlockCausal`` when c does not divide
        l); False (nothing done) where it does not serve the call."""
        if self.own or self.block or not cpu_window.usable(q, k, v, out) or lse.stride(1) != 1:
            return False
        ks, vs = self._summaries(k, v)
        cpu_window.prefix_forward(q, ks, vs, out, lse, block=self.l, keys=self.c,
                                  scale=self.scale, merge=True)
        return True

    def _summaries(self, k, v):
        """The summaries of every block for every row: (G, M c, d) each, copies."""
        G, N, _ = k.shape
        idx = gather_index(G, N // self.l, self.l, self.c, self.los, k.device)
        return _gather(k, idx), _gather(v, idx)

    def forward(self, q, k, v):
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        ks, vs = self._summaries(k, v)                                   # (G, M c, d)
        if cpu_window.usable(q, k, v):   # every row: earlier blocks (block 0 reads nothing)
            out, lse = q.new_empty(G, N, d), q.new_empty(G, N)
            cpu_window.prefix_forward(q, ks, vs, out, lse, block=l, keys=c, scale=self.scale)
            chunks = [(0, out, lse)]
            if self.block and self.blocks.kernel(q, k, v):
                self.blocks.kernel_forward(q, k, v, out, lse, merge=True)
            elif self.block:                            # blocks beyond the kernel's window
                chunks += self.blocks.forward(q, k, v)
        else:
            chunks = self._flash_forward(q, k, v, ks, vs)
        if self.own:
            o, lse = attention_forward(q.unflatten(1, (M, l)), ks.unflatten(1, (M, c)),
                                       vs.unflatten(1, (M, c)), scale=self.scale,
                                       mask=self._own_mask(G, q.dtype, q.device))  # (G, M, l, d)
            lo = _lo_rows(self.los, G, q.device)[:, None, None]
            empty = torch.arange(l, device=q.device)[None, None, :] < lo    # (G, 1, l)
            chunks.append((0, o, lse.masked_fill(empty, float("-inf"))))
        return chunks

    def _flash_forward(self, q, k, v, ks, vs):
        """The earlier blocks (and, with ``block``, A(1)) through PyTorch's kernel: fold +
        tail, or ``SummaryEarlier``'s loop when c does not divide l."""
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        chunks = []
        if M >= 2 and self.loop is not None:
            chunks += self.loop.forward(q, k, v)
        elif M >= 2:
            g, S = l // c, (M - 1) * c
            o, lse = attention_forward(self.fold(q, M), ks[:, None, :S].expand(G, g, S, d),
                                       vs[:, None, :S].expand(G, g, S, d), is_causal=True,
                                       scale=self.scale)                # (G, g, S, d)
            chunks.append((l, self.unfold(o, M), self.unfold(lse, M)))
            if self.block:
                o, lse = attention_forward(q[:, l:].unflatten(1, (M - 1, l)),
                                           self._block_tail_keys(k, ks, M),
                                           self._block_tail_keys(v, vs, M),
                                           mask=self.block_tail_mask(q.dtype, q.device),
                                           scale=self.scale)            # (G, M-1, l, d)
                chunks.append((l, o, lse))
            else:
                o, lse = attention_forward(q[:, l:].unflatten(1, (M - 1, l)),
                                           ks[:, :S].unflatten(1, (M - 1, c)),
                                           vs[:, :S].unflatten(1, (M - 1, c)),
                                           mask=self._tail_mask(q.dtype, q.device),
                                           scale=self.scale)            # (G, M-1, l, d)
                empty = torch.arange(l, device=q.device) % c == c - 1
                chunks.append((l, o, lse.masked_fill(empty, float("-inf"))))
        if self.block:                                  # block 0: plain causal, (G, l, d)
            chunks.insert(0, (0, *causal_prefix_forward(q, k, v, l, self.scale)))
        return chunks

    def backward(self, q, k, v, go, out, lse, grads=None):
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        ks, vs = self._summaries(k, v)                                   # (G, M c, d)
        if cpu_window.usable(q, k, v, go, out, *(grads or ())) and lse.stride(1) == 1:
            first = grads is None               # dq: every row written once by the kernel
            grads = ([torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)]
                     if first else grads)
            segments = cpu_window.prefix_segments(G)
            dks, dvs = (q.new_empty(G, segments, M * c, d) for _ in range(2))
            cpu_window.prefix_backward(q, ks, vs, go, out, lse, grads[0], dks, dvs, block=l,
                                       keys=c, scale=self.scale, init=first)
            dks, dvs = dks.sum(1), dvs.sum(1)                            # (G, M c, d)
            if self.block:
                self.blocks.backward(q, k, v, go, out, lse, grads)
        else:
            grads = [torch.zeros_like(q) for _ in range(3)] if grads is None else grads
            dks, dvs = self._flash_backward(q, k, v, go, out, lse, grads, ks, vs)
        dq, dk, dv = grads
        if self.own:
            r = lambda t: t.unflatten(1, (M, l))                          # (G, M, l, ...)
            gq, gk, gv = attention_backward(
                r(go), r(q), ks.unflatten(1, (M, c)), vs.unflatten(1, (M, c)), r(out), r(lse),
                mask=self._own_mask(G, q.dtype, q.device), scale=self.scale)
            r(dq).add_(gq)
            dks.add_(gk.flatten(1, 2))
            dvs.add_(gv.flatten(1, 2))
        idx = gather_index(G, M, l, c, self.los, q.device)
        _scatter_add(dk, idx, dks)
        _scatter_add(dv, idx, dvs)
        return grads

    def _flash_backward(self, q, k, v, go, out, lse, grads, ks, vs):
        """``_flash_forward``'s gradient: added into grads (dq, dk, dv) (G, N, d), and
        returned for the summaries as (dks, dvs) (G, M c, d)."""
        G, N, d = q.shape
        l, c, M = self.l, self.c, N // self.l
        dq, dk, dv = grads
        dks = torch.zeros(G, M * c, d, dtype=dk.dtype, device=dk.device)
        dvs = torch.zeros_like(dks)
        if M >= 2 and self.loop is not None:
            self.loop.backward(q, k, v, go, out, lse, grads)
        elif M >= 2:
            g, S = l // c, (M - 1) * c
            f = lambda t: self.fold(t, M)
            gq, gk, gv = attention_backward(
                f(go), f(q), ks[:, None, :S].expand(G, g, S, d), vs[:, None, :S].expand(G, g, S, d),
                f(out), f(lse), is_causal=True, scale=self.scale)
            dq[:, l:].unflatten(1, (M - 1, g, c)).add_(self.unfold(gq, M))
            dks[:, :S].add_(gk.sum(1, dtype=dks.dtype))
            dvs[:, :S].add_(gv.sum(1, dtype=dvs.dtype))
            r = lambda t: t[:, l:].unflatten(1, (M - 1, l))               # (G, M-1, l, ...)
            if self.block:
                gq, gk, gv = attention_backward(
                    r(go), r(q), self._block_tail_keys(k, ks, M), self._block_tail_keys(v, vs, M),
                    r(out), r(lse), mask=self.block_tail_mask(q.dtype, q.device),
                    scale=self.scale)                                   # gk (G, M-1, c + l, d)
                r(dk).add_(gk[:, :, c:])
                r(dv).add_(gv[:, :, c:])
                gk, gv = gk[:, :, :c], gv[:, :, :c]
            else:
                gq, gk, gv = attention_backward(
                    r(go), r(q), ks[:, :S].unflatten(1, (M - 1, c)),
                    vs[:, :S].unflatten(1, (M - 1, c)), r(out), r(lse),
                    mask=self._tail_mask(q.dtype, q.device), scale=self.scale)
            r(dq).add_(gq)
            dks[:, :S].add_(gk.flatten(1, 2))
            dvs[:, :S].add_(gv.flatten(1, 2))
        if self.block:
            causal_prefix_backward(q, k, v, go, out, lse, dq, dk, dv, l, self.scale)
        return dks, dvs
