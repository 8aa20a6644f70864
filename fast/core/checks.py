"""Input checks shared by every attention entry point: q, k, v, the scale, SDPA's arguments.

Child et al., 2019, section 4 (eq. 2-4): causal attention reads q (B, H, n_q, d) and
k, v (B, Hkv, n_k, d) -- the queries the last n_q of the n_k positions, Hkv = H or,
for grouped-query attention, dividing H -- and scales scores by 1 / sqrt(d) unless
told otherwise.
``fast.attention.sparse_attention`` and the Triton kernel's own entry point
(``fast.kernels.triton_attention``) call the same ``check_tensors`` and
``check_scale``; the kernel passes its narrower dtypes and adds its own limit on
d. ``check_call`` is every check of ``sparse_attention``'s arguments that reads no
value -- the tensors, the scale, SDPA's arguments (mask, dropout, causal, grouped
heads), the pattern's keywords and parameters (``reference.params.check_params``) --
run once per call signature by its call plan. Every bad input raises ValueError saying
what was given and what is allowed (TypeError for an unknown keyword).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from fast.core.precision import fold_dtype
from reference.params import PARAMS, check_params

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
# Every parameter some pattern takes: the only extra keywords sparse_attention accepts.
KNOWN_PARAMS = frozenset(name for required, optional in PARAMS.values()
                         for name in (*required, *optional))

# Names other attention APIs take, and what to use here instead.
OTHER_NAMES = {
    "key_padding_mask": "a padded batch is given by lengths= (real tokens per sequence) and "
                        "offsets= (pad tokens before each: left padding); any boolean mask "
                        "is attn_mask= (True = may read; backend 'naive')",
    "attention_mask": "a boolean mask is attn_mask= (True = may read; backend 'naive'); "
                      "padding is lengths= and offsets=",
    "mask": "a boolean mask is attn_mask= (True = may read)",
    "causal": "is_causal= (True; every pattern is causal)",
    "dropout": "dropout_p=",
    "softmax_scale": "scale=",
    "need_weights": "sparse_attention returns the output only",
    "num_key_value_groups": "k and v with fewer heads, and enable_gqa=True",
}


def check_tensors(q, k, v, *, dtypes: tuple = DTYPES, finite: bool = True,
                  enable_gqa: bool = False) -> None:
    """q (B, H, n_q, d), k and v (B, Hkv, n_k, d): real floating tensors of one dtype
    and device, every dimension >= 1, dtype one of ``dtypes``; k and v of one shape;
    n_q <= n_k (the queries are the last n_q positions); Hkv = H, or, with
    ``enable_gqa`` (grouped-query attention, as SDPA), Hkv dividing H. Nested (jagged)
    tensors are refused: a padded batch is dense tensors and their lengths.

    ``finite=True`` also rejects NaN and inf (``check_finite``): one read-only pass
    per tensor (``torch.aminmax``; NaN and inf survive a min/max and nothing can
    overflow). On a GPU it waits for the device (the answer is read on the host),
    so an inner entry point that is also called from ``sparse_attention`` may skip it.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (B, H, n, d), "
                             f"got {type(t).__name__}")
        if t.is_nested:
            raise ValueError(f"{name} is a nested (jagged) tensor; attention here takes "
                             f"dense (B, H, n, d) tensors: pad the sequences to one length "
                             f"and pass their lengths (lengths=, and offsets= for left "
                             f"padding)")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, n, d) (4 dimensions), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise ValueError(f"{name} has dtype {t.dtype}; allowed: "
                             f"{', '.join(str(d) for d in dtypes)}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape (B, Hkv, n_k, d), got {shapes}")
    (B, H, n_q, d), (Bk, Hkv, n_k, dk) = q.shape, k.shape
    if (B, d) != (Bk, dk):
        raise ValueError(f"q, k, v must have one shape (B, H, n, d) but for the heads of k "
                         f"and v (grouped-query attention) and the query length n_q <= "
                         f"n_k: the batch B and width d must agree, got {shapes}")
    if n_q > n_k:
        raise ValueError(f"the query length n_q must be at most the key length n_k (the "
                         f"queries are the last n_q positions of the keys), got n_q={n_q} > "
                         f"n_k={n_k} ({shapes})")
    if Hkv != H and not (enable_gqa and Hkv >= 1 and H % Hkv == 0):
        raise ValueError(
            f"k and v have {Hkv} heads and q has {H}: "
            + ("with enable_gqa=True the key/value heads must divide the query heads"
               if enable_gqa else
               "grouped-query attention (key/value heads dividing the query heads) needs "
               "enable_gqa=True, as in scaled_dot_product_attention")
            + f" ({shapes})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if n_q == 0 or n_k == 0:
        raise ValueError(f"sequence length n must be >= 1, got n = 0 ({shapes})")
    if B == 0 or H == 0 or d == 0 or Hkv == 0:
        raise ValueError(f"B, H and d must be >= 1, got shape (B, H, n, d) = {tuple(q.shape)}"
                         f" ({shapes})")
    if finite:
        check_finite(q, k, v)


class NonFiniteInput(ValueError):
    """q, k or v holds NaN or inf (``check_finite``): a ValueError with a name of its own,
    so that a training loop can stop on it as it stops on a non-finite loss."""


def check_finite(q, k, v) -> None:
    """Reject NaN and inf in q, k, v: one read-only pass per tensor."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        # min and max are NaN if any element is, +-inf if any is
        if not bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()):
            raise NonFiniteInput(f"{name} holds non-finite values (NaN or inf); all must be "
                                 f"finite")


def check_scale(scale, d: int) -> float:
    """The score scale: 1 / sqrt(d) for None, else a finite real number."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite real number or None, got {scale!r}")
    return float(scale)


def check_keywords(params: dict) -> None:
    """Extra keywords must be parameters of some pattern (``reference.params.PARAMS``);
    any other is named, as Python names an unexpected keyword argument."""
    unknown = sorted(set(params) - KNOWN_PARAMS)
    if unknown:
        hints = "; ".join(f"for {name!r}: {OTHER_NAMES[name]}" for name in unknown
                          if name in OTHER_NAMES)
        raise TypeError(f"sparse_attention() got unexpected keyword argument"
                        f"{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                        f"it takes the pattern's parameters {sorted(KNOWN_PARAMS)} and the "
                        f"arguments of its signature" + (f" ({hints})" if hints else ""))


def check_mask(attn_mask, q, k) -> None:
    """attn_mask: a bool tensor on q's device, broadcastable to (B, H, n_q, n_k)."""
    B, H, n_q, _ = q.shape
    want = (B, H, n_q, k.shape[2])
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
        got = attn_mask.dtype if isinstance(attn_mask, torch.Tensor) else type(attn_mask).__name__
        raise ValueError(f"attn_mask must be a bool tensor (True = may read), ANDed with the "
                         f"pattern, broadcastable to (B, H, n_q, n_k) = {want}; got {got} "
                         f"(an additive float mask is not taken)")
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask must be on q's device {q.device}, got {attn_mask.device}")
    try:
        fits = torch.broadcast_shapes(attn_mask.shape, want) == want
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"(B, H, n_q, n_k) = {want}")


def check_sdpa(dropout_p, is_causal, enable_gqa) -> float:
    """SDPA's arguments as sparse_attention takes them; returns dropout_p as a float."""
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be True or False, got {is_causal!r}")
    if not is_causal:
        raise ValueError("is_causal=False is not taken: every pattern is causal (row i reads "
                         "j <= i); allowed: is_causal=True (the default)")
    if not isinstance(enable_gqa, bool):
        raise ValueError(f"enable_gqa must be True or False, got {enable_gqa!r}")
    if (isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float))
            or not 0.0 <= dropout_p < 1.0):
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    return float(dropout_p)


class Checked(NamedTuple):
    """What ``check_call`` leaves: the pattern's parameters as ``check_params`` returns
    them, the scale and dropout_p as floats, and where the scale goes
    (``fast.core.precision.fold_dtype``: None, or the dtype to fold it into q in)."""
    params: dict
    scale: float
    dropout_p: float
    fold: torch.dtype | None


def check_call(q, k, v, pattern, combine, layer, scale, attn_mask, dropout_p, is_causal,
               enable_gqa, check_finite, params: dict, pattern_params: dict) -> Checked:
    """Every check of a ``fast.sparse_attention`` call that reads no value, in the order a
    user meets them: the keywords, ``check_finite``, SDPA's arguments, q, k, v, the scale,
    the mask's metadata (then where the scale goes), and last the pattern and its parameters
    (``params``: stride and c as given, with ``pattern_params``) at n_k keys and H
    heads."""
    check_keywords(pattern_params)
    if check_finite is not None and not isinstance(check_finite, bool):
        raise ValueError(f"check_finite must be True, False or None, got {check_finite!r}")
    dropout_p = check_sdpa(dropout_p, is_causal, enable_gqa)
    check_tensors(q, k, v, finite=False, enable_gqa=enable_gqa)
    scale = check_scale(scale, q.shape[-1])
    if attn_mask is not None:
        check_mask(attn_mask, q, k)
    fold = fold_dtype(scale, q.dtype)
    params = check_params(pattern, k.shape[2], q.shape[1], combine, layer,
                          {**params, **pattern_params})
    return Checked(params, scale, dropout_p, fold)
