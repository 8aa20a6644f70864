/* Causal window attention on the CPU, float32: the strided pattern's band and column, the
 * fixed pattern's own block, and (prefix mode) the fixed pattern's summaries of earlier blocks.
 *
 * Child et al., 2019, section 4.3 (strided A(1): the last l positions; A(2): every l-th one;
 * fixed A(1): the own block; A(2): the last c positions of every block) and section 5.5 (the
 * column "by transposing the matrix and computing a local window"; fixed positions
 * "aggregated and computed in blocks"; the softmax fused, the upper triangle never computed).
 * Loaded by fast/backends/cpu_window.py, which says when it runs, how it is built and what it
 * was measured against (docs/design.md, section 5).
 *
 * One call serves G heads, each holding S sequences of Nseq rows: row r of sequence s lies at
 * natural row s * seqoff + r * step of its head (the band: S = 1, step 1; the column: S = l,
 * seqoff 1, step l). Query row i of a sequence reads its keys j with i - w < j <= i (j < i if
 * strict). Rows are float32 vectors of d (a multiple of 8) floats, d apart within a head;
 * heads are any distance apart (g* strides); lse has one float per row.
 *
 * The work goes in blocks of R = 16 query rows. A block's scores are formed transposed,
 * s[t][r], so that its 16 rows are two 8-lane vectors: every product is an outer product of
 * register tiles (8 keys by 16 rows, 8 rows by 16 features; ``scores_t``, ``pv``, ``ptx``),
 * which is what makes short problems fast (PyTorch's CPU flash kernel takes such problems in
 * 32- or 64-row query blocks of general matrix products). Keys come in tiles of KT with an
 * online softmax (FlashAttention, Dao et al., 2022): any window length works in fixed memory.
 *
 * Forward: out, lse of each row; with ``merge`` the rows are merged into the (out, lse) that
 * are there already (another piece over disjoint keys; fast/core/merge.py has the formula).
 * Backward: given the MERGED out and lse it recomputes P = exp(s - lse) and adds this piece's
 * share of dq, dk, dv (FlashAttention-2, Dao, 2023, sec. 3.1.2); delta = rowsum(dO * O) is
 * formed per block. Key gradients of overlapping windows never race: a task is a whole
 * sequence, or, when sequences are few (the band: one per head), a segment at least a window
 * long, with even segments in one phase and odd ones in the next. From step 2 on, a task packs
 * its sequence's keys and values (and gradients) into contiguous buffers, since rows l apart
 * would share a cache set; those tasks write every row of their sequence once, so ``init``
 * (write, don't add) needs no zero-filled gradient buffers.
 *
 * Prefix mode (P > 0; prefix_forward, prefix_backward): row i of a head's N natural rows reads
 * the first (i / P) C of the head's Nk keys -- the fixed pattern's summaries, gathered in
 * block order, of every block before row i's. A block of 16 rows inside one query block reads
 * one key range whole (no mask); only blocks that straddle two query blocks mask per row. Its
 * backward splits each head's 16-row blocks into nseg interleaved segments, each with key
 * gradients of its own (written whole, the caller sums them), so no two tasks write a row.
 *
 * Overflow (OVERFLOW): finite float32 inputs can still give scores that are not finite (q and
 * k entries near 1e20: a product of 1e40), which the online softmax would take for weights of
 * 0 -- the row's dominant key dropped, or the whole row 0. The forward notes, per row, a NaN
 * score (the max loop skips NaN) or a row that reads keys and ends with no weight (every score
 * -inf, or a +inf one: e^(inf - inf)); such a row gets out = NaN and lse = +inf, which the
 * caller takes for a log-sum-exp beyond float32's range and recomputes in float64
 * (fast/backends/structured/attention.py). A merge into a row already so marked keeps the mark.
 *
 * Returns 0, 1 when a thread could not get its scratch memory, 2 for init without packing or
 * a prefix geometry that reads past the keys.
 */
#include <math.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>

#define R 16   /* query rows per block: two vectors of 8 lanes */
#define TK 8   /* keys (or rows) per register tile */
#define KT 256 /* keys per tile of the online softmax */

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32)));
typedef unsigned v8w __attribute__((vector_size(32)));

static inline v8 ld(const float *p) { return *(const v8u *)p; }
static inline void st(float *p, v8 x) { *(v8u *)p = x; }
static inline v8 bc(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8 sel(v8i m, v8 a, v8 b) { return (v8)((m & (v8i)a) | (~m & (v8i)b)); }
static inline v8 vmax(v8 a, v8 b) { return sel(a > b, a, b); }

/* e^x for x <= 88 (the kernel's x = s - max or s - lse is at most a rounding above 0), 0 below
 * -87.3 and at -inf: x = n ln2 + r with n = round(x / ln2) (the 1.5 * 2^23 trick, whose float
 * bits then hold n too), |r| <= ln2 / 2 by a two-part ln2 (Cody and Waite), e^r by Cephes'
 * single-precision polynomial, 2^n put into the exponent bits. Lanes below -87.3 compute
 * nonsense and are cleared at the end, with no clamp: about half the operations of clamping
 * and flooring, where the exponential was a fifth of the forward's time. */
static inline v8 vexp(v8 x) {
    const float magic = 12582912.0f;                                  /* 1.5 * 2^23 */
    v8i keep = x >= bc(-87.33654f);                                   /* false at -inf, NaN */
    v8 fx = x * bc(1.44269504088896341f) + bc(magic);                 /* n in the low bits */
    v8 n = fx - bc(magic);
    v8 r = x - n * bc(0.693359375f) - n * bc(-2.12194440e-4f);
    v8 y = bc(1.9875691500E-4f);
    y = y * r + bc(1.3981999507E-3f);
    y = y * r + bc(8.3334519073E-3f);
    y = y * r + bc(4.1665795894E-2f);
    y = y * r + bc(1.6666665459E-1f);
    y = y * r + bc(5.0000001201E-1f);
    y = y * r * r + r + bc(1.0f);
    v8w scale = ((v8w)fx << 23) + (127u << 23);                       /* 2^n, n >= -126 */
    return (v8)(keep & (v8i)(y * (v8)scale));
}

typedef struct {
    const float *q, *k, *v, *go, *o, *lsein;
    float *out, *lse, *dq, *dk, *dv;
    long gq, gk, gv, go_, gl, gg, gdq, gdk, gdv; /* head strides */
    long S, Nseq, step, seqoff;  /* sequences per head, rows each, natural rows between a
                                    sequence's rows, and between sequences' first rows */
    long P, C, Nk, nseg;         /* prefix mode (P > 0): row i reads keys t < (i / P) C of
                                    Nk; the backward's segments per head */
    int d, w, strict, merge, init;
    float scale;
} Call;

/* s[t*R + r] = qt[:, r] . k[t] for t < W; qt (d x R), k rows ks apart */
static void scores_t(const float *qt, const float *k, long ks, int W, int d, float *s) {
    for (int t = 0; t < W; t += TK) {
        int nt = W - t < TK ? W - t : TK;
        const float *kr[TK];
        for (int u = 0; u < TK; u++) kr[u] = k + (t + (u < nt ? u : 0)) * ks;
        v8 a[TK][2];
#pragma GCC unroll 8
        for (int u = 0; u < TK; u++) a[u][0] = a[u][1] = bc(0.0f);
        for (int c = 0; c < d; c++) {
            v8 q0 = ld(qt + c * R), q1 = ld(qt + c * R + 8);
#pragma GCC unroll 8
            for (int u = 0; u < TK; u++) {
                v8 b = bc(kr[u][c]);
                a[u][0] += b * q0;
                a[u][1] += b * q1;
            }
        }
        for (int u = 0; u < nt; u++) {
            st(s + (t + u) * R, a[u][0]);
            st(s + (t + u) * R + 8, a[u][1]);
        }
    }
}

/* acc[r][c] += sum_t p[t*R + r] v[t][c] (acc R x d; v rows vs apart), c in [c0, c0 + 8 NV) */
#define PV(NV)                                                                                 \
    static void pv##NV(const float *p, const float *v, long vs, int W, int d, int c0,          \
                       float *acc) {                                                           \
        for (int r = 0; r < R; r += TK) {                                                      \
            v8 a[TK][NV];                                                                      \
            _Pragma("GCC unroll 8") for (int u = 0; u < TK; u++)                               \
                _Pragma("GCC unroll 2") for (int x = 0; x < NV; x++) a[u][x] = bc(0.0f);        \
            for (int t = 0; t < W; t++) {                                                      \
                const float *vr = v + t * vs + c0, *pr = p + t * R + r;                        \
                v8 vv[NV];                                                                     \
                _Pragma("GCC unroll 2") for (int x = 0; x < NV; x++) vv[x] = ld(vr + 8 * x);   \
                _Pragma("GCC unroll 8") for (int u = 0; u < TK; u++) {                         \
                    v8 b = bc(pr[u]);                                                          \
                    _Pragma("GCC unroll 2") for (int x = 0; x < NV; x++) a[u][x] += b * vv[x]; \
                }                                                                              \
            }                                                                                  \
            for (int u = 0; u < TK; u++)                                                       \
                for (int x = 0; x < NV; x++) {                                                 \
                    float *o = acc + (r + u) * d + c0 + 8 * x;                                 \
                    st(o, ld(o) + a[u][x]);                                                    \
                }                                                                              \
        }                                                                                      \
    }
PV(2)
PV(1)

static void pv(const float *p, const float *v, long vs, int W, int d, float *acc) {
    int c = 0;
    for (; c + 16 <= d; c += 16) pv2(p, v, vs, W, d, c, acc);
    if (c < d) pv1(p, v, vs, W, d, c, acc);
}

/* dst[t][c] += alpha sum_r p[t*R + r] x[r][c] (x R x d; dst rows ds apart), c in [c0, c0 + 8 NV) */
#define PTX(NV)                                                                                \
    static void ptx##NV(const float *p, const float *x_, long ds, int W, int d, int c0,        \
                        float alpha, float *dst) {                                             \
        for (int t = 0; t < W; t += TK) {                                                      \
            int nt = W - t < TK ? W - t : TK;                                                  \
            const float *pr[TK];                                                               \
            for (int u = 0; u < TK; u++) pr[u] = p + (t + (u < nt ? u : 0)) * R;               \
            v8 a[TK][NV];                                                                      \
            _Pragma("GCC unroll 8") for (int u = 0; u < TK; u++)                               \
                _Pragma("GCC unroll 2") for (int x = 0; x < NV; x++) a[u][x] = bc(0.0f);        \
            for (int r = 0; r < R; r++) {                                                      \
                v8 xx[NV];                                                                     \
                _Pragma("GCC unroll 2") for (int x = 0; x < NV; x++)                           \
                    xx[x] = ld(x_ + r * d + c0 + 8 * x);                                       \
                _Pragma("GCC unroll 8") for (int u = 0; u < TK; u++) {                         \
                    v8 b = bc(pr[u][r]);                                                       \
                    _Pragma("GCC unroll 2") for (int x = 0; x < NV; x++) a[u][x] += b * xx[x]; \
                }                                                                              \
            }                                                                                  \
            for (int u = 0; u < nt; u++)                                                       \
                for (int x = 0; x < NV; x++) {                                                 \
                    float *o = dst + (t + u) * ds + c0 + 8 * x;                                \
                    st(o, ld(o) + bc(alpha) * a[u][x]);                                        \
                }                                                                              \
        }                                                                                      \
    }
PTX(2)
PTX(1)

static void ptx(const float *p, const float *x, long ds, int W, int d, float alpha, float *dst) {
    int c = 0;
    for (; c + 16 <= d; c += 16) ptx2(p, x, ds, W, d, c, alpha, dst);
    if (c < d) ptx1(p, x, ds, W, d, c, alpha, dst);
}

/* -inf where row i0 + r may not read key j0 + t: allowed iff i - w < j <= i (j < i if strict)
 * and i < n (rows past the sequence read nothing) */
static void mask(float *s, long i0, long j0, int W, const Call *c, int nr) {
    if (c->P) {                    /* prefix mode: row i reads keys below (i / P) C */
        if (nr == R && j0 + W <= (i0 / c->P) * c->C) return;   /* every row reads them all */
        for (int r = 0; r < R; r++) {
            long hi = r < nr ? ((i0 + r) / c->P) * c->C - j0 : 0;
            for (int t = hi < 0 ? 0 : (int)(hi < W ? hi : W); t < W; t++) s[t * R + r] = -INFINITY;
        }
        return;
    }
    for (int t = 0; t < W; t++) {
        long j = j0 + t, lo = j - i0 + c->strict, hi = j + c->w - i0;
        if (hi > nr) hi = nr;
        if (lo <= 0 && hi >= R) continue;
        for (int r = 0; r < R; r++)
            if (r < lo || r >= hi) s[t * R + r] = -INFINITY;
    }
}

/* rows [i0, i0 + nr) of x (rows xs apart) as xt (d x R), times alpha; zero lanes past nr */
static void pack_t(const float *x, long xs, long i0, int nr, int d, float alpha, float *xt) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < d; c++) xt[c * R + r] = r < nr ? alpha * x[(i0 + r) * xs + c] : 0.0f;
}

static void pack(const float *x, long xs, long i0, int nr, int d, float *xr) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < d; c++) xr[r * d + c] = r < nr ? x[(i0 + r) * xs + c] : 0.0f;
}

/* the keys a block of rows [i0, i0 + nr) scores: [key_lo, key_hi) */
static inline long key_lo(long i0, const Call *c) {
    return c->P || i0 - c->w + 1 < 0 ? 0 : i0 - c->w + 1;
}
static inline long key_hi(long i0, int nr, const Call *c) {
    return c->P ? ((i0 + nr - 1) / c->P) * c->C : i0 + nr;
}

/* one sequence: its rows' pointers and row strides (keys and values may be a packed copy) */
typedef struct {
    const float *q, *k, *v, *o, *go, *lsein;
    float *out, *lse, *dq, *dk, *dv;
    long rs, ks, ls;   /* row strides: query side, key side, lse */
} Seq;

/* whether row i of a sequence reads any key: window mode, keys i - w < j <= i (j < i if
 * strict) from 0 on; prefix mode, keys t < (i / P) C */
static inline int reads(long i, const Call *c) {
    return c->P ? i >= c->P : i >= c->strict && c->w > c->strict;
}

static void forward_block(const Call *c, const Seq *sq, long i0, float *buf) {
    int d = c->d, nr = c->Nseq - i0 < R ? (int)(c->Nseq - i0) : R;
    long rs = sq->rs, ks = sq->ks;
    const float *q = sq->q, *k = sq->k, *v = sq->v;
    float *out = sq->out, *lse = sq->lse;
    float *qt = buf, *s = qt + d * R, *acc = s + KT * R;
    pack_t(q, rs, i0, nr, d, c->scale, qt);
    memset(acc, 0, sizeof(float) * R * d);
    float m[R], z[R], mt[R], alpha[R];
    for (int r = 0; r < R; r++) m[r] = -INFINITY, z[r] = 0.0f;
    v8i nan0 = (v8i){0}, nan1 = nan0;              /* a row read a NaN score */
    long jhi = key_hi(i0, nr, c);
    for (long j0 = key_lo(i0, c); j0 < jhi; j0 += KT) {
        int W = jhi - j0 < KT ? (int)(jhi - j0) : KT;
        scores_t(qt, k + j0 * ks, ks, W, d, s);
        mask(s, i0, j0, W, c, nr);
        v8 m0 = bc(-INFINITY), m1 = m0;
        for (int t = 0; t < W; t++) {
            v8 x0 = ld(s + t * R), x1 = ld(s + t * R + 8);
            m0 = vmax(m0, x0);
            m1 = vmax(m1, x1);
            nan0 |= x0 != x0;
            nan1 |= x1 != x1;
        }
        st(mt, m0);
        st(mt + 8, m1);
        for (int r = 0; r < R; r++) {
            float mn = mt[r] > m[r] ? mt[r] : m[r];
            if (mn == -INFINITY) mn = 0.0f;          /* nothing read yet: weights stay 0 */
            alpha[r] = expf(m[r] - mn);
            m[r] = mn;
        }
        v8 n0 = ld(m), n1 = ld(m + 8), z0 = bc(0.0f), z1 = z0;
        for (int t = 0; t < W; t++) {
            v8 p0 = vexp(ld(s + t * R) - n0), p1 = vexp(ld(s + t * R + 8) - n1);
            st(s + t * R, p0);
            st(s + t * R + 8, p1);
            z0 += p0;
            z1 += p1;
        }
        st(mt, z0);
        st(mt + 8, z1);
        for (int r = 0; r < R; r++) {
            z[r] = z[r] * alpha[r] + mt[r];
            if (alpha[r] != 1.0f)
                for (int x = 0; x < d; x++) acc[r * d + x] *= alpha[r];
        }
        pv(s, v + j0 * ks, ks, W, d, acc);
    }
    int nan[R];
    for (int r = 0; r < 8; r++) nan[r] = nan0[r], nan[r + 8] = nan1[r];
    for (int r = 0; r < nr; r++) {
        long i = i0 + r;
        float *o = out + i * rs, l_b = z[r] > 0.0f ? m[r] + logf(z[r]) : -INFINITY;
        float inv = z[r] > 0.0f ? 1.0f / z[r] : 0.0f, wa = 0.0f, wb = inv;
        if (nan[r] || (!(z[r] > 0.0f) && reads(i, c)) || (c->merge && lse[i * sq->ls] == INFINITY)) {
            for (int x = 0; x < d; x++) o[x] = NAN;  /* overflowed scores: never 0, never */
            lse[i * sq->ls] = INFINITY;              /* a dropped key (see OVERFLOW above) */
            continue;
        }
        if (c->merge) {                              /* into the previous piece's (o, lse) */
            float l_a = lse[i * sq->ls], l = l_a > l_b ? l_a : l_b;
            if (l == -INFINITY) {
                wa = 0.0f, wb = 0.0f;
            } else {
                l = l + logf(expf(l_a - l) + expf(l_b - l));
                wa = expf(l_a - l);
                wb = expf(l_b - l) * inv;
            }
            l_b = l;
            for (int x = 0; x < d; x++) o[x] = wa * o[x] + wb * acc[r * d + x];
        } else {
            for (int x = 0; x < d; x++) o[x] = wb * acc[r * d + x];
        }
        lse[i * sq->ls] = l_b;
    }
}

static void backward_block(const Call *c, const Seq *sq, long i0, float *buf) {
    int d = c->d, nr = c->Nseq - i0 < R ? (int)(c->Nseq - i0) : R;
    long rs = sq->rs, ks = sq->ks;
    const float *q = sq->q, *k = sq->k, *v = sq->v, *o = sq->o, *go = sq->go, *lse = sq->lsein;
    float *dq = sq->dq, *dk = sq->dk, *dv = sq->dv;
    float *qt = buf, *gt = qt + d * R, *qr = gt + d * R, *gr = qr + R * d, *acc = gr + R * d,
          *s = acc + R * d, *dp = s + KT * R;
    pack_t(q, rs, i0, nr, d, c->scale, qt);
    pack_t(go, rs, i0, nr, d, 1.0f, gt);
    pack(q, rs, i0, nr, d, qr);
    pack(go, rs, i0, nr, d, gr);
    memset(acc, 0, sizeof(float) * R * d);
    float lr[R], dl[R];
    for (int r = 0; r < R; r++) {
        float t = 0.0f;
        if (r < nr)
            for (int x = 0; x < d; x++) t += gr[r * d + x] * o[(i0 + r) * rs + x];
        dl[r] = t;
        lr[r] = r < nr ? lse[(i0 + r) * sq->ls] : INFINITY;
    }
    v8 l0 = ld(lr), l1 = ld(lr + 8), e0 = ld(dl), e1 = ld(dl + 8);
    long jhi = key_hi(i0, nr, c);
    for (long j0 = key_lo(i0, c); j0 < jhi; j0 += KT) {
        int W = jhi - j0 < KT ? (int)(jhi - j0) : KT;
        scores_t(qt, k + j0 * ks, ks, W, d, s);
        mask(s, i0, j0, W, c, nr);
        scores_t(gt, v + j0 * ks, ks, W, d, dp);
        for (int t = 0; t < W; t++) {
            v8 p0 = vexp(ld(s + t * R) - l0), p1 = vexp(ld(s + t * R + 8) - l1);
            st(s + t * R, p0);
            st(s + t * R + 8, p1);
            st(dp + t * R, p0 * (ld(dp + t * R) - e0));
            st(dp + t * R + 8, p1 * (ld(dp + t * R + 8) - e1));
        }
        ptx(s, gr, ks, W, d, 1.0f, dv + j0 * ks);
        ptx(dp, qr, ks, W, d, c->scale, dk + j0 * ks);
        pv(dp, k + j0 * ks, ks, W, d, acc);
    }
    for (int r = 0; r < nr; r++)
        for (int x = 0; x < d; x++) {
            float *t = dq + (i0 + r) * rs + x;
            *t = (c->init ? 0.0f : *t) + c->scale * acc[r * d + x];
        }
}

/* A task is blocks [b0, b1) of sequence sq of head g. Tasks of one phase never write the same
 * key rows: whole sequences, or segments of one parity at least a window long. */
typedef struct {
    const Call *c;
    int backward, id, nthreads, failed;
    long nseq, seg, nb, phase, nphase;
} Work;

/* rows of a sequence lie step natural rows apart; from step 2 on (the strided column: 32 KiB
 * apart at l = 128, d = 64, where every row falls in the same cache set) a task holds a whole
 * sequence and works on packed copies of its keys and values (and their gradients) */
static void copy_rows(float *dst, long ds, const float *src, long ss, long n, int d) {
    for (long i = 0; i < n; i++) memcpy(dst + i * ds, src + i * ss, sizeof(float) * d);
}

static void *work(void *p) {
    Work *wk = p;
    const Call *c = wk->c;
    int d = c->d, packed = c->step > 1;
    size_t n = (size_t)(4 * d * R + R * d + 2 * KT * R) + 64;
    size_t np = packed ? (size_t)(wk->backward ? 4 : 2) * c->Nseq * d : 0;
    float *buf = malloc((n + np) * sizeof(float));
    if (!buf) {
        wk->failed = 1;
        return NULL;
    }
    float *kp = buf + n, *vp = kp + c->Nseq * d, *dkp = vp + c->Nseq * d, *dvp = dkp + c->Nseq * d;
    if (c->P && wk->backward) {  /* prefix mode: task x = segment x mod nseg of head x / nseg,
                                    its 16-row blocks x mod nseg, + nseg, ...; its own dk, dv */
        for (long x = wk->id; x < wk->nseq * c->nseg; x += wk->nthreads) {
            long g = x / c->nseg;
            Seq sq = {.q = c->q + g * c->gq, .k = c->k + g * c->gk, .v = c->v + g * c->gv,
                      .o = c->o + g * c->go_, .go = c->go + g * c->gg, .lsein = c->lsein + g * c->gl,
                      .dq = c->dq + g * c->gdq, .dk = c->dk + x * c->gdk, .dv = c->dv + x * c->gdv,
                      .rs = d, .ks = d, .ls = 1};
            memset(sq.dk, 0, sizeof(float) * c->Nk * d);         /* contiguous (G nseg, Nk, d) */
            memset(sq.dv, 0, sizeof(float) * c->Nk * d);
            for (long b = x % c->nseg; b < wk->nb; b += c->nseg) backward_block(c, &sq, b * R, buf);
        }
        free(buf);
        return NULL;
    }
    long per = (wk->nb + wk->seg - 1) / wk->seg;               /* segments per sequence */
    long mine = (per - wk->phase + wk->nphase - 1) / wk->nphase;  /* of this phase */
    long total = wk->nseq * mine;
    for (long x = wk->id; x < total; x += wk->nthreads) {
        long qs = x / mine, sg = (x % mine) * wk->nphase + wk->phase;
        long g = qs / c->S, off = (qs % c->S) * c->seqoff;      /* natural row of row 0 */
        long rs = c->step * d, b1 = (sg + 1) * wk->seg;
        Seq sq = {.q = c->q + g * c->gq + off * d, .k = c->k + g * c->gk + off * d,
                  .v = c->v + g * c->gv + off * d, .rs = rs, .ks = rs, .ls = c->step};
        if (wk->backward) {
            sq.o = c->o + g * c->go_ + off * d;
            sq.go = c->go + g * c->gg + off * d;
            sq.lsein = c->lsein + g * c->gl + off;
            sq.dq = c->dq + g * c->gdq + off * d;
            sq.dk = c->dk + g * c->gdk + off * d;
            sq.dv = c->dv + g * c->gdv + off * d;
        } else {
            sq.out = c->out + g * c->go_ + off * d;
            sq.lse = c->lse + g * c->gl + off;
        }
        if (packed) {                 /* a task is a whole sequence here (see run) */
            copy_rows(kp, d, sq.k, rs, c->Nseq, d);
            copy_rows(vp, d, sq.v, rs, c->Nseq, d);
            sq.k = kp, sq.v = vp, sq.ks = d;
            if (wk->backward) {
                memset(dkp, 0, sizeof(float) * 2 * c->Nseq * d);
                sq.dk = dkp, sq.dv = dvp;
            }
        }
        if (b1 > wk->nb) b1 = wk->nb;
        for (long b = sg * wk->seg; b < b1; b++) {
            if (wk->backward)
                backward_block(c, &sq, b * R, buf);
            else
                forward_block(c, &sq, b * R, buf);
        }
        if (packed && wk->backward) {  /* the sequence's key gradients, added once */
            float *dk = c->dk + g * c->gdk + off * d, *dv = c->dv + g * c->gdv + off * d;
            for (long i = 0; i < c->Nseq; i++)
                for (int x = 0; x < d; x++) {
                    dk[i * rs + x] = (c->init ? 0.0f : dk[i * rs + x]) + dkp[i * d + x];
                    dv[i * rs + x] = (c->init ? 0.0f : dv[i * rs + x]) + dvp[i * d + x];
                }
        }
    }
    free(buf);
    return NULL;
}

static int run(const Call *c, long G, int backward, int nthreads) {
    long nseq = G * c->S, nb = (c->Nseq + R - 1) / R, seg = nb, nphase = 1;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 256) nthreads = 256;
    if (c->P) {
        seg = backward ? nb : 1;                   /* prefix mode: see work */
    } else if (c->step > 1) {
        seg = nb;                                  /* whole sequences: packed keys */
    } else if (!backward) {
        seg = 1;                                   /* blocks are independent */
    } else if (nseq < 4 * nthreads) {              /* split sequences: two phases */
        seg = (c->w + R - 1) / R;
        if (seg < 8) seg = 8;
        if (seg < nb) nphase = 2; else seg = nb;
    }
    int failed = 0;
    for (long ph = 0; ph < nphase; ph++) {
#ifdef _OPENMP
        /* the OpenMP runtime PyTorch loaded (same soname): its warm threads, and no second
         * pool spinning against PyTorch's on the same cores */
#pragma omp parallel num_threads(nthreads) reduction(| : failed)
        {
            Work wk = {.c = c, .backward = backward, .id = omp_get_thread_num(),
                       .nthreads = omp_get_num_threads(), .nseq = nseq, .seg = seg, .nb = nb,
                       .phase = ph, .nphase = nphase};
            work(&wk);
            failed |= wk.failed;
        }
#else
        pthread_t th[256];
        Work wk[256];
        int started = 1;
        for (int i = 0; i < nthreads; i++)
            wk[i] = (Work){.c = c, .backward = backward, .id = i, .nthreads = nthreads,
                           .nseq = nseq, .seg = seg, .nb = nb, .phase = ph, .nphase = nphase};
        for (int i = 1; i < nthreads; i++) {
            if (pthread_create(&th[i], NULL, work, &wk[i]) != 0) break;
            started++;
        }
        for (int i = started; i < nthreads; i++) work(&wk[i]);   /* threads that did not start */
        work(&wk[0]);
        for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < nthreads; i++) failed |= wk[i].failed;
#endif
    }
    return failed;
}

int window_forward(const float *q, const float *k, const float *v, float *out, float *lse,
                   const long *gs, long G, long S, long Nseq, long step, long seqoff, int d,
                   int w, int strict, int merge, float scale, int nthreads) {
    Call c = {.q = q, .k = k, .v = v, .out = out, .lse = lse, .gq = gs[0], .gk = gs[1],
              .gv = gs[2], .go_ = gs[3], .gl = gs[4], .S = S, .Nseq = Nseq, .step = step,
              .seqoff = seqoff, .d = d, .w = w, .strict = strict, .merge = merge, .scale = scale};
    return run(&c, G, 0, nthreads);
}

int window_backward(const float *q, const float *k, const float *v, const float *go,
                    const float *o, const float *lse, float *dq, float *dk, float *dv,
                    const long *gs, long G, long S, long Nseq, long step, long seqoff,
                    int d, int w, int strict, int init, float scale, int nthreads) {
    if (init && step < 2) return 2;                /* only packed sequences write once */
    Call c = {.q = q, .k = k, .v = v, .go = go, .o = o, .lsein = lse, .dq = dq, .dk = dk,
              .dv = dv, .gq = gs[0], .gk = gs[1], .gv = gs[2], .go_ = gs[3], .gl = gs[4],
              .gg = gs[5], .gdq = gs[6], .gdk = gs[7], .gdv = gs[8], .S = S, .Nseq = Nseq,
              .step = step, .seqoff = seqoff, .d = d, .w = w, .strict = strict, .init = init,
              .scale = scale};
    return run(&c, G, 1, nthreads);
}

/* Prefix mode (the fixed pattern's summaries of earlier blocks): row i of the N rows of
 * each of G heads reads keys t < (i / P) C of its head's Nk gathered keys (k, v rows d
 * apart); no upper triangle, no mask but at the blocks' edges. */
int prefix_forward(const float *q, const float *k, const float *v, float *out, float *lse,
                   const long *gs, long G, long N, long Nk, int d, long P, long C, int merge,
                   float scale, int nthreads) {
    if (P < 1 || C < 1 || ((N - 1) / P) * C > Nk) return 2;
    Call c = {.q = q, .k = k, .v = v, .out = out, .lse = lse, .gq = gs[0], .gk = gs[1],
              .gv = gs[2], .go_ = gs[3], .gl = gs[4], .S = 1, .Nseq = N, .step = 1,
              .seqoff = 0, .P = P, .C = C, .Nk = Nk, .nseg = 1, .d = d, .w = 1, .merge = merge,
              .scale = scale};
    return run(&c, G, 0, nthreads);
}

/* Its backward: dq written (init) or added per row; the key gradients of segment s of head g
 * written whole into rows [0, Nk) of dk[g nseg + s], dv[g nseg + s] (the caller sums the
 * segments: they split a head's query blocks between threads without a race). */
int prefix_backward(const float *q, const float *k, const float *v, const float *go,
                    const float *o, const float *lse, float *dq, float *dk, float *dv,
                    const long *gs, long G, long N, long Nk, int d, long P, long C, long nseg,
                    int init, float scale, int nthreads) {
    if (P < 1 || C < 1 || nseg < 1 || ((N - 1) / P) * C > Nk) return 2;
    Call c = {.q = q, .k = k, .v = v, .go = go, .o = o, .lsein = lse, .dq = dq, .dk = dk,
              .dv = dv, .gq = gs[0], .gk = gs[1], .gv = gs[2], .go_ = gs[3], .gl = gs[4],
              .gg = gs[5], .gdq = gs[6], .gdk = gs[7], .gdv = gs[8], .S = 1, .Nseq = N,
              .step = 1, .seqoff = 0, .P = P, .C = C, .Nk = Nk, .nseg = nseg, .d = d, .w = 1,
              .init = init, .scale = scale};
    return run(&c, G, 1, nthreads);
}
