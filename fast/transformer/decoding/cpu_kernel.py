"""One decoding step of the whole network on the CPU, compiled by Numba.

Child et al., 2019, sections 5.2-5.6 (the residual block: pre-activation
LayerNorm, attention, W_p, the GeLU feed-forward) and section 4.3 (the keys a
head reads). ``fast.transformer.decoding.decode`` computes one new position per
step. For a small model that step is about a hundred one-row products (photos32:
four blocks of 128 features), and eager PyTorch on the CPU spends more time
dispatching each of them than computing it. Here the same step is one loop nest
that Numba compiles once (cached on disk beside this file, or in Numba's cache
folder; in memory where neither can be written: ``_jit``), so a step costs about
its arithmetic (``python -m fast generate`` times both engines:
figures/data/generation.json).

The kernel knows nothing about patterns: each head's reads arrive as a list of
store rows, worked out by the caches (``fast.transformer.decoding.kv_cache``) from
``fast.backends.reads`` -- the one place that says which keys a step reads.
Arrays (NumPy, C-contiguous; float32 unless said):

    tokens (B,) int64           the tokens at position t
    embed (vocab, d), pos (d,)  the token embeddings and position t's embedding
    weights                     ``cpu_step.KERNEL_WEIGHTS``, each stacked over the
                                L blocks
    eps (L + 1, 2) float64      each block's two LayerNorm eps, then ln_f's
    head_w (d, vocab), head_b   the output layer, after ln_f (ln_w, ln_b)
    stores                      a numba typed List of (B, Hg, rows, dk + dv)
                                caches: a head's key then its value, per row
    table (L, H, 7) int64       per block and head: its store, its slot in the
                                store, two rows to write position t's key and
                                value to (-1: none), its reads rows[lo:hi], and
                                where its keep flags start in ``keep`` (-1: all)
    rows (R,) int64, keep (K,) bool

Arithmetic as the PyTorch step does it (same weights, same order of layers, the
GeLU slope of ``fast.transformer.network.block``), accumulated in float32: the
logits agree with ``model(idx)[:, -1]`` to float32 rounding (the tests ask 1e-5). A
head that reads no key outputs 0 (``reference.attention``). Float32 only: a float64
model, autocast (float16 / bfloat16) and CUDA take the PyTorch step.
"""

from __future__ import annotations

import numpy as np

from fast.transformer.network.block import GELU_SLOPE

try:
    import numba
except ImportError as err:                  # the PyTorch step still works without it
    numba = None
    MISSING = (f"Numba is not installed ({err}); install it with `pip install numba`, or "
               f"decode with engine='torch'")
else:
    MISSING = ""



SLOPE = np.float32(GELU_SLOPE)              # a float32 constant inside the compiled loop


def _jit(fn):
    """Compile with Numba (nopython, cached on disk) when it is installed. Where no
    folder takes Numba's cache -- an install that is read-only, with a HOME that is
    not writable and no NUMBA_CACHE_DIR -- Numba refuses ``cache=True`` ("no locator
    available"); the kernel is then compiled in memory, once per process, rather
    than cached in a shared temporary folder (Numba's cache files are pickles: a
    folder others can write to would let them run code here)."""
    if numba is None:
        return fn
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError as err:
        if "no locator available" not in str(err):
            raise
        return numba.njit(cache=False, nogil=True)(fn)


@_jit
def _layer_norm(h, w, b, eps, out):
    """out[r] = (h[r] - mean) / sqrt(var + eps) * w + b, for each row r."""
    B, d = h.shape
    for r in range(B):
        mean = np.float32(0.0)
        for i in range(d):
            mean += h[r, i]
        mean /= d
        var = np.float32(0.0)
        for i in range(d):
            z = h[r, i] - mean
            var += z * z
        inv = np.float32(1.0 / np.sqrt(var / d + eps))
        for i in range(d):
            out[r, i] = (h[r, i] - mean) * inv * w[i] + b[i]


@_jit
def _linear(x, w, b, out):
    """out = x @ w + b: x (B, k), w (k, n), b (n,); the inner loop runs along a
    row of w, which the compiler vectorises."""
    B, k = x.shape
    n = w.shape[1]
    for r in range(B):
        for j in range(n):
            out[r, j] = b[j]
        for i in range(k):
            xi = x[r, i]
            for j in range(n):
                out[r, j] += xi * w[i, j]


@_jit
def _attend(q, store, rows, keep, scores, picked, out):
    """One head's row of attention: softmax(q . k_j) v_j over the store rows j in
    ``rows`` whose keep flag is set (``keep`` empty: all). q (dk,), already scaled;
    store (rows, dk + dv); out (dv,); scores and picked: scratch of len(rows) at
    least. No kept row: out = 0; kept rows whose scores all overflowed to -inf (finite
    q and k near 1e20): NaN, as torch.softmax gives. Every row's score is computed (a dense cache's
    step costs O(t), as it should), the weighted sum runs over the kept rows
    only. Rows go four at a time, so that four sums are in flight instead of one
    chain of dependent additions."""
    dk, dv, m = q.shape[0], out.shape[0], rows.shape[0]
    four = m - m % 4
    for a in range(0, four, 4):                                  # scores: q . k
        j0, j1, j2, j3 = rows[a], rows[a + 1], rows[a + 2], rows[a + 3]
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for i in range(dk):
            s0 += q[i] * store[j0, i]
            s1 += q[i] * store[j1, i]
            s2 += q[i] * store[j2, i]
            s3 += q[i] * store[j3, i]
        scores[a], scores[a + 1], scores[a + 2], scores[a + 3] = s0, s1, s2, s3
    for a in range(four, m):
        j0, s0 = rows[a], np.float32(0.0)
        for i in range(dk):
            s0 += q[i] * store[j0, i]
        scores[a] = s0
    top, reads = -np.inf, False
    for a in range(m):
        if keep.shape[0] and not keep[a]:
            scores[a] = -np.inf
        else:
            reads = True
            if scores[a] > top or scores[a] != scores[a]:    # NaN wins, as in torch.softmax
                top = scores[a]
    for i in range(dv):
        out[i] = np.nan if reads and top == -np.inf else 0.0
    if top == -np.inf:           # reads nothing: 0; or every score it reads overflowed to
        return                   # -inf (finite q, k near 1e20 in float32): NaN, never 0
    total = np.float32(0.0)
    kept = 0                                                 # softmax, kept rows packed
    for a in range(m):
        p = np.exp(scores[a] - top)                          # a dropped row: exp(-inf) = 0
        total += p
        if p != 0.0 or p != p:
            scores[kept], picked[kept] = p, rows[a]
            kept += 1
    four = kept - kept % 4
    for a in range(0, four, 4):                              # out = sum_j p_j v_j
        j0, j1, j2, j3 = picked[a], picked[a + 1], picked[a + 2], picked[a + 3]
        p0, p1, p2, p3 = scores[a] / total, scores[a + 1] / total, scores[a + 2] / total, \
            scores[a + 3] / total
        for i in range(dv):
            out[i] += p0 * store[j0, dk + i] + p1 * store[j1, dk + i] + \
                p2 * store[j2, dk + i] + p3 * store[j3, dk + i]
    for a in range(four, kept):
        j0, p0 = picked[a], scores[a] / total
        for i in range(dv):
            out[i] += p0 * store[j0, dk + i]


@_jit
def decode_step(tokens, embed, pos, ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w,
                ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, eps, ln_w, ln_b, head_w, head_b, stores,
                table, rows, keep):
    """Position t of every row: tokens (B,) -> logits (B, vocab) (module docstring)."""
    L, H = table.shape[0], table.shape[1]
    B, d = tokens.shape[0], embed.shape[1]
    width = stores[0].shape[3]                      # dk + dv
    dv = d // H
    dk = width - dv
    dq = qkv_w.shape[2] - H * width
    h = np.empty((B, d), np.float32)
    for r in range(B):
        for i in range(d):
            h[r, i] = embed[tokens[r], i] + pos[i]
    x = np.empty((B, d), np.float32)
    y = np.empty((B, d), np.float32)
    o = np.empty((B, d), np.float32)
    qkv = np.empty((B, qkv_w.shape[2]), np.float32)
    f = np.empty((B, fc1_w.shape[2]), np.float32)
    scores = np.empty(max(rows.shape[0], 1), np.float32)
    picked = np.empty(max(rows.shape[0], 1), np.int64)
    for layer in range(L):
        _layer_norm(h, ln1_w[layer], ln1_b[layer], eps[layer, 0], x)
        _linear(x, qkv_w[layer], qkv_b[layer], qkv)
        for head in range(H):
            slot, w0, w1 = table[layer, head, 1], table[layer, head, 2], table[layer, head, 3]
            lo, hi, k0 = table[layer, head, 4], table[layer, head, 5], table[layer, head, 6]
            buf = stores[table[layer, head, 0]]
            for r in range(B):
                kv = qkv[r, dq + head * width:dq + (head + 1) * width]
                if w0 >= 0:
                    buf[r, slot, w0] = kv
                if w1 >= 0:
                    buf[r, slot, w1] = kv
                flags = keep[k0:k0 + hi - lo] if k0 >= 0 else keep[:0]
                _attend(qkv[r, head * dk:(head + 1) * dk], buf[r, slot], rows[lo:hi], flags,
                        scores, picked, o[r, head * dv:(head + 1) * dv])
        _linear(o, proj_w[layer], proj_b[layer], y)
        h += y
        _layer_norm(h, ln2_w[layer], ln2_b[layer], eps[layer, 1], x)
        _linear(x, fc1_w[layer], fc1_b[layer], f)
        for r in range(B):                          # f(x) = x sigmoid(1.702 x) (network.block)
            for j in range(f.shape[1]):
                f[r, j] = f[r, j] / (np.float32(1.0) + np.exp(-SLOPE * f[r, j]))
        _linear(f, fc2_w[layer], fc2_b[layer], y)
        h += y
    _layer_norm(h, ln_w, ln_b, eps[L, 0], x)
    logits = np.empty((B, head_w.shape[1]), np.float32)
    _linear(x, head_w, head_b, logits)
    return logits
