"""Block-sparse FlashAttention-2 kernels in Triton: forward, dQ (and delta) and dK/dV.

Child et al., 2019, section 5.5 ("Efficient block-sparse attention kernels"):
the sparse patterns are computed as blocks of dense attention; the upper
triangle is never computed and the softmax is fused.  Here the fusion is the
FlashAttention-2 recipe (Dao, 2023): one program owns a block of queries,
walks only the key blocks a look-up table (LUT) lists for it, and keeps an
online softmax (running max m, running sum l, running output acc) in float32.

Every kernel works in *slot space*: a layout part (``fast.layout.LayoutPart``)
gives, per head, the sequence position of every query slot and key slot, either
listed (``q_pos`` / ``k_pos``, -1 for padding: the rows are gathered through
them) or as a formula (``fast.layout.slots``: natural order, the strided
transposition, the fixed summary gather, computed here, ``Q_MAP`` / ``K_MAP``).
So a transposed order or a gathered key set costs no permuted copy of q, k or v.
Outputs are written back in *position space*. A LUT row is read listed (block
index and token mask per entry) or as a range (``RANGE``: block start + t, token
masks listed only for a row's first and last entries, ``fast.layout.lut.Ranges``).

Scores are kept unscaled, s = q.k (-q.k for a negative scale, ``NEGATE``), and the
scale enters only through c = |scale| log2(e) > 0 applied to differences from the
row maximum,
p = 2^((s - m) c): nothing overflows for any float32 c, and when every score a
row reads is equal (however large) each p is exactly 1. A row's softmax is kept
as its statistics (m, l): the maximum of its scores and the sum of 2^((s - m) c),
both float32, never folded into one log-sum-exp (m c + log2 l loses log2 l when
m c is large: a tie of large scores would then merge with wrong weights).

Pseudocode of the forward program for query block ``qb`` of head ``(b, h)``::

    q = Q[b, h, positions of the query slots of qb]   # (BLOCK, D), padding -> 0
    m, l, acc = -inf, 0, 0
    for t in range(count[h, qb]):
        kb, mid = LUT entry t                           # key block, token mask
        k, v = K[b, h, positions of kb], V[...]         # (BLOCK, D)
        s = q k^T, -inf where the pair is not read      # token mask, padding
        m' = max(m, rowmax(s));  p = 2^((s - m') c);  a = 2^((m - m') c)
        l = a l + rowsum(p);     acc = a acc + p v;    m = m'
    out = acc / l                                       # rows with l = 0: 0

Parts are merged exactly inside the kernel: a part launched with LOAD_PREV folds
its rows into the (out, m, l) of the parts before it,

    m' = max(m_prev, m),  w_prev = l_prev 2^((m_prev - m') c),  w = l 2^((m - m') c),
    l' = w_prev + w,      out' = (w_prev out_prev + w out) / l',

and writes ``Out`` in that tensor's dtype: the last part of a layout writes the
output in q's dtype while the others keep a float32 ``Prev`` (the launchers,
``fast.kernels.launch``, choose which). The same formula in log-sum-exp form,
with the same empty-row rule (out 0, lse -inf), is ``fast.core.merge``.

The token mask of a partial block is always applied: the diagonal block is
causal inside itself because the layout gives it a mask, never "a block sees
all of itself". Non-finite inputs are not masked away: a NaN or inf in a pair a
row reads reaches that row's output and gradients as IEEE arithmetic carries it
(a row with l = NaN is not taken for an empty one). Nor are scores that overflow
from finite inputs (entries near 1e20: products of 1e40): a +inf score makes its
row NaN (2^(inf - inf)), and one that overflowed to -inf is raised to -FLT_MAX
before the mask is applied, so that a row whose every read score overflowed ends
with m = -FLT_MAX and is written NaN (l = NaN), never taken for a row that reads
nothing (out 0).

Backward (FlashAttention-2, section 3.1.2): with each row's merged (m, l),
P = 2^((S - m) c - log2 l) is each part's exact share of the merged softmax, so
    dV = P^T dO,  dS = P * (dO V^T - delta),  delta = rowsum(P * dO V^T) = rowsum(dO * O),
    dQ = scale dS K,  dK = scale dS^T Q.
``_dq_kernel`` walks a query block's key blocks (the forward table);
``_dkdv_kernel`` walks a key block's query blocks (the transposed table).
delta comes from dO * O (``COMPUTE_DELTA``: the first dQ launch, or a torch
pass), or, for large scales, from ``_dq_kernel``'s ``DELTA_PASS``: the sum of
P * dO V^T over the same recomputed tiles, so that a one-hot row (p = 1 exactly
at its maximum) gets dS = 0 exactly instead of scale times a rounding error.
Gradient writes follow the forward's LOAD_PREV / Out / Prev rule: inside a
part every position owns at most one slot, so no two programs touch one row,
and the parts run one after another on one stream (no atomics: bitwise
repeatable).

``GROUP`` lets one program walk several query (dK/dV: key) blocks one after
another.

Interpreter note (TRITON_INTERPRET=1, Triton 3.9): ``scalar_bool & tensor_bool``
comes out as int32 there and ``tl.load`` rejects it as a mask, so scalar
conditions are first broadcast to a vector (``offs * 0 + x``).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634   # log2(e): the kernels exponentiate in base 2
FLT_MAX = tl.constexpr(3.4028234663852886e38)   # float32's largest number


@triton.jit
def _program_heads(H, HL):
    """This program's batch b and head h (grid axis 1 is b * H + h) as int64 (64-bit
    offsets: B*H*n*d may pass 2^31), the layout head hl (a layout with HL == 1
    serves every head) and the axis index bh."""
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    return b, h.to(tl.int64), h % HL, bh


@triton.jit
def _slots(Pos, Off, hl, ROW, s0, offs, P, X, Y, LIMIT, MAP: tl.constexpr):
    """Positions (BLOCK,) of the slots s0 + offs of layout head hl and which are real:
    computed from the slot map (s mod P) X + (s div P) Y + Off[hl] < LIMIT when MAP,
    else loaded from Pos (rows of stride ROW; 0: one row for every head), -1 = padding."""
    if MAP:
        s = s0 + offs
        pos = (s % P) * X + (s // P) * Y + tl.load(Off + hl)
        ok = pos < LIMIT
    else:
        pos = tl.load(Pos + hl * ROW + s0 + offs)
        ok = pos >= 0
    return pos, ok


@triton.jit
def _rows(ptr, base, pos, offs_d, stride_n, row_ok, d_ok):
    """Load the rows ``pos`` (one per slot) of a (n, D) matrix; padding -> 0."""
    ptrs = ptr + base + pos[:, None] * stride_n + offs_d[None, :]
    return tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def _lut_row(Count, Rows, row, RANGE: tl.constexpr):
    """LUT row ``row``: its entry count and, for a range row, (start, lead, trail,
    offset) (``fast.layout.lut.Ranges``)."""
    count = tl.load(Count + row)
    start = 0
    lead = 0
    trail = 0
    off = 0
    if RANGE:
        start = tl.load(Rows + row * 4)
        lead = tl.load(Rows + row * 4 + 1)
        trail = tl.load(Rows + row * 4 + 2)
        off = tl.load(Rows + row * 4 + 3)
    return count, start, lead, trail, off


@triton.jit
def _lut_entry(Index, Mask, Ends, row, W, t, count, start, lead, trail, off,
               RANGE: tl.constexpr):
    """Entry t of LUT row ``row``: (block, token-mask index; -1 = full tile). A range
    row computes the block and reads a mask only for its first ``lead`` and last
    ``trail`` entries; a listed row loads both from (HL, R, W) tables."""
    if RANGE:
        first_trail = count - trail
        e = tl.where(t < lead, off + t, tl.where(t >= first_trail, off + lead + t - first_trail,
                                                 -1))
        mid = tl.load(Ends + tl.maximum(e, 0), mask=e >= 0, other=-1)
        blk = start + t
    else:
        at = row.to(tl.int64) * W + t
        blk = tl.load(Index + at)
        mid = tl.load(Mask + at)
    return blk, mid


@triton.jit
def _token_mask(tok_ptr, mid, offs_m, offs_n, BLOCK: tl.constexpr):
    """(BLOCK, BLOCK) bool: which (query slot, key slot) pairs of the block may be
    read. ``mid`` < 0 means a full block (all True); otherwise token_masks[mid]."""
    partial = (offs_m * 0 + mid) >= 0                                # (BLOCK,) vector
    ptrs = (tok_ptr + tl.maximum(mid, 0) * BLOCK * BLOCK
            + offs_m[:, None] * BLOCK + offs_n[None, :])
    tm = tl.load(ptrs, mask=partial[:, None] & (offs_n[None, :] >= 0), other=1)
    return tm != 0


@triton.jit
def _fwd_kernel(
    # pointers: q, k, v (B, H, n, D); Out (B, H, n, D), written in its own dtype; Prev
    # (B, H, n, D) float32, read when LOAD_PREV (may be Out); row statistics Stats
    # (B, H, 2, n) float32, contiguous (m, then l, of each head's rows): read when
    # LOAD_PREV, always written
    Q, K, V, Out, Prev, Stats,
    # strides (the last dimension is contiguous; Out and Prev share theirs)
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    # query slots: positions (HL or 1, Mq) int32 and their row stride (Mq, or 0 when every
    # head holds the same), or the map (period, x, y, offsets (HL,), limit)
    QPos, QRow, QP, QX, QY, QOff, QLim,
    # key slots: the same
    KPos, KRow, KP, KX, KY, KOff, KLim,
    # look-up table: counts (HL, NQB); listed index and mask (HL, NQB, W), or range rows
    # (HL, NQB, 4) and their listed masks (E,)
    Count, Index, Mask, W, Rows, Ends,
    TokMask,                    # (NM, BLOCK, BLOCK) int8
    # sizes (SHARE: query heads per key/value head; head h reads k, v of head h // SHARE)
    N, H, HL, SHARE, NQB, D,
    c,                          # |scale| log2(e) > 0 (the sign: NEGATE)
    # meta-parameters
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    LOAD_PREV: tl.constexpr,    # merge into the (Prev, m, l) of the parts before this one
    GROUP: tl.constexpr,        # query blocks per program
    Q_MAP: tl.constexpr, K_MAP: tl.constexpr, RANGE: tl.constexpr,
    NEGATE: tl.constexpr,       # the scale is negative: s = -q.k
):
    b, h64, hl, bh = _program_heads(H, HL)
    offs_m = tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q_base = b * stride_qb + h64 * stride_qh
    k_base = b * stride_kb + (h64 // SHARE) * stride_kh
    v_base = b * stride_vb + (h64 // SHARE) * stride_vh
    o_base = b * stride_ob + h64 * stride_oh
    M, L = _stats(Stats, bh, N)

    for g in range(0, GROUP):
        qb = tl.program_id(0) * GROUP + g
        if qb < NQB:
            q_pos, q_ok = _slots(QPos, QOff, hl, QRow, qb * BLOCK, offs_m, QP, QX, QY, QLim,
                                 Q_MAP)                                  # (BLOCK,)
            q = _rows(Q, q_base, q_pos, offs_d, stride_qn, q_ok, d_ok)  # (BLOCK, BLOCK_D)

            m_i = tl.full([BLOCK], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK], tl.float32)
            acc = tl.zeros([BLOCK, BLOCK_D], tl.float32)
            row = hl * NQB + qb
            count, start, lead, trail, off = _lut_row(Count, Rows, row, RANGE)
            for t in range(0, count):
                kb, mid = _lut_entry(Index, Mask, Ends, row, W, t, count, start, lead, trail,
                                     off, RANGE)
                k_pos, k_ok = _slots(KPos, KOff, hl, KRow, kb * BLOCK, offs_n, KP, KX, KY, KLim,
                                     K_MAP)
                k = _rows(K, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
                v = _rows(V, v_base, k_pos, offs_d, stride_vn, k_ok, d_ok)

                s = tl.dot(q, tl.trans(k), input_precision=PRECISION)     # (BLOCK, BLOCK)
                if NEGATE:
                    s = -s
                allowed = _token_mask(TokMask, mid, offs_m, offs_n, BLOCK) & k_ok[None, :]
                # a score that overflowed to -inf is kept apart from a pair not read
                s = tl.where(allowed, tl.maximum(s, -FLT_MAX, propagate_nan=tl.PropagateNan.ALL),
                             float("-inf"))

                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing yet
                p = tl.exp2((s - m_safe[:, None]) * c)
                alpha = tl.exp2((m_i - m_safe) * c)
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                m_i = m_new

            over = m_i == -FLT_MAX             # every score read overflowed: NaN, never 0
            l_i = tl.where(over, float("nan"), l_i)
            has = l_i != 0.0                                # NaN counts: it is not empty
            out = tl.where(over[:, None], float("nan"), acc / tl.where(has, l_i, 1.0)[:, None])
            o_off = o_base + q_pos[:, None] * stride_on + offs_d[None, :]
            o_ok = q_ok[:, None] & d_ok[None, :]
            if LOAD_PREV:
                l_p = tl.load(L + q_pos, mask=q_ok, other=0.0)
                # a row no part has written yet (l = 0: the empty-row state is all zeros)
                # has no maximum
                m_p = tl.load(M + q_pos, mask=q_ok & (l_p != 0.0), other=float("-inf"))
                o_p = tl.load(Prev + o_off, mask=o_ok, other=0.0)
                top = tl.maximum(m_p, m_i)
                top_safe = tl.where(top == float("-inf"), 0.0, top)
                w_p = tl.where(l_p != 0.0, l_p * tl.exp2((m_p - top_safe) * c), 0.0)
                w_n = tl.where(has, l_i * tl.exp2((m_i - top_safe) * c), 0.0)
                l_i = w_p + w_n
                t_safe = tl.where(l_i != 0.0, l_i, 1.0)
                out = o_p * (w_p / t_safe)[:, None] + out * (w_n / t_safe)[:, None]
                m_i = top
            tl.store(Out + o_off, out.to(Out.dtype.element_ty), mask=o_ok)
            tl.store(M + q_pos, m_i, mask=q_ok)
            tl.store(L + q_pos, l_i, mask=q_ok)


@triton.jit
def _stats(Stats, bh, N):
    """Where the row statistics of this program's head start: (m, l), rows of N float32
    one after the other in Stats (B, H, 2, n)."""
    M = Stats + bh.to(tl.int64) * 2 * N
    return M, M + N


@triton.jit
def _row_stats(M, L, q_pos, q_ok):
    """A query row's merged statistics for the backward: its max (+inf for rows that read
    nothing, so that P = 0 there) and log2 of its sum."""
    m = tl.load(M + q_pos, mask=q_ok, other=float("inf"))
    l = tl.load(L + q_pos, mask=q_ok, other=0.0)
    empty = l == 0.0
    return tl.where(empty, float("inf"), m), tl.log2(tl.where(empty, 1.0, l))


@triton.jit
def _probs(q, k, m, log2_l, allowed, c, PRECISION: tl.constexpr, NEGATE: tl.constexpr):
    """The recomputed P = 2^((s - m) c - log2 l) of one tile, s = +-q k^T, 0 on pairs not
    read (the large terms cancel first: exactly 1 where a one-hot row has its maximum)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if NEGATE:
        s = -s
    p = tl.exp2((s - m[:, None]) * c - log2_l[:, None])
    return tl.where(allowed, p, 0.0)


@triton.jit
def _dq_kernel(
    # pointers: q, k, v (B, H, n, D); O (the output) and dO (B, H, n, D) sharing strides;
    # Stats (B, H, 2, n) and Delta (B, H, n) float32 contiguous; DQ (B, H, n, D) written in
    # its dtype, Prev float32 read when LOAD_PREV (may be DQ); they share strides
    Q, K, V, O, DO, Stats, Delta, DQ, Prev,
    # strides: q, k/v (shared), O/dO, dQ/Prev
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_ob, stride_oh, stride_on,
    stride_gb, stride_gh, stride_gn,
    # query slots, key slots, the forward look-up table, token masks: as ``_fwd_kernel``
    QPos, QRow, QP, QX, QY, QOff, QLim,
    KPos, KRow, KP, KX, KY, KOff, KLim,
    Count, Index, Mask, W, Rows, Ends,
    TokMask,
    # sizes (SHARE: query heads per key/value head; head h reads k, v of head h // SHARE)
    N, H, HL, SHARE, NQB, D,
    c, scale,                   # |scale| log2(e) and the scale itself (signed)
    # meta-parameters
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    LOAD_PREV: tl.constexpr, GROUP: tl.constexpr,
    Q_MAP: tl.constexpr, K_MAP: tl.constexpr, RANGE: tl.constexpr, NEGATE: tl.constexpr,
    COMPUTE_DELTA: tl.constexpr,  # delta = rowsum(dO * O) here, written to Delta
    DELTA_PASS: tl.constexpr,     # no dQ: add rowsum(P * dO V^T) of this part into Delta
):
    b, h64, hl, bh = _program_heads(H, HL)
    offs_m = tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q_base = b * stride_qb + h64 * stride_qh
    k_base = b * stride_kb + (h64 // SHARE) * stride_kh   # v shares k's strides
    o_base = b * stride_ob + h64 * stride_oh
    s_base = bh.to(tl.int64) * N                                     # Delta
    M, L = _stats(Stats, bh, N)

    for g in range(0, GROUP):
        qb = tl.program_id(0) * GROUP + g
        if qb < NQB:
            q_pos, q_ok = _slots(QPos, QOff, hl, QRow, qb * BLOCK, offs_m, QP, QX, QY, QLim,
                                 Q_MAP)
            q = _rows(Q, q_base, q_pos, offs_d, stride_qn, q_ok, d_ok)
            do = _rows(DO, o_base, q_pos, offs_d, stride_on, q_ok, d_ok)
            m_i, log2_l = _row_stats(M, L, q_pos, q_ok)
            if COMPUTE_DELTA:
                o = _rows(O, o_base, q_pos, offs_d, stride_on, q_ok, d_ok)
                delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
                tl.store(Delta + s_base + q_pos, delta, mask=q_ok)
            elif DELTA_PASS:
                delta = tl.zeros([BLOCK], tl.float32)
            else:
                delta = tl.load(Delta + s_base + q_pos, mask=q_ok, other=0.0)

            dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
            row = hl * NQB + qb
            count, start, lead, trail, off = _lut_row(Count, Rows, row, RANGE)
            for t in range(0, count):
                kb, mid = _lut_entry(Index, Mask, Ends, row, W, t, count, start, lead, trail,
                                     off, RANGE)
                k_pos, k_ok = _slots(KPos, KOff, hl, KRow, kb * BLOCK, offs_n, KP, KX, KY, KLim,
                                     K_MAP)
                k = _rows(K, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
                v = _rows(V, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
                allowed = _token_mask(TokMask, mid, offs_m, offs_n, BLOCK) & k_ok[None, :]
                p = _probs(q, k, m_i, log2_l, allowed, c, PRECISION, NEGATE)      # (BLOCK, BLOCK)
                dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
                if DELTA_PASS:
                    delta += tl.sum(p * dp, 1)
                else:
                    ds = p * (dp - delta[:, None])
                    dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)

            if DELTA_PASS:
                if LOAD_PREV:
                    delta += tl.load(Delta + s_base + q_pos, mask=q_ok, other=0.0)
                tl.store(Delta + s_base + q_pos, delta, mask=q_ok)
            else:
                g_off = b * stride_gb + h64 * stride_gh + q_pos[:, None] * stride_gn \
                    + offs_d[None, :]
                g_ok = q_ok[:, None] & d_ok[None, :]
                dq = dq * scale
                if LOAD_PREV:
                    dq += tl.load(Prev + g_off, mask=g_ok, other=0.0)
                tl.store(DQ + g_off, dq.to(DQ.dtype.element_ty), mask=g_ok)


@triton.jit
def _dkdv_kernel(
    # pointers: q, k, v, dO (B, H, n, D); Stats (B, H, 2, n) and Delta (B, H, n) float32
    # contiguous; dK, dV (B, H, n, D) written in their dtype; PrevK, PrevV float32, read
    # when LOAD_PREV (may be dK, dV); all four share strides
    Q, K, V, DO, Stats, Delta, DK, DV, PrevK, PrevV,
    # strides: q, k/v (shared), dO, dK/dV/PrevK/PrevV
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_ob, stride_oh, stride_on,
    stride_gb, stride_gh, stride_gn,
    # query slots, key slots as ``_fwd_kernel``; the transposed look-up table: per key
    # block its query blocks (counts (HL, NKB), listed or ranges); token masks
    # [query slot, key slot]
    QPos, QRow, QP, QX, QY, QOff, QLim,
    KPos, KRow, KP, KX, KY, KOff, KLim,
    Count, Index, Mask, W, Rows, Ends,
    TokMask,
    # sizes (SHARE: query heads per key/value head; head h reads k, v of head h // SHARE)
    N, H, HL, SHARE, NKB, D,
    c, scale,
    # meta-parameters
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    LOAD_PREV: tl.constexpr, GROUP: tl.constexpr,   # GROUP: key blocks per program
    Q_MAP: tl.constexpr, K_MAP: tl.constexpr, RANGE: tl.constexpr,
    NEGATE: tl.constexpr,       # the scale is negative: s = -q.k
):
    b, h64, hl, bh = _program_heads(H, HL)
    offs_m = tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q_base = b * stride_qb + h64 * stride_qh
    k_base = b * stride_kb + (h64 // SHARE) * stride_kh   # v shares k's strides
    o_base = b * stride_ob + h64 * stride_oh
    s_base = bh.to(tl.int64) * N                                     # Delta
    M, L = _stats(Stats, bh, N)

    for g in range(0, GROUP):
        kb = tl.program_id(0) * GROUP + g
        if kb < NKB:
            k_pos, k_ok = _slots(KPos, KOff, hl, KRow, kb * BLOCK, offs_n, KP, KX, KY, KLim,
                                 K_MAP)
            k = _rows(K, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
            v = _rows(V, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)

            dk = tl.zeros([BLOCK, BLOCK_D], tl.float32)
            dv = tl.zeros([BLOCK, BLOCK_D], tl.float32)
            row = hl * NKB + kb
            count, start, lead, trail, off = _lut_row(Count, Rows, row, RANGE)
            for t in range(0, count):
                qb, mid = _lut_entry(Index, Mask, Ends, row, W, t, count, start, lead, trail,
                                     off, RANGE)
                q_pos, q_ok = _slots(QPos, QOff, hl, QRow, qb * BLOCK, offs_m, QP, QX, QY, QLim,
                                     Q_MAP)
                q = _rows(Q, q_base, q_pos, offs_d, stride_qn, q_ok, d_ok)
                do = _rows(DO, o_base, q_pos, offs_d, stride_on, q_ok, d_ok)
                m_i, log2_l = _row_stats(M, L, q_pos, q_ok)
                delta = tl.load(Delta + s_base + q_pos, mask=q_ok, other=0.0)
                allowed = _token_mask(TokMask, mid, offs_m, offs_n, BLOCK) & k_ok[None, :]
                p = _probs(q, k, m_i, log2_l, allowed, c, PRECISION, NEGATE)  # (BLOCK_q, BLOCK_k)
                dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
                ds = p * (dp - delta[:, None])
                dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
                dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)

            g_ok = k_ok[:, None] & d_ok[None, :]
            g_off = b * stride_gb + h64 * stride_gh + k_pos[:, None] * stride_gn \
                + offs_d[None, :]
            dk = dk * scale
            if LOAD_PREV:
                dk += tl.load(PrevK + g_off, mask=g_ok, other=0.0)
                dv += tl.load(PrevV + g_off, mask=g_ok, other=0.0)
            tl.store(DK + g_off, dk.to(DK.dtype.element_ty), mask=g_ok)
            tl.store(DV + g_off, dv.to(DV.dtype.element_ty), mask=g_ok)
