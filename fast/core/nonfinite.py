"""Non-finite q, k, v with the finite check off: never hidden, never spread.

Child et al., 2019, section 4 (eq. 2-4): output i is softmax(q_i K_S^T) V_S over the
positions S_i it reads, and nothing else. ``fast.sparse_attention(check_finite=False)``
accepts NaN and inf in q, k, v; what it then promises is that formula, with a
non-finite value read as NaN:

* a row whose query holds a NaN or inf, or that reads a key or value holding one,
  outputs NaN (the whole row), forward and backward: its dq is NaN, and so are dk
  and dv of every position it reads;
* every other row, and every gradient no such row touches, is exactly what it is
  without the non-finite values -- a NaN never reaches a row that does not read it.

A padded batch's rows outside their sequences are no rows of it: a padded query row
outputs 0 with zero gradients whatever it holds, and a padded key is read by no row
(``fast.backends.padding.zero_outside``).

This is the float64 reference's answer (``reference.attention``, which refuses
non-finite input; with it the formula gives NaN exactly in those rows) in every
dtype, and stricter than IEEE arithmetic in one corner: a score of -inf from an
infinite key counts as a read NaN, not as a masked position. The fused kernels do
not keep the promise on their own: an additive -inf mask turns a NaN score into
NaN for rows that do not read it (NaN + -inf = NaN), the causal SDPA math path
multiplies masked NaNs by zero, and the CPU kernel's row maximum skips a NaN in
its scalar tail (a NaN query row came out 0).

``quarantine(attend, q, k, v, reach)`` keeps it for any attention function: the
non-finite rows of q, k, v are replaced by zeros, ``attend`` runs on the clean
inputs, and the rows that read a non-finite value are set to NaN -- in the output,
and in the gradients, where their own contribution is first cut off (a row's
NaN would otherwise flow through the kernel's masked pairs too). Which rows read
which positions comes from ``reach``; ``attention_reach(attend)`` derives it from
the attention itself, run once more on zeros (every score 0, so every read key has
weight 1 / |S_i| > 0) with d = 1; ``causal_reach`` is the closed form for full
causal attention. On the CPU the look for non-finite values costs one read of
q, k, v and no wait, and clean inputs go straight to ``attend``; on a GPU that
look would wait for the device, so a call there is quarantined without looking, and
so is every call traced by torch.compile (the look is a host read).

What it costs is why it is asked for, not given: ``fast.sparse_attention`` keeps this
promise with ``check_finite=False`` (an isfinite pass of q, k, v on every call, the
masked fills, and for patterns other than "full" a second attention, on d = 1, with its
backward). By default it refuses non-finite input on the CPU and, on a GPU, looks at no
value at all, as SDPA, flash-attn and FlexAttention do: a NaN there goes where the
kernels carry it (``fast.attention``, "Non-finite").
"""

from __future__ import annotations

import torch


def _bad_rows(t: torch.Tensor) -> torch.Tensor:
    """(B, H, n) bool: rows of t (B, H, n, d) holding a NaN or inf."""
    return ~torch.isfinite(t).all(-1)


class _ZeroRows(torch.autograd.Function):
    """Rows ``bad`` of x set to 0; the gradient set to NaN in rows ``nan_grad``."""

    @staticmethod
    def forward(ctx, x, bad, nan_grad):
        ctx.nan_grad = nan_grad
        return x.masked_fill(bad[..., None], 0.0)

    @staticmethod
    def backward(ctx, grad):
        return grad.masked_fill(ctx.nan_grad[..., None], float("nan")), None, None


class _NaNRows(torch.autograd.Function):
    """Rows ``bad`` of out set to NaN; no gradient flows back through them."""

    @staticmethod
    def forward(ctx, out, bad):
        ctx.bad = bad
        return out.masked_fill(bad[..., None], float("nan"))

    @staticmethod
    def backward(ctx, grad):
        return grad.masked_fill(ctx.bad[..., None], 0.0), None


def causal_reach(bad_keys: torch.Tensor, bad_rows: torch.Tensor | None, keys: bool = True):
    """Full causal self-attention (row i reads j <= i, one head of keys per query head):
    (rows that read a bad key, keys read by a bad row -- None unless ``keys``) from
    bad_keys (B, H, n) bool and the bad rows (B, H, n)."""
    reads_bad = torch.cummax(bad_keys.to(torch.uint8), dim=-1).values.bool()
    if bad_rows is None or not keys:
        return reads_bad, None
    rows = bad_rows | reads_bad
    read_by_bad = torch.cummax(rows.flip(-1).to(torch.uint8), dim=-1).values.flip(-1).bool()
    return reads_bad, read_by_bad


def attention_reach(attend):
    """A ``reach`` for ``quarantine`` from the attention function itself: attention over
    zero q and k (every score 0: weight 1 / |S_i| on every key a row reads) of the
    bad-key indicator; its backward with the bad rows gives the keys they read. Queries
    and keys may differ in number and heads (q (B, H, n_q, d), k (B, Hkv, n_k, d)): the
    shapes come from bad_rows (B, H, n_q) and bad_keys (B, Hkv, n_k)."""
    def reach(bad_keys: torch.Tensor, bad_rows: torch.Tensor | None, keys: bool = True):
        rows = bad_keys.shape if bad_rows is None else bad_rows.shape
        want_keys = keys and bad_rows is not None
        zq = torch.zeros(*rows, 1, dtype=torch.float32, device=bad_keys.device)
        zk = torch.zeros(*bad_keys.shape, 1, dtype=torch.float32, device=bad_keys.device)
        ind = bad_keys.to(torch.float32)[..., None].requires_grad_(want_keys)
        with torch.enable_grad():
            frac = attend(zq, zk, ind)                                    # (B, H, n_q, 1)
        reads_bad = frac[..., 0].detach() > 0
        if not want_keys:
            return reads_bad, None
        rows = bad_rows | reads_bad
        share, = torch.autograd.grad(frac, ind, rows.to(frac.dtype)[..., None])
        return reads_bad, share[..., 0] > 0
    return reach


def quarantine(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reach,
               *, always: bool | None = None) -> torch.Tensor:
    """``attend(q, k, v)`` with the promise of the module docstring for non-finite
    values. q (B, H, n_q, d), k, v (B, Hkv, n_k, d); ``reach(bad_keys, bad_rows, keys)``
    as ``causal_reach`` (``keys``: whether the keys the bad rows read are wanted too).
    ``always``: quarantine without looking first (default: on a GPU, and when traced by
    torch.compile, where looking is a host read that breaks the graph; the answers are
    the same either way)."""
    if always is None:
        always = q.device.type != "cpu" or torch.compiler.is_compiling()
    bad_q, bad_kv = _bad_rows(q), _bad_rows(k) | _bad_rows(v)           # (B, H, n)
    if not always and not bool(bad_q.any() or bad_kv.any()):
        return attend(q, k, v)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    reads_bad, read_by_bad = reach(bad_kv, bad_q, keys=grad)
    rows = bad_q | reads_bad                                            # rows that output NaN
    if not grad:
        with torch.no_grad():
            clean = [t.masked_fill(b[..., None], 0.0) for t, b in ((q, bad_q), (k, bad_kv),
                                                                  (v, bad_kv))]
            return attend(*clean).masked_fill(rows[..., None], float("nan"))
    q0 = _ZeroRows.apply(q, bad_q, rows)
    k0 = _ZeroRows.apply(k, bad_kv, read_by_bad)
    v0 = _ZeroRows.apply(v, bad_kv, read_by_bad)
    return _NaNRows.apply(attend(q0, k0, v0), rows)


__all__ = ["quarantine", "attention_reach", "causal_reach"]
