"""Launching the block-sparse kernels: a layout's launches decided once, forward, backward.

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

What a layout's launches are at one scale -- the parts' order for each output, where
each launch writes (``_Writes``: zero-filled or not, a float32 scratch or not), each
launch's grid, tables, settings, flags and scale numbers (``_Launch``) -- is the same on
every call, so it is decided once (``Launches``; ``fast.kernels.triton_attention.launches``
keeps them per layout and scale); ``forward`` and ``backward`` then allocate what the
kernels write (the row statistics m and l as one tensor (B, H, 2, n), whose empty-row state
is all zeros: a row with l = 0 has no maximum), each output laid out as the tensor it
belongs to (``empty_like``: a model's transposed
views are read and written in place, the kernels take any batch, head and row
strides), and launch. Nothing here reads a value back from the device: what the
launchers branch on is in each part's ``facts`` (host ints), and nothing is made on
the CPU per call, so a forward and backward can be captured in a CUDA graph.

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
from fast.kernels import triton_kernels
from fast.kernels.variants import Launch, Variant

FLOAT32_MAX = torch.finfo(torch.float32).max
FLOAT32_TINY = torch.finfo(torch.float32).tiny      # smallest normal float32
EXACT_DELTA_ABOVE = 1.0   # scale above which delta is summed over the tiles (DELTA_PASS)


def interpreted() -> bool:
    """True when the kernels were built for the NumPy interpreter (TRITON_INTERPRET=1
    was set before Triton was imported)."""
    return type(triton_kernels._fwd_kernel).__name__ == "InterpretedFunction"


# ----------------------------------------------------------------------------
# Scale
# ----------------------------------------------------------------------------

def fold_scale(q: torch.Tensor, scale: float) -> tuple[torch.Tensor, float]:
    """(q, scale) as the kernels take them: |scale| log2(e) a normal float32. A scale of 0,
    or so small that |scale| log2(e) is below float32's smallest normal, is folded into q
    (q * scale, differentiable, and scale 1): the same scores, and q's gradient gets its
    factor through autograd. A negative scale stays (the kernels negate the scores)."""
    if folds(scale):
        return q * scale, 1.0                                              # (B, H, n, d)
    return q, scale


def folds(scale: float) -> bool:
    """Whether ``fold_scale`` folds ``scale`` into q."""
    return abs(scale) * triton_kernels.LOG2E < FLOAT32_TINY


def _exponent(scale: float) -> tuple[float, float]:
    """(c, scale) passed to the kernels: c = |scale| log2(e) and the scale, each at most
    float32's largest value in magnitude."""
    return (min(abs(scale) * triton_kernels.LOG2E, FLOAT32_MAX),
            math.copysign(min(abs(scale), FLOAT32_MAX), scale))


def lse_of(stats: torch.Tensor, scale: float) -> torch.Tensor:
    """The natural log-sum-exp of each row's scaled scores from its statistics (m, l)
    (``stats`` (B, H, 2, n)): (m c + log2 l) ln 2, computed in float64 (m c may pass
    float32's range), -inf for rows that read nothing; float32 (B, H, n)."""
    c, _ = _exponent(scale)
    m, l = stats.unbind(2)                                               # (B, H, n) each
    lse = (m.double() * c + torch.log2(l.double())) * math.log(2.0)
    return torch.where(l == 0, float("-inf"), lse).float()


# ----------------------------------------------------------------------------
# Launch settings and arguments
# ----------------------------------------------------------------------------

def padded_d(d: int) -> int:
    """The head dim a kernel computes with: d padded to a power of two >= 16 (BLOCK_D)."""
    return max(16, triton.next_power_of_2(d))


def _meta(dtype: torch.dtype, device: torch.device, d: int) -> dict:
    if dtype != torch.float32:
        precision = "tf32"        # ignored for float16 / bfloat16 operands
    elif device.type == "cpu":
        precision = "ieee"        # the interpreter: plain float32 NumPy matmuls
    else:
        # float32 on a GPU: never plain TF32 (it would weaken the fp32 ground truth);
        # "tf32x3" (three TF32 products) keeps float32 accuracy on tensor cores, where
        # "ieee" compiles to an FMA loop that spills (Triton 3.9, sm_80 / sm_90).
        precision = "tf32x3"
    return dict(BLOCK_D=padded_d(d), PRECISION=precision)


_STAGES: dict = {}  # (kernel, BLOCK, BLOCK_D, dtype, device, warps, stages) -> stages that fit


class _Launch:
    """One kernel over one part, everything but the call's tensors fixed: the grid's
    first dimension (ceil(rows / group) programs; the second is B H), the part's tables,
    the sizes and the scale's numbers, the flags (``LOAD_PREV``, ``NEGATE``, ...), and
    the variant's warps (default 4, 8 for a padded head dim above 64), stages (default
    2) and group. Where the GPU's shared memory is too small for those stages, the
    launch is retried once with 1, which is remembered. The interpreter ignores warps
    and stages."""

    __slots__ = ("kernel", "blocks", "tables", "hl", "rows", "n", "d", "numbers", "options",
                 "_stages_key")

    def __init__(self, kernel, part, rows: int, tables: tuple, hl: int, flags: dict,
                 settings: Launch, meta: dict, dtype: torch.dtype, device: torch.device,
                 n: int, d: int, numbers: tuple):
        group = settings.group
        warps = settings.warps or (4 if meta["BLOCK_D"] <= 64 else 8)
        asked = settings.stages or 2
        self._stages_key = (id(kernel), part.block_size, meta["BLOCK_D"], dtype, str(device),
                            warps, asked)
        self.kernel, self.blocks, self.tables = kernel, triton.cdiv(rows, group), tables
        self.hl, self.rows, self.n, self.d, self.numbers = hl, rows, n, d, numbers
        self.options = dict(BLOCK=part.block_size, GROUP=group, num_warps=warps,
                            num_stages=_STAGES.get(self._stages_key, asked), **meta, **flags)

    def __call__(self, B: int, H: int, share: int, head: tuple):
        """Launch on the call's tensors and strides (``head``), then the part's tables, the
        sizes (n, H, layout heads, query heads per key/value head, rows, d) and the
        scale's numbers."""
        args = (*head, *self.tables, self.n, H, self.hl, share, self.rows, self.d,
                *self.numbers)
        grid = (self.blocks, B * H)
        while True:
            try:
                self.kernel[grid](*args, **self.options)
            except triton.runtime.errors.OutOfResources:
                if self.options["num_stages"] == 1:
                    raise
                self.options["num_stages"] = _STAGES[self._stages_key] = 1
                continue
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
    """How the launches of an ``_Order`` write ``count`` outputs in ``dtype``, decided
    once: a ``final`` buffer in ``dtype`` and a float32 ``scratch`` (one buffer when
    ``dtype`` is float32 or when only one launch writes); zero-filled or not.
    ``buffers(like)`` makes them for one call, laid out as ``like`` (``empty_like``: a
    transposed view's outputs are written in its layout, so the caller needs no copy);
    ``step(i, buffers)`` gives launch i its (destinations, sources) (it loads the sources
    when i > 0: its ``LOAD_PREV``); ``result(buffers)`` the outputs."""

    def __init__(self, order: _Order, count: int, dtype: torch.dtype):
        self.count, self.dtype, self.fill = count, dtype, order.fill
        self.last = len(order.parts) - 1
        self.final_written = not order.cast                 # the last launch writes final
        self.one = dtype == torch.float32 or (len(order.parts) <= 1 and self.final_written)

    def buffers(self, like: torch.Tensor) -> tuple[list, list]:
        make = torch.zeros_like if self.fill else torch.empty_like
        if self.one:
            scratch = [make(like, dtype=self.dtype) for _ in range(self.count)]
            return scratch, scratch
        scratch = [make(like, dtype=torch.float32) for _ in range(self.count)]
        final = ([torch.empty_like(like, dtype=self.dtype) for _ in range(self.count)]
                 if self.final_written else None)
        return final, scratch

    def step(self, i: int, buffers: tuple[list, list]):
        final, scratch = buffers
        dst = final if (i == self.last and final is not None) else scratch
        return dst, scratch

    def result(self, buffers: tuple[list, list]) -> list[torch.Tensor]:
        final, scratch = buffers
        if final is not None:
            return final
        return [t.to(self.dtype) for t in scratch]


# ----------------------------------------------------------------------------
# The launches of a layout, decided once
# ----------------------------------------------------------------------------

class Launches:
    """Every launch of a forward and a backward over ``parts`` for ``variant``, q's dtype,
    head dim d and n on ``device``, at ``scale`` (as ``fold_scale`` leaves it), decided
    once (a layout's launches are the same on every call): the parts' order for each
    output, where each launch writes (``_Writes``), each launch's settings, tables, sizes,
    scale numbers and flags (``_Launch``). ``forward`` and ``backward`` then only allocate
    what the kernels write and launch."""

    def __init__(self, parts: list, variant: Variant, dtype: torch.dtype, d: int,
                 device: torch.device, n: int, scale: float):
        meta = _meta(dtype, device, d)
        c, g = _exponent(scale)
        negate = scale < 0
        live = [p for p in parts if p.facts.tiles > 0]
        self.live = bool(live)
        fwd = _order(live, lambda p: p.facts.q_real == n, variant.fused)
        q_order = _order(live, lambda p: p.facts.q_real == n, variant.fused)
        k_order = _order(live, lambda p: p.facts.k_real == n, variant.fused)

        def launch(kernel, part, table: str, numbers: tuple, **flags):
            a = part_args(part, variant)
            rows = getattr(a, table)[0].shape[1]
            tables = (*a.q_slots, *a.k_slots, *getattr(a, table), a.token_masks)
            rng = a.kv_range if table == "kv" else a.qt_range
            return _Launch(kernel, part, rows, tables, a.hl,
                           dict(**a.flags, RANGE=rng, NEGATE=negate, **flags),
                           variant.settings(part.name, dtype, meta["BLOCK_D"]), meta, dtype,
                           device, n, d, numbers)

        self.fwd = [launch(triton_kernels._fwd_kernel, p, "kv", (c,), LOAD_PREV=i > 0)
                    for i, p in enumerate(fwd.parts)]
        self.fwd_writes = _Writes(fwd, 1, dtype)
        self.fwd_fill = fwd.fill or not live        # the row statistics start empty
        # |scale| > 1: delta = rowsum(P dP) summed over the same tiles first (DELTA_PASS)
        self.delta_pass = [launch(triton_kernels._dq_kernel, p, "kv", (c, g), LOAD_PREV=i > 0,
                                  COMPUTE_DELTA=False, DELTA_PASS=True)
                           for i, p in enumerate(q_order.parts)] \
            if abs(scale) > EXACT_DELTA_ABOVE else None
        self.delta_fill = q_order.fill          # the delta pass starts from zero sums
        # fused: the first dQ launch writes every row, so it forms delta itself
        self.first_delta = (variant.fused and bool(q_order.parts) and not q_order.fill
                            and self.delta_pass is None)
        self.dq = [launch(triton_kernels._dq_kernel, p, "kv", (c, g), LOAD_PREV=i > 0,
                          COMPUTE_DELTA=self.first_delta and i == 0, DELTA_PASS=False)
                   for i, p in enumerate(q_order.parts)]
        self.dq_writes = _Writes(q_order, 1, dtype)
        self.dkdv = [launch(triton_kernels._dkdv_kernel, p, "qt", (c, g), LOAD_PREV=i > 0)
                     for i, p in enumerate(k_order.parts)]
        self.dkdv_writes = _Writes(k_order, 2, dtype)          # dk, dv in k's dtype
        self.dkdv_sums = _Writes(k_order, 2, torch.float32)    # per query head, summed after


def _strides(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple:
    """The batch, head and row strides of three (B, H, n, d) tensors."""
    return (*a.stride()[:3], *b.stride()[:3], *c.stride()[:3])


# ----------------------------------------------------------------------------
# Forward and backward
# ----------------------------------------------------------------------------

def forward(q, k, v, launches: Launches):
    """(out in q's dtype and layout (B, H, n, d), the row statistics float32 (B, H, 2, n):
    each head's m, then its l).

    Trusts its inputs: q, k, v on the parts' device, each with contiguous rows (the last
    stride 1; any other strides), ``launches`` made for q's n, dtype and d and the
    call's scale."""
    B, H, n, _ = q.shape
    share = H // k.shape[1]
    writes = launches.fwd_writes
    buffers = writes.buffers(q)
    # the empty-row state is all zeros (l = 0: the kernels then read no m)
    stats = (torch.zeros if launches.fwd_fill else torch.empty)(
        (B, H, 2, n), dtype=torch.float32, device=q.device)
    strides_qkv = _strides(q, k, v)
    for i, launch in enumerate(launches.fwd):
        (out,), (prev,) = writes.step(i, buffers)
        launch(B, H, share, (q, k, v, out, prev, stats, *strides_qkv, *out.stride()[:3]))
    out, = writes.result(buffers)
    return out, stats


def backward(q, k, v, out, stats, grad_out, launches: Launches):
    """(dq, dk, dv) in the inputs' dtype and layout from the merged output and statistics
    (FlashAttention-2 backward). Trusts its inputs, as ``forward``; k and v share strides
    (the kernels read both with k's)."""
    B, H, n, _ = q.shape
    if k.stride() != v.stride():
        raise ValueError(f"k and v must share strides, got {k.stride()} and {v.stride()}")
    share = H // k.shape[1]
    # dO is read with O's strides: a gradient of another layout (an expanded one, from a
    # sum) is copied into O's
    do = grad_out if (grad_out.dtype == out.dtype and grad_out.stride() == out.stride()) \
        else torch.empty_like(out).copy_(grad_out)
    head = _strides(q, k, do)
    if launches.delta_pass is not None:     # delta = rowsum(P dP) over the same tiles
        delta = (torch.zeros if launches.delta_fill else torch.empty)(
            (B, H, n), dtype=torch.float32, device=q.device)
        for launch in launches.delta_pass:
            launch(B, H, share, (q, k, v, out, do, stats, delta, delta, delta, *head,
                                 *delta.stride()[:3]))
    elif launches.first_delta:              # written by the first dQ launch
        delta = torch.empty((B, H, n), dtype=torch.float32, device=q.device)
    else:
        delta = (do.float() * out.float()).sum(-1).contiguous()             # (B, H, n)

    writes = launches.dq_writes
    bufs = writes.buffers(q)
    for i, launch in enumerate(launches.dq):
        (dst,), (prev,) = writes.step(i, bufs)
        launch(B, H, share, (q, k, v, out, do, stats, delta, dst, prev, *head,
                             *dst.stride()[:3]))
    # grouped key/value heads: dk, dv per query head in float32, summed after
    kw = launches.dkdv_writes if share == 1 else launches.dkdv_sums
    kbufs = kw.buffers(k if share == 1 else q)
    for i, launch in enumerate(launches.dkdv):
        (dk, dv), (pk, pv) = kw.step(i, kbufs)
        launch(B, H, share, (q, k, v, do, stats, delta, dk, dv, pk, pv, *head,
                             *dk.stride()[:3]))
    dq, = writes.result(bufs)
    dk, dv = kw.result(kbufs)
    if share > 1:   # the query heads of key/value head j are j share .. j share + share - 1
        dk, dv = (torch.empty_like(k).copy_(t.unflatten(1, (-1, share)).sum(2))
                  for t in (dk, dv))
    return dq, dk, dv


def rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy of it when its rows are not contiguous (the kernels read each row of d
    values with stride 1)."""
    return t if t.stride(-1) == 1 else t.contiguous()


class BlockSparseAttention(torch.autograd.Function):
    """out = softmax(scale q k^T restricted to the layout) v, with a Triton backward, on
    parts the caller built (``fast.kernels.triton_attention.attention_with_parts``; the
    layouts of ``sparse_attention`` run as the operator, ``triton_attention``)."""

    @staticmethod
    def forward(ctx, q, k, v, parts, scale, variant):
        q, k, v = (rows_contiguous(t) for t in (q, k, v))
        if k.stride() != v.stride():
            k, v = k.contiguous(), v.contiguous()
        launches = Launches(parts, variant, q.dtype, q.shape[-1], q.device, q.shape[2], scale)
        out, stats = forward(q, k, v, launches)
        ctx.save_for_backward(q, k, v, out, stats)  # delta = rowsum(dO * O), FlashAttention-2
        ctx.launches = launches
        return out

    @staticmethod
    @once_differentiable("the Triton backend of sparse_attention")
    def backward(ctx, grad_out):
        q, k, v, out, stats = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, stats, grad_out, ctx.launches)
        return dq, dk, dv, None, None, None
