"""The Triton kernels compiled on a GPU: every pattern x combine mode x dtype, and no host sync.

Child et al., 2019, sections 4.3 and 5.1 (patterns, head combinations), 5.5
(block-sparse kernels) and 5.6 (half precision). Each case runs forward and
backward on odd sizes (n = 1025: not a multiple of the block, of the stride or of
64), float32 / float16 / bfloat16, and checks (``triton_helpers.check_case``):
the flash-attention rule against float64, no NaN or inf, rows that read nothing
give 0, a repeat is bitwise equal. The tests marked ``gpu`` need CUDA with the
kernels compiled: ``make test`` runs them in a second pass
(``TRITON_INTERPRET=0 pytest -m gpu``) when CUDA is present.

Every kernel variant (``fast.kernels.variants.VARIANTS``) runs every case on the
GPU. Each GPU test has a CPU twin that runs the same function on small sizes in
float32 under the Triton interpreter (``make test``'s first pass), so the checks
themselves are exercised on every machine: the default variant
(``fast.kernels.variants.DEFAULT``, what every call that names none runs) on every
case, each other variant on the cases that take its code paths (the interpreter is
slow; the cross product is the GPU's).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import sparse_attention
from fast.attention import resolve_backend
from fast.kernels.launch import BlockSparseAttention
from fast.kernels.variants import DEFAULT, Launch
from tests.fast.kernels.triton_helpers import (
    DEVICE,
    check_case,
    flash_rule,
    gpu,
    make_inputs,
    needs_interpreter,
    needs_runner,
    ref_masks,
    triton_attention,
)

# (pattern, combine, layer, parameters at n = 1025 on the GPU, parameters at n = 75 on the CPU)
CASES = [
    ("full", "merged", 0, {}, {}),
    ("strided", "merged", 0, dict(stride=48), dict(stride=7)),
    ("strided", "multihead", 0, dict(stride=32), dict(stride=8)),
    ("strided", "interleaved", 1, dict(stride=48), dict(stride=7)),
    ("fixed", "merged", 0, dict(stride=64, c=16), dict(stride=16, c=4)),
    ("fixed", "multihead", 0, dict(stride=64, c=16), dict(stride=8, c=2)),
    ("fixed", "interleaved", 1, dict(stride=48, c=16), dict(stride=12, c=4)),  # empty rows
    ("longformer", "merged", 0, dict(window=40, dilation=2, global_tokens=(0, 500)),
     dict(window=5, dilation=2, global_tokens=(0, 17))),
    ("bigbird", "merged", 0, dict(window=48, n_random=3, n_global=4),
     dict(window=6, n_random=2, n_global=2)),
]
IDS = [f"{c[0]}-{c[1]}{c[2]}" for c in CASES]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
VARIANTS = list(triton_attention.VARIANTS)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).split(".")[-1])
@pytest.mark.parametrize("pattern,combine,layer,params,_", CASES, ids=IDS)
def test_gpu_pattern_combine_dtype(pattern, combine, layer, params, _, dtype, variant):
    check_case(pattern, combine, layer, params, dtype, "cuda", B=2, H=4, n=1025, d=64,
               variant=variant)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).split(".")[-1])
def test_gpu_head_width_48_is_padded_inside(dtype, variant):
    """d = 48 (not a power of two): the kernel pads it to 64 in registers."""
    check_case("fixed", "merged", 0, dict(stride=48, c=16), dtype, "cuda", B=1, H=3, n=999,
               d=48, variant=variant)


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("pattern,combine,layer,_,params", CASES, ids=IDS)
def test_cpu_twin_pattern_combine(pattern, combine, layer, _, params):
    """The GPU test's function, small and in float32, under the interpreter."""
    check_case(pattern, combine, layer, params, torch.float32, "cpu", B=1, H=4, n=75, d=16,
               block_size=16, variant=DEFAULT)


# (pattern, combine, layer, params, H, n, d) at block 16 under the interpreter
SMALL = {
    "full": ("full", "merged", 0, {}, 1, 37, 48),
    "strided": ("strided", "multihead", 0, dict(stride=7), 3, 45, 16),
    "strided48": ("strided", "merged", 0, dict(stride=6), 2, 39, 48),
    "fixed": ("fixed", "merged", 0, dict(stride=8, c=2), 2, 41, 16),
    "fixed48": ("fixed", "interleaved", 1, dict(stride=12, c=4), 3, 43, 48),  # empty rows
    "longformer": ("longformer", "merged", 0, dict(window=5, dilation=2, global_tokens=(0, 17)),
                   1, 40, 16),
    # n = 100: some rows of the random part are not ranges (listed tables kept)
    "bigbird": ("bigbird", "merged", 0, dict(window=4, n_random=2, n_global=2, seed=1), 1, 100,
                16),
}
# Each variant on the cases that take its code paths (the default, fused, runs every case
# above): baseline's zero-filled float32 buffers and cast on the two-part patterns and on
# parts that do not cover every row, fused on one part and on such parts too; grouped
# on the parts it groups (local, block, window); index on the transposed, gathered and
# natural slot maps; ranges on listed and range tables and on a part with non-range rows.
VARIANT_CASES = {
    "baseline": ["strided", "fixed48", "longformer"],
    "fused": ["full", "fixed48", "longformer"],
    "grouped": ["strided48", "fixed", "longformer"],
    "tuned": ["strided48"],       # float32: its larger tiles are float16 / bfloat16 only
    "index": ["strided", "fixed48", "longformer"],
    "ranges": ["strided48", "fixed", "bigbird"],
    "all": ["full", "strided", "fixed48", "longformer", "bigbird"],
}
TWIN = [(v, c) for v, cases in VARIANT_CASES.items() for c in cases]


def test_every_variant_has_cpu_cases():
    assert set(VARIANT_CASES) == set(triton_attention.VARIANTS) and DEFAULT in VARIANT_CASES


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("variant,case", TWIN, ids=[f"{v}-{c}" for v, c in TWIN])
def test_cpu_twin_variant(variant, case):
    """A variant against float64 by the flash-attention rule, under the interpreter."""
    pattern, combine, layer, params, H, n, d = SMALL[case]
    check_case(pattern, combine, layer, params, torch.float32, "cpu", B=1, H=H, n=n, d=d,
               block_size=16, repeat=variant == "all", variant=variant)


@pytest.mark.slow
@needs_runner
def test_a_tile_size_per_part_kind():
    """Launch settings may build each part kind at its own tile size (the fixed block part
    at 16, its summary at 32; strided local at 32, column at 16): the parts hold the same
    pairs at every size, so the answer is exact."""
    mixed = triton_attention.Variant("mixed", fused=True, launch=(
        Launch(part="block", block=16), Launch(part="summary", block=32),
        Launch(part="local", block=32), Launch(part="column", block=16, group=2)))
    for pattern, params in (("fixed", dict(stride=8, c=2)), ("strided", dict(stride=6))):
        check_case(pattern, "multihead", 0, params, torch.float32, DEVICE, B=1, H=2, n=71,
                   d=16, block_size=64, repeat=False, variant=mixed)
        parts = triton_attention.variant_parts(pattern, 71, 2, "multihead", 0, params, 64, DEVICE,
                                               "structured",
                                mixed, torch.float32, 16)
        assert [p.block_size for p in parts] == ([16, 32] if pattern == "fixed" else [32, 16])


# ----------------------------------------------------------------------------
# No host sync: a warm forward + backward never waits for the GPU
# ----------------------------------------------------------------------------

def _warm_then_strict(call, q, k, v, do) -> None:
    """One call to build the layout and compile, then one under
    ``torch.cuda.set_sync_debug_mode("error")``: any host read of a device value raises."""
    for mode in ("default", "error"):
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(mode)
        try:
            call(qg, kg, vg).backward(do)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("pattern,params", [("strided", dict(stride=32)),
                                            ("fixed", dict(stride=64, c=16))])
def test_gpu_forward_and_backward_never_wait_for_the_device(pattern, params, variant):
    """Once the layout is cached, neither the kernel's entry point nor
    ``fast.sparse_attention`` (auto backend: Triton on CUDA; its NaN check is off on
    CUDA unless asked for) reads anything back from the GPU."""
    q, k, v, do = make_inputs(1, 4, 1000, 64, device="cuda", dtype=torch.float16)
    for combine in ("merged", "multihead"):
        _warm_then_strict(lambda a, b, c, m=combine: triton_attention.triton_sparse_attention(
            a, b, c, pattern, combine=m, variant=variant, **params), q, k, v, do)
        _warm_then_strict(lambda a, b, c, m=combine: sparse_attention(
            a, b, c, pattern, combine=m, variant=variant, **params), q, k, v, do)


@pytest.mark.gpu
@gpu
def test_gpu_auto_backend_is_the_compiled_kernel():
    """On CUDA the auto backend of a sparse pattern is the compiled Triton kernel."""
    assert resolve_backend("auto", "strided", torch.device("cuda"), torch.float16) == "triton"
    assert resolve_backend("auto", "full", torch.device("cuda"), torch.float16) == "structured"


HALF = [SMALL["fixed"],   # the summary's keys cover few rows: dK/dV from a zeroed scratch
        ("longformer", "merged", 0, dict(window=5, dilation=2, global_tokens=(5, 33)), 1, 40,
         16)]            # the global queries cover few rows: dQ the same


@needs_interpreter
@pytest.mark.parametrize("variant", ["baseline", "fused", "all"])
@pytest.mark.parametrize("case", HALF, ids=[c[0] for c in HALF])
def test_cpu_twin_float16_writes(variant, case):
    """Outputs and gradients in float16 under the interpreter (which runs float16 matmuls in
    NumPy, though its public entry takes float32 only: the autograd Function is called
    directly): the write paths of a dtype other than float32 -- the last part writing q's
    dtype from a float32 scratch buffer, parts that do not cover every row -- by the
    flash-attention rule against float64."""
    pattern, combine, layer, params, H, n, d = case
    v = triton_attention.VARIANTS[variant]
    parts = triton_attention.variant_parts(pattern, n, H, combine, layer, params, 16, "cpu",
                                           "structured", v,
                            torch.float16, d)
    masks = torch.from_numpy(np.ascontiguousarray(ref_masks(pattern, n, H, combine, layer,
                                                            **params)))
    q, k, val, do = make_inputs(1, H, n, d, dtype=torch.float64)
    flash_rule(lambda a, b, c: BlockSparseAttention.apply(a, b, c, parts, d ** -0.5, v),
               (q, k, val), do, masks, d ** -0.5, torch.float16, 1e-5,
               f"{pattern} {combine} {variant}")
