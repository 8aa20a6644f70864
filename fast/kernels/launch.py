"""Launching the block-sparse kernels: forward, backward and their autograd Function.

Child et al., 2019, section 5.5 (block-sparse kernels) with the FlashAttention-2
recipe (Dao, 2023) for the forward and backward passes; the kernels themselves
are in ``fast.kernels.triton_kernels``, the settings of each variant in
``fast.kernels.variants``.

A layout has one or more disjoint *parts* (``fast.layout.LayoutPart``, on the run
device) whose union is exactly ``reference.patterns.head_masks``. The parts run one
after another; each after the first merges its rows into those already written
through the row statistics (m, l) (rows that read nothing in every part: out 0,
never NaN; the same merge in torch is ``fast.core.merge.merge``). ``backward``
gives every part the MERGED statistics, which makes each part's gradient its
exact share of the merged gradient.

Where each launch writes (``_order``, ``_Writes``): the baseline zero-fills a
float32 buffer, every part merges into it, and one cast pass makes the output in
q's dtype. A ``fused`` variant orders the parts so that the first one writes
every row (no zero-fill) and the last one too (it writes the output in q's
dtype itself, no cast); the parts between merge in a float32 scratch buffer
(none at all for float32 inputs, or for a one-part layout). dq follows the
parts' query slots, dk and dv their key slots (the fixed summary's keys are only
the summary positions, so its dK/dV launch goes first, into a zero-filled buffer).

Scale: the kernels take c = |scale| log2(e), a normal float32, and the sign
(``fold_scale`` folds a zero or tinier scale into q first); a scale beyond
float32's range acts as its largest value. For |scale| > 1 (sharper than any
default 1 / sqrt(d)) delta is summed over the recomputed tiles (``DELTA_PASS``)
so that one-hot rows keep exact gradients (``fast.kernels.triton_kernels``).

Nothing here reads a value back from the device: what the launchers branch on
is in each part's ``facts`` (host ints).

Run on a GPU, or on the CPU with ``TRITON_INTERPRET=1`` set before Triton is
imported (NumPy interpreter: float32 only, slow, for tests; other dtypes on the
CPU take ``backend="structured"``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

try:
    import triton
except ImportError as err:  # pragma: no cover - exercised only without triton
    raise ImportError(
        "fast.kernels.launch needs Triton (pip install 'sparse-transformer[triton]'); "
        "without it use fast.sparse_attention(..., backend='structured')"
    ) from err

from fast.core.autograd import once_differentiable
from fast.kernels import triton_kernels as K
from fast.kernels.variants import Launch, Variant

FLOAT32_MAX = torch.finfo(torch.float32).max
FLOAT32_TINY = torch.finfo(torch.float32).tiny      # smallest normal float32
EXACT_DELTA_ABOVE = 1.0   # scale above which delta is summed over the tiles (DELTA_PASS)


def interpreted() -> bool:
    """True when the kernels were built for the NumPy interpreter (TRITON_INTERPRET=1
    was set before Triton was imported)."""
    return type(K._fwd_kernel).__name__ == "InterpretedFunction"


# ----------------------------------------------------------------------------
# Scale
# ----------------------------------------------------------------------------

def fold_scale(q: torch.Tensor, scale: float) -> tuple[torch.Tensor, float]:
    """(q, scale) as the kernels take them: |scale| log2(e) a normal float32. A scale of 0,
    or so small that |scale| log2(e) is below float32's smallest normal, is folded into q
    (q * scale, differentiable, and scale 1): the same scores, and q's gradient gets its
    factor through autograd. A negative scale stays (the kernels negate the scores)."""
    if abs(scale) * K.LOG2E < FLOAT32_TINY:
        return q * scale, 1.0                                              # (B, H, n, d)
    return q, scale


def _exponent(scale: float) -> tuple[float, float]:
    """(c, scale) passed to the kernels: c = |scale| log2(e) and the scale, each at most
    float32's largest value in magnitude."""
    return (min(abs(scale) * K.LOG2E, FLOAT32_MAX),
            math.copysign(min(abs(scale), FLOAT32_MAX), scale))


def lse_of(m: torch.Tensor, l: torch.Tensor, scale: float) -> torch.Tensor:
    """The natural log-sum-exp of each row's scaled scores from its statistics (m, l):
    (m c + log2 l) ln 2, computed in float64 (m c may pass float32's range), -inf for
    rows that read nothing; float32 (B, H, n)."""
    c, _ = _exponent(scale)
    lse = (m.double() * c + torch.log2(l.double())) * math.log(2.0)
    return torch.where(l == 0, float("-inf"), lse).float()


# ----------------------------------------------------------------------------
# Launch settings and arguments
# ----------------------------------------------------------------------------

def padded_d(d: int) -> int:
    """The head dim a kernel computes with: d padded to a power of two >= 16 (BLOCK_D)."""
    return max(16, triton.next_power_of_2(d))


def _meta(q: torch.Tensor) -> dict:
    if q.dtype != torch.float32:
        precision = "tf32"        # ignored for float16 / bfloat16 operands
    elif q.device.type == "cpu":
        precision = "ieee"        # the interpreter: plain float32 NumPy matmuls
    else:
        # float32 on a GPU: never plain TF32 (it would weaken the fp32 ground truth);
        # "tf32x3" (three TF32 products) keeps float32 accuracy on tensor cores, where
        # "ieee" compiles to an FMA loop that spills (Triton 3.9, sm_80 / sm_90).
        precision = "tf32x3"
    return dict(BLOCK_D=padded_d(q.shape[-1]), PRECISION=precision)


_STAGES: dict = {}  # (kernel, BLOCK, BLOCK_D, dtype, device, warps, stages) -> stages that fit


def _launch(kernel, n_blocks: int, B: int, H: int, args, part, settings: Launch, meta: dict,
            q: torch.Tensor, **flags) -> None:
    """Launch over (ceil(n_blocks / group), B H) programs with the variant's warps (default
    4, 8 for a padded head dim above 64) and stages (default 2); where the GPU's shared
    memory is too small for those stages, retry once with 1 and remember it. The
    interpreter ignores warps and stages."""
    group = settings.group
    warps = settings.warps or (4 if meta["BLOCK_D"] <= 64 else 8)
    asked = settings.stages or 2
    key = (id(kernel), part.block_size, meta["BLOCK_D"], q.dtype, str(q.device), warps, asked)
    stages = _STAGES.get(key, asked)
    grid = (triton.cdiv(n_blocks, group), B * H)
    while True:
        try:
            kernel[grid](*args, BLOCK=part.block_size, GROUP=group, num_warps=warps,
                         num_stages=stages, **meta, **flags)
        except triton.runtime.errors.OutOfResources:
            if stages == 1:
                raise
            stages = 1
            continue
        _STAGES[key] = stages
        return


_DUMMY: dict = {}


def _dummy(device, dtype=torch.int32) -> torch.Tensor:
    """A one-element tensor for a pointer argument the kernel does not read."""
    key = (str(device), dtype)
    if key not in _DUMMY:
        _DUMMY[key] = torch.zeros(1, dtype=dtype, device=device)
    return _DUMMY[key]


class PartArgs(NamedTuple):
    """What the kernels read of one part, for one variant."""
    hl: int                # layout heads the tables hold (1: one serves every head)
    q_slots: tuple         # QPos, QRow, QP, QX, QY, QOff, QLim
    k_slots: tuple
    kv: tuple              # Count, Index, Mask, W, Rows, Ends (the forward table)
    qt: tuple              # the same for the transposed table
    token_masks: torch.Tensor
    flags: dict            # Q_MAP, K_MAP
    kv_range: bool
    qt_range: bool

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors the kernels read of this part (each counted once)."""
        seen = {}
        for t in (*self.q_slots, *self.k_slots, *self.kv, *self.qt, self.token_masks):
            if torch.is_tensor(t) and t.numel() > 1:
                seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return sum(seen.values())


def part_args(part, variant: Variant) -> PartArgs:
    """The kernel arguments of a part on its device, for the variant's ``index_math`` and
    ``ranges`` (built once per part and kept)."""
    key = ("args", variant.index_math, variant.ranges)
    if key not in part._cache:
        part._cache[key] = _part_args(part, variant)
    return part._cache[key]


def _part_args(part, variant: Variant) -> PartArgs:
    one = part.shared
    hl = 1 if one else part.q_pos.shape[0]
    device = part.device
    dummy = _dummy(device)

    def slots(pos, same, slot_map):
        row = 0 if same else pos.shape[1]
        pos = pos[:1] if same else pos[:hl]                              # (HL or 1, M)
        if variant.index_math and slot_map is not None:
            return (pos, row, slot_map.period, slot_map.x, slot_map.y,
                    slot_map.offset[:hl].contiguous(), slot_map.limit), True
        return (pos, row, 1, 0, 0, dummy, 0), False

    def table(count, lut, ranges):
        count = count[:hl]                                               # (HL, R)
        if ranges is not None:
            return (count, dummy, dummy, 1, ranges.rows, ranges.ends), True
        index, mask = lut.on(device, first_head=one)                     # (HL, R, W)
        return (count, index, mask, index.shape[-1], dummy, dummy), False

    q_slots, q_map = slots(part.q_pos, part.facts.q_same, part.q_map)
    k_slots, k_map = slots(part.k_pos, part.facts.k_same, part.k_map)
    kv_r, qt_r = part.ranges(first_head=one) if variant.ranges else (None, None)
    kv, kv_range = table(part.kv_count, part.kv_lut, kv_r)
    qt, qt_range = table(part.q_count, part.q_lut, qt_r)
    tm = part.token_masks.to(torch.int8).contiguous()                    # (NM, B, B)
    if tm.shape[0] == 0:
        tm = torch.zeros(1, part.block_size, part.block_size, dtype=torch.int8, device=device)
    return PartArgs(hl, q_slots, k_slots, kv, qt, tm, dict(Q_MAP=q_map, K_MAP=k_map),
                    kv_range, qt_range)


def _strides(*tensors) -> tuple:
    return tuple(s for t in tensors for s in t.stride()[:3])


# ----------------------------------------------------------------------------
# Where each launch writes
# ----------------------------------------------------------------------------

class _Order(NamedTuple):
    parts: list
    fill: bool     # start from the empty-row state (the first part does not write every row)
    cast: bool     # the last part does not write every row: cast the float32 buffer at the end


def _order(parts: list, covers, fused: bool) -> _Order:
    """The launch order of the parts for one output (module docstring); ``covers(part)``:
    whether the part writes every row of that output."""
    if not fused:
        return _Order(parts, True, True)
    cov = [p for p in parts if covers(p)]
    rest = [p for p in parts if not covers(p)]
    if len(cov) >= 2:
        return _Order([cov[0]] + rest + cov[1:], False, False)
    if cov:
        return _Order(rest + cov, bool(rest), False)
    return _Order(rest, True, len(rest) > 1)


class _Writes:
    """The buffers of ``count`` outputs of ``shape`` written by the launches of an
    ``_Order``: ``final`` in ``dtype`` and a float32 ``scratch`` (one buffer when
    ``dtype`` is float32 or when only one launch writes). ``step(i)`` gives launch i its
    (destinations, sources, whether it loads the sources); ``result()`` the outputs."""

    def __init__(self, order: _Order, count: int, shape, dtype, device):
        self.order = order
        last_writes_final = not order.cast
        alone = len(order.parts) <= 1 and last_writes_final
        make = torch.zeros if order.fill else torch.empty
        if dtype == torch.float32 or alone:
            self.scratch = [make(shape, dtype=dtype, device=device) for _ in range(count)]
            self.final = self.scratch
        else:
            self.scratch = [make(shape, dtype=torch.float32, device=device)
                            for _ in range(count)]
            self.final = ([torch.empty(shape, dtype=dtype, device=device) for _ in range(count)]
                          if last_writes_final else None)
        self.dtype = dtype

    def step(self, i: int):
        last = i == len(self.order.parts) - 1
        dst = self.final if (last and self.final is not None) else self.scratch
        return dst, self.scratch, i > 0

    def result(self) -> list[torch.Tensor]:
        if self.final is not None:
            return self.final
        return [t.to(self.dtype) for t in self.scratch]


# ----------------------------------------------------------------------------
# Forward and backward
# ----------------------------------------------------------------------------

def forward(q, k, v, parts: list, scale: float, variant: Variant):
    """(out in q's dtype (B, H, n, d), row statistics m, l float32 (B, H, n)).

    Trusts its inputs: q, k, v contiguous on the parts' device, parts that fit q,
    ``scale`` as ``fold_scale`` leaves it."""
    B, H, n, d = q.shape
    meta = _meta(q)
    c, _ = _exponent(scale)
    live = [p for p in parts if p.facts.tiles > 0]
    order = _order(live, lambda p: p.facts.q_real == n, variant.fused)
    writes = _Writes(order, 1, (B, H, n, d), q.dtype, q.device)
    if order.fill or not live:
        m = torch.full((B, H, n), float("-inf"), dtype=torch.float32, device=q.device)
        l = torch.zeros(B, H, n, dtype=torch.float32, device=q.device)
    else:
        m = torch.empty(B, H, n, dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
    for i, part in enumerate(order.parts):
        (out,), (prev,), load = writes.step(i)
        a = part_args(part, variant)
        _launch(K._fwd_kernel, a.kv[0].shape[1], B, H, (
            q, k, v, out, prev, m, l, *_strides(q, k, v, out),
            *a.q_slots, *a.k_slots, *a.kv, a.token_masks,
            n, H, a.hl, H // k.shape[1], a.kv[0].shape[1], d, c,
        ), part, variant.settings(part.name, q.dtype, meta["BLOCK_D"]), meta, q,
            LOAD_PREV=load, RANGE=a.kv_range, NEGATE=scale < 0, **a.flags)
    out, = writes.result()
    return out, m, l


def backward(q, k, v, out, m, l, grad_out, parts: list, scale: float, variant: Variant):
    """(dq, dk, dv) in the inputs' dtype from the merged output and statistics
    (FlashAttention-2 backward). Trusts its inputs, as ``forward``."""
    B, H, n, d = q.shape
    if k.stride() != v.stride():
        raise ValueError(f"k and v must share strides, got {k.stride()} and {v.stride()}")
    meta = _meta(q)
    c, g = _exponent(scale)
    do = grad_out.to(q.dtype).contiguous()
    shape = (B, H, n, d)
    live = [p for p in parts if p.facts.tiles > 0]
    q_order = _order(live, lambda p: p.facts.q_real == n, variant.fused)
    k_order = _order(live, lambda p: p.facts.k_real == n, variant.fused)

    def dq_launch(part, dst, prev, load, delta, **flags):
        a = part_args(part, variant)
        _launch(K._dq_kernel, a.kv[0].shape[1], B, H, (
            q, k, v, out, do, m, l, delta, dst, prev, *_strides(q, k, do, dst),
            *a.q_slots, *a.k_slots, *a.kv, a.token_masks,
            n, H, a.hl, H // k.shape[1], a.kv[0].shape[1], d, c, g,
        ), part, variant.settings(part.name, q.dtype, meta["BLOCK_D"]), meta, q,
            LOAD_PREV=load, RANGE=a.kv_range, NEGATE=scale < 0, **a.flags, **flags)

    first_delta = False
    if abs(scale) > EXACT_DELTA_ABOVE:      # delta = rowsum(P dP) over the same tiles
        sums = _Writes(q_order, 1, (B, H, n), torch.float32, q.device)
        for i, part in enumerate(q_order.parts):
            (dst,), _, load = sums.step(i)
            dq_launch(part, dst, dst, load, dst, COMPUTE_DELTA=False, DELTA_PASS=True)
        delta, = sums.result()
    elif variant.fused and q_order.parts and not q_order.fill:
        delta = torch.empty(B, H, n, dtype=torch.float32, device=q.device)
        first_delta = True                  # written by the first dQ launch
    else:
        delta = (do.float() * out.float()).sum(-1).contiguous()             # (B, H, n)

    dqw = _Writes(q_order, 1, shape, q.dtype, q.device)
    for i, part in enumerate(q_order.parts):
        (dst,), (prev,), load = dqw.step(i)
        dq_launch(part, dst, prev, load, delta, DELTA_PASS=False,
                  COMPUTE_DELTA=first_delta and i == 0)
    share = H // k.shape[1]          # grouped key/value heads: dk, dv per query head, summed
    dkw = _Writes(k_order, 2, shape, k.dtype if share == 1 else torch.float32, q.device)
    for i, part in enumerate(k_order.parts):
        (dk, dv), (pk, pv), load = dkw.step(i)
        a = part_args(part, variant)
        _launch(K._dkdv_kernel, a.qt[0].shape[1], B, H, (
            q, k, v, do, m, l, delta, dk, dv, pk, pv, *_strides(q, k, do, dk),
            *a.q_slots, *a.k_slots, *a.qt, a.token_masks,
            n, H, a.hl, H // k.shape[1], a.qt[0].shape[1], d, c, g,
        ), part, variant.settings(part.name, q.dtype, meta["BLOCK_D"]), meta, q,
            LOAD_PREV=load, RANGE=a.qt_range, NEGATE=scale < 0, **a.flags)
    dq, = dqw.result()
    dk, dv = dkw.result()
    if share > 1:   # the query heads of key/value head j are j share .. j share + share - 1
        dk, dv = (t.unflatten(1, (-1, share)).sum(2).to(k.dtype) for t in (dk, dv))
    return dq, dk, dv


class BlockSparseAttention(torch.autograd.Function):
    """out = softmax(scale q k^T restricted to the layout) v, with a Triton backward."""

    @staticmethod
    def forward(ctx, q, k, v, parts, scale, variant):
        out, m, l = forward(q, k, v, parts, scale, variant)
        ctx.save_for_backward(q, k, v, out, m, l)  # delta = rowsum(dO * O) as in FlashAttention-2
        ctx.parts, ctx.scale, ctx.variant = parts, scale, variant
        return out

    @staticmethod
    @once_differentiable("the Triton backend of sparse_attention")
    def backward(ctx, grad_out):
        q, k, v, out, m, l = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, m, l, grad_out, ctx.parts, ctx.scale, ctx.variant)
        return dq, dk, dv, None, None, None
