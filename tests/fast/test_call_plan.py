"""sparse_attention's call plan: made once per signature, bounded, and every error still fires.

Child et al., 2019, section 4 (eq. 2-4): a call of ``fast.sparse_attention`` is checked
and its path decided once per call signature (``fast.attention.CallPlan``); later calls
of that signature run only the value checks asked for and the path. These tests hold
the promise that goes with it: a repeated call makes no new plan, the plans kept are
bounded (least recently used dropped first), and bad input gets the same clear error on
a signature whose plan is kept as on a fresh one -- a NaN after a clean call, padding
values outside the keys, and an argument whose value equals a good one's but whose
type does not (a stride of 4.0 after 4). Before the plan there was nothing to reuse:
every call ran every check.
"""

from __future__ import annotations

import pytest
import torch

import fast.attention as fast_attention
from fast import sparse_attention
from fast.core.checks import NonFiniteInput
from tests.fast.api_helpers import inputs, run, truth, truth_masks


@pytest.fixture
def plans_made(monkeypatch):
    """The plans made while a test runs, counted."""
    made = []
    init = fast_attention.CallPlan.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(fast_attention.CallPlan, "__init__", spy)
    return made


def _call(q, k=None, v=None, **kw):
    k = q if k is None else k
    v = q if v is None else v
    return sparse_attention(q, k, v, "strided", **{"stride": 4, **kw})


def test_a_repeated_call_makes_no_new_plan(plans_made):
    """The same signature twice: one plan; a change of anything a plan depends on (n,
    dtype, requires_grad, grad mode, a keyword, the strides): a new one."""
    q = torch.randn(1, 2, 29, 8)
    first = _call(q)
    assert torch.equal(_call(q), first) and len(plans_made) == 1
    _call(torch.randn(1, 2, 30, 8))
    _call(q.double())
    _call(q.clone().requires_grad_(True))
    with torch.no_grad():
        _call(q.clone().requires_grad_(True))
    _call(q, combine="multihead")
    _call(torch.randn(1, 2, 8, 29).transpose(-1, -2))      # rows not contiguous
    assert len(plans_made) == 7
    for _ in range(3):                                      # each of them again: kept
        _call(q)
        _call(q.double())
    assert len(plans_made) == 7 and fast_attention.call_plans() == 7


def test_the_plans_kept_are_bounded_least_recently_used_first(monkeypatch, plans_made):
    monkeypatch.setattr(fast_attention.plan, "MAX_CALL_PLANS", 3)
    qs = [torch.randn(1, 1, n, 4) for n in range(20, 25)]
    for q in qs:
        _call(q)
    assert fast_attention.call_plans() == 3 and len(plans_made) == 5
    _call(qs[2])                          # kept (one of the last three): no new plan
    assert len(plans_made) == 5
    _call(qs[0])                          # dropped: made anew, and qs[3] dropped for it
    assert len(plans_made) == 6 and fast_attention.call_plans() == 3
    _call(qs[4])
    _call(qs[2])
    assert len(plans_made) == 6
    _call(qs[3])
    assert len(plans_made) == 7


def _message(fn) -> tuple[type, str]:
    with pytest.raises((ValueError, TypeError)) as err:
        fn()
    return err.type, str(err.value)


BAD = {  # what goes wrong after a good call of the same signature, or of a neighbour
    "nan in k": lambda q, bad: _call(q, k=bad),
    "lengths outside the keys": lambda q, bad: _call(q, lengths=torch.tensor([29, 30])),
    "offsets outside the keys": lambda q, bad: _call(q, offsets=[0, 30]),
    "a stride of 4.0": lambda q, bad: _call(q, stride=4.0),
    "a stride of 0": lambda q, bad: _call(q, stride=0),
    "is_causal=1": lambda q, bad: _call(q, is_causal=1),
    "a NaN scale": lambda q, bad: _call(q, scale=float("nan")),
    "k in another dtype": lambda q, bad: _call(q, k=q.double()),
    "check_finite='yes'": lambda q, bad: _call(q, check_finite="yes"),
    "an unknown keyword": lambda q, bad: _call(q, key_padding_mask=None),
    "a float attn_mask": lambda q, bad: _call(q, backend="naive",
                                              attn_mask=torch.zeros(29, 29)),
}
GOOD = {
    "nan in k": {}, "lengths outside the keys": {"lengths": torch.tensor([29, 20])},
    "offsets outside the keys": {"offsets": [0, 3]}, "a stride of 4.0": {},
    "a stride of 0": {}, "is_causal=1": {}, "a NaN scale": {"scale": 0.5},
    "k in another dtype": {}, "check_finite='yes'": {"check_finite": True},
    "an unknown keyword": {}, "a float attn_mask": {"backend": "naive",
                                                    "attn_mask": torch.ones(29, 29).bool()},
}


@pytest.mark.parametrize("what", list(BAD))
def test_each_error_fires_on_a_kept_plan_as_on_a_fresh_one(what):
    """A good call first (its plan kept), then the bad one: the same error type and
    message as the bad call gets in a fresh process (no plan kept), every time."""
    q = torch.randn(2, 2, 29, 8)
    bad = q.clone()
    bad[1, 0, 3, 5] = float("nan")
    fresh = _message(lambda: BAD[what](q, bad))
    fast_attention.clear_call_plans()
    _call(q, **GOOD[what])
    for _ in range(2):
        assert _message(lambda: BAD[what](q, bad)) == fresh
    assert fresh[0] is not NonFiniteInput or "k holds non-finite values" in fresh[1]


def test_a_nan_after_a_clean_call_is_refused_by_name():
    """The CPU default (check_finite on): a clean call, then a NaN in v, raises
    NonFiniteInput naming v; then the clean call runs again."""
    q = torch.randn(1, 2, 29, 8)
    clean = _call(q)
    bad = q.clone()
    bad[0, 1, 7, 2] = float("inf")
    with pytest.raises(NonFiniteInput, match="^v holds non-finite values"):
        _call(q, v=bad)
    assert torch.equal(_call(q), clean)


@pytest.mark.parametrize("backend", ["naive", "structured"])
def test_kept_plans_give_the_reference_on_every_layout(backend):
    """One shape, three layouts in turn, twice each (three plans, each reused): the
    reference's out, dq, dk, dv every time (n_q < n_k, grouped heads)."""
    B, H, Hkv, n_q, n_k, d = 2, 4, 2, 20, 37, 16
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=3)
    want = truth(q, k, v, go, truth_masks("strided", B, H, n_q, n_k, stride=5))
    layouts = {
        "contiguous": lambda t: t,
        "heads last": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
        "rows not contiguous": lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2),
    }
    for _ in range(2):
        for name, layout in layouts.items():
            got = run(lambda a, b, c, f=layout: sparse_attention(
                f(a), f(b), f(c), "strided", stride=5, backend=backend, enable_gqa=True),
                q, k, v, go)
            for part, a, b in zip(("out", "dq", "dk", "dv"), got, want):
                assert (a - b).abs().max().item() < 1e-10, f"{name} {part}"


def test_every_path_the_choice_names_has_one_binder_taking_the_same_arguments():
    """``choose_path`` names a path of ``PATHS`` for every backend, pattern and query
    count, and every binder takes the same arguments, so the plan binds each path
    alike (a binder out of step would fail only on its own path, at its first call)."""
    import inspect

    from fast.attention.paths import BACKENDS, PATHS, choose_path
    from reference.params import PARAMS

    signatures = {name: list(inspect.signature(bind).parameters) for name, bind in
                  PATHS.items()}
    assert len({tuple(s) for s in signatures.values()}) == 1, signatures
    cpu = torch.device("cpu")
    chosen = set()
    for backend in BACKENDS:
        for pattern in PARAMS:
            params = {"stride": 4, "c": 1} if pattern in ("strided", "fixed", "strided3") \
                else {}
            for n_q, n_k in ((1, 40), (40, 40), (3, 3)):
                try:
                    which = choose_path(backend, pattern, "merged", params, cpu,
                                        torch.float32, 1, 2, n_q, n_k, backward=False,
                                        attn_mask=False, dropout=False, padded=False)
                except ValueError:                # refused by name: not a path
                    continue
                assert which in PATHS, (backend, pattern, n_q, which)
                chosen.add(which)
    assert chosen == set(PATHS), chosen
