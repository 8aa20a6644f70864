"""What one benchmark run measures: the ``Sweep``, its points, what it skips and costs.

Child et al., 2019, section 5.5 and Table 2 (sparse patterns pay only for what
they compute), and the long sequences of the paper's title. A ``Sweep`` says
what one ``python -m fast bench`` run measures: the device, the timing method
(``fast.measure.timing``: a fresh process per point and the minimum, or one
process and the median), the dtypes, the (B, H) shapes, the n, the contenders
(``fast.measure.contenders``) and the limits; it is checked when made (ValueError
saying what was given and what is allowed). ``Sweep.defaults(device,
same_process, variants)`` gives the runs the command makes:

* the CPU (``make bench``): float32, (B, H) = (1, 4), d = 64, n = 1024 .. 65536,
  dense, naive, FlexAttention and the structured path, a fresh process per point
  (``FRESH``), so that each peak memory is that point's alone; dense only up to
  n = 16384, naive up to 4096 and while its mask fits in 3 GiB, FlexAttention at
  n = 16384 only (it compiles per n): the peers at the targets' point, and no point
  that costs more than it tells -- dense at 32768 and naive at 8192 took 90 s of
  ``make figures``' budget to extend lines whose slope (2) the smaller n already show;
  ``--dense-n-max``, ``--naive-n-max`` and ``--flex-n`` give them back. At n = 16384
  dense and the structured path are measured again in ONE long-lived process
  (``LONG_LIVED``), the process a training loop is: the speed-ups and backward /
  forward ratios of both are reported (docs/design.md, sec. 7, says why they differ);
* the same in one process (``--same-process``): every point with ``SAME``;
* CUDA (``make gpu-bench``): float16 and bfloat16, (B, H) = (1, 4) and (4, 16),
  dense, FlexAttention, the structured path and the Triton kernels, with
  ``SAME`` (CUDA events) and each contender capped at ``CAP_S`` seconds a point
  (``Method.cap_s``: a contender that passes it is not run at the larger n of its
  shape), and one more point, (B, H, n) = (1, 16, 65536), for the long-n target
  (``--points`` replaces it); the run starts no new point after 9 minutes. The long sweep
  (``long_ns``, ``make gpu-long``): B = 1, H = 8, l = 256, n = 2^17 .. 2^20, the
  layout build, the first call and the peak memory against the bytes of q, k, v, o;
* the variant sweep (``--variants``, ``make gpu-variants``): every kernel variant
  of ``fast.kernels.variants.VARIANTS`` (``variants``) side by side in one
  process, against dense causal SDPA and FlexAttention measured in the same run,
  at the GPU targets' points: float16, (B, H, n) = (4, 16, 16384) first, then
  (1, 4, 16384) and (1, 16, 65536) (``VARIANT_POINTS``; ``--points`` or ``--shapes``,
  ``--n-min``, ``--n-max`` replace the last two), strided and fixed at each; at most
  ``VARIANT_METHOD.max_reps`` repetitions a measurement, each contender capped at
  ``CAP_S`` seconds a point, and no new point after 7 minutes, so that it should end
  within 8 on an H100. The Triton
  contenders are measured once per variant (``variants_of``), FlexAttention and
  dense once. With ``--same-process`` on the CPU it is a check of the method, at
  (1, 4, 128) by default (the kernels interpreted, float32).

``points`` lists what is measured, ``skip_reason`` why a contender is not at a
point, ``estimate`` what the run costs (printed before it starts) and ``config``
how the record names the sweep. ``fast.experiments.bench`` runs it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import torch

from fast.kernels.variants import DEFAULT, VARIANTS, Variant
from fast.layout.costs import DEFAULT_BLOCK
from fast.measure import contenders
from fast.measure.contenders import DTYPES, LONG_PARAMS, PATTERN_PARAMS, D
from fast.measure.timing import FRESH, SAME, Method, estimate_s

TARGET_POINT = (1, 16, 65536)     # CUDA: one more point, for the long-n target
# the variant sweep on CUDA: the targets' points, the one that costs most last
VARIANT_POINTS = ((4, 16, 16384), (1, 4, 16384), (1, 16, 65536))
VARIANT_CONTENDERS = ("dense", "triton block-sparse", "flex")
CAP_S = 60.0                      # CUDA: seconds one contender may spend at one point
GPU_METHOD = SAME.with_(cap_s=CAP_S)
VARIANT_METHOD = GPU_METHOD.with_(max_reps=100)
VARIANT_MINUTES = 7.0
LONG_SHAPE = (1, 8)               # (B, H) of the long sweep
ASSUME_TFLOPS = {"cpu": 0.05, "cuda": 300.0}   # dense throughput the estimate assumes
COPY_MIB = {"cpu": 64, "cuda": 1024}           # MiB copied to measure the bandwidth
LONG_LIVED = SAME.with_(min_reps=3)            # the CPU sweep's one-process check


def powers(lo: int, hi: int) -> tuple[int, ...]:
    """The powers of 2 from lo to hi, both ends included; lo and hi must be powers of 2
    with lo <= hi (an end rounded to one would measure n outside the range asked for)."""
    for name, end in (("lo", lo), ("hi", hi)):
        if not (isinstance(end, int) and end >= 1 and end & (end - 1) == 0):
            raise ValueError(f"powers: {name}={end!r}; allowed: a power of 2 (1, 2, 4, ...)")
    if lo > hi:
        raise ValueError(f"powers: lo={lo} > hi={hi}; allowed: lo <= hi")
    return tuple(2 ** e for e in range(lo.bit_length() - 1, hi.bit_length()))


@dataclass(frozen=True)
class Sweep:
    """What one benchmark run measures (module docstring); checked when made."""
    device: str = "cpu"                               # "cpu" or "cuda"
    method: Method = FRESH                            # how each point is timed
    dtypes: tuple[str, ...] = ("float32",)            # names of contenders.DTYPES
    shapes: tuple[tuple[int, int], ...] = ((1, 4),)   # (B, H) of the sweep
    ns: tuple[int, ...] = powers(1024, 65536)         # sequence lengths
    contenders: tuple[str, ...] = contenders.default_names("cpu")
    dense_n_max: int | None = 16384                   # None: no limit
    naive_n_max: int | None = 4096
    mask_gb: float = 3.0                              # the naive mask's largest size
    flex_ns: tuple[int, ...] | None = (16384,)        # n FlexAttention runs at (None: all)
    target_points: tuple[tuple[int, int, int], ...] = ()  # (B, H, n) added, first dtype
    same_process_ns: tuple[int, ...] = (16384,)      # FRESH: n measured again in one process
    long_ns: tuple[int, ...] = ()                     # the long sweep (same process only)
    long_dense_n_max: int = 2 ** 19
    max_minutes: float | None = None                  # start no point after this
    point_timeout_s: float = 600.0                    # FRESH: seconds a point may take
    variants: tuple[str, ...] = ()                    # kernel variants side by side (names
                                                      # of VARIANTS); (): the default one

    def __post_init__(self):
        def bad(what, given, allowed):
            raise ValueError(f"{what} {given!r}; allowed: {allowed}")

        if self.device not in ("cpu", "cuda"):
            bad("device", self.device, "cpu, cuda")
        if not isinstance(self.method, Method):
            bad("method", self.method, "a fast.measure.timing.Method")
        if not self.dtypes or any(d not in DTYPES for d in self.dtypes):
            bad("dtypes", self.dtypes, f"one or more of {', '.join(DTYPES)}")
        if any(len(s) != 2 or min(s) < 1 for s in self.shapes) or not self.shapes:
            bad("shapes", self.shapes, "(B, H) pairs of positive integers")
        for name in ("ns", "long_ns", "same_process_ns"):
            ns = getattr(self, name)
            if any(n < 1 for n in ns) or list(ns) != sorted(set(ns)):
                bad(name, ns, "positive n in ascending order, each once")
        if not self.contenders or any(c not in contenders.NAMES for c in self.contenders):
            bad("contenders", self.contenders, f"one or more of {', '.join(contenders.NAMES)}")
        if not (self.ns or self.long_ns):
            bad("ns", self.ns, "at least one n (or a long sweep)")
        if self.long_ns and self.method.process != "same":
            bad("long_ns with the method", self.method.process, "the long sweep runs in one "
                "process only: the same-process method")
        if not self.mask_gb >= 0 or (self.max_minutes is not None and not self.max_minutes > 0):
            bad("limits mask_gb, max_minutes", (self.mask_gb, self.max_minutes),
                "mask_gb >= 0 and max_minutes > 0 or None")
        if self.variants:
            if any(v not in VARIANTS for v in self.variants) or len(set(self.variants)) < len(
                    self.variants):
                bad("variants", self.variants, f"names from {', '.join(VARIANTS)}, each once")
            if self.method.process != "same" or self.long_ns:
                bad("variants with the method and long_ns", (self.method.process, self.long_ns),
                    "the same-process method and no long sweep (the variant sweep times the "
                    "targets' points in one process)")
            if not set(self.contenders) & set(contenders.TRITON):
                bad("variants with the contenders", self.contenders,
                    f"at least one of {', '.join(contenders.TRITON)}")

    @classmethod
    def defaults(cls, device: str = "cpu", same_process: bool = False,
                 variants: tuple[str, ...] = (), **changes) -> Sweep:
        """The run ``python -m fast bench`` makes on ``device`` (CUDA: always one
        process), the variant sweep of ``variants`` when given, with ``changes``
        (fields; None keeps the default)."""
        if variants:
            cuda = device == "cuda"
            base = cls(device=device, method=VARIANT_METHOD, variants=tuple(variants),
                       dtypes=("float16",) if cuda else ("float32",),
                       shapes=(VARIANT_POINTS[0][:2],) if cuda else ((1, 4),),
                       ns=(VARIANT_POINTS[0][2],) if cuda else (128,),
                       target_points=VARIANT_POINTS[1:] if cuda else (),
                       contenders=VARIANT_CONTENDERS, dense_n_max=None, naive_n_max=None,
                       flex_ns=None if cuda else cls.flex_ns, same_process_ns=(),
                       max_minutes=VARIANT_MINUTES)
        elif device == "cuda":
            base = cls(device="cuda", method=GPU_METHOD, dtypes=("float16", "bfloat16"),
                       shapes=((1, 4), (4, 16)), contenders=contenders.default_names("cuda"),
                       dense_n_max=None, naive_n_max=None, flex_ns=None,
                       target_points=(TARGET_POINT,), same_process_ns=(), max_minutes=9.0)
        elif same_process:
            base = cls(method=SAME, same_process_ns=())
        else:
            base = cls(device=device)
        return dataclasses.replace(base, **{k: v for k, v in changes.items() if v is not None})

    @property
    def long_lived_ns(self) -> tuple[int, ...]:
        """The n measured again in one process: ``same_process_ns`` among ``ns``, with
        the fresh-process method (the other method measures every n in one process)."""
        if self.method.process != "fresh":
            return ()
        return tuple(n for n in self.same_process_ns if n in self.ns)

    def file_name(self) -> str:
        """bench_cpu, bench_cpu_same_process or bench_cuda (+ "_variants" for the variant
        sweep)."""
        same = self.method.process == "same" and self.device == "cpu"
        return (f"bench_{self.device}" + ("_same_process" if same else "")
                + ("_variants" if self.variants else ""))

    def variants_of(self, name: str) -> tuple[str | None, ...]:
        """The kernel variants contender ``name`` is measured with: a Triton contender
        with each of ``variants`` (or the default one), the others once (None)."""
        if name not in contenders.TRITON:
            return (None,)
        return self.variants or (DEFAULT,)


# ----------------------------------------------------------------------------
# What the sweep measures, and what it costs
# ----------------------------------------------------------------------------

def points(sweep: Sweep) -> list[tuple]:
    """(dtype name, B, H, n) of the sweep, in the order measured."""
    out = [(dt, B, H, n) for dt in sweep.dtypes for (B, H) in sweep.shapes for n in sweep.ns]
    return out + [(sweep.dtypes[0], *p) for p in sweep.target_points]


def skip_reason(sweep: Sweep, name: str, pattern: str | None, dtype: str, H: int,
                n: int) -> str | None:
    """Why the sweep does not measure ``name`` at this point, or None when it does."""
    why = contenders.why_not(name, sweep.device, DTYPES[dtype])
    if why is not None:
        return why
    if name == "dense" and sweep.dense_n_max is not None and n > sweep.dense_n_max:
        return (f"dense causal attention is O(n^2): past --dense-n-max "
                f"{sweep.dense_n_max} one call takes minutes here")
    if name == "naive" and sweep.naive_n_max is not None and n > sweep.naive_n_max:
        return (f"the naive path is O(n^2) and runs the full square: past --naive-n-max "
                f"{sweep.naive_n_max} it would take most of the run")
    if name == "naive" and contenders.mask_bytes(pattern, n, H) > sweep.mask_gb * 2**30:
        return (f"the n x n mask needs {contenders.mask_bytes(pattern, n, H) / 2**30:.1f}"
                f" GiB > --mask-gb {sweep.mask_gb}")
    if name in contenders.FLEX and sweep.flex_ns is not None and n not in sweep.flex_ns:
        return "FlexAttention compiles per n (~25 s on a CPU): only run at --flex-n"
    return None


def estimate(sweep: Sweep) -> dict:
    """Measurements and an upper estimate of the sweep's seconds, from its size: each
    measurement at most its first call plus (warm-up + repetitions) calls of t
    seconds, t from the FLOPs at ``ASSUME_TFLOPS``, every contender at most 3x dense
    (3.5x more with the backward), plus 20 s of compilation per dtype and contender
    (each kernel variant a contender of its own)."""
    tflops = ASSUME_TFLOPS[sweep.device]
    runs = sum(len(sweep.variants_of(name)) for name in sweep.contenders)
    total = 20.0 * len(sweep.dtypes) * runs
    count = 0
    per_point = 1 + len(PATTERN_PARAMS) * (runs - 1)
    for _, B, H, n in points(sweep):
        fwd = 2 * B * H * n * n * D / (tflops * 1e12)                      # causal half
        for t in (3 * fwd, 3 * 3.5 * fwd):
            total += per_point * estimate_s(t, sweep.method, first_s=t)
            count += per_point
    for n in sweep.long_ns:
        fwd = 2 * LONG_SHAPE[1] * n * n * D / (tflops * 1e12)
        total += 2 * estimate_s(4.5 * fwd, sweep.method, first_s=5.0)
        count += 4
    return {"measurements": count, "estimate_s": total}


def config(sweep: Sweep) -> dict:
    """The sweep as the JSON records it."""
    out = {k: v for k, v in dataclasses.asdict(sweep).items() if k != "method"}
    B, H = sweep.shapes[0]
    cpu_memory = ("peak RSS above the inputs, fresh process per point"
                  if sweep.method.process == "fresh" else
                  "peak RSS above the inputs, in-process (under-counts)")
    out.update({
        "B": B, "H": H, "d": D, "block": DEFAULT_BLOCK, "patterns": PATTERN_PARAMS,
        "combine": "merged", "long_params": LONG_PARAMS, "long_shape": list(LONG_SHAPE),
        "target_s": sweep.method.target_s,
        "timing": {**dataclasses.asdict(sweep.method), "method": sweep.method.describe()},
        "same_process_timing": ({**dataclasses.asdict(LONG_LIVED),
                                 "method": LONG_LIVED.describe()}
                                if sweep.long_lived_ns else None),
        "memory": ("torch.cuda.max_memory_allocated above the inputs" if sweep.device == "cuda"
                   else cpu_memory),
        "default_variant": DEFAULT,
        "flex_peer": contenders.FLEX_PEER,
        "variant_settings": {name: variant_settings(VARIANTS[name])
                             for name in sweep.variants or (DEFAULT,)}})
    return json.loads(json.dumps(out))               # tuples as lists, as read back


def variant_settings(variant: Variant) -> dict:
    """A kernel variant's switches, launch rules and prediction, as the record keeps them
    (so that a record still says what each name meant after the variants change)."""
    rules = [{k: str(v) if isinstance(v, torch.dtype) else v
              for k, v in dataclasses.asdict(rule).items() if v is not None}
             for rule in variant.launch]
    return {"fused": variant.fused, "index_math": variant.index_math, "ranges": variant.ranges,
            "launch": rules, "prediction": variant.prediction}
