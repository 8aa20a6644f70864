"""Which path a call of ``sparse_attention`` runs, and each path bound to its arguments.

Child et al., 2019, section 4.3 (the strided and fixed patterns), section 5.1 (merged /
multi-head / interleaved heads) and section 5.5 (block-sparse kernels): one pattern,
several ways to compute it exactly. This module decides among them in one place
(``choose_path``, with ``resolve_backend``) and binds the chosen one once per call
signature (``PATHS``: one binder per path), for the call plan
(``fast.attention.plan``) to keep.

Backends (one flag, the slow and the fast path side by side):

* "naive"      SDPA with a boolean (H, n_q, n_k) mask built from closed forms:
               O(n_q n_k), the obviously-correct path that honours every argument
               (``fast.backends.naive``); refused, before it allocates, beyond half the
               memory available;
* "structured" no n x n tensor anywhere: full -> causal SDPA, or one causal band through
               the CPU window kernel where that is faster (float32 heads of width <= 16,
               n = 256..1024: ``fast.backends.structured.dense_window``) or where the
               scores may outgrow float32's log-sum-exp (eager on the CPU, a call to
               differentiate: the structured operator decides; ``fast.attention.api``,
               "Scale"); strided and fixed -> flash attention over the transposed grid,
               bands and gathered summaries, merged through their log-sum-exp
               (``fast.backends.structured``); one query (n_q = 1) -> the one-query step
               (``fast.backends.one_query``): the keys its row reads, gathered, O(keys
               read) (eager only: it reads values and positions on the host, so a traced
               call takes the operator); it serves every pattern, the structured path the
               paper's three (``FACTORIZED``);
* "triton"     the block-sparse Triton kernel (``fast.kernels.triton_attention``);
* "auto"       the fastest exact path that honours the call's arguments: attn_mask or
               dropout -> "naive"; full -> "structured"'s (causal SDPA, or the window
               kernel where it is faster); one query of any pattern -> the one-query
               step (traced: as any other call, below). On CUDA, with
               Triton importable (and not in its interpreter mode) and a
               float16/bfloat16/float32 input, every other pattern -> "triton" (the
               structured path's CUDA fallback is exact but not fast). Else strided and
               fixed -> "naive" below the crossover measured on the CPU, "structured"
               from it on (``fast.backends.auto``); every other pattern (longformer,
               bigbird, those added to the registry) -> "naive".

The paths a call can take are the five names of ``PATHS``: "naive", "row" (the
one-query step), "full" (causal SDPA), "structured" and "triton". Each binder takes the
call's (checked) tensors and arguments and returns ``attend(q, k, v, attn_mask,
lengths, offsets) -> (B, H, n_q, d)``, everything but the tensors bound; a padded
batch's paths run through ``fast.backends.padding.padded_run``, except the two that
take the padding themselves (naive, row).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import torch

from fast.backends import auto
from fast.backends import naive as naive_backend
from fast.backends.flash_cpu import uses_kernel
from fast.backends.naive import naive_sparse_attention
from fast.backends.one_query import row_attention
from fast.backends.padding import padded_run
from fast.backends.structured import full_attention, structured_attention
from reference.params import FACTORIZED

BACKENDS = ("auto", "structured", "naive", "triton")


@functools.lru_cache(maxsize=1)
@torch.compiler.assume_constant_result     # torch.compile: read when traced, no break
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


# ----------------------------------------------------------------------------
# Which path a call takes: decided here, once per call signature
# ----------------------------------------------------------------------------

def _refused(backend: str, attn_mask: bool, dropout: bool) -> str | None:
    """The argument ``backend`` cannot honour (None: it honours them all)."""
    if backend in ("naive", "auto"):
        return None
    if attn_mask:
        return (f"attn_mask is honoured by backend 'naive' only (a dense (n_q, n_k) mask); "
                f"backend {backend!r} runs the pattern without one. Allowed: "
                f"backend='naive' or 'auto' with attn_mask, or lengths=/offsets= for a "
                f"padded batch on any backend")
    if dropout:
        return (f"dropout_p > 0 is honoured by backend 'naive' only (its weights are "
                f"written out, so the dropout mask and its backward are exact); backend "
                f"{backend!r} runs fused kernels without a dropout mask. Allowed: "
                f"dropout_p=0.0, or backend='naive' or 'auto'")
    return None


def resolve_backend(backend, pattern: str, device: torch.device,
                    dtype: torch.dtype = torch.float32, n: int | None = None, *,
                    n_q: int | None = None, stride: int | None = None,
                    backward: bool = False, attn_mask: bool = False,
                    dropout: bool = False) -> str:
    """The backend that ``backend`` means for ``pattern`` on ``device`` in ``dtype``, for
    n keys (None: long; the structured path) and n_q queries (None: n), a backward to
    follow or not, an ``attn_mask`` or dropout to honour (module docstring). Raises a
    ValueError naming the argument a backend asked for cannot honour. ``choose_path``
    turns the answer into the path a call runs.

    "auto" never picks the Triton kernels for CUDA tensors when they run in the
    interpreter (TRITON_INTERPRET=1, which reads CPU tensors only): it picks
    "structured" then, so a test run under the interpreter on a GPU machine
    still trains and samples on the GPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "structured" and pattern not in FACTORIZED:
        raise ValueError(f"backend 'structured' serves the patterns {FACTORIZED}, got "
                         f"pattern {pattern!r}; use 'naive' or 'triton'")
    why = _refused(backend, attn_mask, dropout)
    if why is not None:
        raise ValueError(why)
    if backend != "auto":
        return backend
    n_q = n if n_q is None else n_q
    if attn_mask or dropout:
        return "naive"
    if pattern == "full" or (n_q == 1 and not torch.compiler.is_compiling()):
        return "structured"                   # traced, one query is an ordinary call
    if (device.type == "cuda" and dtype != torch.float64 and _triton_available()
            and not _triton_interpreted()):
        return "triton"
    if pattern not in FACTORIZED:             # the structured path serves these only
        return "naive"
    if n is not None and device.type == "cpu" and auto.prefer_naive(pattern, n_q, n, stride,
                                                                     backward):
        return "naive"
    return "structured"


def choose_path(backend: str, pattern: str, combine: str, params: dict, device: torch.device,
                dtype: torch.dtype, B: int, H: int, n_q: int, n_k: int, *, backward: bool,
                attn_mask: bool, dropout: bool, padded: bool) -> str:
    """The path a call runs, decided in this one place, for q (B, H, n_q, d) and k, v
    (B, Hkv, n_k, d) of ``dtype`` on ``device`` (checked): ``resolve_backend``'s backend,
    then

    * "auto"'s naive path below the crossover, when that path cannot hold the call in
      memory (``fast.backends.naive.too_big``): "structured";
    * the structured backend with one query (n_q = 1) of any pattern: "row", the
      one-query step (``fast.backends.one_query``; eager only: it reads
      values and positions on the host, so a traced call takes the operator);
    * the structured backend on "full": "full", causal SDPA
      (``fast.backends.structured.full_attention``);
    * the structured backend on fewer keys than the stride (one dense block): "naive".

    Returns a name of ``PATHS``: "naive", "structured", "full", "row" or "triton"."""
    stride = params.get("stride")
    which = resolve_backend(backend, pattern, device, dtype, n_k, n_q=n_q, stride=stride,
                            backward=backward, attn_mask=attn_mask, dropout=dropout)
    if (which == "naive" and backend == "auto" and pattern in ("strided", "fixed")
            and not attn_mask and not dropout and naive_backend.too_big(
                B, H, n_q, n_k, dtype, device, B if padded else 1,
                naive_backend.mask_heads(pattern, combine, H), False)):
        which = "structured"                  # the crossover's path cannot hold this call
    if which != "structured":
        return which
    if n_q == 1 and not torch.compiler.is_compiling():
        return "row"                          # every pattern of the registry
    if pattern == "full":
        return "full"
    return "naive" if n_k < stride else "structured"


# ----------------------------------------------------------------------------
# Each path bound once: attend(q, k, v, attn_mask, lengths, offsets)
# ----------------------------------------------------------------------------

def _padded(unpadded, padded: bool):
    """attend(q, k, v, attn_mask, lengths, offsets) of a path that takes q, k, v alone: a
    padded batch through ``padded_run`` (its queries gathered, its keys masked)."""
    if padded:
        def attend(q, k, v, attn_mask, lengths, offsets):
            return padded_run(unpadded, q, k, v, lengths, offsets)
        return attend
    return lambda q, k, v, attn_mask, lengths, offsets: unpadded(q, k, v)


def _naive(q, k, v, *, pattern, combine, layer, params, scale, dropout_p, check_finite,
           variant, padded, backward):
    def attend(q, k, v, attn_mask, lengths, offsets):
        return naive_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                      scale=scale, attn_mask=attn_mask, lengths=lengths,
                                      offsets=offsets, dropout_p=dropout_p, **params)
    return attend


def _row(q, k, v, *, pattern, combine, layer, params, scale, dropout_p, check_finite,
         variant, padded, backward):
    """The one-query step: only the keys its row reads."""
    def attend(q, k, v, attn_mask, lengths, offsets):
        return row_attention(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                             params=params, lengths=lengths, offsets=offsets,
                             check_finite=check_finite)
    return attend


def _triton(q, k, v, *, pattern, combine, layer, params, scale, dropout_p, check_finite,
            variant, padded, backward):
    """The Triton kernels' ``TritonCall``: what the signature decides, decided once."""
    try:
        from fast.kernels.triton_attention import prepare
    except ModuleNotFoundError as err:
        if err.name not in ("fast.kernels.triton_attention", "triton"):
            raise
        raise ImportError(f"backend 'triton' needs the module {err.name!r}, which is not "
                          f"installed or not written yet; use backend 'naive' or "
                          f"'structured'") from err
    return _padded(prepare(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                           params=params, variant=variant), padded)


def _full(q, k, v, *, pattern, combine, layer, params, scale, dropout_p, check_finite,
          variant, padded, backward):
    """SDPA, or the operator for its float64 decision: eager CPU calls below float64 that
    autograd will differentiate (``fast.backends.structured.full_attention``)."""
    exact_check = (uses_kernel(q) and q.dtype != torch.float64 and backward
                   and not torch.compiler.is_compiling())

    def unpadded(q, k, v):
        return full_attention(q, k, v, scale, exact_check)
    return _padded(unpadded, padded)


def _structured(q, k, v, *, pattern, combine, layer, params, scale, dropout_p,
                check_finite, variant, padded, backward):
    stride, c = params["stride"], params.get("c")

    def unpadded(q, k, v):
        return structured_attention(q, k, v, pattern, combine=combine, layer=layer,
                                    scale=scale, stride=stride, c=c)
    return _padded(unpadded, padded)


# path name -> its binder: binder(q, k, v, **arguments) -> attend (module docstring)
PATHS = {"naive": _naive, "row": _row, "triton": _triton, "full": _full,
         "structured": _structured}
