"""The custom operators behind ``sparse_attention``: opcheck, and the reference through them.

Child et al., 2019, sections 4.3 and 5.1 (the patterns and their heads), section 5.5 (the
structured pieces) and 5.4 (recomputation: a float32 call whose log-sum-exp outgrows
float32 is recomputed in float64, in the backward too). ``sparse_transformer::structured``
(and its backward) and ``sparse_transformer::check_inputs`` are what every call runs,
eager or traced by ``torch.compile`` (docs/design.md, "torch.compile"); the structured
operators' autograd formula is ``StructuredAttention``, a Function that calls them (as
flash-attn's does): ``torch.library.opcheck`` checks each operator (schema, fake tensors
against real ones -- shapes, dtypes and strides -- and the AOT-dispatched operator
against eager) on odd sizes: n not a multiple of the stride, d = 48, one and three
heads, n_q < n_k, grouped key/value heads, inputs that are transposed views (as a
model's split into heads leaves them); the gradients through the Function are compared
with the reference.
The reference comparisons here run compiled calls (``aot_eager``: dynamo and AOT
autograd, no code generation) against ``reference/`` in float64.
"""

from __future__ import annotations

import pytest
import torch

import fast.attention  # noqa: F401  (registers the operators)
from fast import sparse_attention
from fast.backends.structured import StructuredAttention
from tests.fast.api_helpers import inputs, run, truth, truth_masks

OPS = torch.ops.sparse_transformer

# (pattern, combine, layer, stride, c), (B, H, Hkv, n_q, n_k): every case on odd sizes,
# together one head and three, n_q < n_k, grouped key/value heads
PAIRS = [
    (("strided", "merged", 0, 5, None), (1, 1, 1, 37, 37)),
    (("strided", "merged", 0, 5, None), (2, 4, 2, 20, 37)),
    (("strided", "interleaved", 1, 4, None), (2, 3, 3, 37, 37)),
    (("strided", "multihead", 0, 4, None), (2, 3, 3, 20, 37)),
    (("fixed", "merged", 0, 8, 2), (2, 3, 3, 37, 37)),
    (("fixed", "merged", 0, 8, 2), (2, 4, 2, 37, 37)),
    (("fixed", "multihead", 0, 8, 2), (2, 3, 3, 20, 37)),
    (("fixed", "merged", 0, 6, 4), (2, 1, 1, 20, 37)),  # c does not divide l: one head
]


def _case_id(case):
    return "-".join(str(x) for x in case if x is not None)


def _transposed(B, H, n, d, dtype, seed):
    """(B, H, n, d) as a model's split into heads leaves it: a transposed view."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, H * d, generator=g, dtype=torch.float64).to(dtype)
    return x.view(B, n, H, d).transpose(1, 2)                            # (B, H, n, d)


def _pair_id(pair):
    return _case_id(pair[0]) + "-" + "x".join(map(str, pair[1]))


@pytest.mark.parametrize("case,shape", PAIRS, ids=map(_pair_id, PAIRS))
@pytest.mark.parametrize("grad", [True, False], ids=["backward", "forward"])
def test_opcheck_structured(case, shape, grad):
    """Each operator alone (no input requires grad: their autograd formula is the
    Function's, ``StructuredAttention``, whose gradients ``test_op_equals_reference``
    checks)."""
    B, H, Hkv, n_q, n_k = shape
    q, k, v, _ = inputs(B, H, Hkv, n_q, n_k, 48, seed=1, dtype=torch.float32)
    args = (*case[:2], case[2], case[3], case[4], 48 ** -0.5)
    torch.library.opcheck(OPS.structured, (q, k, v, *args))
    if not grad:
        return
    out, lse, exact = OPS.structured(q, k, v, *args)
    go = torch.randn_like(out)
    torch.library.opcheck(OPS.structured_backward, (go, q, k, v, out, lse, exact, *args))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16], ids=str)
def test_opcheck_structured_transposed_views(dtype):
    """Strided inputs (a transposed view of (B, n, H d)): the fake outputs must have the
    strides of the real ones (before: the backward's fake took q's strides, and a
    compiled graph's next ``view`` failed)."""
    q, k, v = (_transposed(2, 3, 37, 48, dtype, seed) for seed in (1, 2, 3))
    args = ("fixed", "multihead", 0, 8, 2, 0.2)
    torch.library.opcheck(OPS.structured, (q, k, v, *args))
    out, lse, exact = OPS.structured(q, k, v, *args)
    torch.library.opcheck(OPS.structured_backward,
                          (torch.randn_like(out), q, k, v, out, lse, exact, *args))


def test_opcheck_check_inputs():
    q, k, v, _ = inputs(2, 3, 3, 20, 37, 48, seed=1)
    lengths, offsets = torch.tensor([30, 33]), torch.tensor([2, 0])
    torch.library.opcheck(OPS.check_inputs, (q, k, v, True, lengths, offsets, True, True))
    torch.library.opcheck(OPS.check_inputs, (q, k, v, True, None, None, False, False))


@pytest.mark.parametrize("case,shape", PAIRS, ids=map(_pair_id, PAIRS))
def test_op_equals_reference(case, shape):
    """The operator (out, and dq, dk, dv through its autograd formula, the Function that
    calls it and its backward) against the float64 reference: the answer is out's last
    n_q of the first n_k rows."""
    pattern, combine, layer, stride, c = case
    B, H, Hkv, n_q, n_k = shape
    params = {"stride": stride} if c is None else {"stride": stride, "c": c}
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, 48, seed=3)
    mask = truth_masks(pattern, B, H, n_q, n_k, combine, layer, **params)
    want = truth(q, k, v, go, mask)

    def op(q, k, v):
        out, lse, exact = StructuredAttention.apply(q, k, v, pattern, combine, layer, stride,
                                                    c, 48 ** -0.5)
        assert out.shape[2] % stride == 0 and lse.shape == out.shape[:3] and not exact
        return out[:, :, n_k - n_q:n_k]

    got = run(op, q, k, v, go)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a - b).abs().max().item()
        print(f"{case} {shape} {name}: error {err:.2e}")
        assert err < 1e-10, name


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


@pytest.mark.parametrize("pattern,combine,params", [
    ("strided", "merged", {"stride": 5}),
    ("fixed", "multihead", {"stride": 8, "c": 2}),
])
@pytest.mark.parametrize("padding", [None, "lengths", "offsets"])
def test_compiled_equals_reference(pattern, combine, params, padding):
    """sparse_attention compiled with fullgraph=True (finite check on, the CPU default):
    forward and backward against the float64 reference, with n_q < n_k, grouped
    key/value heads and a padded batch."""
    B, H, Hkv, n_q, n_k = 2, 4, 2, 20, 37
    lengths = None if padding is None else torch.tensor([30, 25])
    offsets = torch.tensor([3, 0]) if padding == "offsets" else None
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, 48, seed=4)
    mask = truth_masks(pattern, B, H, n_q, n_k, combine, lengths=lengths, offsets=offsets,
                       **params)
    want = truth(q, k, v, go, mask)
    attend = _compiled(lambda q, k, v: sparse_attention(
        q, k, v, pattern, combine=combine, backend="structured", enable_gqa=True,
        lengths=lengths, offsets=offsets, **params))
    got = run(attend, q, k, v, go)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a - b).abs().max().item()
        print(f"{pattern} {padding} {name}: error {err:.2e}")
        assert err < 1e-10, name


@pytest.mark.parametrize("backend", ["auto", "structured", "naive"])
def test_compiled_with_a_traced_stride_equals_reference(backend):
    """A stride passed as an argument under dynamic=True (or one that changes between
    calls) is traced as a symbol: every backend still compiles whole -- auto picks its
    crossover by integer comparisons that guard (``fast.backends.auto.nearest``) -- and
    each stride's call equals the float64 reference, forward and backward."""
    q, k, v, go = inputs(1, 2, 2, 37, 37, 48, seed=6)
    torch._dynamo.reset()
    attend = torch.compile(lambda q, k, v, stride: sparse_attention(
        q, k, v, "strided", stride=stride, backend=backend), backend="aot_eager",
        fullgraph=True, dynamic=True)
    for stride in (8, 16, 5):
        want = truth(q, k, v, go, truth_masks("strided", 1, 2, 37, 37, stride=stride))
        got = run(lambda q, k, v, s=stride: attend(q, k, v, s), q, k, v, go)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            err = (a - b).abs().max().item()
            print(f"{backend} stride {stride} {name}: error {err:.2e}")
            assert err < 1e-10, name


@pytest.mark.parametrize("backend", ["auto", "structured"])
@pytest.mark.parametrize("pattern,params", [("strided", {"stride": 5}),
                                            ("fixed", {"stride": 8, "c": 2})])
@pytest.mark.parametrize("n_k", [1, 37])
def test_compiled_one_query_equals_reference(backend, pattern, params, n_k):
    """One query -- a sequence of one position, or the last of 37 -- compiles whole: a
    traced call takes the operator (the eager one-query step reads values and positions
    on the host), and equals the float64 reference, forward and backward."""
    q, k, v, go = inputs(2, 4, 2, 1, n_k, 48, seed=7)
    want = truth(q, k, v, go, truth_masks(pattern, 2, 4, 1, n_k, **params))
    attend = _compiled(lambda q, k, v: sparse_attention(
        q, k, v, pattern, backend=backend, enable_gqa=True, **params))
    got = run(attend, q, k, v, go)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a - b).abs().max().item()
        print(f"{backend} {pattern} n_k={n_k} {name}: error {err:.2e}")
        assert err < 1e-10, name


@pytest.mark.parametrize("score", [4e4, 3.6e7])
def test_compiled_recomputes_in_float64_as_eager(score):
    """Tied large scores in float32 (|lse| beyond EXACT_LSE): the operator decides on the
    host, inside, to recompute in float64, forward and backward -- out, dq, dk, dv are the
    float64 call's rounded once -- and compiled and eager give the same bits; the output
    is the mean of the values read."""
    n, H, d = 37, 2, 8
    q = torch.zeros(1, H, n, d)
    q[..., 0] = score ** 0.5
    v = torch.randn(1, H, n, d, generator=torch.Generator().manual_seed(2))
    go = torch.randn(1, H, n, d, generator=torch.Generator().manual_seed(3))
    fn = lambda q, k, v: sparse_attention(q, k, v, "strided", stride=5, scale=1.0,
                                          backend="structured")
    eager = run(fn, q, q, v, go)
    compiled = run(_compiled(fn), q, q, v, go)
    exact = run(fn, q.double(), q.double(), v.double(), go.double())
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), eager, compiled, exact):
        assert torch.equal(a, b), name
        assert torch.equal(a, c.float()), name
    mask = torch.from_numpy(truth_masks("strided", 1, H, n, n, stride=5))
    mean = (mask.double() @ v.double()) / mask.sum(-1, keepdim=True)
    err = (eager[0].double() - mean).abs().max().item()
    print(f"score {score:g}: error {err:.2e}")
    assert err <= 4 * torch.finfo(torch.float32).eps * v.abs().max().item()


@pytest.mark.parametrize("backend", ["structured", "naive"])
def test_compiled_raises_what_eager_raises(backend):
    """The host reads happen inside the operator, at run time: a compiled call raises
    the eager ValueError for NaN input and for lengths outside the keys, and runs on
    after it (nothing was dropped from the graph as dead code)."""
    q, k, v, _ = inputs(2, 3, 3, 37, 37, 48, seed=5, dtype=torch.float32)
    attend = _compiled(lambda q, k, v, lengths: sparse_attention(
        q, k, v, "strided", stride=5, backend=backend, lengths=lengths))
    ok = torch.tensor([37, 30])
    attend(q, k, v, ok)
    bad = k.clone()
    bad[1, 2, 7, 3] = float("nan")
    for fn in (attend, lambda q, k, v, lengths: sparse_attention(
            q, k, v, "strided", stride=5, backend=backend, lengths=lengths)):
        with pytest.raises(ValueError, match="k holds non-finite values"):
            fn(q, bad, v, ok)
        with pytest.raises(ValueError, match=r"lengths\[1\] = 38 is outside \[0, n_k = 37\]"):
            fn(q, k, v, torch.tensor([37, 38]))
    assert torch.equal(attend(q, k, v, ok), sparse_attention(
        q, k, v, "strided", stride=5, backend=backend, lengths=ok))


def test_second_derivative_through_the_operator_raises():
    """The operator's autograd formula (``StructuredAttention``) refuses create_graph=True
    by name."""
    q, k, v, go = inputs(1, 2, 2, 40, 40, 16, seed=9)
    q.requires_grad_(True)
    out, _, _ = StructuredAttention.apply(q, k, v, "strided", "merged", 0, 4, None, 0.25)
    with pytest.raises(RuntimeError, match="once_differentiable.*backend='naive'"):
        torch.autograd.grad((out * go).sum(), q, create_graph=True)


def test_compiled_quarantine_of_full_equals_eager():
    """check_finite=False: a traced call quarantines without looking first (the look is a
    host read), with the same answers as eager, NaN rows and gradients included; "full"
    (its reach in closed form) trains whole."""
    q, k, v, go = inputs(1, 2, 2, 37, 37, 48, seed=1, dtype=torch.float32)
    k[0, 1, 9, 3] = float("nan")
    fn = lambda q, k, v: sparse_attention(q, k, v, "full", check_finite=False)
    eager = run(fn, q, k, v, go)
    compiled = run(_compiled(fn), q, k, v, go)
    assert eager[0][0, 1, 9:].isnan().all() and not eager[0][0, 1, :9].isnan().any()
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a.isnan(), b.isnan()), name
        assert torch.equal(a.nan_to_num(), b.nan_to_num()), name
