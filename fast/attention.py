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
* "auto"       full -> causal SDPA everywhere. On CUDA, with Triton importable (and
               not in its interpreter mode) and a float16/bfloat16/float32 input,
               every other pattern -> "triton" (the structured path's CUDA fallback
               is exact but not fast). Else strided, fixed -> "structured";
               longformer, bigbird -> "naive".

Every bad input raises ValueError saying what was given and what is allowed.
q, k, v and the scale are checked by ``fast.core.checks`` (the same checks as the
Triton kernel's own entry point); the backends trust what they get.

Scale: any finite ``scale`` is allowed, zero and negative ones included (scale 0 is
uniform attention over the positions a row reads), and every backend gives the
reference's answer. The rule (``fast.core.precision.fold_dtype``): scores are
scale * (q . k); the kernels apply a scale that is a positive normal number of the
accumulation dtype (float32 for float32, bfloat16 and float16 inputs; float64 for
float64); any other scale (<= 0, below the smallest normal number, or beyond
float32's range) is folded into q first -- q * scale in the accumulation dtype
(float64 beyond float32's range), with q, k, v in that dtype, scale 1 -- and the
output is rounded back once. So float16 never overflows in q * scale, and the fused
CPU kernel, which returns NaN for a scale <= 0 or one that rounds to 0 (torch
2.13.0), never sees one. The Triton kernels take the scale as it is
(``fast.kernels.launch.fold_scale`` says how). Large scales are exact too: the
structured backend recomputes a float32 call in float64 when its log-sum-exp
outgrows float32 (``fast.backends.structured.EXACT_LSE``).

Non-finite q, k or v (NaN, inf) are rejected by ``check_finite``, in one read-only
pass, since a NaN would otherwise surface far from its cause -- by default on the
CPU only: on CUDA the answer must be read back on the host, which makes every call
wait for the GPU. With ``check_finite=False`` the "naive" and "structured" backends
keep the promise of ``fast.core.nonfinite``: a row that reads a NaN or inf (its
query, or a key or value it reads) outputs NaN, and its gradients are NaN; no
other row sees it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import torch
import torch.nn.functional as F

from fast.backends.naive import naive_sparse_attention
from fast.backends.structured import structured_attention
from fast.core.checks import check_scale, check_tensors
from fast.core.nonfinite import attention_reach, causal_reach, quarantine
from fast.core.precision import fold_dtype
from reference.params import check_params

BACKENDS = ("auto", "structured", "naive", "triton")


@functools.lru_cache(maxsize=1)
def _triton_available() -> bool:
    return (importlib.util.find_spec("triton") is not None
            and importlib.util.find_spec("fast.kernels.triton_attention") is not None)


def _triton_interpreted() -> bool:
    """Whether the Triton kernels run (or will run) in Triton's CPU interpreter: decided
    when Triton is first imported, by the environment variable TRITON_INTERPRET."""
    launch = sys.modules.get("fast.kernels.launch")
    if launch is not None:
        return launch.interpreted()
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on", "y")


def resolve_backend(backend, pattern: str, device: torch.device,
                    dtype: torch.dtype = torch.float32) -> str:
    """The backend that ``backend`` means for ``pattern`` on ``device`` in ``dtype``.

    "auto" never picks the Triton kernels for CUDA tensors when they run in the
    interpreter (TRITON_INTERPRET=1, which reads CPU tensors only): it picks
    "structured" then, so a test run under the interpreter on a GPU machine
    still trains and samples on the GPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "structured" and pattern in ("longformer", "bigbird"):
        raise ValueError(f"backend 'structured' serves the patterns ('full', 'strided', "
                         f"'fixed'), got pattern {pattern!r}; use 'naive' or 'triton'")
    if backend != "auto":
        return backend
    if pattern == "full":
        return "structured"
    if (device.type == "cuda" and dtype != torch.float64 and _triton_available()
            and not _triton_interpreted()):
        return "triton"
    return "structured" if pattern in ("strided", "fixed") else "naive"


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str, *,
                     stride: int | None = None, c: int | None = None,
                     combine: str = "merged", layer: int = 0, scale: float | None = None,
                     backend: str = "auto", check_finite: bool | None = None,
                     variant=None, **pattern_params) -> torch.Tensor:
    """Causal sparse attention of the Sparse Transformer.

    q, k, v: (B, H, n, d), one dtype (float64/float32/bfloat16/float16) and device,
    any n >= 1 and d >= 1. Returns (B, H, n, d); differentiable in q, k and v.
    pattern: "full", "strided" (stride), "fixed" (stride, c), "longformer"
    (window, dilation=1, global_tokens=()), "bigbird" (window, n_random,
    n_global, seed=0). combine: "merged" | "multihead" | "interleaved" (sec. 5.1);
    layer: the residual block index (only "interleaved" looks at it).
    scale defaults to 1 / sqrt(d); any finite value is allowed. Rows that read nothing
    output 0. The "structured" and "triton" backends are differentiable once (their
    backward is written by hand): asking for a second derivative (create_graph=True)
    raises a RuntimeError; "naive" is twice differentiable.
    check_finite: reject NaN / inf in q, k, v (None: on the CPU only, where it costs no
    wait for a device).
    variant: the Triton kernel variant (a name in ``fast.kernels.variants.VARIANTS`` or a
    ``Variant``; None: the default), for the "triton" backend only.
    """
    if check_finite is None:
        check_finite = q.device.type == "cpu" if isinstance(q, torch.Tensor) else True
    check_tensors(q, k, v, finite=check_finite)
    B, H, n, d = q.shape
    params = check_params(pattern, n, H, combine, layer,
                          {"stride": stride, "c": c, **pattern_params})
    scale = check_scale(scale, d)
    which = resolve_backend(backend, pattern, q.device, q.dtype)
    if variant is not None and which != "triton":
        raise ValueError(f"variant {variant!r} selects a Triton kernel variant, but backend "
                         f"{backend!r} runs {which!r} here; allowed: variant=None, or "
                         f"backend='triton'")
    run = functools.partial(_run, which, pattern, combine, layer, params, variant)
    dtype, fold = q.dtype, fold_dtype(scale, q.dtype) if which != "triton" else None
    if fold is not None:          # see fold_dtype: q * scale in the dtype it fits, scale 1
        q, k, v = q.to(fold) * scale, k.to(fold), v.to(fold)            # (B, H, n, d)
        scale = 1.0
    if not check_finite and which in ("naive", "structured"):
        reach = causal_reach if pattern == "full" else attention_reach(
            functools.partial(run, scale=1.0))
        out = quarantine(functools.partial(run, scale=scale), q, k, v, reach)
    else:
        out = run(q, k, v, scale=scale)
    return out.to(dtype)


def _run(which, pattern, combine, layer, params, variant, q, k, v, *, scale):
    """The chosen backend on checked inputs."""
    if which == "naive":
        return naive_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                      scale=scale, **params)
    if which == "triton":
        try:
            from fast.kernels.triton_attention import attend
        except ModuleNotFoundError as err:
            if err.name not in ("fast.kernels.triton_attention", "triton"):
                raise
            raise ImportError(f"backend 'triton' needs the module {err.name!r}, which is not "
                              f"installed or not written yet; use backend 'naive' or "
                              f"'structured'") from err
        return attend(q, k, v, pattern, combine=combine, layer=layer, scale=scale, params=params,
                      variant=variant)
    # "structured"
    if pattern == "full":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return structured_attention(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                                **params)
