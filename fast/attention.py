"""``sparse_attention``: the public entry point -- input checks, then one backend.

Child et al., 2019, section 4 (eq. 2-4, factorized self-attention), section 4.3
(strided and fixed patterns) and section 5.1 (eq. 5-8, merged / multi-head /
interleaved heads). Head h of layer ``layer`` reads exactly
``reference.patterns.head_masks(pattern, n, H, combine, layer, stride=, c=)[h]``;
"longformer" and "bigbird" read ``reference.patterns.longformer`` / ``bigbird``
in every head (combine and layer do not change them).

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
q, k, v and the scale are checked by ``fast.core.checks`` (the same checks as the
Triton kernel's own entry point); non-finite q, k or v (NaN, inf) are rejected
there, in one read-only pass, since a NaN would otherwise surface far from its cause.
"""

from __future__ import annotations

import importlib.util
import numbers

import torch
import torch.nn.functional as F

from fast.backends.naive import naive_sparse_attention
from fast.backends.structured import structured_attention
from fast.core.checks import check_scale, check_tensors
from reference.patterns import COMBINES, summary_range, summary_rank

PATTERNS = ("full", "strided", "fixed", "longformer", "bigbird")
BACKENDS = ("auto", "structured", "naive", "triton")

# The parameters each pattern takes: (required, optional with default).
_PARAMS = {
    "full": ((), {}),
    "strided": (("stride",), {}),
    "fixed": (("stride", "c"), {}),
    "longformer": (("window",), {"dilation": 1, "global_tokens": ()}),
    "bigbird": (("window", "n_random", "n_global"), {"seed": 0}),
}


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_int(name: str, x, low: int, high: int | None = None) -> int:
    if not _is_int(x) or x < low or (high is not None and x > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {x!r}")
    return int(x)


def check_pattern(pattern, n: int, n_heads: int, combine, layer, params: dict) -> dict:
    """Check the pattern, combine mode, layer and the pattern's parameters; return
    the parameters (defaults filled in, unused ``None`` dropped)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    _check_int("layer", layer, 0)
    required, optional = _PARAMS[pattern]
    given = {key: val for key, val in params.items() if val is not None}
    extra = sorted(set(given) - set(required) - set(optional))
    if extra:
        raise ValueError(f"pattern {pattern!r} takes parameters "
                         f"{list(required) + list(optional)}, got unexpected {extra}")
    missing = [key for key in required if key not in given]
    if missing:
        raise ValueError(f"pattern {pattern!r} needs the parameters {list(required)}, "
                         f"missing {missing}")
    out = {**optional, **given}
    if pattern in ("strided", "fixed"):
        _check_int("stride l", out["stride"], 1)
    if pattern == "fixed":
        _check_int("summary width c", out["c"], 1)
        if out["c"] > out["stride"]:
            raise ValueError(f"summary width c must be at most the stride l, "
                             f"got c={out['c']} > l={out['stride']}")
        for h in range(n_heads):  # raises when several summary heads need l % c == 0
            summary_range(out["stride"], out["c"], summary_rank(h, combine))
    if pattern in ("longformer", "bigbird"):
        _check_int("window", out["window"], 1)
    if pattern == "longformer":
        _check_int("dilation", out["dilation"], 1)
        try:
            g = list(out["global_tokens"])
        except TypeError:
            raise ValueError(f"global_tokens must be an iterable of integer positions in "
                             f"[0, {n}), got {out['global_tokens']!r}") from None
        if any(not _is_int(x) or not 0 <= x < n for x in g):
            raise ValueError(f"global_tokens must be integer positions in [0, {n}), got {g}")
        out["global_tokens"] = tuple(int(x) for x in g)
    if pattern == "bigbird":
        _check_int("n_random", out["n_random"], 0)
        _check_int("n_global", out["n_global"], 0, n)
        _check_int("seed", out["seed"], 0)
    return out


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
    params = check_pattern(pattern, n, H, combine, layer,
                           {"stride": stride, "c": c, **pattern_params})
    scale = check_scale(scale, d)
    which = resolve_backend(backend, pattern, q.device, q.dtype)

    if which == "naive":
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
    return structured_attention(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                                **params)
