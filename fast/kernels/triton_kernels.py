"""Block-sparse FlashAttention-2 kernels in Triton: forward, dQ and dK/dV.

Child et al., 2019, section 5.5 ("Efficient block-sparse attention kernels"):
the sparse patterns are computed as blocks of dense attention; the upper
triangle is never computed and the softmax is fused.  Here the fusion is the
FlashAttention-2 recipe (Dao, 2023): one program owns a block of queries,
walks only the key blocks a look-up table (LUT) lists for it, and keeps an
online softmax (running max m, running sum l, running output acc) in float32.

Every kernel works in *slot space*: a layout part (``fast.layout.LayoutPart``)
lists, per head, the sequence position of every query slot (``q_pos``) and key
slot (``k_pos``), -1 for padding.  Rows are loaded through these maps (gathered
pointer loads, padding slots masked), so a transposed order (the strided
column head) or a gathered key set (the fixed summary head) costs no permuted
copy of q, k or v.  Outputs are written back in *position space*.

Pseudocode of the forward program for query block ``qb`` of head ``(b, h)``::

    q = Q[b, h, q_pos[h, qb]]                        # (BLOCK, D), padding -> 0
    m, l, acc = -inf, 0, 0
    for t in range(kv_count[h, qb]):
        kb, mid = kv_index[h, qb, t], kv_mask[h, qb, t]
        k, v = K[b, h, k_pos[h, kb]], V[...]          # (BLOCK, D)
        s = q k^T * scale * log2(e)                   # base-2 scores
        allowed = k slot is real & (mid < 0 or token_masks[mid])
        s = where(allowed, s, -inf)
        m' = max(m, rowmax(s));  p = 2^(s - m');  a = 2^(m - m')
        l = a l + rowsum(p);     acc = a acc + p v;   m = m'
    out = acc / l,  lse = (m + log2 l) ln 2           # natural log; rows with l=0: 0, -inf

Parts are merged exactly through their log-sum-exp, inside the kernel: every
part after the first is launched with ACCUMULATE and folds its (out, lse) into
the rows already written (lse' = logaddexp(lse_prev, lse), out' = weighted sum),
so no per-part buffers and no extra passes over memory are needed. Its readable
twin in torch, the same formula and the same empty-row rule (out 0, lse -inf),
is ``fast.core.merge`` (``merge``), which the tests compare it with.

The token mask of a partial block is always applied: the diagonal block is
causal inside itself because the layout gives it a mask, never "a block sees
all of itself".  ``lse`` is stored in NATURAL log units, like
``reference.attention.attend``, so parts merge with ``fast.core.merge``.

Backward (FlashAttention-2, section 3.1.2): with the merged output O and merged
lse, P = exp(S - lse) is each part's exact share of the merged softmax, so
    dV = P^T dO,  dS = P * (dO V^T - delta),  delta = rowsum(dO * O),
    dQ = scale dS K,  dK = scale dS^T Q.
``_dq_kernel`` walks a query block's key blocks (the forward table);
``_dkdv_kernel`` walks a key block's query blocks (the transposed table).
Both ADD into float32 gradient buffers (load, add, store): the parts of a
layout are launched one after another on one stream and, inside a part, every
position owns at most one slot, so no two programs touch the same row.

Interpreter note (TRITON_INTERPRET=1, Triton 3.9): ``scalar_bool & tensor_bool``
comes out as int32 there and ``tl.load`` rejects it as a mask, so scalar
conditions are first broadcast to a vector (``offs * 0 + x``).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634   # log2(e): scores are kept in base 2 inside the kernels
LN2 = 0.6931471805599453     # ln(2): lse leaves the kernels in natural-log units


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
def _slot_rows(ptr, base, pos, offs_d, stride_n, row_ok, d_ok):
    """Load the rows ``pos`` (one per slot) of a (n, D) matrix; padding -> 0."""
    ptrs = ptr + base + pos[:, None] * stride_n + offs_d[None, :]
    return tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)


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
    # pointers: inputs (B, H, n, D) and outputs out (B, H, n, D) fp32, lse (B, H, n) fp32
    Q, K, V, Out, Lse,
    # strides (the last dimension is contiguous)
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    stride_lb, stride_lh,
    # look-up table of one layout part (int32, contiguous)
    QPos, KPos,                 # (HL, Mq), (HL, Mk): position of each slot, -1 = padding
    KvCount, KvIndex, KvMask,   # (HL, NQB), (HL, NQB, MAXK), (HL, NQB, MAXK)
    TokMask,                    # (NM, BLOCK, BLOCK) int8
    # sizes
    H, HL, Mq, Mk, NQB, MAXK, D,
    qk_scale,                   # scale * log2(e)
    # meta-parameters
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    ACCUMULATE: tl.constexpr,   # merge into the (out, lse) already there (every part but the first)
):
    qb = tl.program_id(0)
    b, h64, hl, bh = _program_heads(H, HL)
    offs_m = tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    q_pos = tl.load(QPos + hl * Mq + qb * BLOCK + offs_m)            # (BLOCK,)
    q_ok = q_pos >= 0
    q_base = b * stride_qb + h64 * stride_qh
    k_base = b * stride_kb + h64 * stride_kh
    v_base = b * stride_vb + h64 * stride_vh
    q = _slot_rows(Q, q_base, q_pos, offs_d, stride_qn, q_ok, d_ok)

    m_i = tl.full([BLOCK], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_D], tl.float32)

    lut = (hl * NQB + qb) * MAXK
    count = tl.load(KvCount + hl * NQB + qb)
    for t in range(0, count):
        kb = tl.load(KvIndex + lut + t)
        mid = tl.load(KvMask + lut + t)
        k_pos = tl.load(KPos + hl * Mk + kb * BLOCK + offs_n)        # (BLOCK,)
        k_ok = k_pos >= 0
        k = _slot_rows(K, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
        v = _slot_rows(V, v_base, k_pos, offs_d, stride_vn, k_ok, d_ok)

        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale   # (BLOCK, BLOCK)
        allowed = _token_mask(TokMask, mid, offs_m, offs_n, BLOCK) & k_ok[None, :]
        s = tl.where(allowed, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # rows with nothing yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_base = b * stride_ob + h64 * stride_oh
    o_ptrs = Out + o_base + q_pos[:, None] * stride_on + offs_d[None, :]
    o_ok = q_ok[:, None] & d_ok[None, :]
    l_ptrs = Lse + b * stride_lb + h64 * stride_lh + q_pos
    if ACCUMULATE:
        # exact merge with the parts already written (natural-log lse; torch twin: fast.core.merge):
        # lse' = logaddexp(lse_prev, lse), out' = e^(lse_prev - lse') out_prev + e^(lse - lse') out
        lse_prev = tl.load(l_ptrs, mask=q_ok, other=float("-inf"))
        out_prev = tl.load(o_ptrs, mask=o_ok, other=0.0)
        top = tl.maximum(lse_prev, lse)
        top = tl.where(top == float("-inf"), 0.0, top)
        w_prev = tl.exp(lse_prev - top)
        w_new = tl.exp(lse - top)
        total = w_prev + w_new                                      # 0 only for empty rows
        t_safe = tl.where(total > 0.0, total, 1.0)
        out = (out_prev * (w_prev / t_safe)[:, None]) + (out * (w_new / t_safe)[:, None])
        lse = tl.where(total > 0.0, top + tl.log(t_safe), float("-inf"))
    tl.store(o_ptrs, out, mask=o_ok)
    tl.store(l_ptrs, lse, mask=q_ok)


@triton.jit
def _row_stats(Lse, Delta, base, q_pos, q_ok):
    """Merged lse in base 2 (+inf for rows that read nothing, so P = 0) and delta."""
    lse = tl.load(Lse + base + q_pos, mask=q_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.load(Delta + base + q_pos, mask=q_ok, other=0.0)
    return lse2, delta


@triton.jit
def _recompute(q, k, v, do, lse2, delta, TokMask, mid, k_ok, offs_m, offs_n, qk_scale,
               BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of the backward, shared by ``_dq_kernel`` and ``_dkdv_kernel``: the
    recomputed P = 2^(S - lse) on the allowed pairs (0 elsewhere) and
    dS = P * (dO V^T - delta). (BLOCK_q, BLOCK_k) each."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    allowed = _token_mask(TokMask, mid, offs_m, offs_n, BLOCK) & k_ok[None, :]
    p = tl.where(allowed, tl.exp2(s - lse2[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def _dq_kernel(
    # pointers: q, k, v, dO (B, H, n, D); lse, delta (B, H, n) fp32; dQ (B, H, n, D) fp32 (added to)
    Q, K, V, DO, Lse, Delta, DQ,
    # strides: q/dO/dQ share (B, H, n) strides, k/v share theirs; lse/delta contiguous (B, H, n)
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_ob, stride_oh, stride_on,
    stride_gb, stride_gh, stride_gn,
    # look-up table of one layout part
    QPos, KPos, KvCount, KvIndex, KvMask, TokMask,
    # sizes
    H, HL, N, Mq, Mk, NQB, MAXK, D,
    qk_scale, scale,
    # meta-parameters
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):
    qb = tl.program_id(0)
    b, h64, hl, bh = _program_heads(H, HL)
    offs_m = tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    q_pos = tl.load(QPos + hl * Mq + qb * BLOCK + offs_m)
    q_ok = q_pos >= 0
    q_base = b * stride_qb + h64 * stride_qh
    k_base = b * stride_kb + h64 * stride_kh          # v shares k's strides
    o_base = b * stride_ob + h64 * stride_oh
    q = _slot_rows(Q, q_base, q_pos, offs_d, stride_qn, q_ok, d_ok)
    do = _slot_rows(DO, o_base, q_pos, offs_d, stride_on, q_ok, d_ok)
    lse2, delta = _row_stats(Lse, Delta, bh.to(tl.int64) * N, q_pos, q_ok)

    dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    lut = (hl * NQB + qb) * MAXK
    count = tl.load(KvCount + hl * NQB + qb)
    for t in range(0, count):
        kb = tl.load(KvIndex + lut + t)
        mid = tl.load(KvMask + lut + t)
        k_pos = tl.load(KPos + hl * Mk + kb * BLOCK + offs_n)
        k_ok = k_pos >= 0
        k = _slot_rows(K, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
        v = _slot_rows(V, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
        _, ds = _recompute(q, k, v, do, lse2, delta, TokMask, mid, k_ok, offs_m, offs_n,
                           qk_scale, BLOCK, PRECISION)                     # (BLOCK, BLOCK)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)

    g_ptrs = DQ + b * stride_gb + h64 * stride_gh + q_pos[:, None] * stride_gn + offs_d[None, :]
    g_ok = q_ok[:, None] & d_ok[None, :]
    prev = tl.load(g_ptrs, mask=g_ok, other=0.0)
    tl.store(g_ptrs, prev + dq * scale, mask=g_ok)


@triton.jit
def _dkdv_kernel(
    # pointers: q, k, v, dO (B, H, n, D); lse, delta (B, H, n) fp32;
    # dK, dV (B, H, n, D) fp32 (added to)
    Q, K, V, DO, Lse, Delta, DK, DV,
    # strides
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_ob, stride_oh, stride_on,
    stride_gb, stride_gh, stride_gn,
    # look-up table of one layout part, transposed: per key block, its query blocks
    QPos, KPos,
    QCount, QIndex, QMask,      # (HL, NKB), (HL, NKB, MAXQ), (HL, NKB, MAXQ)
    TokMask,                    # (NM, BLOCK, BLOCK): [query slot, key slot]
    # sizes
    H, HL, N, Mq, Mk, NKB, MAXQ, D,
    qk_scale, scale,
    # meta-parameters
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):
    kb = tl.program_id(0)
    b, h64, hl, bh = _program_heads(H, HL)
    offs_m = tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    k_pos = tl.load(KPos + hl * Mk + kb * BLOCK + offs_n)
    k_ok = k_pos >= 0
    q_base = b * stride_qb + h64 * stride_qh
    k_base = b * stride_kb + h64 * stride_kh          # v shares k's strides
    o_base = b * stride_ob + h64 * stride_oh
    k = _slot_rows(K, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)
    v = _slot_rows(V, k_base, k_pos, offs_d, stride_kn, k_ok, d_ok)

    dk = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    lut = (hl * NKB + kb) * MAXQ
    count = tl.load(QCount + hl * NKB + kb)
    for t in range(0, count):
        qb = tl.load(QIndex + lut + t)
        mid = tl.load(QMask + lut + t)
        q_pos = tl.load(QPos + hl * Mq + qb * BLOCK + offs_m)
        q_ok = q_pos >= 0
        q = _slot_rows(Q, q_base, q_pos, offs_d, stride_qn, q_ok, d_ok)
        do = _slot_rows(DO, o_base, q_pos, offs_d, stride_on, q_ok, d_ok)
        lse2, delta = _row_stats(Lse, Delta, bh.to(tl.int64) * N, q_pos, q_ok)
        p, ds = _recompute(q, k, v, do, lse2, delta, TokMask, mid, k_ok, offs_m, offs_n,
                           qk_scale, BLOCK, PRECISION)                    # (BLOCK_q, BLOCK_k)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)

    g_ok = k_ok[:, None] & d_ok[None, :]
    off = b * stride_gb + h64 * stride_gh + k_pos[:, None] * stride_gn + offs_d[None, :]
    prev_k = tl.load(DK + off, mask=g_ok, other=0.0)
    tl.store(DK + off, prev_k + dk * scale, mask=g_ok)
    prev_v = tl.load(DV + off, mask=g_ok, other=0.0)
    tl.store(DV + off, prev_v + dv, mask=g_ok)
