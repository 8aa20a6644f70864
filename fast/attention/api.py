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

Backends: "auto" (the default: the fastest exact path that honours the call's
arguments), "naive" (SDPA with the pattern's boolean mask: honours every argument),
"structured" (no n x n tensor: the paper's patterns on the CPU) and "triton" (the
block-sparse kernels); ``fast.attention.paths`` says what each runs and when "auto"
picks which. One call plan per signature (``fast.attention.plan``; docs/design.md
§15): the arguments are checked, and the path chosen and bound, by the first
call of a signature; a later one runs only what depends on the values, and bad input
gets the same error on a kept plan as on a fresh one.

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

import torch

from fast.attention.plan import plan_for


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
    backend then computes alike (``fast.core.precision.autocast_casts``).
    """
    arguments = (pattern, stride, c, combine, layer, scale, dropout_p, is_causal, enable_gqa,
                 backend, check_finite, variant)
    plan = plan_for(q, k, v, attn_mask, lengths, offsets, arguments, pattern_params)
    return plan(q, k, v, attn_mask, lengths, offsets)
