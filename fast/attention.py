"""``sparse_attention``: the public entry point -- input checks, then one backend.

Child et al., 2019, section 4 (eq. 2-4, factorized self-attention), section 4.3
(strided and fixed patterns) and section 5.1 (eq. 5-8, merged / multi-head /
interleaved heads). Head h of layer ``layer`` reads exactly
``reference.patterns.head_masks(pattern, n, H, combine, layer, **params)[h]``
(for "longformer" and "bigbird" every head reads the one mask; combine and layer
do not change them). The pattern and its parameters are checked by
``reference.params.check_params``, as everywhere else.

Backends (one flag, the slow and the fast path side by side):

* "naive"      SDPA with a boolean (H, n, n) mask built from closed forms:
               O(n^2), the obviously-correct path (``fast.backends.naive``);
* "structured" no n x n tensor anywhere: full -> causal SDPA; strided and fixed
               -> flash attention over the transposed grid, bands and gathered
               summaries, merged through their log-sum-exp (``fast.backends.structured``);
* "triton"     the block-sparse Triton kernel (``fast.kernels.triton_attention``);
* "auto"       full -> causal SDPA everywhere. On CUDA, with Triton importable and
               a float16/bfloat16/float32 input, every other pattern -> "triton"
               (the structured path's CUDA fallback is exact but not fast). Else
               strided, fixed -> "structured"; longformer, bigbird -> "naive".

Every bad input raises ValueError saying what was given and what is allowed.
Non-finite q, k or v (NaN, inf) are rejected: the check is one read-only pass
(``torch.aminmax``; NaN and inf survive a min/max, and nothing can overflow),
about 1 ms per tensor at B=1, H=4, n=16384, d=64 on the project's CPU, and a
NaN would otherwise surface far from its cause.
"""

from __future__ import annotations

import importlib.util
import math
import numbers

import torch
import torch.nn.functional as F

from reference.params import check_params

BACKENDS = ("auto", "structured", "naive", "triton")
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def check_tensors(q, k, v) -> None:
    """q, k, v: real floating tensors of one shape (B, H, n, d), dtype and device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (B, H, n, d), "
                             f"got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, n, d) (4 dimensions), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; allowed: "
                             f"{', '.join(str(d) for d in DTYPES)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have one shape (B, H, n, d), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, n, d = q.shape
    if n == 0:
        raise ValueError(f"sequence length n must be >= 1, got n = 0 (shape {tuple(q.shape)})")
    if B == 0 or H == 0 or d == 0:
        raise ValueError(f"B, H and d must be >= 1, got shape (B, H, n, d) = {tuple(q.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # one read-only pass: min and max are NaN if any element is, +-inf if any is
        if not bool(torch.isfinite(torch.stack(torch.aminmax(t))).all()):
            raise ValueError(f"{name} holds non-finite values (NaN or inf); all must be finite")


def _check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite real number or None, got {scale!r}")
    return float(scale)


def _triton_available() -> bool:
    return (importlib.util.find_spec("triton") is not None
            and importlib.util.find_spec("fast.kernels.triton_attention") is not None)


def resolve_backend(backend, pattern: str, device: torch.device,
                    dtype: torch.dtype = torch.float32) -> str:
    """The backend that ``backend`` means for ``pattern`` on ``device`` in ``dtype``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "structured" and pattern in ("longformer", "bigbird"):
        raise ValueError(f"backend 'structured' serves the patterns ('full', 'strided', "
                         f"'fixed'), got pattern {pattern!r}; use 'naive' or 'triton'")
    if backend != "auto":
        return backend
    if pattern == "full":
        return "structured"
    if device.type == "cuda" and dtype != torch.float64 and _triton_available():
        return "triton"
    return "structured" if pattern in ("strided", "fixed") else "naive"


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str, *,
                     stride: int | None = None, c: int | None = None,
                     combine: str = "merged", layer: int = 0, scale: float | None = None,
                     backend: str = "auto", **pattern_params) -> torch.Tensor:
    """Causal sparse attention of the Sparse Transformer.

    q, k, v: (B, H, n, d), one dtype (float64/float32/bfloat16/float16) and device,
    any n >= 1 and d >= 1. Returns (B, H, n, d); differentiable in q, k and v.
    pattern: "full", "strided" (stride), "fixed" (stride, c), "longformer"
    (window, dilation=1, global_tokens=()), "bigbird" (window, n_random,
    n_global, seed=0). combine: "merged" | "multihead" | "interleaved" (sec. 5.1);
    layer: the residual block index (only "interleaved" looks at it).
    scale defaults to 1 / sqrt(d). Rows that read nothing output 0.
    """
    check_tensors(q, k, v)
    B, H, n, d = q.shape
    params = check_params(pattern, n, H, combine, layer,
                          {"stride": stride, "c": c, **pattern_params})
    scale = _check_scale(scale, d)
    which = resolve_backend(backend, pattern, q.device, q.dtype)

    if which == "naive":
        from fast.backends.naive import naive_sparse_attention
        return naive_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                      scale=scale, **params)
    if which == "triton":
        try:
            from fast.kernels.triton_attention import triton_sparse_attention
        except ModuleNotFoundError as err:
            if err.name not in ("fast.kernels.triton_attention", "triton"):
                raise
            raise ImportError(f"backend 'triton' needs the module {err.name!r}, which is not "
                              f"installed or not written yet; use backend 'naive' or "
                              f"'structured'") from err
        return triton_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                       scale=scale, **params)
    # "structured"
    if pattern == "full":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    from fast.backends.structured import structured_attention
    return structured_attention(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                                **params)
