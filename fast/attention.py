"""``sparse_attention``: the public entry point -- one call plan per signature, then its path.

Child et al., 2019, section 4 (eq. 2-4, factorized self-attention), section 4.3
(strided and fixed patterns) and section 5.1 (eq. 5-8, merged / multi-head /
interleaved heads). Head h of layer ``layer`` reads exactly
``reference.patterns.head_masks(pattern, n, H, combine, layer, **params)[h]``
(for "longformer" and "bigbird" every head reads the one mask; combine and layer
do not change them), for every pattern of the registry (``fast.patterns``, where each is
stated once). The pattern and its parameters are checked by
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
               one query (n_q = 1) -> the one-query step (``fast.backends.one_query``): the keys
               its row reads, gathered, O(keys read) (eager only: it reads values and
               positions on the host, so a traced call takes the operator); it serves
               every pattern, the structured path the paper's three (``FACTORIZED``);
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

One call plan per signature (docs/design.md, "The call plan"). A call's signature --
the shapes, strides, dtypes, devices and requires_grad of q, k, v, grad mode, autocast,
and every other argument with its type (the mask's and the padding's metadata, not
their values) -- names a ``CallPlan``, made by the first call of that signature and
kept (the ``MAX_CALL_PLANS`` most recently used; ``clear_call_plans``): it runs every
check that reads no value (``fast.core.checks.check_call``), chooses the path in one
place (``choose_path``) and binds the callable that runs it. A later call of the
signature runs only what depends on the values: the value checks it asks for
(``check_finite``; padding values), the padding moved to the device, and the path --
on the Triton path the operator alone, which allocates what the kernels write and
launches them, reading nothing back (so it can be captured in a CUDA graph). Bad
input gets the same error on a kept plan as on a fresh one: a new argument is a new
signature, and values are checked on every call.

torch.compile (docs/design.md, "torch.compile"): a model that calls ``sparse_attention``
compiles with ``fullgraph=True`` -- one graph, no graph break, no recompile from step to
step of one shape. A traced call makes its plan in the trace (Python over shapes and
Python values, the backend choice included: auto's measured crossover is a constant
when traced) and keeps none. What cannot be traced is an operator, which every call
runs, eager or compiled -- one path per operator: the structured path's forward and
backward (``sparse_transformer::structured``, ``fast.backends.structured``: its pieces,
merges and its float64 decision inside), the Triton kernels
(``sparse_transformer::triton``), each differentiated by an autograd Function that calls
its backward operator, and the checks that read values on the host
(``sparse_transformer::check_inputs``, ``fast.backends.host_checks``: the finite check
and the padding values). "full" and the naive path are plain PyTorch (SDPA), which the
compiler traces and fuses. Not yet without a break: ``check_finite=False`` with a
backward on a pattern other than "full" (its NaN quarantine finds what a row reads
through ``torch.autograd.grad``), ``fast.SparseKVCache``'s steps (decoding), a Triton
``Variant`` built by the caller, and a naive call big enough that its memory guard
reads /proc/meminfo. An argument error found while tracing (a bad stride, a refused
keyword) is raised by dynamo under ``fullgraph=True`` as
``torch._dynamo.exc.Unsupported`` ("Observed exception"), eager's message in its text;
errors of values (NaN, padding) are eager's.

The paths with queries shorter than the keys (n_q < n_k, n_q > 1) compute every one of
the n_k rows on the structured and Triton backends (q padded in front with zero rows):
exact, at the cost of n_k queries; the naive path costs n_q n_k pairs.

Every bad input raises ValueError saying what was given and what is allowed (TypeError
for an unknown keyword). The arguments are checked by ``fast.core.checks.check_call``
once per signature (q, k, v and the scale by the same checks as the Triton kernel's own
entry point); the backends trust what they get.

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
"full" does when eager on the CPU (``full_attention``; a compiled "full" layer is
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

Non-finite q, k or v (NaN, inf), as SDPA, flash-attn and FlexAttention treat values:
metadata is checked always, values when asked. ``check_finite=True`` rejects them
(``fast.core.checks.NonFiniteInput``), in one read-only pass, since a NaN would otherwise
surface far from its cause; on a GPU that read makes the call wait for the device.
``check_finite=None`` (the default) is True on the CPU, where the read costs no wait,
and looks at no value on a GPU: a forward or backward there reads nothing back, and the
dense "full" pattern is SDPA's work alone; a NaN then goes where the kernels carry it
(the Triton kernels keep it to the rows that read it in the forward:
tests/fast/kernels/test_triton_numerics.py). The same switch decides whether the values
of ``lengths`` and ``offsets`` given on a GPU are checked. With ``check_finite=False``
the "naive" and "structured" backends keep the promise of ``fast.core.nonfinite``, at
the cost of an isfinite pass (and, for patterns other than "full", a second attention)
on every call: a row that reads a NaN or inf (its query, or a key or value it reads)
outputs NaN, and its gradients are NaN; no other row sees it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections import OrderedDict

import torch

from fast.backends import auto, host_checks
from fast.backends import naive as naive_backend
from fast.backends.flash_cpu import uses_kernel
from fast.backends.naive import naive_sparse_attention
from fast.backends.one_query import row_attention
from fast.backends.padding import as_padding, padded_run, to_device, zero_outside
from fast.backends.structured import full_attention, structured_attention
from fast.core.checks import check_call
from fast.core.nonfinite import attention_reach, causal_reach, quarantine
from fast.core.precision import autocast_inputs
from reference.params import FACTORIZED

BACKENDS = ("auto", "structured", "naive", "triton")
MAX_CALL_PLANS = 256      # call plans kept (least recently used dropped first)


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

    Returns "naive", "structured", "full", "row" or "triton"."""
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


def finite_default(device: torch.device) -> bool | None:
    """What ``check_finite=None`` means on ``device``: True on the CPU (the finite check
    costs a read of q, k, v and no wait), None elsewhere (nothing looks at the values)."""
    return True if device.type == "cpu" else None


# ----------------------------------------------------------------------------
# The call plan
# ----------------------------------------------------------------------------

class CallPlan:
    """Everything a call of one signature needs, checked and decided once (module
    docstring, "One call plan per signature"; docs/design.md, "The call plan"): every
    check of the arguments' types, shapes, strides, dtypes and devices, the pattern and
    its parameters, the scale, the mask's and the padding's metadata; the path
    (``choose_path``) and the callable that runs it; which value checks a call asks for;
    where the scale goes (``fold_dtype``); whether non-finite rows are isolated
    (``fast.core.nonfinite``). ``__call__`` then does only what depends on the values:
    the value checks asked for, the padding moved to the device, and the path.

    Built from the call's own tensors, after autocast's cast (``autocast``: (device type,
    the dtype each of q, k, v is cast to or None) when autocast was on for q's device,
    else None); keeps no tensor."""

    def __init__(self, q, k, v, attn_mask, lengths, offsets, pattern, stride, c, combine,
                 layer, scale, dropout_p, is_causal, enable_gqa, backend, check_finite,
                 variant, pattern_params: dict, autocast: tuple | None):
        params, scale, dropout_p, fold = check_call(q, k, v, pattern, combine, layer, scale,
                                                    attn_mask, dropout_p, is_causal,
                                                    enable_gqa, check_finite,
                                                    {"stride": stride, "c": c},
                                                    pattern_params)
        B, H, n_q, _ = q.shape
        n_k, device, dtype = k.shape[2], q.device, q.dtype
        padded = lengths is not None or offsets is not None
        backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        which = choose_path(backend, pattern, combine, params, device, dtype, B, H, n_q, n_k,
                            backward=backward, attn_mask=attn_mask is not None,
                            dropout=dropout_p > 0, padded=padded)
        if variant is not None and which != "triton":
            raise ValueError(f"variant {variant!r} selects a Triton kernel variant, but "
                             f"backend {backend!r} runs {which!r} here; allowed: "
                             f"variant=None, or backend='triton'")
        if check_finite is None:
            check_finite = finite_default(device)
        self.path, self.autocast, self.B, self.n_k, self.device = which, autocast, B, n_k, device
        self.finite = bool(check_finite) and which != "row"   # the step looks at its reads
        self.values = bool(check_finite)      # the padding's values on a GPU too
        self.padded = padded
        # see fold_dtype: q * scale in the dtype it fits, scale 1 (the Triton kernels take
        # any scale: fast.kernels.launch.fold_scale)
        self.dtype, self.fold, self.scale = dtype, None if which == "triton" else fold, scale
        if self.fold is not None:
            q, k, v, scale = q.to(self.fold), k.to(self.fold), v.to(self.fold), 1.0
        # non-finite values kept to the rows that read them (fast.core.nonfinite)
        self.isolate = check_finite is False and which in ("naive", "structured", "full")
        self.simple = (pattern == "full" and n_q == n_k and k.shape[1] == H
                       and attn_mask is None and not padded)
        self.always = device.type != "cpu" or torch.compiler.is_compiling()
        self.attend = _attend(q, k, v, which=which, pattern=pattern, combine=combine,
                              layer=layer, params=params, scale=scale, dropout_p=dropout_p,
                              check_finite=check_finite, variant=variant, padded=padded,
                              backward=backward)
        self.reach = _attend(q, k, v, which=which, pattern=pattern, combine=combine,
                             layer=layer, params=params, scale=1.0, dropout_p=0.0,
                             check_finite=check_finite, variant=variant, padded=padded,
                             backward=backward) if self.isolate else None

    def __call__(self, q, k, v, attn_mask, lengths, offsets):
        """The path on this call's tensors: (B, H, n_q, d) in q's dtype (autocast's)."""
        if self.autocast is None:
            return self._run(q, k, v, attn_mask, lengths, offsets)
        device, (cq, ck, cv) = self.autocast   # SDPA's rule: cast, then autocast off inside
        q, k, v = (t if c is None else t.to(c) for t, c in ((q, cq), (k, ck), (v, cv)))
        with torch.autocast(device, enabled=False):
            return self._run(q, k, v, attn_mask, lengths, offsets)

    def _run(self, q, k, v, attn_mask, lengths, offsets):
        if self.padded:                   # not moved yet: values on the host are read there
            lengths, offsets, (host_l, host_o) = as_padding(lengths, offsets, self.B)
            values = (lengths is not None and (host_l or self.values),
                      offsets is not None and (host_o or self.values))
        else:
            values = (False, False)
        if self.finite or values[0] or values[1]:        # the host reads, in one operator
            with torch.no_grad():         # nothing to differentiate: no autograd node made
                host_checks.check(q, k, v, self.finite, lengths, offsets, *values)
        if self.padded:
            lengths, offsets = to_device(lengths, offsets, self.device)  # checked where given
        if self.fold is not None:
            q, k, v = q.to(self.fold) * self.scale, k.to(self.fold), v.to(self.fold)
        if self.isolate:
            out = self._isolated(q, k, v, attn_mask, lengths, offsets)
        else:
            out = self.attend(q, k, v, attn_mask, lengths, offsets)
        return out if self.fold is None else out.to(self.dtype)

    def _isolated(self, q, k, v, attn_mask, lengths, offsets):
        """The path with ``fast.core.nonfinite``'s promise: padded rows output 0 NaN or
        not, and a non-finite value reaches exactly the rows that read it."""
        q = zero_outside(q, lengths, offsets, self.n_k)
        reach = causal_reach if self.simple else attention_reach(
            lambda a, b, c: self.reach(a, b, c, attn_mask, lengths, offsets))
        return quarantine(lambda a, b, c: self.attend(a, b, c, attn_mask, lengths, offsets),
                          q, k, v, reach, always=self.always)


def _attend(q, k, v, *, which, pattern, combine, layer, params, scale, dropout_p,
            check_finite, variant, padded, backward):
    """The callable of one path: attend(q, k, v, attn_mask, lengths, offsets) ->
    (B, H, n_q, d), everything but the tensors bound (module docstring, "Backends")."""
    if which == "naive":
        def attend(q, k, v, attn_mask, lengths, offsets):
            return naive_sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                          scale=scale, attn_mask=attn_mask, lengths=lengths,
                                          offsets=offsets, dropout_p=dropout_p, **params)
        return attend
    if which == "row":                    # the one-query step: only the keys its row reads
        def attend(q, k, v, attn_mask, lengths, offsets):
            return row_attention(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                                 params=params, lengths=lengths, offsets=offsets,
                                 check_finite=check_finite)
        return attend
    if which == "triton":
        try:
            from fast.kernels.triton_attention import prepare
        except ModuleNotFoundError as err:
            if err.name not in ("fast.kernels.triton_attention", "triton"):
                raise
            raise ImportError(f"backend 'triton' needs the module {err.name!r}, which is not "
                              f"installed or not written yet; use backend 'naive' or "
                              f"'structured'") from err
        unpadded = prepare(q, k, v, pattern, combine=combine, layer=layer, scale=scale,
                           params=params, variant=variant)
    elif which == "full":
        # SDPA, or the operator for its float64 decision: eager CPU calls below float64
        # that autograd will differentiate (fast.backends.structured.full_attention)
        exact_check = (uses_kernel(q) and q.dtype != torch.float64 and backward
                       and not torch.compiler.is_compiling())
        def unpadded(q, k, v):
            return full_attention(q, k, v, scale, exact_check)
    else:                                 # "structured"
        stride, c = params["stride"], params.get("c")
        def unpadded(q, k, v):
            return structured_attention(q, k, v, pattern, combine=combine, layer=layer,
                                        scale=scale, stride=stride, c=c)
    if padded:
        def attend(q, k, v, attn_mask, lengths, offsets):
            return padded_run(unpadded, q, k, v, lengths, offsets)
        return attend
    return lambda q, k, v, attn_mask, lengths, offsets: unpadded(q, k, v)


_PLANS: OrderedDict = OrderedDict()     # signature -> CallPlan, least recently used first


def clear_call_plans() -> None:
    """Forget every call plan (the next call of each signature checks and decides anew)."""
    _PLANS.clear()


def call_plans() -> int:
    """How many call plans are kept (at most ``MAX_CALL_PLANS``)."""
    return len(_PLANS)


def _metadata(x):
    """What a plan depends on of an optional tensor argument (a mask, lengths, offsets):
    its shape, dtype and device; of anything else its type (its values are read on
    every call)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.shape, x.dtype, x.device
    return type(x)


def _signature(q, k, v, arguments: tuple):
    """The key of a call's plan: every argument a plan depends on -- the shapes, strides,
    dtypes, devices and requires_grad of q, k, v, grad mode, autocast on q's device, and
    ``arguments`` (the others, with their types: 4 and 4.0 are one key otherwise, and
    only one of them is a stride) -- or None where there is none to make (an argument
    that is not a tensor, a nested tensor: the plan's checks then name it)."""
    try:
        device = q.device
        autocast = torch.is_autocast_enabled(device.type)
        return (q.shape, q.stride(), q.dtype, device, q.requires_grad,
                k.shape, k.stride(), k.dtype, k.device, k.requires_grad,
                v.shape, v.stride(), v.dtype, v.device, v.requires_grad,
                torch.is_grad_enabled(), autocast,
                torch.get_autocast_dtype(device.type) if autocast else None, arguments)
    except (AttributeError, TypeError, RuntimeError):
        return None


def _plan(key, q, k, v, *arguments) -> CallPlan:
    """A new plan (every check runs here) for q, k, v and the other ``arguments`` of
    ``CallPlan``, kept under ``key`` when there is one."""
    (qc, kc, vc), device = autocast_inputs(q, k, v)
    if device is None:
        plan = CallPlan(q, k, v, *arguments, autocast=None)
    else:                                 # the checks see what the call computes on
        with torch.autocast(device, enabled=False):
            casts = tuple(c.dtype if c is not t else None for c, t in ((qc, q), (kc, k), (vc, v)))
            plan = CallPlan(qc, kc, vc, *arguments, autocast=(device, casts))
    if key is not None:
        _PLANS[key] = plan
        while len(_PLANS) > MAX_CALL_PLANS:
            _PLANS.popitem(last=False)
    return plan


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
    n_global, seed=0), or a pattern added since (``reference.params.PARAMS`` lists
    each with its parameters). combine: "merged" | "multihead" | "interleaved" (sec. 5.1);
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
    check_finite: True rejects NaN / inf in q, k, v (a read of each value; a wait on a
    GPU); False accepts them and keeps each to the rows that read it on the naive and
    structured backends (``fast.core.nonfinite``: an isfinite pass a call); None (the
    default): True on the CPU, where the read costs no wait, and on a GPU no look at the
    values (module docstring, "Non-finite").
    variant: the Triton kernel variant (a name in ``fast.kernels.variants.VARIANTS`` or a
    ``Variant``; None: the default), for the "triton" backend only.
    Any other keyword must be a parameter of some pattern; others raise a TypeError.

    Under autocast (``torch.autocast`` on q's device) it does what SDPA does: q, k and v,
    unless float64, are cast to the autocast dtype, and the output is in it; every
    backend then computes alike (``fast.core.precision.autocast_inputs``).
    """
    arguments = (pattern, stride, c, combine, layer, scale, dropout_p, is_causal, enable_gqa,
                 backend, check_finite, variant)
    if torch.compiler.is_compiling():     # traced: the plan is made in the trace, once
        return _plan(None, q, k, v, attn_mask, lengths, offsets, *arguments,
                     pattern_params)(q, k, v, attn_mask, lengths, offsets)
    key = _signature(q, k, v, (*arguments, *map(type, arguments),
                               None if attn_mask is None else _metadata(attn_mask),
                               None if lengths is None else _metadata(lengths),
                               None if offsets is None else _metadata(offsets),
                               tuple(pattern_params.items()) if pattern_params else ()))
    try:
        plan = _PLANS.get(key) if key is not None else None
    except TypeError:                     # an unhashable argument: checked by a new plan
        key = plan = None
    if plan is None:
        plan = _plan(key, q, k, v, attn_mask, lengths, offsets, *arguments, pattern_params)
    else:
        try:
            _PLANS.move_to_end(key)
        except KeyError:                  # dropped meanwhile by another thread
            pass
    return plan(q, k, v, attn_mask, lengths, offsets)
