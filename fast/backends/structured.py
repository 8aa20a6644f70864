"""The structured backend: strided and fixed attention at O(n sqrt(n)), with autograd.

Child et al., 2019, section 4.3 (the patterns), section 5.1 (eq. 5-8: merged,
multi-head and interleaved heads) and section 5.5 (transpose the sequence into
an (n/l, l) grid; gather the fixed positions; never compute the upper triangle).

Plan: the heads of a layer fall into groups that read the same pieces
(``fast.backends.strided``, ``fast.backends.fixed``):

  pattern  combine       heads                         pieces
  strided  merged        all                           Column + LocalBand(strict)
  strided  multihead     even / odd                    LocalBand / Column
  strided  interleaved   all (layer even / odd)        LocalBand / Column
  fixed    merged        all, c | l                    Summary(block=True): A(1) inside
  fixed    merged        all, c does not divide l      BlockCausal + Summary(own=False)
  fixed    multihead     even / odd                    BlockCausal / Summary(own=True)
  fixed    interleaved   all (layer even / odd)        BlockCausal / Summary(own=True)

Summary(own=True) also reads the summaries of the query's own block (j <= i);
it runs as SummaryEarlier internally when c does not divide l. The first piece
of a group reads something in every row.

Which heads read which parts comes from ``reference.heads.head_roles``; each
fixed summary piece gathers every head's own sub-block (``HeadRole.summary``).
A group's heads are a view of q, k, v (``group``: batch and heads merge into one
dimension whenever they can), so pieces read and write the layer's tensors in
place. The pieces of a group cover disjoint key sets, so their outputs merge
exactly through the log-sum-exp (``merge_chunks``, ``fast.core.merge``).

Backward: it saves only q, k, v, the merged out and the merged lse, and runs each
piece's flash backward with the merged out and lse: recomputing
P = exp(s - lse_merged) gives each piece its exact share of the merged gradient,
about 2.5 times a piece's forward work (docs/design.md, section 5). The gradient
buffers are not zero-filled: the group's first piece writes every row (``init``;
the strided column, first in its group, writes its natural-order gradients where
the band then adds). The kernel forms delta = rowsum(dO * O) itself on every call
(it takes no delta), one read of dO and O per piece. No tensor of size n x n is
ever made; the largest pieces are (l, 2 l) bands, (n/l, n/l) column problems and
(l, n c / l) summary problems, and kernel calls whose outputs would be large are
cut into slabs (``fast.backends.flash_cpu.spans``).

Precision (sec. 5.6): float16 and bfloat16 inputs are computed in float32
inside -- forward, merge and backward -- and rounded once, at the end (rounding
each piece's output or gradient first gave several times the naive path's
gradient error at large logits; tests/fast/test_attention_edges.py). The backward
saves q, k, v as given (upcast again when it runs) and the merged out and lse in
the accumulation dtype. A row's softmax weights are recomputed from its
log-sum-exp, which float32 holds to ulp(|lse|): a float32 call whose largest
|lse| exceeds ``EXACT_LSE`` (large scales, large or tied scores) is recomputed in
float64 and keeps float64 through its backward.

n is padded with zeros up to a multiple of l inside (padded rows come after all
real rows, so causality keeps real rows from reading them; their gradients are
cut off). Sequences shorter than l are one dense block: they go to the naive
path, which is no bigger than one block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fast.backends.fixed import BlockCausal, Summary
from fast.backends.naive import naive_sparse_attention
from fast.backends.strided import Column, LocalBand
from fast.core.autograd import once_differentiable
from fast.core.merge import merge_into
from fast.core.precision import acc_dtype
from reference.heads import head_roles


def plan(pattern: str, combine: str, layer: int, n_heads: int, scale: float, stride: int,
         c: int | None = None) -> list[tuple[slice, list]]:
    """[(head slice, pieces)] for one layer; see the table in the module docstring.

    The heads are grouped by the parts their ``reference.heads.HeadRole`` reads
    (all heads, or the even and the odd ones); each group's parts become pieces.
    """
    if pattern not in ("strided", "fixed"):
        raise ValueError(f"the structured plan serves 'strided' and 'fixed', got {pattern!r}")
    roles = head_roles(pattern, n_heads, combine, layer, stride=stride, c=c)
    groups: dict[tuple[str, ...], list] = {}
    for role in roles:
        groups.setdefault(role.parts, []).append(role)
    return [(_head_slice([r.head for r in group]), _pieces(pattern, group, scale, stride, c))
            for group in groups.values()]


def _head_slice(heads: list[int]) -> slice:
    """The heads of a group (all, the even or the odd ones) as a slice."""
    step = heads[1] - heads[0] if len(heads) > 1 else 1
    sl = slice(heads[0], heads[-1] + 1, step)
    if list(range(heads[-1] + 1)[sl]) != heads:
        raise AssertionError(f"heads {heads} are not an arithmetic progression")
    return sl


def _pieces(pattern: str, group: list, scale: float, l: int, c: int | None) -> list:
    """The pieces that compute what the heads of ``group`` (one set of parts) read."""
    role = group[0]
    if pattern == "strided":
        # the column first: its output and gradients, in natural order over every row,
        # become the group's buffers, and the band merges and adds into them; j = i is
        # the column's, so a band beside it is strict
        pieces = [Column(l, scale)] if role.reads("column") else []
        if role.reads("local") and not (pieces and l == 1):   # l = 1: the band is {i}
            pieces.append(LocalBand(l, scale, strict=bool(pieces)))
        return pieces
    # fixed: each head gathers its own summary sub-block, from lo = its summary[0]
    los = [r.summary[0] for r in group]
    if not role.reads("summary"):
        return [BlockCausal(l, scale)]
    if not role.reads("block"):
        return [Summary(l, c, los, scale, own=True)]
    if l % c == 0:
        return [Summary(l, c, los, scale, own=False, block=True)]
    return [BlockCausal(l, scale), Summary(l, c, los, scale, own=False)]


def merge_chunks(chunk_lists, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (G, N, d), lse (G, N)) from the pieces' chunks: rows covered by one chunk
    are copied, rows covered by several are merged through the lse.

    A chunk (start, o, m) holds rows [start, start + R) either in natural order,
    o (G, R, d), or in a blocked view o (G, R1, ..., d) whose row index is
    mixed-radix over (R1, ...) (as the kernel left it, no copy). A segment is
    handled in the shape of its most blocked chunk; the others are viewed so. A
    chunk that holds every row in natural order (the strided column's) becomes
    out itself, and the others are merged into it in place: no new buffer."""
    chunks = [(s, o, m) for chs in chunk_lists for s, o, m in chs]
    rows_of = lambda m: m.numel() // m.shape[0]
    home = next((ch for ch in chunks if ch[0] == 0 and ch[1].dim() == 3 and rows_of(ch[2]) == N
                 and ch[1].stride()[1:] == (ch[1].shape[2], 1) and ch[2].stride(1) == 1), None)
    if home is not None:
        out, lse = home[1], home[2]
    else:
        G, d = chunks[0][1].shape[0], chunks[0][1].shape[-1]
        out = chunks[0][1].new_empty(G, N, d)
        lse = chunks[0][2].new_empty(G, N)
    cuts = sorted({0, N} | {s for s, _, _ in chunks} | {s + rows_of(m) for s, _, m in chunks})

    def rows(t, lo, hi, shape, tail):
        """Rows [lo, hi) of t (G, R1, ..., *tail), shaped (G, *shape[1:], *tail)."""
        inner = math.prod(t.shape[2:t.dim() - tail])       # rows per step of dim 1
        t = t[:, lo // inner:hi // inner]
        return t.reshape(*shape, *t.shape[t.dim() - tail:]) if shape else t

    for a, b in zip(cuts[:-1], cuts[1:]):
        here = [ch for ch in chunks if ch[0] <= a and b <= ch[0] + rows_of(ch[2])]
        ref_s, _, ref_m = max(here, key=lambda ch: ch[2].dim())
        shape = rows(ref_m, a - ref_s, b - ref_s, None, 0).shape if ref_m.dim() > 2 else None
        dst_o, dst_m = rows(out, a, b, shape, 1), rows(lse, a, b, shape, 0)
        at_home = any(ch is home for ch in here)   # out already holds this piece here
        pieces = [(dst_o, dst_m)] if at_home else []
        pieces += [(rows(o, a - s, b - s, shape, 1), rows(m, a - s, b - s, shape, 0))
                   for s, o, m in (ch for ch in here if ch is not home)]
        if len(pieces) == 1:
            if not at_home:
                dst_o.copy_(pieces[0][0])
                dst_m.copy_(pieces[0][1])
            continue
        merge_into(dst_o, dst_m, *pieces[0], *pieces[1])
        for o, m in pieces[2:]:
            merge_into(dst_o, dst_m, dst_o, dst_m, o, m)
    return out, lse


def group(t: torch.Tensor, heads: slice) -> tuple[torch.Tensor, bool]:
    """(B, H, N, ...) -> (the heads' (B Hg, N, ...), whether it is a view of t).

    A view whenever batch and heads merge into one dimension (one batch element,
    all heads, or every other head of an even number of heads): the pieces read
    and write through it, so a group costs no copy. Otherwise a copy."""
    flat = t[:, heads].flatten(0, 1)                                    # (B Hg, N, ...)
    return flat, flat.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


def pad_rows(t: torch.Tensor, N: int) -> torch.Tensor:
    """(B, H, n, d) -> (B, H, N, d) with zero rows after the real ones; t itself
    (a view, no copy) when n = N and its rows have stride d."""
    n = t.shape[2]
    if N != n:
        return F.pad(t, (0, 0, 0, N - n))
    return t if t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] else t.contiguous()


# float32 keeps a row's softmax weights, recomputed from its log-sum-exp, only to
# about ulp(|lse|): beyond this |lse| a float32 call is recomputed in float64.
EXACT_LSE = 64.0


def layer_forward(groups, low, acc):
    """(out (B, H, N, d), lse (B, H, N)) in ``acc`` of the padded q, k, v ``low``."""
    q, k, v = (t.to(acc) for t in low)
    B, H, N, d = q.shape
    if len(groups) == 1:
        heads, pieces = groups[0]
        (qg, view), (kg, _), (vg, _) = group(q, heads), group(k, heads), group(v, heads)
        if view:                                    # the group's out is the layer's out
            out, lse = merge_chunks([p.forward(qg, kg, vg) for p in pieces], N)
            return out.view(B, H, N, d), lse.view(B, H, N)
    out = torch.empty(B, H, N, d, dtype=acc, device=q.device)
    lse = torch.empty(B, H, N, dtype=acc, device=q.device)
    for heads, pieces in groups:
        (qg, _), (kg, _), (vg, _) = group(q, heads), group(k, heads), group(v, heads)
        if qg.shape[0] == 0:
            continue
        og, lg = merge_chunks([p.forward(qg, kg, vg) for p in pieces], N)  # (G, N, d), (G, N)
        out[:, heads] = og.view(B, -1, N, d)
        lse[:, heads] = lg.view(B, -1, N)
    return out, lse


def _outgrows_float32(lse: torch.Tensor) -> bool:
    """Whether some row's |lse| passes EXACT_LSE (rows that read nothing, -inf, aside):
    one pass over lse, two when some row reads nothing."""
    low, high = torch.aminmax(lse)
    if low == float("-inf"):
        low = lse.nan_to_num(neginf=0.0).amin()
    return bool(high > EXACT_LSE or -low > EXACT_LSE)


class _StructuredAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, groups, stride):
        B, H, n, d = q.shape
        N = -(-n // stride) * stride
        low = pad_rows(q, N), pad_rows(k, N), pad_rows(v, N)            # (B, H, N, d)
        out, lse = layer_forward(groups, low, acc_dtype(q.dtype))   # "Precision" above
        if out.dtype == torch.float32 and _outgrows_float32(lse):
            out, lse = layer_forward(groups, low, torch.float64)
        ctx.save_for_backward(*low, out, lse)       # q, k, v as given; out, lse in acc
        ctx.groups, ctx.n = groups, n
        out = out.to(low[0].dtype)
        return out if N == n else out[:, :, :n]

    @staticmethod
    @once_differentiable("the structured backend of sparse_attention")
    def backward(ctx, grad_out):
        *low, out, lse = ctx.saved_tensors
        dtype, acc = low[0].dtype, out.dtype
        q, k, v = (t.to(acc) for t in low)
        B, H, N, d = q.shape
        go = pad_rows(grad_out.to(acc), N)                              # (B, H, N, d)
        # rows that read nothing (lse = -inf) must contribute nothing: exp(s - inf) = 0
        lse_b = lse.masked_fill(lse == float("-inf"), float("inf"))
        grads = None                               # (B, H, N, d) each, made by the pieces
        for heads, pieces in ctx.groups:
            views = [group(t, heads)[0] for t in (q, k, v, go, out, lse_b)]
            if views[0].shape[0] == 0:
                continue
            gg = None                    # the group's first piece makes its (G, N, d) buffers
            for p in pieces:
                gg = p.backward(*views, gg)
            if len(ctx.groups) == 1 and group(q, heads)[1]:
                grads = [g.view(B, H, N, d) for g in gg]
                break
            if grads is None:                      # every head is in one group: all written
                grads = [torch.empty(B, H, N, d, dtype=acc, device=q.device) for _ in range(3)]
            for g, part in zip(grads, gg):
                g[:, heads] = part.view(B, -1, N, d)
        dq, dk, dv = (g[:, :, :ctx.n].to(dtype) for g in grads)
        return dq, dk, dv, None, None


def structured_attention(q, k, v, pattern: str, *, combine: str = "merged", layer: int = 0,
                         scale: float, stride: int, c: int | None = None) -> torch.Tensor:
    """Strided or fixed attention, q, k, v (B, H, n, d) already validated
    (``fast.attention``). Returns (B, H, n, d)."""
    n = q.shape[2]
    if n < stride:
        params = {"stride": stride} if pattern == "strided" else {"stride": stride, "c": c}
        return naive_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                      scale=scale, **params)
    groups = plan(pattern, combine, layer, q.shape[1], scale, stride, c)
    return _StructuredAttention.apply(q, k, v, groups, stride)
