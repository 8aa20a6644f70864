"""Kernel variants: the speed levers of docs/gpu.md as settings chosen per call.

Child et al., 2019, section 5.5 (block-sparse kernels). Every variant computes the
same attention, exactly (the tests run each against the float64 reference); they
differ in how the work is laid out on a GPU:

* ``fused``      -- the output is written once, in q's dtype, by the last part,
                    which merges the parts before it through their (max, sum) row
                    statistics in its epilogue; the first part writes its rows
                    without a zero-filled buffer, the parts between merge in a float32
                    scratch buffer; dq, dk, dv the same way, and delta = rowsum(dO O)
                    computed by the first dQ kernel instead of a separate pass;
* ``index_math`` -- a part whose slot order is a formula (natural, the strided
                    transposition, the fixed summary gather: ``fast.layout.slots``)
                    has its rows' positions computed in the kernel, not loaded;
* ``ranges``     -- a look-up table whose rows are ranges is walked as ranges
                    (column = start + t, masks listed only at a row's ends:
                    ``fast.layout.lut.Ranges``), so the fixed pattern's tables at
                    n = 2**20 are megabytes;
* ``launch``     -- per part kind, dtype and head dim: the tile size (the part is
                    built at it), warps, pipeline stages and ``group``, the query
                    (or key) blocks one program walks one after another.

``VARIANTS`` names the ones a benchmark sweep times side by side, each with its
prediction (what it should save, and why); ``baseline`` is the kernel as first
measured (docs/gpu.md), the reference of every ratio. ``DEFAULT`` is ``fused``: the
first GPU run of every variant (docs/gpu.md, "Kernel variants"; the numbers in
figures/data/gpu_variants_h200.json) passed every test with it and found it the
fastest at every entry it measured at the target point; the others stay selectable.
``fast.kernels.triton_attention.triton_sparse_attention(..., variant=name)`` and
``fast.sparse_attention(..., backend="triton", variant=name)`` run one; a sweep
builds its own with ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

WARPS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Launch:
    """Launch settings for the parts a rule matches (``part``, ``dtype``, ``d``: None
    matches any). Unset settings take the defaults: the call's block size, 4 warps
    (8 when the padded head dim passes 64), 2 stages, one block per program."""
    part: str | None = None          # part kind: "local", "column", "block", "summary", ...
    dtype: torch.dtype | None = None
    d: int | None = None             # head dim padded to a power of two (16 .. 128)
    block: int | None = None         # tile size: a power of two >= 16
    warps: int | None = None
    stages: int | None = None
    group: int = 1                   # query (dK/dV: key) blocks per program

    def __post_init__(self):
        for name in ("block", "warps", "stages", "d"):
            x = getattr(self, name)
            if x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < 1):
                raise ValueError(f"Launch.{name} must be a positive int or None, got {x!r}")
        if self.block is not None and (self.block < 16 or self.block & (self.block - 1)):
            raise ValueError(f"Launch.block must be a power of two >= 16, got {self.block}")
        if self.warps is not None and self.warps not in WARPS:
            raise ValueError(f"Launch.warps must be one of {WARPS}, got {self.warps}")
        if not isinstance(self.group, int) or isinstance(self.group, bool) or self.group < 1:
            raise ValueError(f"Launch.group must be an int >= 1, got {self.group!r}")

    def matches(self, part: str, dtype: torch.dtype, d: int) -> bool:
        return ((self.part is None or self.part == part)
                and (self.dtype is None or self.dtype == dtype)
                and (self.d is None or self.d == d))


@dataclass(frozen=True)
class Variant:
    """One way to run the kernels; see the module docstring for each lever."""
    name: str
    fused: bool = False
    index_math: bool = False
    ranges: bool = False
    launch: tuple[Launch, ...] = ()  # first matching rule wins
    prediction: str = field(default="", compare=False)

    def __post_init__(self):
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"Variant.{f.name} must be a bool, got "
                                f"{getattr(self, f.name)!r}")
        if not isinstance(self.launch, tuple) or not all(isinstance(r, Launch)
                                                          for r in self.launch):
            raise TypeError(f"Variant.launch must be a tuple of Launch, got {self.launch!r}")

    def settings(self, part: str, dtype: torch.dtype, d: int) -> Launch:
        """The launch settings of a part kind at this dtype and padded head dim."""
        return next((r for r in self.launch if r.matches(part, dtype, d)), Launch())


# Part kinds whose query blocks read few tiles each (2-3 for the strided local part,
# 1-4 for the fixed block part): their programs are short, fixed costs weigh.
FEW_TILES = ("local", "block", "window")
# Part kinds whose rows read many tiles (dense-like): larger tiles and deeper pipelines.
MANY_TILES = ("column", "summary", "full", "natural")

GROUPED = tuple(Launch(part=p, group=4) for p in FEW_TILES)
TUNED = (tuple(Launch(part=p, dtype=dt, block=128, warps=8, stages=3)
               for p in ("summary", "full", "natural") for dt in (torch.float16, torch.bfloat16))
         + tuple(Launch(part=p, stages=3) for p in ("column",)))

VARIANTS = {v.name: v for v in (
    Variant("baseline", prediction=(
        "The kernel as first measured on a GPU (docs/gpu.md): a zero-filled float32 output "
        "that every part merges into, then a cast pass; the gradients the same, and delta "
        "in a separate pass. The reference point of every other variant.")),
    Variant("fused", fused=True, prediction=(
        "Saves the zero-fill, the cast and a float32 round trip of the output (by arithmetic "
        "about a third of a strided call at (4, 16, 16384), float16), and the same for dq, "
        "dk, dv and the delta pass: strided forward toward 6-7x dense there; the float32 "
        "out, dq, dk, dv no longer held at once, so a forward+backward at n = 2**20 needs "
        "about 8 GiB less. The largest expected gain.")),
    Variant("grouped", fused=True, launch=GROUPED, prediction=(
        "On top of fused: four query (key) blocks per program in the parts whose rows read "
        "few tiles, so a program's fixed costs (start, table row reads, head decode) are "
        "paid once per four. Matters where those parts' grid is many short programs, most "
        "at (1, 4, 16384); loses where it leaves fewer programs than the GPU has SMs.")),
    Variant("tuned", fused=True, launch=TUNED, prediction=(
        "On top of fused: the dense-like parts (fixed summary, full, natural order) as "
        "128 x 128 tiles, 8 warps, 3 stages in float16 / bfloat16, the strided column part "
        "with 3 stages: 1.2-1.5x on those parts, which set the fixed pattern's time (fixed "
        "toward 3x dense at (4, 16, 16384)). A starting point: the sweep fills the table.")),
    Variant("index", fused=True, index_math=True, prediction=(
        "On top of fused: slot positions computed, not loaded (the strided transposition, "
        "the fixed summary gather, natural order): no load waits before each row load and "
        "the compiler sees contiguous rows; 10-20% on the column and summary parts.")),
    Variant("ranges", fused=True, ranges=True, prediction=(
        "On top of fused: key block = start + t, masks read only at a row's ends, so no "
        "table load sits before each tile's loads; the fixed pattern's tables at n = 2**20 "
        "in megabytes instead of 4 GiB (needed for n = 2**21 on an 80 GB GPU).")),
    Variant("all", fused=True, index_math=True, ranges=True, launch=GROUPED + TUNED,
            prediction=("Every lever at once: the product of their gains if they are "
                        "independent.")),
)}
DEFAULT = "fused"    # the measured winner (module docstring)


def resolve(variant) -> Variant:
    """A ``Variant`` from its name in ``VARIANTS``, a ``Variant`` itself, or None (the
    default)."""
    if variant is None:
        return VARIANTS[DEFAULT]
    if isinstance(variant, Variant):
        return variant
    if isinstance(variant, str):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {tuple(VARIANTS)} or a Variant, "
                             f"got {variant!r}")
        return VARIANTS[variant]
    raise TypeError(f"variant must be a name in {tuple(VARIANTS)}, a Variant or None, "
                    f"got {type(variant).__name__}")
