"""``sparse_attention``: the public entry point -- input checks, then one backend.

Child et al., 2019, section 4 (eq. 2-4, factorized self-attention), section 4.3
(strided and fixed patterns) and section 5.1 (eq. 5-8, merged / multi-head /
interleaved heads). Head h of layer ``layer`` reads exactly
``reference.patterns.head_masks(pattern, n, H, combine, layer, **params)[h]``
(for "longformer" and "bigbird" every head reads the one mask; combine and layer
do not change them). The pattern and its parameters are checked by
``reference.params.check_params``, as everywhere else.

The arguments follow ``torch.nn.functional.scaled_dot_product_attention`` (SDPA), the
signature users reach for, where they mean the same (``sparse_attention``'s docstring
says each); the decisions behind them:

* **Queries aligned to the end.** q holds n_q <= n_k queries: query i is position
  n_k - n_q + i, and reads the last n_q rows of the pattern's masks at n_k -- SDPA's
  bottom-right causal convention, and decoding's (one query, the newest position,
  against every key so far), chunked prefill's and a cache's.
* **Padding by lengths and offsets** (``fast.backends.padding``), on every backend: a
  padded position is read by nobody and its query row outputs 0; left padding shifts
  each sequence's positions to start at 0 (positions are what the patterns are made
  of). Any other mask is ``attn_mask``: boolean (True = may read), broadcastable to
  (B, H, n_q, n_k), ANDed with the pattern, at absolute positions -- the naive backend
  honours it, the others refuse it by name.
* **Grouped-query attention**: k and v may have Hkv heads dividing q's H (query head h
  reads key/value head h // (H / Hkv), as ``repeat_interleave`` pairs them), with
  ``enable_gqa=True``: required, as SDPA requires it (a head count that does not match
  is more often a bug than a choice). No backend repeats k or v: the naive backend
  passes ``enable_gqa`` to SDPA; the structured one runs each of the H / Hkv slices
  q[:, s::share] against k, v (views that line up head by head); the Triton kernels
  index the shared head (their backward sums dk, dv over a key/value head's query
  heads from a buffer per query head); the one-query step gathers the keys it reads.
* **is_causal**: True (the default), as every pattern is causal; False is refused.
* **dropout_p**: the naive backend applies it exactly (``fast.backends.naive``: the
  weights times a Bernoulli mask over (1 - p), the backward through the same mask,
  repeatable under ``torch.manual_seed``); the structured and Triton backends refuse
  it by name (their fused kernels take no dropout mask); "auto" takes the naive path.
* **Unknown keywords** raise a TypeError naming them (and, for the names of other
  attention APIs -- ``key_padding_mask``, ``attention_mask``, ... -- what to use here);
  the pattern's own parameters are the only extra keywords taken.

Backends (one flag, the slow and the fast path side by side):

* "naive"      SDPA with a boolean (H, n_q, n_k) mask built from closed forms:
               O(n_q n_k), the obviously-correct path that honours every argument
               (``fast.backends.naive``); refused, before it allocates, beyond half the
               memory available;
* "structured" no n x n tensor anywhere: full -> causal SDPA, or one causal band through
               the CPU window kernel where that is faster (float32 heads of width <= 16,
               n = 256..1024: ``fast.backends.structured.dense_window``) or where the
               scores may outgrow float32's log-sum-exp (eager on the CPU, a call to
               differentiate: the structured operator decides, see "Scale"); strided and fixed
               -> flash attention over the transposed grid, bands and gathered
               summaries, merged through their log-sum-exp (``fast.backends.structured``);
               one query (n_q = 1) -> the one-query step (``fast.backends.row``): the keys
               its row reads, gathered, O(keys read) (eager only: it reads values and
               positions on the host, so a traced call takes the operator);
* "triton"     the block-sparse Triton kernel (``fast.kernels.triton_attention``);
* "auto"       the fastest exact path that honours the call's arguments: attn_mask or
               dropout -> "naive"; full -> "structured"'s (causal SDPA, or the window
               kernel where it is faster); one query of a
               full, strided or fixed pattern -> the one-query step (traced: as any
               other call, below). On CUDA, with
               Triton importable (and not in its interpreter mode) and a
               float16/bfloat16/float32 input, every other pattern -> "triton" (the
               structured path's CUDA fallback is exact but not fast). Else strided and
               fixed -> "naive" below the crossover measured on the CPU, "structured"
               from it on (``fast.backends.auto``); longformer, bigbird -> "naive".

torch.compile (docs/design.md, "torch.compile"): a model that calls ``sparse_attention``
compiles with ``fullgraph=True`` -- one graph, no graph break, no recompile from step to
step of one shape. Everything here is Python over shapes and Python values (the backend
choice included: auto's measured crossover is a constant when traced), and what cannot
be traced is a ``torch.library.custom_op`` (eager calls run the same Python without
the dispatcher): the
structured path's forward and backward (``sparse_transformer::structured``,
``fast.backends.structured``: its pieces, merges and its float64 decision inside), and
the checks that read values on the host (``sparse_transformer::check_inputs``,
``fast.backends.host_checks``: the finite check and the padding values). "full" and
the naive path are plain PyTorch (SDPA), which the compiler traces and fuses. Not yet
without a break: ``check_finite=False`` with a backward on a pattern other than "full"
(its NaN quarantine finds what a row reads through ``torch.autograd.grad``),
``fast.SparseKVCache``'s steps (decoding), a Triton ``Variant`` built by the
caller, and a naive call big enough that its memory guard reads /proc/meminfo.
An argument error found while tracing (a bad stride, a refused keyword) is raised
by dynamo under ``fullgraph=True`` as ``torch._dynamo.exc.Unsupported`` ("Observed
exception"), eager's message in its text; errors of values (NaN, padding) are eager's.

The paths with queries shorter than the keys (n_q < n_k, n_q > 1) compute every one of
the n_k rows on the structured and Triton backends (q padded in front with zero rows):
exact, at the cost of n_k queries; the naive path costs n_q n_k pairs.

Every bad input raises ValueError saying what was given and what is allowed (TypeError
for an unknown keyword). q, k, v and the scale are checked by ``fast.core.checks`` (the
same checks as the Triton kernel's own entry point); the backends trust what they get.

Scale: any finite ``scale`` is allowed, zero and negative ones included (scale 0 is
uniform attention over the positions a row reads), and every backend gives the
reference's answer to the precision said below. The rule
(``fast.core.precision.fold_dtype``): scores are scale * (q . k); the kernels apply a
scale that is a positive normal number of the accumulation dtype (float32 for float32,
bfloat16 and float16 inputs; float64 for float64), up to
``fast.core.precision.wide_scale`` (for float32 about 1.8e19, beyond which scale * (q .
k) overflows float32); any other scale (<= 0, below the smallest normal number, or
beyond that) is folded into q first -- q * scale in the accumulation dtype (float64
beyond the float32 limit), with q, k, v in that dtype, scale 1 -- and the output is
rounded back once. So float16 never overflows in q * scale, and the fused CPU kernel,
which returns NaN for a scale <= 0 or one that rounds to 0 (torch 2.13.0), never sees
one. The Triton kernels take the scale as it is (``fast.kernels.launch.fold_scale`` says
how). Large scales are exact too: the structured backend recomputes a float32 call in
float64 when its log-sum-exp outgrows float32 (``fast.backends.structured.EXACT_LSE``);
"full" does when eager on the CPU (``structured_attention``; a compiled "full" layer is
SDPA's, whose backward recomputes its weights from a float32 log-sum-exp: at such
scores, run it eagerly or in float64). That recompute, and every float64 call, has no
wider dtype to go to: a backward's weights carry the rounding of the scores'
log-sum-exp, a relative error of about |score| x 2^-52 (gradient errors of about 1e-4 at
scores of 1e11), and beyond scores of about 1e16 the weights can overflow, giving inf or
NaN gradients (a float64 "full" call is SDPA's, which does the same). The naive
backend's unpadded calls stay exact there: their (H, n_q, n_k) mask takes SDPA's math
path, one softmax per row; use them for checks at such scores. Padded ones (``lengths``
/ ``offsets``: a (B, H, n_q, n_k) mask) take SDPA's fused CPU kernel, whose backward
recomputes from a float32 log-sum-exp (gradient errors of about 1e-2 at scale 1e3).

Non-finite q, k or v (NaN, inf) are rejected by ``check_finite``, in one read-only
pass, since a NaN would otherwise surface far from its cause -- by default on the
CPU only: on CUDA the answer must be read back on the host, which makes every call
wait for the GPU. The same switch decides whether the values of ``lengths`` and
``offsets`` given on a GPU are checked. With ``check_finite=False`` the "naive" and
"structured" backends keep the promise of ``fast.core.nonfinite``: a row that reads a
NaN or inf (its query, or a key or value it reads) outputs NaN, and its gradients are
NaN; no other row sees it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import torch

from fast.backends import auto, host_checks
from fast.backends import naive as naive_backend
from fast.backends.naive import naive_sparse_attention
from fast.backends.padding import as_padding, padded_run, to_device, zero_outside
from fast.backends.row import row_attention
from fast.backends.structured import structured_attention
from fast.core.checks import check_scale, check_tensors
from fast.core.nonfinite import attention_reach, causal_reach, quarantine
from fast.core.precision import autocast_inputs, fold_dtype
from reference.params import FACTORIZED, PARAMS, check_params

BACKENDS = ("auto", "structured", "naive", "triton")
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
    ValueError naming the argument a backend asked for cannot honour.

    "auto" never picks the Triton kernels for CUDA tensors when they run in the
    interpreter (TRITON_INTERPRET=1, which reads CPU tensors only): it picks
    "structured" then, so a test run under the interpreter on a GPU machine
    still trains and samples on the GPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "structured" and pattern in ("longformer", "bigbird"):
        raise ValueError(f"backend 'structured' serves the patterns ('full', 'strided', "
                         f"'fixed'), got pattern {pattern!r}; use 'naive' or 'triton'")
    why = _refused(backend, attn_mask, dropout)
    if why is not None:
        raise ValueError(why)
    if backend != "auto":
        return backend
    n_q = n if n_q is None else n_q
    if attn_mask or dropout:
        return "naive"
    if pattern == "full" or (n_q == 1 and pattern in FACTORIZED
                             and not torch.compiler.is_compiling()):
        return "structured"                   # traced, one query is an ordinary call
    if (device.type == "cuda" and dtype != torch.float64 and _triton_available()
            and not _triton_interpreted()):
        return "triton"
    if pattern not in ("strided", "fixed"):
        return "naive"
    if n is not None and device.type == "cpu" and auto.prefer_naive(pattern, n_q, n, stride,
                                                                     backward):
        return "naive"
    return "structured"


def _check_keywords(params: dict) -> None:
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


def _check_mask(attn_mask, q, k) -> None:
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


def _check_sdpa(dropout_p, is_causal, enable_gqa) -> float:
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


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str, *,
                     stride: int | None = None, c: int | None = None,
                     combine: str = "merged", layer: int = 0, scale: float | None = None,
                     attn_mask: torch.Tensor | None = None, lengths=None, offsets=None,
                     dropout_p: float = 0.0, is_causal: bool = True,
                     enable_gqa: bool = False, backend: str = "auto",
                     check_finite: bool | None = None, variant=None,
                     **pattern_params) -> torch.Tensor:
    """Causal sparse attention of the Sparse Transformer, called as SDPA is.

    q: (B, H, n_q, d); k, v: (B, Hkv, n_k, d), one dtype (float64/float32/bfloat16/
    float16) and device, n_q <= n_k, any d >= 1; backend="triton" on the CPU, under
    Triton's interpreter (TRITON_INTERPRET=1), runs float32 only (the structured backend
    takes the other dtypes there). Returns (B, H, n_q, d); differentiable
    in q, k and v. Query i is position n_k - n_q + i (queries aligned to the end, SDPA's
    bottom-right causal convention: n_q = n_k is self-attention, n_q = 1 a decoding
    step against every earlier key) and reads the last n_q rows of the pattern's masks
    at n_k positions. Rows that read nothing output 0, with zero gradients.

    pattern: "full", "strided" (stride), "fixed" (stride, c), "longformer"
    (window, dilation=1, global_tokens=()), "bigbird" (window, n_random,
    n_global, seed=0). combine: "merged" | "multihead" | "interleaved" (sec. 5.1);
    layer: the residual block index (only "interleaved" looks at it).
    scale defaults to 1 / sqrt(d); any finite value is allowed. Where the structured
    path's float32 log-sum-exp grows beyond what float32 holds exactly (huge scores), the
    call is recomputed in float64 and says so (``fast.core.precision.PrecisionWarning``).

    attn_mask: None, or a bool tensor (True = may read) broadcastable to
    (B, H, n_q, n_k), ANDed with the pattern and read as the tensors are indexed, as
    SDPA reads it: entry [b, h, i, j] is query row i of q and key row j of k, padding or
    not (with ``offsets``, key row j is position j - offsets[b] of its sequence, and the
    mask is still read at j); backend "naive" only (others raise; "auto" takes the naive
    path).
    lengths, offsets: a padded batch, on every backend -- (B,) integers: sequence b
    holds ``lengths[b]`` real tokens (default: all after its offset) after
    ``offsets[b]`` pad tokens (left padding; default 0), and its index i is position
    i - offsets[b], so each sequence reads what it reads unpadded. Right padding keeps
    the positions; left padding needs ``offsets`` (the pattern's positions are shifted
    per sequence). A padded key is never read; a padded query row outputs 0. The values
    are checked on the host (for tensors on a GPU only when ``check_finite``).
    dropout_p: the probability of dropping each attention weight (the kept ones scaled
    by 1 / (1 - p)); backend "naive" only, repeatable under ``torch.manual_seed``;
    applied whenever > 0 (pass 0.0 in evaluation, as with SDPA).
    is_causal: True (every pattern is causal); False raises.
    enable_gqa: k and v may have Hkv heads dividing H (query head h reads key/value
    head h // (H / Hkv)); required for Hkv != H, as in SDPA. No backend copies k or v
    per query head.

    backend: "auto" | "naive" | "structured" | "triton" (module docstring): each honours
    n_q <= n_k, padding and grouped heads; only "naive" honours attn_mask and dropout_p.
    The "structured" and "triton" backends are differentiable once (their backward is
    written by hand): asking for a second derivative (create_graph=True) raises a
    RuntimeError; "naive" is twice differentiable.
    check_finite: reject NaN / inf in q, k, v (None: on the CPU only, where it costs no
    wait for a device).
    variant: the Triton kernel variant (a name in ``fast.kernels.variants.VARIANTS`` or a
    ``Variant``; None: the default), for the "triton" backend only.
    Any other keyword must be a parameter of some pattern; others raise a TypeError.

    Under autocast (``torch.autocast`` on q's device) it does what SDPA does: q, k and v,
    unless float64, are cast to the autocast dtype, and the output is in it; every
    backend then computes alike (``fast.core.precision.autocast_inputs``).
    """
    (q, k, v), device = autocast_inputs(q, k, v)
    if device is not None:                 # cast as SDPA casts; inside, autocast is off
        with torch.autocast(device, enabled=False):
            return sparse_attention(q, k, v, pattern, stride=stride, c=c, combine=combine,
                                    layer=layer, scale=scale, attn_mask=attn_mask,
                                    lengths=lengths, offsets=offsets, dropout_p=dropout_p,
                                    is_causal=is_causal, enable_gqa=enable_gqa,
                                    backend=backend, check_finite=check_finite,
                                    variant=variant, **pattern_params)
    _check_keywords(pattern_params)
    if check_finite is None:
        check_finite = q.device.type == "cpu" if isinstance(q, torch.Tensor) else True
    dropout_p = _check_sdpa(dropout_p, is_causal, enable_gqa)
    check_tensors(q, k, v, finite=False, enable_gqa=enable_gqa)
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    params = check_params(pattern, n_k, H, combine, layer,
                          {"stride": stride, "c": c, **pattern_params})
    scale = check_scale(scale, d)
    if attn_mask is not None:
        _check_mask(attn_mask, q, k)
    lengths, offsets, (host_l, host_o) = as_padding(lengths, offsets, B)   # not moved yet
    backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    which = resolve_backend(backend, pattern, q.device, q.dtype, n_k, n_q=n_q,
                            stride=params.get("stride"), backward=backward,
                            attn_mask=attn_mask is not None, dropout=dropout_p > 0)
    if variant is not None and which != "triton":
        raise ValueError(f"variant {variant!r} selects a Triton kernel variant, but backend "
                         f"{backend!r} runs {which!r} here; allowed: variant=None, or "
                         f"backend='triton'")
    if which == "naive" and backend == "auto" and pattern in ("strided", "fixed") \
            and attn_mask is None and dropout_p == 0 and naive_backend.too_big(
                B, H, n_q, n_k, q.dtype, q.device, B if lengths is not None or offsets
                is not None else 1, naive_backend.mask_heads(pattern, combine, H), False):
        which = "structured"                  # the crossover's path cannot hold this call
    # the one-query step looks for NaN and inf only in q and in what its row reads; it
    # reads values and positions on the host, so a traced call takes the operator instead
    row = (which == "structured" and n_q == 1 and pattern in FACTORIZED
           and not torch.compiler.is_compiling())
    values = (lengths is not None and (host_l or check_finite),
              offsets is not None and (host_o or check_finite))
    if (check_finite and not row) or any(values):      # the host reads, in one operator
        host_checks.check(q, k, v, bool(check_finite) and not row, lengths, offsets, *values)
    lengths, offsets = to_device(lengths, offsets, q.device)       # checked where given
    run = functools.partial(_run, "row" if row else which, pattern, combine, layer, params,
                            variant, attn_mask, lengths, offsets, check_finite)
    dtype, fold = q.dtype, None if which == "triton" else fold_dtype(scale, q.dtype)
    if fold is not None:          # see fold_dtype: q * scale in the dtype it fits, scale 1
        q, k, v = q.to(fold) * scale, k.to(fold), v.to(fold)            # (B, H, n, d)
        scale = 1.0
    if not check_finite and which in ("naive", "structured") and not row:
        q = zero_outside(q, lengths, offsets, n_k)        # padded rows output 0, NaN or not
        simple = (pattern == "full" and n_q == n_k and k.shape[1] == H and attn_mask is None
                  and lengths is None and offsets is None)
        reach = causal_reach if simple else attention_reach(
            functools.partial(run, scale=1.0, dropout_p=0.0))
        out = quarantine(functools.partial(run, scale=scale, dropout_p=dropout_p), q, k, v,
                         reach)
    else:
        out = run(q, k, v, scale=scale, dropout_p=dropout_p)
    return out.to(dtype)


def _run(which, pattern, combine, layer, params, variant, attn_mask, lengths, offsets,
         check_finite, q, k, v, *, scale, dropout_p):
    """The chosen backend on checked inputs ("row": the structured backend's one-query
    step)."""
    if which == "naive":
        return naive_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                      scale=scale, attn_mask=attn_mask, lengths=lengths,
                                      offsets=offsets, dropout_p=dropout_p, **params)
    if which == "triton":
        try:
            from fast.kernels.triton_attention import attend
        except ModuleNotFoundError as err:
            if err.name not in ("fast.kernels.triton_attention", "triton"):
                raise
            raise ImportError(f"backend 'triton' needs the module {err.name!r}, which is not "
                              f"installed or not written yet; use backend 'naive' or "
                              f"'structured'") from err
        full = lambda q, k, v: attend(q, k, v, pattern, combine=combine, layer=layer,
                                      scale=scale, params=params, variant=variant)
        return padded_run(full, q, k, v, lengths, offsets)
    if which == "row":                    # the one-query step: only the keys its row reads
        return row_attention(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                             params=params, lengths=lengths, offsets=offsets,
                             check_finite=check_finite)
    # "structured"
    full = lambda q, k, v: structured_attention(q, k, v, pattern, combine=combine,
                                                layer=layer, scale=scale, **params)
    return padded_run(full, q, k, v, lengths, offsets)
