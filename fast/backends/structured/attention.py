"""The structured backend: strided and fixed attention at O(n sqrt(n)), with autograd.

Child et al., 2019, section 4.3 (the patterns), section 5.1 (eq. 5-8: merged,
multi-head and interleaved heads) and section 5.5 (transpose the sequence into
an (n/l, l) grid; gather the fixed positions; never compute the upper triangle).

Plan: the heads of a layer fall into groups that read the same pieces
(``fast.backends.structured.strided``, ``fast.backends.structured.fixed``):

  pattern  combine       heads                         pieces
  strided  merged        all                           Column + LocalBand(strict)
  strided  multihead     even / odd                    LocalBand / Column
  strided  interleaved   all (layer even / odd)        LocalBand / Column
  fixed    merged        all, c | l                    Summary(block=True): A(1) inside
  fixed    merged        all, c does not divide l      BlockCausal + Summary(own=False)
  fixed    multihead     even / odd                    BlockCausal / Summary(own=True)
  fixed    interleaved   all (layer even / odd)        BlockCausal / Summary(own=True)
  full     (any)         all                           LocalBand(l = N): one causal problem

Summary(own=True) also reads the summaries of the query's own block (j <= i);
it runs as SummaryEarlier internally when c does not divide l (and the CPU window
kernel, where it serves, takes the summaries of earlier blocks for any c:
``fast.backends.structured.fixed``). The first piece
of a group reads something in every row.

Which heads read which parts comes from ``reference.heads.head_roles``; each
fixed summary piece gathers every head's own sub-block (``HeadRole.summary``).
A group's heads are a view of q, k, v (``group``: batch and heads merge into one
dimension whenever they can), so pieces read and write the layer's tensors in
place. The pieces of a group cover disjoint key sets, so their outputs merge
exactly through the log-sum-exp (``merge_chunks``, ``fast.core.merge``).

Backward: it keeps only q, k, v, the merged out and the merged lse, and runs each
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
keeps q, k, v as given (padded and upcast again when it runs) and the merged out and
lse in the accumulation dtype. A row's softmax weights are recomputed from its
log-sum-exp, which float32 holds to ulp(|lse|): a float32 call whose largest
|lse| exceeds ``EXACT_LSE`` (large scales, large or tied scores) is recomputed in
float64, forward and backward (the operator, below), and says so (a ``PrecisionWarning``,
raised inside this module, so Python's default filter shows it once per process: the
answer has float64's precision, the call is slower; fast/attention/api.py, "Scale", says
how far that reaches; silence it with
``warnings.filterwarnings("ignore", category=fast.core.precision.PrecisionWarning)``).

n is padded with zeros up to a multiple of l inside (padded rows come after all
real rows, so causality keeps real rows from reading them; their gradients are
cut off). Sequences shorter than l are one dense block: they go to the naive
path, which is no bigger than one block.

The operator (docs/design.md, "torch.compile"): the forward and the backward are two
operators, ``sparse_transformer::structured`` (q, k, v -> the merged out and lse, N
rows, and the float64 decision) and ``sparse_transformer::structured_backward``, with
fake (shape-only) implementations, and ``StructuredAttention``, an autograd Function
whose forward and backward call them (as flash-attn binds its operator): every call
takes it, eager or compiled -- one path. ``torch.compile`` sees one opaque call per
layer and direction, never the pieces' strided views, in-place merges and the host
read (the float64 decision below) that it cannot trace. The pattern, stride, c,
combine, layer and scale are the operators' attributes: Python values, fixed when a
graph is traced (one graph serves every step of a shape).
What the backward needs is the operator's outputs and inputs, whose dtypes an operator
must declare from its inputs alone; so a call recomputed in float64 returns float32
buffers (its answer, rounded once, and the float32 lse the decision was made on) and the
decision itself, a bool on the host; the backward recomputes the float64 forward before
its own float64 pass (sec. 5.4: recompute rather than keep; the same numbers as keeping
the float64 buffers, at the cost of one more forward in that rare case). The decision is
read back once, in the forward, from the log-sum-exp the kernels computed.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn.functional as F

from fast.backends import cpu_window, flash_cpu
from fast.backends.structured.fixed import BlockCausal, Summary
from fast.backends.structured.strided import Column, LocalBand
from fast.core.autograd import Function, backward_through, keep_for_backward, operator_call
from fast.core.merge import merge_into
from fast.core.precision import PrecisionWarning, acc_dtype, may_overflow, overflow_rows
from reference.heads import head_roles


def plan(pattern: str, combine: str, layer: int, n_heads: int, scale: float, stride: int,
         c: int | None = None, heads: range | None = None) -> list[tuple[slice, list]]:
    """[(head slice, pieces)] for one layer; see the table in the module docstring.

    The heads are grouped by the parts their ``reference.heads.HeadRole`` reads
    (all heads, or the even and the odd ones); each group's parts become pieces.
    ``heads``: plan for these query heads of the layer only (in this order; the slices
    then index them), as the grouped key/value heads of ``plans`` need.
    """
    if pattern == "full":                    # stride = N: the band of N rows is causal
        return [(slice(None), [LocalBand(stride, scale)])]
    if pattern not in ("strided", "fixed"):
        raise ValueError(f"the structured plan serves 'full', 'strided' and 'fixed', got "
                         f"{pattern!r}")
    roles = head_roles(pattern, n_heads, combine, layer, stride=stride, c=c)
    if heads is not None:
        roles = [roles[h] for h in heads]
    groups: dict[tuple[str, ...], list] = {}
    for i, role in enumerate(roles):
        groups.setdefault(role.parts, []).append((i, role))
    return [(_head_slice([i for i, _ in group]),
             _pieces(pattern, [r for _, r in group], scale, stride, c))
            for group in groups.values()]


@functools.lru_cache(maxsize=256)
def plans(pattern: str, combine: str, layer: int, n_heads: int, kv_heads: int, scale: float,
          stride: int, c: int | None = None) -> list[tuple[slice, list]]:
    """[(query heads, that slice's ``plan``)]: one plan for all heads, or with grouped
    key/value heads (``kv_heads`` dividing n_heads, query head h reading key/value head
    h // share) one per s < share for the query heads s, s + share, ...: each of those
    reads key/value head i of its i-th query head, so q[:, s::share] and k, v are views
    that line up head by head, and the pieces run on them unchanged (no copy of k or v
    per query head). Made once per set of arguments and kept (the pieces hold only their
    numbers), so a layer's forward and backward, and every later call, reuse it."""
    share = n_heads // kv_heads
    if share == 1:
        return [(slice(None), plan(pattern, combine, layer, n_heads, scale, stride, c))]
    return [(slice(s, None, share), plan(pattern, combine, layer, n_heads, scale, stride, c,
                                         heads=range(s, n_heads, share)))
            for s in range(share)]


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


def home_chunk(chunks, N: int):
    """The chunk (0, out (G, N, d), lse (G, N)) that holds every row in natural order, rows
    of stride d (the strided column's), or None: the group's out and lse, into which the
    other pieces merge."""
    return next((ch for ch in chunks if ch[0] == 0 and ch[1].dim() == 3
                 and ch[2].numel() // ch[2].shape[0] == N
                 and ch[1].stride()[1:] == (ch[1].shape[2], 1) and ch[2].stride(1) == 1), None)


def run_pieces(pieces, q, k, v, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (G, N, d), lse (G, N)) of a group's pieces. A piece that can merge its rows
    into the group's out and lse in place (``forward_into``: the strided band through the
    CPU window kernel, beside the column) does so once a piece has made them; the others'
    chunks are merged by ``merge_chunks``."""
    chunk_lists: list = []
    for p in pieces:
        home = home_chunk([ch for chs in chunk_lists for ch in chs], N)
        into = getattr(p, "forward_into", None)
        if home is not None and into is not None and into(q, k, v, home[1], home[2]):
            continue
        chunk_lists.append(p.forward(q, k, v))
    return merge_chunks(chunk_lists, N)


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
    home = home_chunk(chunks, N)
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


def pad_rows(t: torch.Tensor, N: int, front: int = 0) -> torch.Tensor:
    """(B, H, n, d) -> (B, H, N, d) with ``front`` zero rows before the real ones and
    the rest after them; t itself (a view, no copy) when n = N and its rows have
    stride d."""
    n = t.shape[2]
    if N != n:
        return F.pad(t, (0, 0, front, N - n - front))
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
            out, lse = run_pieces(pieces, qg, kg, vg, N)
            return out.view(B, H, N, d), lse.view(B, H, N)
    out = torch.empty(B, H, N, d, dtype=acc, device=q.device)
    lse = torch.empty(B, H, N, dtype=acc, device=q.device)
    for heads, pieces in groups:
        (qg, _), (kg, _), (vg, _) = group(q, heads), group(k, heads), group(v, heads)
        if qg.shape[0] == 0:
            continue
        og, lg = run_pieces(pieces, qg, kg, vg, N)              # (G, N, d), (G, N)
        out[:, heads] = og.view(B, -1, N, d)
        lse[:, heads] = lg.view(B, -1, N)
    return out, lse


def _outgrows_float32(lse: torch.Tensor, scores: tuple | None = None) -> bool:
    """Whether some row's |lse| passes EXACT_LSE (rows that read nothing, -inf, aside; +inf
    is a row whose scores the CPU window kernel found overflowed, ``cpu_window.c``), or,
    given ``scores`` = (q, k, scale), whether some score may overflow float32
    (``may_overflow``: what catches PyTorch's kernel, which gives a row whose scores all
    overflowed to -inf an output of 0 and a finite lse). One read on the host, after one
    pass over lse (two when some row reads nothing). "meta" tensors hold no values:
    False."""
    if lse.device.type == "meta":
        return False
    low, high = torch.aminmax(lse)
    if low == float("-inf"):
        low = lse.nan_to_num(neginf=0.0).amin()
    flags = [high > EXACT_LSE, -low > EXACT_LSE]
    if scores is not None:
        flags.append(may_overflow(*scores))
    return bool(torch.stack(flags).any())


def layer_backward(groups, low, out, lse, go):
    """(dq, dk, dv) (B, H, N, d) in the accumulation dtype of ``out`` from the padded
    q, k, v ``low``, the merged out and lse and the padded output gradient ``go``."""
    acc = out.dtype
    q, k, v = (t.to(acc) for t in low)
    B, H, N, d = q.shape
    # rows that read nothing (lse = -inf) must contribute nothing: exp(s - inf) = 0
    lse_b = lse.masked_fill(lse == float("-inf"), float("inf"))
    grads = None                                   # (B, H, N, d) each, made by the pieces
    for heads, pieces in groups:
        views = [group(t, heads)[0] for t in (q, k, v, go, out, lse_b)]
        if views[0].shape[0] == 0:
            continue
        gg = None                        # the group's first piece makes its (G, N, d) buffers
        for p in pieces:
            gg = p.backward(*views, gg)
        if len(groups) == 1 and group(q, heads)[1]:
            return [g.view(B, H, N, d) for g in gg]
        if grads is None:                          # every head is in one group: all written
            grads = [torch.empty(B, H, N, d, dtype=acc, device=q.device) for _ in range(3)]
        for g, part in zip(grads, gg):
            g[:, heads] = part.view(B, -1, N, d)
    return grads


def _run(low, heads_plans, acc):
    """(out (B, H, N, d), lse (B, H, N)) in ``acc`` of the padded q, k, v ``low``."""
    if len(heads_plans) == 1:
        return layer_forward(heads_plans[0][1], low, acc)
    qa, ka, va = (t.to(acc) for t in low)
    B, H, N, d = qa.shape
    out = torch.empty(B, H, N, d, dtype=acc, device=qa.device)
    lse = torch.empty(B, H, N, dtype=acc, device=qa.device)
    for heads, groups in heads_plans:           # query heads s::share: views of q, k, v
        out[:, heads], lse[:, heads] = layer_forward(groups, (qa[:, heads], ka, va), acc)
    return out, lse


def _padded(q, k, v, stride: int):
    """q, k, v padded to N rows, a multiple of the stride: q's rows aligned to the end of
    the keys (zero rows in front), zero rows after the keys (``pad_rows``)."""
    n_q, n_k = q.shape[2], k.shape[2]
    N = -(-n_k // stride) * stride
    return pad_rows(q, N, n_k - n_q), pad_rows(k, N), pad_rows(v, N)     # (B, *, N, d)


def forward(q, k, v, heads_plans, stride: int, scale: float | None = None):
    """The structured forward on plain tensors: q (B, H, n_q, d), the last n_q positions
    of k, v (B, Hkv, n_k, d), ``heads_plans`` from ``plans``. Returns (out, lse, exact):
    the merged output (B, H, N, d) of every row of the padded length N (q's rows are the
    last n_q of the first n_k) and its log-sum-exp (B, H, N), both in the accumulation
    dtype -- what ``backward`` needs besides q, k, v, and the answer:
    ``out[:, :, n_k - n_q:n_k].to(q.dtype)`` -- and whether the call was recomputed in
    float64 (a Python bool).

    A float32 call whose |lse| outgrows float32 ("Precision" above) is recomputed in
    float64; its ``out`` then holds the float64 answer rounded once to q's dtype
    (exactly representable in the accumulation dtype), and ``lse`` stays the float32
    one the decision was made on. The decision is the one value this path reads back on
    the host, once: ``backward`` is told it (``exact``) and recomputes the float64
    forward it needs (sec. 5.4's trade: recompute rather than keep; the saved tensors
    then have one dtype whatever the values, as an operator's declared outputs must:
    ``structured_op`` below)."""
    low = _padded(q, k, v, stride)
    served = flash_cpu.CALLS[0]
    out, lse = _run(low, heads_plans, acc_dtype(q.dtype))           # "Precision" above
    # PyTorch's kernel served a piece: its rows of overflowed scores show only in a bound
    bound = scale is not None and flash_cpu.CALLS[0] != served
    exact = out.dtype == torch.float32 and _outgrows_float32(
        lse, (*low[:2], scale) if bound else None)
    if exact:
        warnings.warn(
            f"sparse_attention: some row's log-sum-exp passed |lse| = {EXACT_LSE:g} (or its "
            f"scores overflow float32), beyond which float32 no longer holds its softmax "
            f"weights exactly; this call is recomputed in float64, forward and backward "
            f"(float64's precision, at the cost of the float64 passes). Scores this large "
            f"usually mean an unscaled q k^T; pass scale=, or float64 inputs, to avoid it",
            PrecisionWarning, stacklevel=2)
        answer, _ = _run(low, heads_plans, torch.float64)
        out = answer.to(q.dtype).to(out.dtype)
    return out, lse, exact


def backward(grad_out, q, k, v, out, lse, exact: bool, heads_plans, stride: int):
    """(dq (B, H, n_q, d), dk, dv (B, Hkv, n_k, d)) in the inputs' dtype, from the
    gradient of ``forward``'s out (B, H, N, d) (0 in rows that are not answers), q, k, v
    as given and ``forward``'s out, lse and ``exact``: a call ``forward`` recomputed in
    float64 is recomputed in float64 here too (nothing is read back to know it), and its
    backward runs in float64."""
    dtype = q.dtype
    n_q, n_k = q.shape[2], k.shape[2]
    low = _padded(q, k, v, stride)
    if exact:
        out, lse = _run(low, heads_plans, torch.float64)
    acc = out.dtype
    go = grad_out.to(acc)                                                # (B, H, N, d)
    if len(heads_plans) == 1:
        dq, dk, dv = layer_backward(heads_plans[0][1], low, out, lse, go)
    else:
        qa, ka, va = (t.to(acc) for t in low)
        dq = torch.empty(qa.shape, dtype=acc, device=q.device)
        dk = dv = None
        for heads, groups in heads_plans:  # each adds its share of dk, dv: no per-head copy
            gq, gk, gv = layer_backward(groups, (qa[:, heads], ka, va), out[:, heads],
                                        lse[:, heads], go[:, heads])
            dq[:, heads] = gq
            dk, dv = (gk, gv) if dk is None else (dk.add_(gk), dv.add_(gv))
    return (dq[:, :, n_k - n_q:n_k].to(dtype).contiguous(),
            dk[:, :, :n_k].to(dtype).contiguous(), dv[:, :, :n_k].to(dtype).contiguous())


# ----------------------------------------------------------------------------
# The operator: what every call of the structured path runs, eager or compiled
# ----------------------------------------------------------------------------

def operator_forward(q, k, v, pattern, combine, layer, stride, c, scale):
    """``forward`` from the operator's inputs and attributes: (out (B, H, N, d), lse
    (B, H, N)), contiguous, in the accumulation dtype, and ``exact`` as a bool tensor of
    one element on the host (a CPU tensor whatever q's device: the backward reads it
    without waiting for one; one element, not none, so that it is counted as what it is,
    one more byte kept for the backward, ``fast.measure.memory``)."""
    heads_plans = plans(pattern, combine, layer, q.shape[1], k.shape[1], scale, stride, c)
    out, lse, exact = forward(q, k, v, heads_plans, stride, scale)
    return out.contiguous(), lse.contiguous(), torch.tensor([exact])


def operator_backward(grad_out, q, k, v, out, lse, exact, pattern, combine, layer, stride, c,
                      scale):
    """``backward`` from the operator's inputs and attributes: (dq, dk, dv), contiguous."""
    heads_plans = plans(pattern, combine, layer, q.shape[1], k.shape[1], scale, stride, c)
    return backward(grad_out, q, k, v, out, lse, bool(exact), heads_plans, stride)


_ATTRIBUTES = "str pattern, str combine, int layer, int stride, int? c, float scale"
_LIB = torch.library.Library("sparse_transformer", "FRAGMENT")   # kept: it owns the ops
_LIB.define(f"structured(Tensor q, Tensor k, Tensor v, {_ATTRIBUTES}) "
            f"-> (Tensor, Tensor, Tensor)")
_LIB.define(f"structured_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
            f"Tensor lse, Tensor exact, {_ATTRIBUTES}) -> (Tensor, Tensor, Tensor)")
_LIB.impl("structured", operator_forward, "CompositeExplicitAutograd")
_LIB.impl("structured_backward", operator_backward, "CompositeExplicitAutograd")


@torch.library.register_fake("sparse_transformer::structured")
def _(q, k, v, pattern, combine, layer, stride, c, scale):
    B, H, _, d = q.shape
    N = -(-k.shape[2] // stride) * stride
    acc = acc_dtype(q.dtype)
    return (q.new_empty(B, H, N, d, dtype=acc), q.new_empty(B, H, N, dtype=acc),
            torch.empty(1, dtype=torch.bool, device="cpu"))


@torch.library.register_fake("sparse_transformer::structured_backward")
def _(grad_out, q, k, v, out, lse, exact, pattern, combine, layer, stride, c, scale):
    return (q.new_empty(q.shape), k.new_empty(k.shape),
            v.new_empty(v.shape))                             # contiguous, as ``backward``'s


# bound once (as flash-attn does); a plain eager call runs the kernel without the dispatch
FORWARD = operator_call(torch.ops.sparse_transformer.structured.default, operator_forward)
BACKWARD = operator_call(torch.ops.sparse_transformer.structured_backward.default,
                         operator_backward)


class StructuredAttention(Function):
    """The operator ``sparse_transformer::structured`` with its backward
    ``sparse_transformer::structured_backward`` as autograd formula: (out (B, H, N, d),
    lse, exact) of q, k, v and the attributes. Every call takes it, eager or traced by
    torch.compile (which traces this Function and keeps each operator as one opaque
    call; a plain eager call runs the operators' kernels directly,
    ``fast.core.autograd.operator_call``)."""

    @staticmethod
    def forward(q, k, v, pattern, combine, layer, stride, c, scale):
        # every parameter named (no *args): torch.compile passes no context to a forward
        # of as many parameters as the call has arguments
        return FORWARD(q, k, v, pattern, combine, layer, stride, c, scale)

    # apart, as torch.func's transforms require; q, k, v as given, out and lse in acc
    setup_context = staticmethod(keep_for_backward)
    backward = staticmethod(backward_through(BACKWARD,
                                             "the structured backend of sparse_attention"))


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The "full" pattern as causal SDPA (the fused kernel), queries aligned to the end of
    the keys (q padded in front to n_k rows, its rows kept at the end); grouped key/value
    heads as views, one call per s < share over the query heads s::share. A call of n_q =
    n_k queries and one key/value head per query head is SDPA's call and nothing else."""
    B, H, n_q, d = q.shape
    Hkv, n_k = k.shape[1], k.shape[2]
    if n_q < n_k:
        q = F.pad(q, (0, 0, n_k - n_q, 0))                               # (B, H, n_k, d)
    share = H // Hkv
    if share == 1:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        outs = [F.scaled_dot_product_attention(q[:, s::share], k, v, is_causal=True,
                                               scale=scale) for s in range(share)]
        out = torch.stack(outs, dim=2).flatten(1, 2)          # (B, Hkv, share, n, d) -> H
    if n_q < n_k:
        out, q = out[:, :, n_k - n_q:], q[:, :, n_k - n_q:]               # (B, H, n_q, d)
    # on the CPU, rows whose scores may overflow are NaN, never SDPA's 0 (eager calls look
    # first, one read; a traced call cannot look, and marks them without looking)
    if looks_for_overflow(q.device) and (torch.compiler.is_compiling()
                                         or bool(may_overflow(q, k, scale))):
        out = out.masked_fill(overflow_rows(q, k, scale), float("nan"))
    return out


def looks_for_overflow(device: torch.device) -> bool:
    """Whether ``causal`` looks for scores that overflow float32 before trusting SDPA's
    answer (whose rows of overflowed scores are 0, docs/design.md §8): on the CPU, where a
    read waits for nothing; never on a GPU, where "full" is SDPA's work alone (a read
    would stall the queue, and the kernels there are SDPA's own)."""
    return device.type == "cpu"


# "full" through the CPU window kernel (one causal band of n rows: ``dense_window``) where it
# beats PyTorch's fused kernel: narrow heads at moderate lengths. Measured by ``python -m fast
# table2 --profile`` (fast.measure.dense_kernels; figures/data/table2_profile.json,
# "dense_kernels"): for heads of width 16 the window kernel's forward and backward were
# faster at every n of 256..1024 in every measurement; at width 32 its forward + backward
# was, but its forward alone was not at n = 256 in one of two runs; at width 64, and below
# n = 256, the two are close or PyTorch's wins. So width 16 only: a default must not lose.
DENSE_WINDOW_WIDTH = 16          # widest head the window kernel takes for "full"
DENSE_WINDOW_MIN = 256           # shortest sequence it takes (cpu_window.WINDOW_MAX: longest)


def dense_window(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether a "full" call runs as one causal band of n rows through the CPU window kernel
    (``fast.backends.cpu_window``) rather than SDPA: float32 CPU tensors, as many queries as
    keys, ``DENSE_WINDOW_MIN`` <= n <= ``cpu_window.WINDOW_MAX``, heads of width at most
    ``DENSE_WINDOW_WIDTH`` (a multiple of 8), and the kernel built. A decision on shapes,
    dtypes and devices only, so eager and compiled calls take the same path (the
    operator, traced) and give the same numbers."""
    d, n_q, n_k = q.shape[-1], q.shape[2], k.shape[2]
    return (q.device.type == "cpu" and q.dtype == torch.float32 and n_q == n_k
            and DENSE_WINDOW_MIN <= n_k <= cpu_window.WINDOW_MAX
            and d <= DENSE_WINDOW_WIDTH and d % 8 == 0 and _window_built())


@torch.compiler.assume_constant_result
def _window_built() -> bool:
    """Whether the CPU window kernel is there (built on first use); under torch.compile a
    constant, found when the call is traced (building or loading it is no graph break)."""
    return cpu_window.library() is not None


def may_outgrow_float32(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """Whether some row's |lse| may pass EXACT_LSE: |s_ij| <= |scale| |q_i| |k_j|
    (Cauchy-Schwarz), and a row's lse lies within [max_j s_ij, max_j s_ij + log n_k].
    One read of q and k, and of one number on the host ("meta" tensors hold none: False)."""
    if q.device.type == "meta":
        return False
    with torch.no_grad():
        bound = abs(scale) * (q.float().norm(dim=-1).amax() * k.float().norm(dim=-1).amax())
        return bool(bound + math.log(k.shape[2]) > EXACT_LSE)


def structured_attention(q, k, v, pattern: str, *, combine: str = "merged", layer: int = 0,
                         scale: float, stride: int, c: int | None = None) -> torch.Tensor:
    """Full, strided or fixed attention through the operator: q (B, H, n_q, d), the last
    n_q positions of k, v (B, Hkv, n_k, d) (Hkv dividing H), already validated, n_k >=
    stride (``fast.attention``'s call plan sends shorter calls to the naive path, which is
    no bigger than one block). Returns (B, H, n_q, d). Every query row is computed over
    the n_k positions (q is padded in front with zero rows, whose outputs are dropped and
    whose gradients are zero): a chunk of n_q < n_k queries costs what n_k do. "full" is
    one causal problem of n_k rows (``plan``: stride = n_k)."""
    out, _, _ = StructuredAttention.apply(q, k, v, pattern, combine, layer, stride, c,
                                          scale)                        # (B, H, N, d)
    n_q, n_k = q.shape[2], k.shape[2]
    if n_q < out.shape[2]:
        out = out[:, :, n_k - n_q:n_k]                                   # (B, H, n_q, d)
    return out.to(q.dtype)


def full_attention(q, k, v, scale: float, exact_check: bool) -> torch.Tensor:
    """The "full" pattern: causal SDPA (``causal``), except in two cases, where it runs as
    one causal problem of n_k rows through the operator (``plan``: stride = n_k, one band):

    * where the CPU window kernel is faster than SDPA's fused kernel (``dense_window``:
      narrow heads, 256..1024 positions, float32, as many queries as keys), eager and
      traced alike -- a decision on shapes;
    * where SDPA's answer would be wrong: its backward recomputes the weights from a
      float32 log-sum-exp, wrong at |lse| > EXACT_LSE ("Precision" above). With
      ``exact_check`` -- decided once per call signature by ``fast.attention``'s call
      plan: an eager CPU call below float64 that autograd will differentiate -- a call
      whose scores may reach that (``may_outgrow_float32``, one read of q and k) takes the
      operator, whose log-sum-exp then makes the float64 decision.

    Elsewhere SDPA: the operator's output (B, H, n, d) costs the model a copy of its heads
    that SDPA's (B, n, H, d) layout does not; a float64 call has nothing to decide; off
    the CPU the operator's fallback is exact but not fast; and a traced call (torch.compile)
    cannot branch on values, so a compiled "full" layer outside ``dense_window`` is SDPA's
    whatever its scores (docs/design.md, "torch.compile")."""
    if dense_window(q, k) or (exact_check and may_outgrow_float32(q, k, scale)):
        return structured_attention(q, k, v, "full", scale=scale, stride=k.shape[2])
    return causal(q, k, v, scale)
