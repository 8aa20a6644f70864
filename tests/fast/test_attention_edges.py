"""sparse_attention at its edges: any finite scale, second derivatives, large logits in
low precision, and integer parameters beyond int32 at every entry point.

Child et al., 2019, section 4 (eq. 2-4: the scale of the scores), section 5.6 (half
precision, float32 accumulation) and the kernels of section 5.5 (positions in int32).
Every fast path is compared with ``reference/`` (NumPy, float64) on odd sizes.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fast import sparse_attention
from fast.attention.paths import _triton_available
from fast.backends import flash_cpu, flex, masks, structured
from fast.commands import train as cli
from fast.core.precision import PrecisionWarning
from fast.layout import block_layout
from fast.transformer.config import ModelConfig, preset
from reference import heads, patterns
from reference.attention import attend, attend_backward

pytestmark = pytest.mark.usefixtures("one_thread")

TRITON = _triton_available()


def _rand(B, H, n, d, seed, dtype=torch.float64, amp=1.0):
    """q, k (times ``amp``: larger logits), v, grad_out; drawn in float64, then cast."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for _ in range(4))
    return [t.to(dtype) for t in (q * amp, k * amp, v, go)]


def _grads(q, k, v, go, pattern, combine, backend, scale=None, **params):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = sparse_attention(q, k, v, pattern, combine=combine, backend=backend, scale=scale,
                           **params)
    out.backward(go)
    return [out.detach(), q.grad, k.grad, v.grad]


def _truth(q, k, v, go, mask, scale=None):
    args = [t.detach().double().numpy() for t in (q, k, v)]
    out, _ = attend(*args, mask, scale=scale)
    grads = attend_backward(*args, mask, go.detach().double().numpy(), scale=scale)
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in (out, *grads)]


# ----------------------------------------------------------------------------
# scale <= 0: the same answer on every backend (folded into q, fast.attention).
# ----------------------------------------------------------------------------

SCALE_BACKENDS = ["naive", "structured", "auto"] + (["triton"] if TRITON else [])


@pytest.mark.parametrize("scale", [0.0, -0.3, -1e-300])
@pytest.mark.parametrize("pattern,params,combine,H", [
    ("full", {}, "merged", 1),
    ("strided", {"stride": 5}, "merged", 4),
    ("fixed", {"stride": 6, "c": 2}, "multihead", 4),
])
@pytest.mark.parametrize("backend", SCALE_BACKENDS)
def test_non_positive_scale_matches_the_reference(scale, pattern, params, combine, H, backend):
    """Dense causal SDPA and the fused CPU kernel return NaN for scale <= 0 (torch
    2.13.0); sparse_attention must give the reference's answer, forward and backward."""
    n, d = 37, 48
    dtype = torch.float32 if backend == "triton" else torch.float64
    q, k, v, go = _rand(1, H, n, d, seed=5, dtype=dtype)
    want = _truth(q, k, v, go, patterns.head_masks(pattern, n, H, combine, 0, **params), scale)
    got = _grads(q, k, v, go, pattern, combine, backend, scale=scale, **params)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a.double() - b).abs().max().item()
        assert err < tol, f"{backend} scale={scale} {name}: max error {err:.3e}"


def _plain(q, k, v, go, mask, scale, dtype):
    """The reference's formula computed plainly in ``dtype`` (matmul, masked softmax,
    matmul; autograd): what "the reference computed in that precision" means below."""
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(~torch.from_numpy(mask), float("-inf")), -1).nan_to_num(0.0)
    out = p @ v
    out.backward(go.to(dtype))
    return [out.detach(), q.grad, k.grad, v.grad]


SCALES = [0.0, -1e6, 1e-30, 1e-46, 5e-324, 1e4, 1e6, 1e10, 1e20, 3e38, -3e38, 1e39]


# float64 "full" on the structured backend is SDPA's, exact below scores of about 1e17 only
# (fast/attention/api.py, "Scale"): not a case of this test.
SCALE_CASES = [
    pytest.param(*case, backend, dtype, id=f"{case[0]}-{case[2]}-{backend}-{dtype}")
    for case in [("strided", {"stride": 5}, "merged", 4),
                 ("fixed", {"stride": 8, "c": 2}, "multihead", 4), ("full", {}, "merged", 2)]
    for backend in ("structured", "naive")
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16)
    if (case[0], backend, dtype) != ("full", "structured", torch.float64)]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("pattern,params,combine,H,backend,dtype", SCALE_CASES)
def test_any_finite_scale_gives_the_reference(pattern, params, combine, H, backend, dtype, scale):
    """Every finite scale, in every dtype: the output and gradients of the reference (on the
    inputs as rounded to the dtype), by the flash-attention rule: error at most twice that
    of the reference's formula computed plainly in the dtype the call computes in (float32
    for float32, bfloat16 and float16 inputs; float64 for float64), plus the final rounding
    to the input dtype, plus -- in float64 -- the precision of the reference itself, whose
    backward forms rowsum(dO * O) as the kernels do (about eps * |scale| |dO| |v| |k|), and
    the weights a float64 recompute forms from the scores' log-sum-exp (dv: about
    eps * |scale| |q| |k| |dO|; fast/attention/api.py, "Scale").
    Before: float32 gradient errors of 0.06 at scale 1e4, 11 at 1e6, 8e4 at 1e10 (the
    float32 log-sum-exp holds ulp(|lse|) of the weights); NaN for 0 < scale < 1.4e-45
    (the kernel's float32 scale rounded to 0); NaN for float32 calls at scales from
    about 1.8e19 to float32's largest (scale * q . k overflowed float32); "full" (then
    SDPA's fused kernel, whose backward recomputes its weights from a float32 log-sum-exp)
    float32 gradient errors of 0.3 at scale 1e4 and 4.6 at 1e5."""
    n, d = 37, 48
    q, k, v, go = _rand(1, H, n, d, seed=8, dtype=dtype)
    mask = patterns.head_masks(pattern, n, H, combine, 0, **params)
    want = _truth(q, k, v, go, mask, scale)
    got = _grads(q, k, v, go, pattern, combine, backend, scale=scale, **params)
    wide = math.sqrt(torch.finfo(torch.float32).max)      # beyond: float32 calls fold to 64
    inside = torch.float64 if dtype == torch.float64 or abs(scale) > wide else torch.float32
    plain = _plain(q, k, v, go, mask, scale, inside)
    low, eps64 = torch.finfo(dtype), torch.finfo(torch.float64).eps
    rounding = 16 * torch.finfo(inside).eps + low.eps    # a few roundings inside, one at the end
    reference = 64 * eps64 * abs(scale) * (go.abs().max() * v.abs().max()
                                           * max(q.abs().max(), k.abs().max())).item()
    # a float64 recompute's weights exp(s - lse) hold |s| eps64 of their value
    weights = 64 * eps64 * abs(scale) * (go.abs().max() * q.abs().max()
                                         * k.abs().max()).item()
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, want, plain):
        err = (a.double() - b).abs().max().item()
        err_plain = (c.double() - b).abs().max().item()
        floor = (rounding * b.abs().max().item() + low.tiny       # below tiny: flushed to 0
                 + (reference if name in ("dq", "dk") else weights if name == "dv" else 0.0))
        print(f"{dtype} scale {scale:g} {backend} {name}: error {err:.3e}, plain "
              f"{inside} {err_plain:.3e}, floor {floor:.3e}")
        assert err <= 2 * err_plain + floor + 1e-300, name
        assert a.dtype == dtype, f"{name}: {a.dtype}"    # the inputs' dtype, as SDPA's


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("score", [4e4, 3.6e7])
@pytest.mark.parametrize("pattern,params,combine", [
    ("strided", {"stride": 5}, "merged"),
    ("fixed", {"stride": 8, "c": 2}, "merged"),
    ("fixed", {"stride": 8, "c": 2}, "multihead"),
])
def test_tied_large_scores_merge_exactly(pattern, params, combine, score, dtype):
    """Every score a row reads equal and large: the output is the mean of the values it
    reads, whatever the pieces. Before: float32 errors of 1e-3 at score 4e4 and 0.85 at
    3.6e7 (each piece's log-sum-exp rounded to ulp(score) lost log(count), so the weights
    tended to one half per piece); a float32 call is now recomputed in float64 beyond
    EXACT_LSE. float64 keeps ulp(|lse|) of the weights: 2e-9 at 3.6e7."""
    n, H, d = 97, 2, 8
    q = torch.zeros(1, H, n, d, dtype=dtype)
    q[..., 0] = score ** 0.5
    v = torch.randn(1, H, n, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mask = patterns.head_masks(pattern, n, H, combine, 0, **params)
    want, _ = attend(q.double().numpy(), q.double().numpy(), v.numpy(), mask, scale=1.0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = sparse_attention(q, q, v.to(dtype), pattern, combine=combine, scale=1.0,
                               backend="structured", **params)
    # float32 says that it recomputed in float64; float64 has nothing to say
    assert [w.category for w in said] == ([PrecisionWarning] if dtype == torch.float32 else [])
    err = (got.double() - torch.from_numpy(want)).abs().max().item()
    tol = {torch.float32: 4 * torch.finfo(torch.float32).eps,
           torch.float64: 1e-10 if score < 1e6 else 4 * score * torch.finfo(torch.float64).eps}
    print(f"{dtype} score {score:g} {pattern} {combine}: error {err:.3e}, allowed {tol[dtype]:.1e}")
    assert err <= tol[dtype] * v.abs().max().item()


def test_a_large_negative_log_sum_exp_is_recomputed_too():
    """Every score a row reads large and negative (q along u, k against it: lse about
    -220): |lse| passes EXACT_LSE from below, so a float32 call is recomputed in float64
    and says so, as for large positive scores; output and gradients the reference's."""
    B, H, n, d, scale = 1, 2, 64, 16, 0.25
    g = torch.Generator().manual_seed(0)
    q, k, v, go = (torch.randn(B, H, n, d, generator=g) for _ in range(4))
    u = torch.ones(d) / d ** 0.5
    q, k = 0.1 * q + 30 * u, 0.1 * k - 30 * u                           # (B, H, n, d)
    mask = patterns.head_masks("strided", n, H, "merged", 0, stride=8)
    lse = attend(*(t.double().numpy() for t in (q, k, v)), mask, scale=scale)[1]
    assert -lse.max() > structured.EXACT_LSE
    want = _truth(q, k, v, go, mask, scale)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = _grads(q, k, v, go, "strided", "merged", "structured", scale=scale, stride=8)
    assert [w.category for w in said] == [PrecisionWarning]        # said once, forward
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a.double() - b).abs().max().item()
        print(f"lse {lse.min():.1f}..{lse.max():.1f} {name}: error {err:.3e}")
        assert err < 1e-6, name


# ----------------------------------------------------------------------------
# Second derivatives: the hand-written backwards are once-differentiable.
# ----------------------------------------------------------------------------

def _second_derivative_raises(backend, dtype):
    """create_graph=True raises at once, whether the incoming gradient is a constant
    (where torch's own once_differentiable would hand back a first derivative without a
    graph, and a later second derivative would silently miss this path) or not; the
    first derivative alone is unchanged."""
    q, k, v, go = _rand(1, 2, 40, 16, seed=9, dtype=dtype)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    for loss in (lambda o: (o * go).sum(), lambda o: o.square().sum()):
        out = sparse_attention(q, k, v, "strided", stride=4, backend=backend)
        with pytest.raises(RuntimeError, match="once_differentiable.*backend='naive'"):
            torch.autograd.grad(loss(out), q, create_graph=True)
    out = sparse_attention(q, k, v, "strided", stride=4, backend=backend)
    dq, = torch.autograd.grad((out * go).sum(), q)
    naive = _grads(q, k, v, go, "strided", "merged", "naive", stride=4)[1]
    assert (dq - naive).abs().max().item() < (1e-10 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("fused", [True, False], ids=["cpu-kernel", "math-fallback"])
def test_double_backward_through_structured_raises(monkeypatch, fused):
    """Before: the CPU kernel said 'derivative ... not implemented'; the math fallback
    (the CUDA path) returned a wrong second derivative silently."""
    monkeypatch.setattr(flash_cpu, "HAS_CPU_FLASH", fused and flash_cpu.HAS_CPU_FLASH)
    _second_derivative_raises("structured", torch.float64)


@pytest.mark.slow
@pytest.mark.skipif(not TRITON, reason="needs triton")
def test_double_backward_through_triton_raises():
    """Before: the first derivative came back without a graph, a second one silently 0."""
    _second_derivative_raises("triton", torch.float32)


@pytest.mark.slow
def test_double_backward_through_naive_is_exact():
    """The naive backend (SDPA) is twice differentiable: the path to use for that."""
    q, k, v, go = _rand(1, 2, 13, 8, seed=10)
    inputs = [t.requires_grad_(True) for t in (q, k, v)]
    f = lambda *t: sparse_attention(*t, "strided", stride=4, backend="naive")
    assert torch.autograd.gradgradcheck(f, inputs, grad_outputs=[go])


# ----------------------------------------------------------------------------
# Low precision at large logits (sec. 5.6): float32 inside, rounded once.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pattern,params,combine,n,H", [
    ("strided", {"stride": 8}, "merged", 97, 4),
    ("fixed", {"stride": 8, "c": 2}, "multihead", 130, 4),
    ("fixed", {"stride": 8, "c": 2}, "merged", 130, 1),
])
def test_low_precision_at_large_logits(pattern, params, combine, n, H, dtype):
    """q and k five times larger (scores of standard deviation 25): the structured path
    meets the flash-attention rule against the plain low-precision reference, and, the
    tighter bar, against SDPA with the pattern's mask (the naive backend, which also
    accumulates in float32): err(structured) <= 2 err(naive) + floor. Rounding every
    piece's output and gradient before merging them gave 3-6x the naive error."""
    d = 48
    q, k, v, go = _rand(1, H, n, d, seed=3, dtype=dtype, amp=5.0)
    mask = patterns.head_masks(pattern, n, H, combine, 0, **params)
    want = _truth(q, k, v, go, mask)
    got = _grads(q, k, v, go, pattern, combine, "structured", **params)
    peer = _grads(q, k, v, go, pattern, combine, "naive", **params)
    ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    s = (ql @ kl.transpose(-1, -2)) * d ** -0.5
    p = torch.softmax(s.masked_fill(~torch.from_numpy(mask), float("-inf")), -1).nan_to_num(0.0)
    low = p @ vl
    low.backward(go)
    plain = [low.detach(), ql.grad, kl.grad, vl.grad]
    eps = torch.finfo(dtype).eps
    for name, a, b, r, c in zip(("out", "dq", "dk", "dv"), got, want, plain, peer):
        err = (a.double() - b).abs().max().item()
        err_plain = (r.double() - b).abs().max().item()
        err_peer = (c.double() - b).abs().max().item()
        print(f"{dtype} {pattern} {combine} {name}: structured {err:.3e}, plain low-precision "
              f"reference {err_plain:.3e}, naive SDPA {err_peer:.3e}")
        assert err <= 2 * err_plain + eps, name
        assert err <= 2 * err_peer + eps, name


# ----------------------------------------------------------------------------
# Integers beyond int32: rejected by every entry point (reference.params.MAX_INT).
# ----------------------------------------------------------------------------

BIG = 2**63
_x = torch.zeros(1, 1, 8, 4)
ENTRY_POINTS = {
    "sparse_attention naive": lambda: sparse_attention(_x, _x, _x, "strided", stride=BIG,
                                                       backend="naive"),
    "sparse_attention structured": lambda: sparse_attention(_x, _x, _x, "strided", stride=BIG,
                                                            backend="structured"),
    "sparse_attention fixed c": lambda: sparse_attention(_x, _x, _x, "fixed", stride=4, c=BIG),
    "reference.patterns.strided": lambda: patterns.strided(8, BIG),
    "reference.patterns.head_masks": lambda: patterns.head_masks("strided", 8, 1, stride=BIG),
    "reference.heads.head_roles": lambda: heads.head_roles("strided", 1, stride=BIG),
    "fast.backends.masks.head_masks": lambda: masks.head_masks("strided", 8, 1, stride=BIG),
    "fast.backends.flex.mask_mod": lambda: flex.mask_mod("strided", 8, 1, stride=BIG),
    "fast.layout.block_layout": lambda: block_layout("strided", 8, 1, stride=BIG),
    "ModelConfig": lambda: ModelConfig(stride=BIG),
    "ModelConfig n_ctx": lambda: ModelConfig(n_ctx=BIG),
    "preset": lambda: preset("quick", stride=BIG),
}
if TRITON:
    ENTRY_POINTS["triton_sparse_attention"] = lambda: __import__(
        "fast.kernels.triton_attention", fromlist=["x"]).triton_sparse_attention(
        _x, _x, _x, "strided", stride=BIG)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_stride_2_63_is_rejected_everywhere(name):
    with pytest.raises(ValueError, match=r"2\*\*31 - 1"):
        ENTRY_POINTS[name]()


def test_stride_2_63_on_the_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as err:
        cli.configs(["--stride", str(BIG)])
    assert err.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and str(BIG) in line and "2147483647" in line


def test_torch_func_grad_of_the_structured_backend_says_what_it_needs():
    """torch.func.grad differentiates with create_graph on, which the hand-written backward
    refuses by name (the naive backend takes it). Before, the structured path's autograd
    Function set its context inside forward, which torch.func refuses with an error about
    setup_context; "full" took that path only at large scores, so whether a model's
    torch.func.grad ran depended on its values."""
    q, k, v = _rand(1, 2, 40, 16, seed=9, dtype=torch.float32)[:3]
    for pattern, params, scale in (("strided", {"stride": 4}, None), ("full", {}, 1e3)):
        def loss(q, backend, pattern=pattern, params=params, scale=scale):
            return sparse_attention(q, k, v, pattern, backend=backend, scale=scale,
                                    **params).sum()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrecisionWarning)     # "full" at 1e3 recomputes
            with pytest.raises(RuntimeError, match="once_differentiable.*backend='naive'"):
                torch.func.grad(loss)(q, "structured")
        assert torch.func.grad(loss)(q, "naive").isfinite().all()


# ----------------------------------------------------------------------------
# stride = 1 and "meta" tensors: legal, on every pattern
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,params", [("strided", {"stride": 1}),
                                            ("fixed", {"stride": 1, "c": 1})])
@pytest.mark.parametrize("combine", ["merged", "multihead", "interleaved"])
@pytest.mark.parametrize("backend", ["structured", "auto", "naive"])
def test_stride_1_forward_and_backward_give_the_reference(pattern, params, combine, backend):
    """l = 1: every row reads every earlier position. Through the CPU window kernel in
    float32 the strided column is one sequence of n rows, which its backward cannot
    write once (``init``) as it writes packed sequences: it adds into zeros instead
    (it refused its arguments, "code 2", with a contiguous gradient)."""
    q, k, v, go = _rand(1, 2, 37, 16, seed=1, dtype=torch.float32)
    go = go.contiguous()
    got = _grads(q, k, v, go, pattern, combine, backend, **params)
    mask = patterns.head_masks(pattern, 37, 2, combine, 0, **params)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, _truth(q, k, v, go, mask)):
        err = (a.double() - b).abs().max().item()
        print(f"{backend} {combine} {name}: {err:.1e}")
        assert err < 1e-5, name


PATTERNS_ALL = [("full", {}), ("strided", {"stride": 4}), ("fixed", {"stride": 4, "c": 1}),
                ("strided", {"stride": 1}), ("longformer", {"window": 3}),
                ("bigbird", {"window": 3, "n_global": 1, "n_random": 1})]


@pytest.mark.parametrize("pattern,params", PATTERNS_ALL)
@pytest.mark.parametrize("backend", ["auto", "naive", "structured"])
@pytest.mark.parametrize("n_q", [20, 1])
def test_meta_tensors_give_shapes_on_every_pattern(pattern, params, backend, n_q):
    """"meta" tensors (shapes only: tracing a model's memory, building it before its
    weights) take every path a CPU call takes, forward and backward, and read no value
    (the float64 decision, the empty-row fix and the overflow bound look at none)."""
    if backend == "structured" and pattern in ("longformer", "bigbird"):
        pytest.skip("the structured backend serves full, strided and fixed")
    for combine in ("merged", "interleaved"):
        q = torch.empty(2, 4, n_q, 16, device="meta", requires_grad=True)
        k, v = (torch.empty(2, 4, 20, 16, device="meta", requires_grad=True) for _ in range(2))
        out = sparse_attention(q, k, v, pattern, combine=combine, layer=1, backend=backend,
                               **params)
        assert out.shape == (2, 4, n_q, 16) and out.device.type == "meta"
        out.sum().backward()
        assert k.grad.shape == k.shape
