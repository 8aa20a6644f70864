"""Input checks shared by every attention entry point: q, k, v and the scale.

Child et al., 2019, section 4 (eq. 2-4): causal attention reads q (B, H, n_q, d) and
k, v (B, Hkv, n_k, d) -- the queries the last n_q of the n_k positions, Hkv = H or,
for grouped-query attention, dividing H -- and scales scores by 1 / sqrt(d) unless
told otherwise.
``fast.attention.sparse_attention`` and the Triton kernel's own entry point
(``fast.kernels.triton_attention``) call the same ``check_tensors`` and
``check_scale``; the kernel passes its narrower dtypes and adds its own limit on
d. Every bad input raises ValueError saying what was given and what is allowed.
"""

from __future__ import annotations

import math
import numbers

import torch

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


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
