"""Masked attention and its gradient, by hand, in NumPy float64 (the ground truth).

Child et al., 2019, section 4 (eq. 2-4):

    Attend(X, S) = ( a(x_i, S_i) )_i,
    a(x_i, S_i)  = softmax( q_i K_{S_i}^T / sqrt(d) ) V_{S_i},

where S_i is the set of positions output i may read, given here as a bool mask
(True where i reads j). ``attend`` also returns the log-sum-exp of every row,
which fast kernels save for their backward pass and use to merge heads exactly.

A row that reads nothing (possible for the second head of early positions) has
an empty softmax: its output is 0 and its log-sum-exp is -inf, never NaN.

Dropout on the attention weights (as ``torch.nn.functional.scaled_dot_product_attention``
applies it): given which weights are kept, ``keep`` (bool, True = kept) and the drop
probability p, the output is (P * keep / (1 - p)) V; the log-sum-exp is that of the
scores, before dropout. The mask is an input here, so that a fast path's own random
mask can be checked exactly.
"""

from __future__ import annotations

import numbers

import numpy as np


def _check(q, k, v, mask, grad_out=None):
    arrays = {"q": q, "k": k, "v": v}
    if grad_out is not None:
        arrays["grad_out"] = grad_out
    out = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.kind not in "fiu":
            raise ValueError(f"{name} must hold real numbers, got dtype {a.dtype}")
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., n, d), got shape {a.shape}")
        if a.shape[-2] == 0:
            raise ValueError(f"{name} is an empty sequence (n = 0); n must be >= 1")
        if name != "grad_out" and a.shape[-1] == 0:  # refused like n = 0: nothing to attend with
            width = "d_v" if name == "v" else "d"
            raise ValueError(f"{name} has width {width} = 0 (shape {a.shape}); "
                             f"{width} must be >= 1")
        a = a.astype(np.float64)
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} holds non-finite values (NaN or inf); all must be finite")
        out[name] = a
    q, k, v = out["q"], out["k"], out["v"]
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the last dimension d, got q {q.shape}, k {k.shape}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must have the same (..., n) shape, got k {k.shape}, v {v.shape}")
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise ValueError(f"mask must be a bool array (True = may read), got dtype {mask.dtype}")
    if not _broadcasts_to(mask.shape, q.shape[:-1] + (k.shape[-2],)):
        raise ValueError(
            f"mask of shape {mask.shape} does not broadcast to (..., n_q, n_k) = "
            f"{q.shape[:-1] + (k.shape[-2],)}"
        )
    if grad_out is not None and out["grad_out"].shape != q.shape[:-1] + (v.shape[-1],):
        raise ValueError(
            f"grad_out must have the output's shape {q.shape[:-1] + (v.shape[-1],)}, "
            f"got {out['grad_out'].shape}"
        )
    return q, k, v, mask, out.get("grad_out")


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """True if an array of ``shape`` broadcasts to exactly ``target``."""
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:  # NumPy's "shape mismatch": the callers say what was expected
        return False


def _scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / np.sqrt(d)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) \
            or not np.isfinite(scale):
        raise ValueError(f"scale must be finite, a real number or None, got {scale!r}")
    return float(scale)


def _probabilities(q, k, mask, scale):
    """Softmax over the allowed keys of each row: (P, lse), P shaped (..., n_q, n_k)."""
    scores = scale * (q @ np.swapaxes(k, -1, -2))               # (..., n_q, n_k)
    scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)                 # -inf for empty rows
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.where(mask, np.exp(scores - safe_max), 0.0)
    total = weights.sum(axis=-1, keepdims=True)                  # 0 for empty rows
    probs = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + safe_max[..., 0], -np.inf)
    return probs, lse


def _dropout(keep, dropout_p, shape):
    """The factor keep / (1 - p) that dropout multiplies the weights by (None: no
    dropout), checked: p a real number (not bool) with 0 <= p < 1; keep bool,
    broadcastable to ``shape``."""
    if isinstance(dropout_p, (bool, np.bool_)) \
            or not isinstance(dropout_p, (int, float, np.integer, np.floating)) \
            or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a real number in [0, 1), got {dropout_p!r} "
                         f"({type(dropout_p).__name__})")
    if keep is None:
        if dropout_p:
            raise ValueError(f"dropout_p={dropout_p} needs keep, the mask of kept weights")
        return None
    keep = np.asarray(keep)
    if keep.dtype != np.bool_:
        raise ValueError(f"keep must be a bool array (True = kept), got dtype {keep.dtype}")
    if not _broadcasts_to(keep.shape, shape):
        raise ValueError(f"keep of shape {keep.shape} does not broadcast to the weights' "
                         f"shape (..., n_q, n_k) = {shape}")
    return keep / (1.0 - dropout_p)


def attend(q, k, v, mask, scale=None, keep=None, dropout_p=0.0):
    """Attention of q over the keys each row may read.

    q: (..., n_q, d), k: (..., n_k, d), v: (..., n_k, d_v) with n_q, n_k, d, d_v >= 1;
    mask: bool, broadcastable to (..., n_q, n_k). Returns ``(out, lse)``: out (..., n_q, d_v)
    and the natural-log log-sum-exp of the scaled scores of each row (..., n_q).
    ``scale`` defaults to 1 / sqrt(d). ``keep``, ``dropout_p``: dropout on the weights
    (module docstring).
    """
    q, k, v, mask, _ = _check(q, k, v, mask)
    probs, lse = _probabilities(q, k, mask, _scale(scale, q.shape[-1]))
    drop = _dropout(keep, dropout_p, probs.shape)
    return (probs if drop is None else probs * drop) @ v, lse


def attend_backward(q, k, v, mask, grad_out, scale=None, keep=None, dropout_p=0.0):
    """Gradients (dq, dk, dv) of sum(grad_out * attend(q, k, v, mask, ...)[0]).

    With S = scale q k^T, P = softmax(S) over allowed keys, O = P V:
        dV = P^T dO
        dP = dO V^T
        dS = P * (dP - D),  D_i = sum_j P_ij dP_ij = sum_c dO_ic O_ic
        dQ = scale dS K,    dK = scale dS^T Q
    Rows that read nothing have P = 0 and so contribute nothing. With dropout
    (M = keep / (1 - p), O = (P M) V): dV = (P M)^T dO and dP = (dO V^T) M, and then
    D_i = sum_j P_ij dP_ij (no longer sum_c dO_ic O_ic).
    """
    q, k, v, mask, grad_out = _check(q, k, v, mask, grad_out)
    scale = _scale(scale, q.shape[-1])
    probs, _ = _probabilities(q, k, mask, scale)
    drop = _dropout(keep, dropout_p, probs.shape)
    if drop is not None:
        dv = np.swapaxes(probs * drop, -1, -2) @ grad_out
        dp = (grad_out @ np.swapaxes(v, -1, -2)) * drop
        delta = np.sum(probs * dp, axis=-1, keepdims=True)
        ds = probs * (dp - delta)
        return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv
    out = probs @ v
    dv = np.swapaxes(probs, -1, -2) @ grad_out
    dp = grad_out @ np.swapaxes(v, -1, -2)
    delta = np.sum(grad_out * out, axis=-1, keepdims=True)
    ds = probs * (dp - delta)
    dq = scale * ds @ k
    dk = scale * np.swapaxes(ds, -1, -2) @ q
    return dq, dk, dv
