"""sparse_attention called as other models call attention: n_q <= n_k, padding, GQA, masks.

Child et al., 2019, section 4 (eq. 2-4: output i reads the set S_i), section 4.3 (the
patterns) and section 5.1 (heads). Every path is compared with ``reference/`` (NumPy,
float64; ``tests/api_helpers.py``) on odd sizes -- n not a multiple of the stride,
d = 48, one and several heads, n_q in {1, 3, n_k} -- forward and backward (dq, dk, dv):
float64 to 1e-10, low precision by the flash-attention rule (error at most twice the
reference's own in that precision, plus a floor; both printed first).

* queries aligned to the end (query i is position n_k - n_q + i), every pattern;
* grouped key/value heads (query head h reads key/value head h // (H / Hkv));
* padded batches: right padding (``lengths``) and left padding (``offsets``, positions
  shifted per sequence): a padded key is read by nobody, a padded query outputs 0 with
  zero gradients, and a left-padded sequence equals itself unpadded;
* ``attn_mask`` ANDed with the pattern, dropout (exact, given its mask; repeatable),
  ``is_causal``, ``enable_gqa`` and the errors for what a backend cannot honour;
* the one-query step reads only the keys its row allows;
* the naive path refuses, in one line and before allocating, what it cannot hold;
* ``backend="auto"`` chooses by the measured crossover (a synthetic record).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from fast import attention as fast_attention
from fast import sparse_attention
from fast.backends import auto, naive
from fast.measure import crossover as measured
from fast.measure.memory import peak_rss
from reference import patterns
from tests.conftest import ROOT
from tests.fast.api_helpers import inputs, run, truth, truth_masks

pytestmark = pytest.mark.usefixtures("one_thread")

BACKENDS = ["naive", "structured"]

# (pattern, params, combine, H): every piece of the structured plan, both head groups
CASES = [
    ("full", {}, "merged", 1),
    ("strided", {"stride": 5}, "merged", 4),
    ("strided", {"stride": 4}, "multihead", 4),
    ("strided", {"stride": 6}, "interleaved", 1),
    ("fixed", {"stride": 6, "c": 2}, "merged", 4),
    ("fixed", {"stride": 8, "c": 2}, "multihead", 4),
    ("fixed", {"stride": 5, "c": 2}, "merged", 1),                  # c does not divide l
    ("fixed", {"stride": 6, "c": 3}, "interleaved", 2),
]
IDS = [f"{c[0]}-{c[2]}-H{c[3]}-{c[1]}" for c in CASES]


def _call(pattern, params, combine, layer, backend, **kw):
    return lambda q, k, v: sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                                            backend=backend, **params, **kw)


def _compare(got, want, tol, label):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape, f"{label} {name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        err = (a.double() - b).abs().max().item()
        assert err < tol, f"{label} {name}: max error {err:.3e}"


# ----------------------------------------------------------------------------
# Queries aligned to the end, grouped key/value heads
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern,params,combine,H", CASES, ids=IDS)
@pytest.mark.parametrize("n_k", [1, 13, 61])
def test_queries_aligned_to_the_end(pattern, params, combine, H, n_k, backend):
    """n_q in {1, 3, n_k}: the last n_q rows of the reference's masks at n_k, forward and
    backward; layer 1 too where the layer matters."""
    d, B = 48, 2
    for n_q in sorted({1, min(3, n_k), n_k}):
        for layer in ((0, 1) if combine == "interleaved" else (0,)):
            q, k, v, go = inputs(B, H, H, n_q, n_k, d, seed=n_k * 7 + n_q + H)
            mask = truth_masks(pattern, B, H, n_q, n_k, combine, layer, **params)
            want = truth(q, k, v, go, mask)
            got = run(_call(pattern, params, combine, layer, backend), q, k, v, go)
            _compare(got, want, 1e-10, f"n_q={n_q} n_k={n_k} layer {layer}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern,params,combine,H", [c for c in CASES if c[3] > 1],
                         ids=[i for c, i in zip(CASES, IDS) if c[3] > 1])
def test_grouped_key_value_heads(pattern, params, combine, H, backend):
    """Hkv dividing H (enable_gqa=True): query head h reads key/value head h // (H / Hkv);
    dk, dv are the sums over the query heads that share them."""
    d, B, n_k = 48, 2, 29
    for Hkv in [h for h in range(1, H) if H % h == 0]:
        for n_q in (1, 3, n_k):
            q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=Hkv * 5 + n_q)
            mask = truth_masks(pattern, B, H, n_q, n_k, combine, **params)
            want = truth(q, k, v, go, mask)
            got = run(_call(pattern, params, combine, 0, backend, enable_gqa=True), q, k, v, go)
            _compare(got, want, 1e-10, f"Hkv={Hkv} n_q={n_q}")


def test_structured_grouped_heads_take_views_of_k_and_v(monkeypatch):
    """The structured pieces of a grouped call read k and v themselves (views), never a
    copy made per query head: every key tensor a piece gets shares k's storage."""
    from fast.backends.structured import strided

    seen = []
    forward = strided.Column.forward

    def spy(self, q, k, v):
        seen.append(k.untyped_storage().data_ptr())
        return forward(self, q, k, v)

    monkeypatch.setattr(strided.Column, "forward", spy)
    q, k, v, _ = inputs(1, 4, 2, 40, 40, 16, seed=3)
    sparse_attention(q, k, v, "strided", stride=8, backend="structured", enable_gqa=True)
    assert len(seen) == 2                                 # one plan per query head of a pair
    assert set(seen) == {k.untyped_storage().data_ptr()}


# ----------------------------------------------------------------------------
# Padded batches
# ----------------------------------------------------------------------------

PADDING = {  # B = 3: (lengths, offsets)
    "right": ([29, 17, 1], None),
    "left": (None, [0, 12, 28]),
    "both": ([20, 9, 0], [3, 12, 29]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("padding", sorted(PADDING))
@pytest.mark.parametrize("pattern,params,combine,H", CASES, ids=IDS)
def test_padded_batches(pattern, params, combine, H, padding, backend):
    """Each sequence reads its own pattern at its own positions; padded keys are read by
    nobody; padded query rows output 0 with zero gradients."""
    lengths, offsets = PADDING[padding]
    B, n_k, d = 3, 29, 48
    Hkv = 2 if H == 4 else H
    for n_q in (1, 3, n_k):
        q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=n_q + H)
        mask = truth_masks(pattern, B, H, n_q, n_k, combine, lengths=lengths, offsets=offsets,
                           **params)
        want = truth(q, k, v, go, mask)
        got = run(_call(pattern, params, combine, 0, backend, enable_gqa=Hkv != H,
                        lengths=None if lengths is None else torch.tensor(lengths),
                        offsets=offsets), q, k, v, go)
        _compare(got, want, 1e-10, f"{padding} n_q={n_q}")
        rows = ~mask.any(-1)                                     # (B, H, n_q): read nothing
        assert (got[0][torch.from_numpy(rows)] == 0).all()
        assert (got[1][torch.from_numpy(rows)] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern,params", [("strided", {"stride": 4}),
                                            ("fixed", {"stride": 6, "c": 2})])
def test_a_left_padded_sequence_is_itself_unpadded(pattern, params, backend):
    """What a padded batch is for: each sequence's rows equal the same sequence alone."""
    B, H, n, d = 3, 2, 23, 16
    pads = [0, 5, 11]
    q, k, v, _ = inputs(B, H, H, n, n, d, seed=4)
    out = sparse_attention(q, k, v, pattern, offsets=torch.tensor(pads), backend=backend,
                           **params)
    for b, P in enumerate(pads):
        alone = sparse_attention(q[b:b + 1, :, P:], k[b:b + 1, :, P:], v[b:b + 1, :, P:],
                                 pattern, backend=backend, **params)
        assert (out[b:b + 1, :, P:] - alone).abs().max() < 1e-12
        assert (out[b, :, :P] == 0).all()


def test_the_truth_of_a_padded_sequence_is_the_pattern_at_its_length():
    """The helper's rule (a sequence of length L reads the first L rows and columns of the
    masks at n_k) is the reference's masks at L."""
    for pattern, params, combine, H in CASES:
        m = truth_masks(pattern, 1, H, 31, 31, combine, lengths=[19], **params)[0]
        assert np.array_equal(m[:, :19, :19],
                              patterns.head_masks(pattern, 19, H, combine, 0, **params))
        assert not m[:, 19:].any() and not m[:, :, 19:].any()


@pytest.mark.parametrize("change,message", [
    (dict(lengths=torch.tensor([5, 40])), "lengths[1] = 40 is outside [0, n_k = 29]"),
    (dict(offsets=[0, -1]), "offsets[1] = -1"),
    (dict(lengths=[20, 20], offsets=[0, 12]), "n_k - offsets[1] = 17"),
    (dict(lengths=torch.tensor([1.0, 2.0])), "must hold integers"),
    (dict(lengths=torch.tensor([1, 2, 3])), "shape (B,) = (2,)"),
    (dict(offsets=3), "sequence of B integers"),
])
def test_bad_padding_is_named(change, message):
    q = torch.zeros(2, 1, 29, 8)
    with pytest.raises(ValueError) as err:
        sparse_attention(q, q, q, "strided", stride=4, **change)
    assert message in str(err.value), str(err.value)


def test_padding_values_are_read_before_they_move(monkeypatch):
    """Lengths and offsets given on the host are checked there, before they move to the
    attention's device (on a GPU, reading them there would wait for it): the checks see
    them first (order recorded), and ``check_padding`` with a device whose values cannot
    be read at all ("meta") still checks host values and returns them moved."""
    from fast.backends import host_checks
    from fast.backends.padding import check_padding
    seen = []
    check, move = host_checks.check, fast_attention.plan.to_device
    monkeypatch.setattr(host_checks, "check", lambda *a: (seen.append("check"), check(*a)))
    monkeypatch.setattr(fast_attention.plan, "to_device",
                        lambda *a: (seen.append("move"), move(*a))[1])
    q = torch.zeros(2, 1, 29, 8)
    sparse_attention(q, q, q, "strided", stride=4, lengths=[5, 29], check_finite=False)
    assert seen == ["check", "move"]
    meta = torch.device("meta")
    lengths, offsets = check_padding([5, 29], torch.tensor([0, 0]), 2, 29, meta, False)
    assert lengths.device == meta and offsets.device == meta
    with pytest.raises(ValueError, match=r"lengths\[1\] = 30 is outside"):
        check_padding([5, 30], None, 2, 29, meta, False)


# ----------------------------------------------------------------------------
# Low precision by the flash-attention rule
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("pattern,params,combine", [("strided", {"stride": 8}, "merged"),
                                                    ("fixed", {"stride": 8, "c": 2},
                                                     "multihead")])
def test_low_precision_flash_rule(pattern, params, combine, dtype, backend):
    """n_q in {1, 5}, Hkv = 2 of H = 4, left padding: err(fast) <= 2 err(the reference's
    formula in the low dtype) + floor."""
    B, H, Hkv, n_k, d = 2, 4, 2, 75, 48
    offsets = [0, 9]
    for n_q in (1, 5):
        q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=n_q, dtype=dtype)
        mask = torch.from_numpy(truth_masks(pattern, B, H, n_q, n_k, combine, offsets=offsets,
                                            **params))
        want = truth(q, k, v, go, mask.numpy())
        got = run(_call(pattern, params, combine, 0, backend, enable_gqa=True,
                        offsets=offsets), q, k, v, go)

        def plain(a, b, c, mask=mask):          # the reference's formula in ``dtype``
            b, c = b.repeat_interleave(H // Hkv, 1), c.repeat_interleave(H // Hkv, 1)
            s = (a @ b.transpose(-1, -2)) * d ** -0.5
            return torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0) @ c

        low = run(plain, q, k, v, go)
        floor = 1e-3 if dtype == torch.float16 else 8e-3
        for name, a, b, r in zip(("out", "dq", "dk", "dv"), got, want, low):
            assert a.dtype == dtype
            err_fast = (a.double() - b).abs().max().item()
            err_low = (r.double() - b).abs().max().item()
            print(f"{dtype} {pattern} n_q={n_q} {name}: err_fast {err_fast:.3e}  "
                  f"err_ref_low {err_low:.3e}")
            assert err_fast <= 2 * err_low + floor, name


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("n_q,n_k", [(20, 20), (300, 300), (1, 300)])   # auto's both sides
def test_under_autocast_every_backend_casts_as_sdpa_does(backend, n_q, n_k):
    """Under torch.autocast, float32 inputs are cast to the autocast dtype as SDPA casts
    them: the output is bfloat16 and the same bits as the call on bfloat16 inputs, on
    every backend (the naive path's SDPA used to run in bfloat16 and the structured
    path in float32, so a layer's precision jumped at auto's crossover; the one-query
    step's float32 products were autocast to bfloat16); the gradients reach the float32
    inputs; float64 is not cast."""
    q, k, v, go = inputs(1, 4, 2, n_q, n_k, 48, seed=3, dtype=torch.float32)
    call = _call("strided", {"stride": 8}, "merged", 0, backend, enable_gqa=True)

    def autocast(a, b, c):                  # the forward under autocast, the backward not
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert F.scaled_dot_product_attention(a, a, a).dtype == torch.bfloat16  # the rule
            return call(a, b, c)

    got = run(autocast, q, k, v, go.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wide = call(q.double(), k.double(), v.double())
    want = run(call, *(t.bfloat16() for t in (q, k, v, go)))
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], want[0])
    for a, b in zip(got[1:], want[1:]):                       # grads: cast back, unrounded
        assert a.dtype == torch.float32 and torch.equal(a, b.float())
    assert wide.dtype == torch.float64


# ----------------------------------------------------------------------------
# The one-query step
# ----------------------------------------------------------------------------

class _Largest(TorchDispatchMode):
    """The largest tensor any operation allocates (views of its inputs aside), in
    elements."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves(
            (args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("pattern,params,combine,reads", [
    ("strided", {"stride": 64}, "merged", 64 + 4096 // 64),
    ("strided", {"stride": 64}, "multihead", 64),
    ("fixed", {"stride": 64, "c": 8}, "merged", 64 + 4096 // 64 * 8),
])
def test_the_one_query_step_reads_only_its_keys(pattern, params, combine, reads):
    """At n_k = 4097 no operation of a one-query step makes a tensor larger than the keys
    its row reads (about l + n / l for strided), however many keys there are; the dense
    masked row (naive) makes n_k-sized ones."""
    B, H, n_k, d = 1, 2, 4097, 8
    q, k, v, _ = inputs(B, H, H, 1, n_k, d, seed=1, dtype=torch.float32)
    with _Largest() as mode:
        sparse_attention(q, k, v, pattern, combine=combine, backend="auto",
                         check_finite=False, **params)
    print(f"{pattern} {combine}: largest tensor {mode.largest} elements, k has {k.numel()}")
    assert mode.largest <= B * H * 2 * reads * d
    with _Largest() as mode:
        sparse_attention(q, k, v, pattern, combine=combine, backend="naive",
                         check_finite=False, **params)
    assert mode.largest >= n_k * H


# ----------------------------------------------------------------------------
# attn_mask, dropout, is_causal, enable_gqa
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("offsets", [None, [0, 5]])
@pytest.mark.parametrize("shape", [(2, 1, 1, 29), (1, 4, 3, 29), (3, 29), (2, 4, 3, 29)])
def test_attn_mask_is_anded_with_the_pattern(shape, offsets):
    """A boolean attn_mask of any shape that broadcasts to (B, H, n_q, n_k), on the naive
    backend and through "auto"; with left padding it is still read at the tensors'
    indices, not at the shifted positions (``truth_masks`` ANDs it by index)."""
    B, H, n_q, n_k, d = 2, 4, 3, 29, 48
    params = {"stride": 6, "c": 2}
    g = torch.Generator().manual_seed(5)
    user = torch.rand(shape, generator=g) < 0.6
    q, k, v, go = inputs(B, H, 2, n_q, n_k, d, seed=6)
    mask = truth_masks("fixed", B, H, n_q, n_k, "multihead", attn_mask=user.numpy(),
                       offsets=offsets, **params)
    want = truth(q, k, v, go, mask)
    for backend in ("naive", "auto"):
        got = run(_call("fixed", params, "multihead", 0, backend, attn_mask=user,
                        enable_gqa=True, offsets=offsets), q, k, v, go)
        _compare(got, want, 1e-10, f"{backend} attn_mask {shape}")


@pytest.mark.parametrize("backend", ["structured", "triton"])
@pytest.mark.parametrize("arg,value,message", [
    ("attn_mask", torch.ones(9, 9, dtype=torch.bool), "attn_mask is honoured by backend "
                                                      "'naive' only"),
    ("dropout_p", 0.1, "dropout_p > 0 is honoured by backend 'naive' only"),
])
def test_what_a_backend_cannot_honour_is_named(backend, arg, value, message):
    q = torch.zeros(1, 2, 9, 8)
    with pytest.raises(ValueError, match=message):
        sparse_attention(q, q, q, "strided", stride=4, backend=backend, **{arg: value})


@pytest.mark.parametrize("change,message", [
    (dict(attn_mask=torch.ones(9, 9)), "attn_mask must be a bool tensor"),
    (dict(attn_mask=torch.ones(2, 9, dtype=torch.bool)), "does not broadcast"),
    (dict(attn_mask=torch.ones(1, 1, 1, 9, 9, dtype=torch.bool)), "does not broadcast"),
    (dict(dropout_p=1.0), "dropout_p must be a number in [0, 1)"),
    (dict(dropout_p=-0.1), "dropout_p must be a number in [0, 1)"),
    (dict(is_causal=False), "is_causal=False is not taken"),
    (dict(is_causal=1), "is_causal must be True or False"),
    (dict(enable_gqa="yes"), "enable_gqa must be True or False"),
])
def test_bad_sdpa_arguments_are_named(change, message):
    q = torch.zeros(1, 2, 9, 8)
    with pytest.raises(ValueError) as err:
        sparse_attention(q, q, q, "strided", stride=4, **change)
    assert message in str(err.value), str(err.value)


def test_shapes_beyond_self_attention_are_checked():
    q, kv = torch.zeros(1, 4, 9, 8), torch.zeros(1, 2, 9, 8)
    with pytest.raises(ValueError, match="needs enable_gqa=True, as in scaled_dot_product"):
        sparse_attention(q, kv, kv, "full")
    with pytest.raises(ValueError, match="key/value heads must divide the query heads"):
        sparse_attention(q, torch.zeros(1, 3, 9, 8), torch.zeros(1, 3, 9, 8), "full",
                         enable_gqa=True)
    with pytest.raises(ValueError, match="n_q=9 > n_k=5"):
        sparse_attention(q, q[:, :, :5], q[:, :, :5], "full")
    with pytest.raises(ValueError, match="the batch B and width d must agree"):
        sparse_attention(q, torch.zeros(2, 4, 9, 8), torch.zeros(2, 4, 9, 8), "full")
    assert sparse_attention(q, q, q, "full", is_causal=True).shape == q.shape


def test_dropout_is_exact_given_its_mask_and_repeatable():
    """The naive path's dropout: the reference with the same kept weights (drawn by
    ``naive.dropout_keep`` under the same seed), forward and backward; the same seed gives
    bitwise the same result, another seed another one; about 1 - p of the weights kept."""
    B, H, Hkv, n_q, n_k, d, p = 2, 4, 2, 5, 37, 48, 0.3
    params = {"stride": 5}
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=8)
    fn = _call("strided", params, "merged", 0, "naive", dropout_p=p, enable_gqa=True)
    torch.manual_seed(11)
    got = run(fn, q, k, v, go)
    torch.manual_seed(11)
    keep = naive.dropout_keep((B, H, n_q, n_k), p, "cpu").numpy()
    mask = truth_masks("strided", B, H, n_q, n_k, **params)
    want = truth(q, k, v, go, mask, keep=keep, dropout_p=p)
    _compare(got, want, 1e-10, "dropout")
    print(f"kept {keep.mean():.3f} of the weights (p = {p})")
    assert abs(keep.mean() - (1 - p)) < 0.05
    torch.manual_seed(11)
    again = run(fn, q, k, v, go)
    torch.manual_seed(12)
    other = run(fn, q, k, v, go)
    for a, b, c in zip(got, again, other):
        assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(11)                      # "auto" takes the naive path for dropout
    auto_got = run(_call("strided", params, "merged", 0, "auto", dropout_p=p,
                         enable_gqa=True), q, k, v, go)
    assert auto_got[0].shape == q.shape
    for name, a, b in zip(("out", "dq", "dk", "dv"), auto_got, got):
        assert torch.equal(a, b), f"auto {name}: not the naive path's dropout"


@pytest.mark.parametrize("pattern,params,n", [("full", {}, 16),
                                              ("strided", {"stride": 32}, 1024)])
def test_auto_takes_the_naive_path_for_attn_mask_and_dropout(pattern, params, n):
    """Where "auto" would take the structured backend ("full" at any n; strided beyond the
    measured crossover), an attn_mask or dropout sends it to the naive backend, the one
    that honours them: the naive backend's answer bitwise, forward and backward, dropout
    drawn under the same seed."""
    q, k, v, go = inputs(1, 2, 2, n, n, 8, seed=4, dtype=torch.float32)
    assert fast_attention.resolve_backend("auto", pattern, q.device, q.dtype, n,
                                          stride=params.get("stride"),
                                          backward=True) == "structured"
    user = torch.rand(n, n, generator=torch.Generator().manual_seed(5)) < 0.7
    plain = run(_call(pattern, params, "merged", 0, "auto"), q, k, v, go)
    for label, kw in (("attn_mask", {"attn_mask": user}), ("dropout", {"dropout_p": 0.5})):
        got = {}
        for backend in ("auto", "naive"):
            torch.manual_seed(7)
            got[backend] = run(_call(pattern, params, "merged", 0, backend, **kw), q, k, v, go)
        for name, a, b, c in zip(("out", "dq", "dk", "dv"), got["auto"], got["naive"], plain):
            assert torch.equal(a, b), f"{label}: auto {name} is not the naive backend's"
            assert not torch.equal(a, c), f"{label}: auto {name} is the plain answer"


# ----------------------------------------------------------------------------
# Keywords, nested tensors
# ----------------------------------------------------------------------------

def test_unknown_keywords_are_named_as_such():
    q = torch.zeros(1, 2, 9, 8)
    with pytest.raises(TypeError) as err:
        sparse_attention(q, q, q, "strided", stride=4, key_padding_mask=torch.ones(1, 9))
    message = str(err.value)
    assert "unexpected keyword argument 'key_padding_mask'" in message
    assert "lengths=" in message and "offsets=" in message
    with pytest.raises(TypeError, match="unexpected keyword arguments 'attention_mask', 'foo'"):
        sparse_attention(q, q, q, "strided", stride=4, attention_mask=None, foo=1)
    # a parameter of another pattern still reads as a pattern error
    with pytest.raises(ValueError, match=r"pattern 'strided' takes parameters \['stride'\], "
                                         r"got unexpected \['window'\]"):
        sparse_attention(q, q, q, "strided", stride=4, window=3)


def test_nested_tensors_are_refused_clearly():
    nested = torch.nested.nested_tensor([torch.zeros(2, 5, 8), torch.zeros(2, 7, 8)],
                                        layout=torch.jagged)
    with pytest.raises(ValueError, match="q is a nested .jagged. tensor.*lengths="):
        sparse_attention(nested, nested, nested, "strided", stride=4)


# ----------------------------------------------------------------------------
# Non-finite values with the check off
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_reaches_only_the_rows_that_read_it(backend):
    """With check_finite=False, n_q < n_k, grouped heads and left padding: a NaN key
    reaches exactly the query rows that read it; a NaN in a padded key reaches none."""
    B, H, Hkv, n_q, n_k, d = 2, 4, 2, 6, 31, 8
    params, offsets = {"stride": 5}, [0, 7]
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=9)
    mask = truth_masks("strided", B, H, n_q, n_k, offsets=offsets, **params)
    fn = _call("strided", params, "merged", 0, backend, enable_gqa=True, offsets=offsets,
               check_finite=False)
    for b, pos in ((0, 27), (1, 3)):                           # (1, 3) is a padded key
        bad = k.clone()
        bad[b, 1, pos, 0] = float("nan")
        got = run(fn, q, bad, v, go)
        rows = torch.zeros(B, H, n_q, dtype=torch.bool)
        rows[b, 2:4] = torch.from_numpy(mask[b, 2:4, :, pos])    # query heads of kv head 1
        assert torch.equal(torch.isnan(got[0]).any(-1), rows), (b, pos)
        clean = run(fn, q, k, v, go)[0]
        assert torch.equal(got[0][~rows], clean[~rows])


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("n_q", [1, 6])                       # the one-query step, and not
def test_a_nan_in_padding_reaches_nothing(backend, n_q):
    """With check_finite=False and right padding, a NaN in a padded query row, key or
    value changes nothing: padded rows output 0 with zero gradients, every number equals
    the call with a finite value there. (The one-query step gave NaN gradients to q, k
    and v of its padded row, and the naive path NaN to a padded query holding a NaN.)"""
    B, H, Hkv, n_k, d = 2, 4, 2, 11, 8
    lengths = [n_k, n_k - 3]                                   # sequence 1: 3 padded rows
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=10)
    fn = _call("strided", {"stride": 4}, "merged", 0, backend, enable_gqa=True,
               lengths=lengths, check_finite=False)
    clean = run(fn, q, k, v, go)
    for which, at in (("q", (1, 2, n_q - 1, 0)), ("k", (1, 1, n_k - 1, 3)),
                      ("v", (1, 0, n_k - 2, 1))):
        bad = {"q": q, "k": k, "v": v}
        bad[which] = bad[which].clone()
        bad[which][at] = float("nan")
        got = run(fn, bad["q"], bad["k"], bad["v"], go)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, clean):
            assert torch.equal(a, b), (which, name)
    assert torch.equal(clean[0][1, :, n_q - 1], torch.zeros(H, d))   # a padded row: 0


# ----------------------------------------------------------------------------
# The naive path's size guard
# ----------------------------------------------------------------------------

def test_the_naive_path_refuses_what_it_cannot_hold_before_allocating(monkeypatch):
    """n = 30,000 of Longformer on the CPU ("auto" takes the naive path): with 4 GiB
    available, one line saying how much it would hold and what to use instead, and
    nothing of that size allocated."""
    monkeypatch.setattr(naive, "available_bytes", lambda device: 4 << 30)
    n = 30_000
    q = torch.zeros(1, 1, n, 4)
    with peak_rss() as peak:
        with pytest.raises(ValueError) as err:
            sparse_attention(q, q, q, "longformer", window=8)
    message = str(err.value)
    print(message)
    assert "\n" not in message and "backend 'naive' would hold about" in message
    assert "backend='triton'" in message and "flex_sparse_attention" in message
    if peak["peak_bytes"] is not None:
        assert peak["peak_bytes"] < 256 << 20
    with pytest.raises(ValueError, match="attn_mask are honoured by the naive path only"):
        sparse_attention(q, q, q, "strided", stride=128, backend="naive",
                         attn_mask=torch.ones(1, n, dtype=torch.bool))
    # "auto" below the crossover takes the structured path when the naive one cannot
    # hold the call
    monkeypatch.setattr(naive, "available_bytes", lambda device: 1 << 10)
    monkeypatch.setattr(naive, "SMALL", 0)
    monkeypatch.setattr(auto, "crossovers", lambda: {"strided": {"8": {"fwd": 10**6,
                                                                     "fb": 10**6}}})
    small = torch.randn(1, 1, 40, 4, dtype=torch.float64)
    assert fast_attention.resolve_backend("auto", "strided", torch.device("cpu"), n=40,
                                          stride=8) == "naive"
    monkeypatch.setattr(fast_attention.paths, "naive_sparse_attention", None)     # not called
    out = sparse_attention(small, small, small, "strided", stride=8)
    want = sparse_attention(small, small, small, "strided", stride=8, backend="structured")
    assert torch.equal(out, want)


# ----------------------------------------------------------------------------
# "auto" by the measured crossover
# ----------------------------------------------------------------------------

def _synthetic(ns, cross, naive_scale=1.0):
    """Times of a sweep in which the structured path overtakes the naive one at ``cross``:
    naive ~ n^2, structured ~ n^1.5, equal at ``cross``."""
    naive_s = [naive_scale * (n / cross) ** 2 for n in ns]
    structured_s = [naive_scale * (n / cross) ** 1.5 for n in ns]
    return naive_s, structured_s


def test_the_crossover_chosen_keeps_auto_within_five_percent_of_the_best():
    """``fast.measure.crossover.choose`` on synthetic times (one crossing, noise, a tie
    band, a path that always wins): the n it returns makes auto at most 5% slower than
    the faster path at every measured n, or says that none does."""
    ns = [64, 128, 256, 512, 1024, 2048, 4096]
    for cross in (100, 300, 1000, 5000, 30):
        naive_s, structured_s = _synthetic(ns, cross)
        X, regret = measured.choose(ns, naive_s, structured_s)
        picked = [naive_s[i] if n < X else structured_s[i] for i, n in enumerate(ns)]
        best = [min(a, b) for a, b in zip(naive_s, structured_s)]
        worst = max(p / b - 1 for p, b in zip(picked, best))
        print(f"crossing at {cross}: X = {X}, regret {regret:.3f}")
        assert abs(worst - regret) < 1e-12 and regret <= 0.05
        if cross > ns[-1]:
            assert X == ns[-1] + 1
        if cross < ns[0]:
            assert X == ns[0]
    # noise that crosses back and forth within 3%: still one switch within 5%
    naive_s = [1.0, 1.0, 1.0, 1.0]
    structured_s = [1.03, 0.98, 1.02, 0.5]
    X, regret = measured.choose([1, 2, 3, 4], naive_s, structured_s)
    assert regret <= 0.05
    # no single switch can do: reported, not hidden
    X, regret = measured.choose([1, 2, 3], [1.0, 2.0, 1.0], [2.0, 1.0, 2.0])
    assert regret > 0.05


def test_the_crossover_report_names_every_entry_over_the_tolerance():
    """What ``python -m fast bench --crossover`` prints ends with the entries whose regret
    is over the tolerance, or "none"."""
    from fast.experiments.bench import crossover_report

    entry = lambda fwd, fb: {"fwd": 256, "regret_fwd": fwd, "fb": 512, "regret_fb": fb}
    data = {"config": {"B": 1, "H": 4, "d": 64, "dtype": "float32", "threads": 2,
                       "tolerance": 0.05},
            "crossover": {"strided": {"16": entry(0.0, 0.0), "128": entry(0.092, 0.01)},
                          "fixed": {"64": entry(0.01, 0.153)}}}
    text = crossover_report(data)
    print(text)
    assert text.splitlines()[-1] == ("  over the tolerance of 5%: strided l=128 fwd (9.2%), "
                                     "fixed l=64 fb (15.3%)")
    data["crossover"] = {"strided": {"16": entry(0.0, 0.05)}}
    assert crossover_report(data).splitlines()[-1] == "  over the tolerance of 5%: none"


def test_auto_follows_its_crossovers(monkeypatch, tmp_path):
    """The crossovers in force are followed: the pass (a backward or not), the nearest
    measured stride, n_q < n_k by the model of ``fast.backends.auto``; a record the
    benchmark writes is read back as such, and a damaged one is one sentence naming the
    file. (This test read the record from figures/data before the crossovers became
    constants of the package: the choices asserted are the same.)"""
    record = {"crossover": {"strided": {"16": {"fwd": 300, "fb": 500},
                                        "64": {"fwd": 900, "fb": 700}}}}
    path = tmp_path / "auto_cpu.json"
    path.write_text(json.dumps(record))
    table = measured.read_record(path)
    assert table == record["crossover"]
    monkeypatch.setattr(auto, "crossovers", lambda: table)
    cpu = torch.device("cpu")
    choose = lambda n, stride, backward=False, n_q=None, pattern="strided": \
        fast_attention.resolve_backend("auto", pattern, cpu, torch.float32, n, n_q=n_q,
                                       stride=stride, backward=backward)
    assert choose(299, 16) == "naive" and choose(300, 16) == "structured"
    assert choose(499, 16, backward=True) == "naive"
    assert choose(500, 16, backward=True) == "structured"
    assert choose(800, 48) == "naive"                # nearest measured stride: 64
    assert choose(800, 23) == "structured"           # nearest: 16
    assert choose(4096, 16, n_q=30) == "naive"       # 30^2 < 300 * 4096
    assert choose(4096, 16, n_q=1200) == "structured"
    assert choose(100, 16, pattern="fixed") == "structured"   # no crossover for it
    assert choose(100, 16, n_q=1) == "structured"    # the one-query step
    q = torch.randn(1, 2, 200, 8)
    calls = []
    monkeypatch.setattr(fast_attention.paths, "naive_sparse_attention",
                        lambda *a, **kw: calls.append("naive") or torch.zeros_like(q))
    sparse_attention(q, q, q, "strided", stride=16)
    assert calls == ["naive"]
    path.write_text('{"crossover": {"strided": {"16": {"fwd": "many"}}}}')
    with pytest.raises(ValueError, match="auto_cpu.json does not hold auto's crossovers"):
        measured.read_record(path)


@pytest.mark.parametrize("strides", [(16, 32, 64, 128, 256), (16, 64), (8,), (3, 5, 100)])
def test_the_nearest_measured_stride_is_nearest_in_log2_ties_to_the_smaller(strides):
    """``auto.nearest`` decides in integers (a traced stride guards on them); it is the
    log2 rule the module docstring states, at every stride up to 4096."""
    pairs = tuple((s, 10 * s) for s in strides)
    for stride in range(1, 4097):
        want = min(strides, key=lambda s: (abs(np.log2(s) - np.log2(stride)), s))
        assert auto.nearest(pairs, stride) == 10 * want, stride
    assert auto.nearest(((16, 1), (64, 2)), 32) == 1                     # the tie: smaller
    assert auto.nearest((), 32) is None and auto.nearest(pairs, None) is None


def test_the_crossovers_are_the_committed_measurement():
    """``fast.backends.crossovers.CROSSOVERS`` are the crossovers of the measurement in
    figures/data/auto_cpu.json: a record re-measured (``python -m fast bench
    --crossover``, ``make bench``) and not adopted, or constants edited by hand, fail
    here, with the constants the record proposes."""
    from fast.backends.crossovers import CROSSOVERS

    path = ROOT / "figures" / "data" / "auto_cpu.json"
    if not path.is_file():
        pytest.skip(f"no {path} (not a source checkout)")
    table = measured.read_record(path)
    assert table == CROSSOVERS, (f"{path} and fast/backends/crossovers.py differ: adopt the "
                                 f"measurement with\n{measured.proposal(table)}\nor restore "
                                 f"the record (git checkout {path.relative_to(ROOT)})")
    source = (ROOT / "fast" / "backends" / "crossovers.py").read_text()
    assert measured.proposal(CROSSOVERS) in source          # what the command prints, pasted


def test_a_damaged_record_changes_nothing_the_library_does(tmp_path):
    """A checkout whose figures/data/auto_cpu.json is damaged (cut short by a full disk,
    a merge gone wrong): the library read it at run time, so every auto call on the
    CPU raised ValueError, train and sample included. Now auto's crossovers are
    constants: the same choice, no file read."""
    for package in ("fast", "reference"):
        subprocess.run(["cp", "-r", str(ROOT / package), str(tmp_path / package)], check=True)
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    data = tmp_path / "figures" / "data"
    data.mkdir(parents=True)
    (data / "auto_cpu.json").write_text((ROOT / "figures/data/auto_cpu.json").read_text()[:300])
    probe = ("import torch, fast; from fast.attention import resolve_backend; "
             "q = torch.randn(1, 2, 100, 16); "
             "fast.sparse_attention(q, q, q, 'strided', stride=16); "
             "print(fast.__file__, [resolve_backend('auto', 'strided', torch.device('cpu'), "
             "torch.float32, n, stride=16) for n in (32, 64, 4096)])")
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    print(run.stdout, run.stderr[-1500:])
    assert run.returncode == 0
    assert run.stdout.startswith(str(tmp_path / "fast"))
    assert run.stdout.rstrip().endswith("['naive', 'structured', 'structured']")
