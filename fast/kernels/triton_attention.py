"""Block-sparse attention in Triton: the public wrapper, its checks and the layout cache.

Child et al., 2019, section 5.5 (block-sparse kernels) over the patterns of
section 4.3 and the head combinations of section 5.1 (eq. 5-8). The pieces, one
job each:

* ``fast.kernels.triton_kernels`` -- the @triton.jit kernels (forward, dQ, dK/dV);
* ``fast.kernels.variants``       -- the kernel variants (the speed levers) by name;
* ``fast.kernels.launch``         -- the launches of a layout, decided once
  (``Launches``), and what a forward and a backward launch;
* this module                     -- the layout cache (``cached_layout``: built by
  ``fast.layout.block_layout``, moved to the device once) and the launches of each
  layout (``launches``); the kernels as one operator, ``sparse_transformer::triton``,
  with its backward ``sparse_transformer::triton_backward`` as the autograd formula
  (``TritonAttention``); ``prepare`` (the entry of ``fast.sparse_attention``'s call
  plan: a ``TritonCall`` per call signature) and ``triton_sparse_attention`` (the
  public function); ``attention_with_parts`` / ``attention_lse`` / ``forward``
  (already-built parts in, eager only) and the input checks (``fast.core.checks``
  plus the kernel's own limits).

One path (docs/design.md, "torch.compile"): every call of the layouts of
``sparse_attention`` runs the operator's one kernel, eager or compiled, bound once as
flash-attn binds its operator -- an autograd Function whose forward and backward call
the two operators (``FORWARD``, ``BACKWARD``); ``torch.compile`` traces the Function and
keeps each operator as one opaque call. The operators are defined with
``torch.library.Library`` (a kernel registered for every backend, and a fake one): a
dispatch costs about a third of what a ``torch.library.custom_op`` with
``register_autograd`` costs (its Python wrapper checks aliasing and fills defaults on
every call: ``python -m fast bench --host-cost`` measures the path), and a plain eager
call, which nothing but autograd sees, runs the kernel without the dispatch
(``fast.core.autograd.operator_call``: the same function on the same tensors). The
operators take two attributes: the scale, and one text naming the layout and its
kernels (``layout_text``: the pattern, combine, the layer's key, the parameters, block,
order and variant), made once per call signature -- each argument of a dispatched
operator is parsed on every call, so the attributes are as few as the decisions they
carry. The launches are found by one look-up of a flat key per call
(``launches``: the text, the scale and q's shape, dtype and device).

Checks run once per call signature, at the entry the caller used: the public
functions here check q, k, v, the scale and the kernel's limits on every call;
``prepare`` is the entry of ``fast.sparse_attention``'s call plan, which has checked
q, k, v, the pattern and the scale already, so it checks only what the kernel alone
limits (dtype, d, device), once.

This is the one module to import the kernels from: it also re-exports the names
that tests and notebook 04 use (``interpreted``, ``parts_from_masks``,
``VARIANTS`` and ``merge``, the torch twin of the in-kernel merge from
``fast.core.merge``).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

from fast import patterns
from fast.core.autograd import Function, backward_through, keep_for_backward, operator_call
from fast.core.checks import check_scale, check_tensors
from fast.core.merge import merge
from fast.kernels import launch
from fast.kernels.launch import interpreted
from fast.kernels.variants import VARIANTS, Variant, resolve
from fast.layout import LayoutPart, block_layout
from fast.layout.from_masks import parts_from_masks
from reference.params import check_params

__all__ = [
    "GPU_DTYPES", "MAX_HEAD_DIM", "VARIANTS", "TritonAttention", "TritonCall", "Variant",
    "attention_lse", "attention_with_parts", "cached_layout", "clear_layout_cache",
    "default_block", "forward", "interpreted", "launches", "layout_cost", "layout_of",
    "layout_text", "merge", "parts_from_masks", "prepare", "triton_sparse_attention",
    "variant_parts",
]

GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 128
DEFAULT_BLOCK_GPU = 64
DEFAULT_BLOCK_INTERPRETER = 32


# ----------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------

def _interpreter_dtype_error(dtype: torch.dtype) -> ValueError:
    """The interpreter's refusal of a dtype other than float32, naming the CPU path that
    takes it."""
    return ValueError(f"the Triton interpreter (TRITON_INTERPRET=1) runs float32 only, got "
                      f"{dtype}; for float16, bfloat16 or float64 on the CPU use "
                      f"fast.sparse_attention(..., backend='structured')")


def _kernel_limits(q) -> None:
    """What only the kernel limits, for q, k, v already checked by ``check_tensors``:
    the dtype, d, and where it runs. Non-finite values are left to
    ``fast.sparse_attention``, which checks them once: here the check would make every
    call wait for the GPU."""
    if q.device.type == "cpu" and interpreted() and q.dtype != torch.float32:
        raise _interpreter_dtype_error(q.dtype)
    if q.dtype not in GPU_DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; allowed: "
                         f"{', '.join(str(d) for d in GPU_DTYPES)} (the Triton kernel)")
    d = q.shape[-1]
    if d > MAX_HEAD_DIM:
        raise ValueError(
            f"head dimension d must be at most {MAX_HEAD_DIM} for the Triton kernel, got d={d} "
            "(d that is not a power of two is padded inside the kernel)"
        )
    if q.device.type == "cpu":
        if not interpreted():
            raise RuntimeError(
                "the Triton kernels got a CPU tensor but were compiled for a GPU: set the "
                "environment variable TRITON_INTERPRET=1 before importing triton (slow, for "
                "tests), move q, k, v to CUDA, or use fast.sparse_attention(..., "
                "backend='structured') on the CPU"
            )
    elif q.device.type == "cuda" and interpreted():
        raise RuntimeError(
            "TRITON_INTERPRET=1 is set, so the Triton kernels run on the CPU: "
            "pass CPU tensors or unset TRITON_INTERPRET to run on the GPU"
        )
    elif q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cuda (or cpu with TRITON_INTERPRET=1), got {q.device}")


def _check_inputs(q, k, v, scale, enable_gqa: bool = False, parts: bool = False) -> float:
    """The checks of a public entry: q, k, v (``fast.core.checks``, the kernel's dtypes),
    the kernel's limits and the scale; returns the scale. ``parts``: an entry on
    already-built parts, which are laid out for q's n and heads: q, k, v of one shape."""
    if (isinstance(q, torch.Tensor) and q.device.type == "cpu" and interpreted()
            and q.is_floating_point() and q.dtype != torch.float32):   # no GPU dtype here
        raise _interpreter_dtype_error(q.dtype)
    check_tensors(q, k, v, dtypes=GPU_DTYPES, finite=False, enable_gqa=enable_gqa)
    if parts and q.shape != k.shape:
        raise ValueError(f"attention on already-built layout parts takes q, k, v of one shape "
                         f"(B, H, n, d), the parts' n and heads; got q {tuple(q.shape)}, k "
                         f"{tuple(k.shape)}; fast.sparse_attention takes n_q < n_k and "
                         f"grouped key/value heads")
    _kernel_limits(q)
    return check_scale(scale, q.shape[-1])


def _check_block(block_size) -> int:
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 16 \
            or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
    return block_size


def _on_device(q, parts, block_size: int) -> list[LayoutPart]:
    """Already-built parts on q's device, checked against q: built for ``block_size``,
    for 1 head (shared) or q's heads, and for no longer a sequence than q's."""
    n_heads, n = q.shape[1], q.shape[2]
    out = []
    for p in parts:
        if not isinstance(p, LayoutPart):
            raise TypeError(f"parts must be fast.layout.LayoutPart, got {type(p).__name__}")
        if p.block_size != block_size:
            raise ValueError(f"layout part {p.name!r} was built for another block size "
                             f"({p.block_size}) than block_size={block_size}")
        p = p.to(q.device)
        if p.q_pos.shape[0] not in (1, n_heads):
            raise ValueError(f"layout part {p.name!r} has {p.q_pos.shape[0]} heads; q has "
                             f"{n_heads} (a part serves 1 head, shared, or all of them)")
        if p.facts.top >= n:
            raise ValueError(f"layout part {p.name!r} reads position {p.facts.top}, but "
                             f"n = {n}: it was built for a longer sequence")
        out.append(p)
    return out


# ----------------------------------------------------------------------------
# Running on parts
# ----------------------------------------------------------------------------

def _apply(q, k, v, parts, scale: float, variant: Variant) -> torch.Tensor:
    q, scale = launch.fold_scale(q, scale)
    return launch.BlockSparseAttention.apply(q, k, v, parts, scale, variant)


def attention_with_parts(q, k, v, parts, *, scale=None, block_size: int,
                         variant=None) -> torch.Tensor:
    """Run the kernels on already-built layout parts (``fast.layout.LayoutPart``, on any
    device: moved to q's); q, k, v (B, H, n, d). Differentiable in q, k, v."""
    scale = _check_inputs(q, k, v, scale, parts=True)
    variant = resolve(variant)
    return _apply(q, k, v, _on_device(q, parts, _check_block(block_size)), scale, variant)


def attention_lse(q, k, v, parts, *, scale=None, block_size: int, variant=None):
    """Forward only: (out in q's dtype, lse float32 in natural log; -inf for rows that read
    nothing). For tests and the notebook."""
    return forward(q, k, v, parts, scale, block_size, variant=variant)


def forward(q, k, v, parts, scale=None, block_size: int | None = None, separate: bool = False,
            variant=None):
    """Forward only on already-built parts: (out, lse), merged inside the kernels, or
    with ``separate=True`` the lists ([out_p], [lse_p]) of every part alone (their torch
    merge, ``merge``, equals the kernels'). out in q's dtype, lse float32, natural log.
    ``block_size``: None takes the parts' own (they must agree)."""
    scale = _check_inputs(q, k, v, scale, parts=True)
    variant = resolve(variant)
    if block_size is None:
        block_size = parts[0].block_size if parts else DEFAULT_BLOCK_GPU
    parts = _on_device(q, parts, _check_block(block_size))
    q, scale = launch.fold_scale(q, scale)
    q, k, v = (t.contiguous() for t in (q, k, v))
    n, d = q.shape[2], q.shape[3]
    if not separate:
        out, stats = launch.forward(q, k, v, launch.Launches(parts, variant, q.dtype, d,
                                                             q.device, n, scale))
        return out, launch.lse_of(stats, scale)
    outs, lses = [], []
    for p in parts:
        out, stats = launch.forward(q, k, v, launch.Launches([p], variant, q.dtype, d,
                                                             q.device, n, scale))
        outs.append(out)
        lses.append(launch.lse_of(stats, scale))
    return outs, lses


# ----------------------------------------------------------------------------
# Layouts: built by fast.layout, cached per (pattern, n, H, combine, layer, params, block, device)
# ----------------------------------------------------------------------------

_LAYOUTS: OrderedDict = OrderedDict()   # key -> (device parts, layout), least recently used first
MAX_CACHED_LAYOUTS = 16


def _hashable(x):
    if isinstance(x, (list, tuple, range, np.ndarray)):
        return tuple(_hashable(y) for y in x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def cached_layout(pattern: str, n: int, n_heads: int, combine: str, layer: int,
                  params: dict, block: int, device,
                  order: str = "structured") -> tuple[list[LayoutPart], object]:
    """The layout's parts on ``device`` (built once, then cached), and the layout.
    ``order="natural"`` (one part, natural token order) is for comparisons only.

    The cache keeps the ``MAX_CACHED_LAYOUTS`` most recently used layouts with every
    table a variant has written on the device (listed tables of the fixed pattern at
    n = 2**20, H = 8 hold 4 GiB; its range tables megabytes: ``fast.kernels.variants``);
    ``clear_layout_cache`` empties it. Interleaved layers r and r + p share one entry
    (they read the same of the pattern's p parts), other combine modes one for every
    layer."""
    layer_key = patterns.get(pattern).layer_key(combine, layer)
    key = (pattern, n, n_heads, combine, layer_key,
           tuple(sorted((k, _hashable(v)) for k, v in params.items())), block, str(device),
           order)
    hit = _LAYOUTS.get(key)
    if hit is None:
        lay = block_layout(pattern, n, n_heads=n_heads, combine=combine, layer=layer_key,
                           block_size=block, order=order, **params)
        hit = ([p.to(device) for p in lay.parts], lay)
        _LAYOUTS[key] = hit
        while len(_LAYOUTS) > MAX_CACHED_LAYOUTS:
            _LAYOUTS.popitem(last=False)
    _LAYOUTS.move_to_end(key)
    return hit


def clear_layout_cache() -> None:
    """Forget every cached layout and its launches (and free their device tables)."""
    _LAYOUTS.clear()
    _LAUNCHES.clear()


def default_block(device) -> int:
    return DEFAULT_BLOCK_INTERPRETER if torch.device(device).type == "cpu" else DEFAULT_BLOCK_GPU


def variant_parts(pattern: str, n: int, n_heads: int, combine: str, layer: int, params: dict,
                  block: int, device, order: str, variant: Variant, dtype,
                  d: int) -> list[LayoutPart]:
    """The layout's parts on ``device`` for ``variant``: each part kind at the tile size
    the variant's launch settings give it (``block`` unless set), from the cached layout
    built at that size (the parts of a pattern, and the pairs each one holds, are the
    same at every block size)."""
    parts, _ = cached_layout(pattern, n, n_heads, combine, layer, params, block, device, order)
    d_pad = launch.padded_d(d)
    out = []
    for i, p in enumerate(parts):
        b = variant.settings(p.name, dtype, d_pad).block
        if b is not None and b != block:
            p = cached_layout(pattern, n, n_heads, combine, layer, params, b, device, order)[0][i]
        out.append(p)
    return out


def layout_cost(pattern: str, n: int, n_heads: int, params: dict, variant=None,
                combine: str = "merged", block: int = DEFAULT_BLOCK_GPU, device="cpu") -> dict:
    """The host's part of a first call, measured: building the layout (``build_s``), moving
    its parts to ``device`` and writing the tables ``variant`` reads (``tables_s``), and
    those tables' bytes (``table_bytes``). Runs without a kernel, on the CPU too; builds
    from scratch (the cache is not used)."""
    variant = resolve(variant)
    t0 = time.perf_counter()
    lay = block_layout(pattern, n, n_heads=n_heads, combine=combine, block_size=block,
                       **params)
    t1 = time.perf_counter()
    args = [launch.part_args(p.to(device), variant) for p in lay.parts]
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    t2 = time.perf_counter()
    return dict(pattern=pattern, n=n, heads=n_heads, combine=combine, block=block,
                variant=variant.name, build_s=t1 - t0, tables_s=t2 - t1,
                table_bytes=sum(a.nbytes for a in args))


# ----------------------------------------------------------------------------
# The operator: what every call of sparse_attention's Triton path runs
# ----------------------------------------------------------------------------

def params_text(params: dict) -> str:
    """A pattern's parameters (ints, and tuples of ints: Longformer's global tokens) as the
    operators' one text attribute, "name=value;..." in sorted order, tuples as "t:a,b"
    (plain string work, which torch.compile traces into a constant)."""
    return ";".join(f"{name}=t:{','.join(str(int(x)) for x in value)}"
                    if isinstance(value, (tuple, list)) else f"{name}={int(value)}"
                    for name, value in sorted(params.items()))


def params_of(text: str) -> dict:
    """The inverse of ``params_text``."""
    out = {}
    for item in filter(None, text.split(";")):
        name, value = item.split("=")
        out[name] = (tuple(int(x) for x in filter(None, value[2:].split(",")))
                     if value.startswith("t:") else int(value))
    return out


_CALLER_VARIANTS: dict = {}   # repr -> a Variant built by the caller (not in VARIANTS)


def variant_text(variant: Variant) -> str:
    """The operators' name for ``variant``: its name when it is the one ``VARIANTS`` holds
    under it, else its ``repr`` (every field; registered here, so the operator finds it)."""
    if VARIANTS.get(variant.name) is variant:
        return variant.name
    text = repr(variant)
    _CALLER_VARIANTS.setdefault(text, variant)
    return text


def _variant_of(text: str) -> Variant:
    found = VARIANTS.get(text) or _CALLER_VARIANTS.get(text)
    if found is None:
        raise ValueError(f"unknown kernel variant {text[:80]!r}: a Variant built by the "
                         f"caller is known to the operator once it has been passed to "
                         f"sparse_attention (or triton_sparse_attention) in this process")
    return found


def layout_text(pattern: str, combine: str, layer: int, params: dict, block: int,
                order: str, variant: Variant) -> str:
    """The operators' one text attribute naming what they launch: the pattern, combine,
    the layer's key (``fast.patterns``: interleaved layers r and r + p read alike, so they
    share one text), the parameters (``params_text``), the block, the order and the
    variant (``variant_text``, last: it may hold any character), joined by "|"."""
    layer = patterns.get(pattern).layer_key(combine, layer)
    return "|".join((pattern, combine, str(layer), params_text(params), str(block), order,
                     variant_text(variant)))


def layout_of(text: str) -> tuple:
    """The inverse of ``layout_text``: (pattern, combine, layer, params, block, order,
    variant)."""
    pattern, combine, layer, params, block, order, variant = text.split("|", 6)
    return (pattern, combine, int(layer), params_of(params), int(block), order,
            _variant_of(variant))


# (layout text, scale, n, H, d, dtype, device) -> the launches (``launch.Launches``), least
# recently used first
_LAUNCHES: OrderedDict = OrderedDict()


def launches(q: torch.Tensor, layout: str, scale: float) -> launch.Launches:
    """The launches of the layout the operators' text names, for q (B, H, n, d) and the
    scale: found by one look-up of a flat key (no parsing), built on the first call of a
    signature from the cached layout (``variant_parts``). Kept with the layouts: the
    ``MAX_CACHED_LAYOUTS`` most recently used, dropped by ``clear_layout_cache``."""
    _, H, n, d = q.shape
    key = (layout, scale, n, H, d, q.dtype, q.device)
    hit = _LAUNCHES.get(key)
    if hit is None:
        pattern, combine, layer, params, block, order, variant = layout_of(layout)
        parts = variant_parts(pattern, n, H, combine, layer, params, block, q.device, order,
                              variant, q.dtype, d)
        hit = _LAUNCHES[key] = launch.Launches(parts, variant, q.dtype, d, q.device, n, scale)
        while len(_LAUNCHES) > MAX_CACHED_LAYOUTS:
            _LAUNCHES.popitem(last=False)
    else:
        try:
            _LAUNCHES.move_to_end(key)
        except KeyError:                  # dropped meanwhile by another thread: still good
            pass
    return hit


def _forward_op(q, k, v, layout, scale):
    """``launch.forward`` on the layout ``layout`` names: (out in q's dtype and layout, the
    row statistics (m, l) float32 (B, H, 2, n)) of q, k, v (B, H, n, d) / (B, Hkv, n, d) (q
    already padded to the keys' n, the scale as ``launch.fold_scale`` leaves it; every row
    contiguous, k and v of one layout: ``TritonCall`` sees to both)."""
    return launch.forward(q, k, v, launches(q, layout, scale))


def _backward_op(grad_out, q, k, v, out, stats, layout, scale):
    """``launch.backward`` on the layout ``layout`` names: (dq, dk, dv) shaped, typed and
    laid out as q, k, v."""
    return launch.backward(q, k, v, out, stats, grad_out, launches(q, layout, scale))


_LIB = torch.library.Library("sparse_transformer", "FRAGMENT")   # kept: it owns the ops
_LIB.define("triton(Tensor q, Tensor k, Tensor v, str layout, float scale) "
            "-> (Tensor, Tensor)")
_LIB.define("triton_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
            "Tensor stats, str layout, float scale) -> (Tensor, Tensor, Tensor)")
_LIB.impl("triton", _forward_op, "CompositeExplicitAutograd")
_LIB.impl("triton_backward", _backward_op, "CompositeExplicitAutograd")


@torch.library.register_fake("sparse_transformer::triton")
def _(q, k, v, layout, scale):
    B, H, n, _ = q.shape
    return torch.empty_like(q), q.new_empty(B, H, 2, n, dtype=torch.float32)


@torch.library.register_fake("sparse_transformer::triton_backward")
def _(grad_out, q, k, v, out, stats, layout, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# bound once (as flash-attn does); a plain eager call runs the kernel without the dispatch
FORWARD = operator_call(torch.ops.sparse_transformer.triton.default, _forward_op)
BACKWARD = operator_call(torch.ops.sparse_transformer.triton_backward.default, _backward_op)


class TritonAttention(Function):
    """The operator ``sparse_transformer::triton`` with its backward
    ``sparse_transformer::triton_backward`` as autograd formula: (out, the row statistics)
    of q, k, v, the layout's text and the scale. Every call takes it, eager or traced by
    torch.compile (which traces this Function and keeps each operator as one opaque
    call; a plain eager call runs the operators' kernels directly, ``operator_call``)."""

    @staticmethod
    def forward(q, k, v, layout, scale):
        # every parameter named (no *args): torch.compile passes no context to a forward
        # of as many parameters as the call has arguments
        return FORWARD(q, k, v, layout, scale)

    # apart, as torch.func's transforms require; delta = rowsum(dO * O), FlashAttention-2
    setup_context = staticmethod(keep_for_backward)
    backward = staticmethod(backward_through(BACKWARD, "the Triton backend of sparse_attention"))


class TritonCall:
    """The kernels for one call signature of ``fast.sparse_attention`` (``prepare``): what
    the signature decides is decided here, once -- the scale folded into q or not
    (``launch.fold_scale``), which tensors need a copy for the kernels (rows not
    contiguous, k and v of two layouts), the operator's attributes -- and ``__call__``
    runs the operator: no check, no look-up but the launches'.

    q (B, H, n_q, d), the last n_q positions of k, v (B, Hkv, n_k, d): the layout is
    built for n_k positions and H heads, and q padded in front with n_k - n_q zero rows
    (their outputs dropped, their gradients zero: a chunk of queries costs what n_k do).
    Grouped key/value heads are read in the kernels (head h reads k, v of h // share)."""

    __slots__ = ("fold", "scale", "copy_q", "copy_kv", "attributes")

    def __init__(self, q, k, v, pattern: str, combine: str, layer: int, params: dict,
                 scale: float, block_size=None, order: str = "structured", variant=None):
        variant = resolve(variant)
        block = default_block(q.device) if block_size is None else _check_block(block_size)
        self.fold, self.scale = launch.folds(scale), scale      # q * scale, and scale 1, or not
        self.copy_q = q.stride(-1) != 1   # (after F.pad or a padded batch's gather: a no-op)
        self.copy_kv = k.stride(-1) != 1 or v.stride(-1) != 1 or k.stride() != v.stride()
        self.attributes = (layout_text(pattern, combine, layer, params, block, order,
                                       variant), 1.0 if self.fold else scale)

    def __call__(self, q, k, v):
        front = k.shape[2] - q.shape[2]   # zero rows in front of q (a padded batch has none)
        if front:
            q = F.pad(q, (0, 0, front, 0))                               # (B, H, n_k, d)
        if self.fold:
            q = q * self.scale                  # as launch.fold_scale: scale 1 in the kernels
        if self.copy_q:
            q = q.contiguous()
        if self.copy_kv:
            k, v = k.contiguous(), v.contiguous()
        out, _ = TritonAttention.apply(q, k, v, *self.attributes)
        return out[:, :, front:] if front else out


def prepare(q, k, v, pattern: str, *, combine: str, layer: int, scale: float, params: dict,
            block_size=None, order: str = "structured", variant=None) -> TritonCall:
    """The kernels for ``fast.sparse_attention``'s call plan, which has checked q, k, v,
    the pattern, its parameters and the scale (a float): only the kernel's own limits are
    checked here, once per signature."""
    _kernel_limits(q)
    return TritonCall(q, k, v, pattern, combine, layer, params, scale, block_size, order,
                      variant)


def triton_sparse_attention(q, k, v, pattern: str, *, stride=None, c=None,
                            combine: str = "merged", layer: int = 0, scale=None,
                            block_size=None, order: str = "structured", variant=None,
                            enable_gqa: bool = False, **pattern_params) -> torch.Tensor:
    """Sparse Transformer attention with the block-sparse Triton kernels.

    q (B, H, n_q, d), k, v (B, Hkv, n_k, d): any n_q <= n_k (the queries are the last
    n_q positions), Hkv = H or with ``enable_gqa`` dividing H (query head h reads
    key/value head h // (H / Hkv)), d <= 128, float32/float16/bfloat16 on CUDA (float32
    on the CPU under TRITON_INTERPRET=1). pattern: "full", "strided" (stride),
    "fixed" (stride, c), "longformer" (window, dilation, global_tokens) or
    "bigbird" (window, n_random, n_global, seed); combine: "merged", "multihead"
    or "interleaved" (sec. 5.1), ``layer`` picks the interleaved head. Head h of
    q reads exactly the last n_q rows of
    ``reference.patterns.head_masks(pattern, n_k, H, combine, layer)[h]``.
    Differentiable in q, k, v. Returns (B, H, n_q, d) in q's dtype. Any finite scale.
    block_size: tile size (power of two >= 16; default 64 on CUDA, 32 under the
    interpreter; a variant may set another per part kind). order: "structured"
    (default: strided columns transposed, fixed summaries gathered, so every part
    is truly block-sparse) or "natural" (one part in natural order, for comparison
    in the benchmark). variant: a name in ``VARIANTS``, a ``Variant``, or None (the
    default, ``fast.kernels.variants.DEFAULT``). Every call checks its inputs;
    ``fast.sparse_attention(..., backend="triton")`` checks once per signature.
    """
    scale = _check_inputs(q, k, v, scale, enable_gqa)
    # the pattern, layer and parameters as every path checks them (before the layout
    # cache, whose key would let 4.0 find the entry of 4 and skip the check)
    params = check_params(pattern, k.shape[2], q.shape[1], combine, layer,
                          {"stride": stride, "c": c, **pattern_params})
    return TritonCall(q, k, v, pattern, combine, layer, params, scale, block_size, order,
                      variant)(q, k, v)
