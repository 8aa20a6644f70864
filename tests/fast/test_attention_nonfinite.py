"""NaN and inf in q, k, v: refused by name with the finite check on; with it off, never
hidden, never spread.

Child et al., 2019, section 4 (eq. 2-4): output i reads exactly the positions S_i.
With ``check_finite=False`` a row that reads a non-finite value (its query, or a key or
value of a position it reads) must output NaN, forward and backward, and every other
row must be what it is without the non-finite values (``fast.core.nonfinite``), on every
backend that sparse_attention runs on the CPU and in every dtype. Before: a NaN query in
the first block came out 0.0 on the structured backend in float32, bfloat16 and float16
(the fused kernel's row maximum skipped it), and a NaN key reached rows that do not read
it through the additive masks (structured) or reached every row (naive).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import sparse_attention
from fast.core import nonfinite
from fast.core.checks import NonFiniteInput
from reference import patterns

pytestmark = pytest.mark.usefixtures("one_thread")

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
CASES = [  # (pattern, params, combine, H): every piece of the structured plan, both heads
    ("full", {}, "merged", 1),
    ("strided", {"stride": 5}, "merged", 2),
    ("strided", {"stride": 8}, "multihead", 2),
    ("fixed", {"stride": 6, "c": 2}, "merged", 2),
    ("fixed", {"stride": 8, "c": 2}, "multihead", 2),
    ("fixed", {"stride": 5, "c": 2}, "merged", 1),        # c does not divide l
]
BAD = [("q", 3, float("nan")), ("q", 20, float("-inf")), ("k", 20, float("nan")),
       ("v", 17, float("inf")), ("k", 0, float("inf"))]


def _inputs(n, H, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, n, d, generator=g, dtype=torch.float64).to(dtype)
            for _ in range(4)]                                          # q, k, v, grad_out


def _run(q, k, v, go, pattern, combine, backend, params, check_finite):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = sparse_attention(q, k, v, pattern, combine=combine, backend=backend,
                           check_finite=check_finite, **params)
    out.backward(go)
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("backend", ["auto", "structured", "naive"])
def test_the_finite_check_names_the_tensor_that_holds_the_value(backend, where, value):
    """check_finite on (the default) on the CPU: one NaN or inf in any one of q, k, v
    raises NonFiniteInput (a ValueError) naming that tensor, not another."""
    q, k, v, _ = _inputs(16, 2, 8, torch.float32)
    {"q": q, "k": k, "v": v}[where][0, 1, 3, 0] = value
    with pytest.raises(NonFiniteInput, match=f"^{where} holds non-finite values"):
        sparse_attention(q, k, v, "strided", stride=4, backend=backend)


@pytest.mark.parametrize("where,pos,value", BAD, ids=[f"{w}{p}={v}" for w, p, v in BAD])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", ["structured", "naive"])
@pytest.mark.parametrize("pattern,params,combine,H", CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[1]}" for c in CASES])
def test_a_non_finite_value_reaches_exactly_the_rows_that_read_it(pattern, params, combine, H,
                                                                  backend, dtype, where, pos,
                                                                  value):
    n, d, head = 29, 8, H - 1
    q, k, v, go = _inputs(n, H, d, dtype)
    bad = {"q": q, "k": k, "v": v}[where]
    bad[0, head, pos, 1] = value
    mask = patterns.head_masks(pattern, n, H, combine, 0, **params)[head]   # (n, n)
    rows = np.zeros(n, bool)                              # rows that read the bad value
    if where == "q":
        rows[pos] = True
    else:
        rows |= mask[:, pos]
    keys = mask[rows].any(0)                              # positions those rows read
    got = _run(q, k, v, go, pattern, combine, backend, params, check_finite=False)
    # the same call without the bad value, and without the bad rows' incoming gradient
    clean = [t.clone() for t in (q, k, v, go)]
    clean[{"q": 0, "k": 1, "v": 2}[where]][0, head, pos] = 0.0
    clean[3][0, head, torch.from_numpy(rows)] = 0.0
    want = _run(*clean, pattern, combine, backend, params, check_finite=True)
    for name, a, b, nan_rows in zip(("out", "dq", "dk", "dv"), got, want,
                                    (rows, rows, keys, keys)):
        nan_rows = torch.from_numpy(nan_rows)
        print(f"{name}: NaN rows {torch.isnan(a[0, head]).any(-1).nonzero().flatten().tolist()}"
              f", expected {nan_rows.nonzero().flatten().tolist()}")
        assert torch.isnan(a[0, head, nan_rows]).all(), name
        a[0, head, nan_rows] = 0.0
        b[0, head, nan_rows] = 0.0
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b), f"{name}: max difference {(a - b).abs().max().item():.3e}"


@pytest.mark.parametrize("pattern,params", [("full", {}), ("strided", {"stride": 4}),
                                            ("fixed", {"stride": 4, "c": 2})])
def test_the_gpu_way_quarantines_without_looking_and_agrees(pattern, params):
    """On a GPU every call is quarantined (looking for a NaN would wait for the device);
    the same code on the CPU: clean inputs give the unquarantined answer bitwise, bad
    ones the answer of the CPU way (which looks first)."""
    n, H, d = 23, 2, 8
    q, k, v, go = _inputs(n, H, d, torch.float32, seed=3)
    attend = lambda q, k, v: sparse_attention(q, k, v, pattern, backend="structured",
                                              check_finite=False, **params)
    reach = (nonfinite.causal_reach if pattern == "full" else nonfinite.attention_reach(attend))
    for t in (q, k):
        t[0, 1, 9, 2] = float("nan")
        for always in (True, False):
            ins = [x.clone().requires_grad_(True) for x in (q, k, v)]
            out = nonfinite.quarantine(attend, *ins, reach, always=always)
            out.backward(go)
            res = [out.detach(), *(x.grad for x in ins)]
            if always:
                first = res
            else:
                for a, b in zip(first, res):
                    assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
        t[0, 1, 9, 2] = 0.5
    ins = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = nonfinite.quarantine(attend, *ins, reach, always=True)
    assert torch.equal(out, attend(q, k, v))


def test_causal_reach_is_the_attention_reach_of_full_attention():
    n, H = 19, 2
    g = torch.Generator().manual_seed(1)
    bad_keys, bad_rows = (torch.rand(1, H, n, generator=g) < 0.1 for _ in range(2))
    attend = lambda q, k, v: sparse_attention(q, k, v, "full", backend="naive")
    for a, b in zip(nonfinite.causal_reach(bad_keys, bad_rows),
                    nonfinite.attention_reach(attend)(bad_keys, bad_rows)):
        assert torch.equal(a, b)
