"""``fast.SparseKVCache`` against the NumPy reference and against re-running attention.

Child et al., 2019, section 4.3 (which keys each head reads), section 5.1 (merged,
multi-head and interleaved heads) and section 5.6 (q.k in float32 when sampling).
Every step's output is row t of ``reference.attention.attend`` over
``reference.patterns.head_masks`` (odd sizes: n = 41, not a multiple of the stride
5 or 6; d = 48; one and four heads; every pattern the sparse mode serves, every
combine mode, both modes; a prompt through ``prefill``, then steps, one or several
positions at a time): float64 to 1e-10, float32 and bfloat16 by the flash-attention
rule (at most twice the error of the reference computed in that dtype, plus a small
floor; both printed). The steps also equal ``sparse_attention`` re-run on the whole
prefix, as a re-running sampler computes them. Then grouped key/value heads, the
neighbours in dense mode, what the cache keeps, autocast, bad input, and the
project's decoder holding these caches.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from fast import SparseKVCache, sparse_attention
from fast.transformer.decoding.decode import Decoder
from fast.transformer.decoding.kv_cache import CACHES
from fast.transformer.decoding.sparse_kv_cache import SparseKVCache as Internal
from reference import patterns
from reference.attention import attend

pytestmark = pytest.mark.usefixtures("one_thread")

N, D = 41, 48

# (pattern, params, combine, heads): a covering set. Fixed l = 6, c = 2 with four
# heads: three sub-blocks, so head 3 wraps round to head 0's; l = 5, c = 2 with one
# summary rank (l need not be a multiple of c then).
CASES = [
    ("full", {}, "merged", 1),
    ("full", {}, "multihead", 4),
    ("strided", {"stride": 5}, "merged", 4),
    ("strided", {"stride": 5}, "multihead", 4),
    ("strided", {"stride": 6}, "interleaved", 1),
    ("strided", {"stride": 4}, "merged", 1),
    ("fixed", {"stride": 6, "c": 2}, "merged", 4),
    ("fixed", {"stride": 6, "c": 2}, "multihead", 4),
    ("fixed", {"stride": 6, "c": 3}, "interleaved", 4),
    ("fixed", {"stride": 5, "c": 2}, "merged", 1),
    ("fixed", {"stride": 5, "c": 2}, "multihead", 2),
]
MODES = ("sparse", "dense")


def qkv(B, H, n, d, seed, dtype=torch.float64, kv_heads=None, dv=None):
    """Seeded q (B, H, n, d), k (B, Hk, n, d), v (B, Hk, n, dv) in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    Hk = kv_heads or H
    shapes = [(B, H, n, d), (B, Hk, n, d), (B, Hk, n, dv or d)]
    return [torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def truth(q, k, v, mask, scale=None) -> torch.Tensor:
    """reference.attention.attend in float64, key/value heads repeated for their query heads."""
    share = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(share, dim=1).numpy() for x in (k, v))
    out, _ = attend(q.double().numpy(), k, v, mask, scale)
    return torch.from_numpy(np.ascontiguousarray(out))                    # (B, H, n, dv)


def run(cache: SparseKVCache, q, k, v, prompt: int, chunks=(1,)) -> torch.Tensor:
    """The prompt through ``prefill`` (none for prompt 0), then ``step`` over chunks of
    the given sizes in turn; returns the steps' outputs, positions prompt..n-1."""
    n, outs, t, i = q.shape[2], [], prompt, 0
    if prompt:
        cache.prefill(k[:, :, :prompt], v[:, :, :prompt])
    assert cache.position == prompt
    while t < n:
        p = min(chunks[i % len(chunks)], n - t)
        outs.append(cache.step(q[:, :, t:t + p], k[:, :, t:t + p], v[:, :, t:t + p]))
        t, i = t + p, i + 1
        assert cache.position == t
    return torch.cat(outs, dim=2)                                         # (B, H, n - prompt, dv)


def layers(combine):
    return (0, 1) if combine == "interleaved" else (0,)


# ----------------------------------------------------------------------------
# Exact against the reference.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern,params,combine,H", CASES)
def test_steps_match_reference_float64(pattern, params, combine, H, mode):
    for layer in layers(combine):
        q, k, v = qkv(2, H, N, D, seed=H + layer + len(params))
        want = truth(q, k, v, patterns.head_masks(pattern, N, H, combine, layer, **params))
        for prompt, chunks in ((1, (1,)), (13, (1,)), (7, (3, 1, 5, 2)), (0, (4, 1))):
            cache = SparseKVCache(pattern, n_heads=H, key_dim=D, capacity=N, combine=combine,
                                  layer=layer, mode=mode, **params)
            got = run(cache, q, k, v, prompt, chunks)
            assert got.dtype == torch.float64 and got.shape == (2, H, N - prompt, D)
            err = (got - want[:, :, prompt:]).abs().max().item()
            assert err < 1e-10, (layer, prompt, chunks, err)


@pytest.mark.parametrize("pattern,params,combine,H", CASES)
def test_steps_equal_sparse_attention_rerun_on_the_prefix(pattern, params, combine, H):
    """What a re-running sampler computes: sparse_attention over positions 0..t,
    its last row, for every t."""
    layer = layers(combine)[-1]
    q, k, v = qkv(1, H, N, D, seed=5)
    cache = SparseKVCache(pattern, n_heads=H, key_dim=D, capacity=N, combine=combine,
                          layer=layer, **params)
    got = run(cache, q, k, v, 3)
    for t in range(3, N):
        rerun = sparse_attention(q[:, :, :t + 1], k[:, :, :t + 1], v[:, :, :t + 1], pattern,
                                 combine=combine, layer=layer, **params)[:, :, t]
        err = (got[:, :, t - 3] - rerun).abs().max().item()
        assert err < 1e-10, (t, err)


@pytest.mark.parametrize("dtype,floor", [(torch.float32, 1e-6), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern,params,combine,H", [CASES[1], CASES[3], CASES[6], CASES[8]])
def test_low_precision_flash_rule(pattern, params, combine, H, mode, dtype, floor):
    """err(cache) <= 2 * err(matmul-softmax-matmul in ``dtype``) + floor, against float64."""
    layer = layers(combine)[-1]
    q, k, v = qkv(2, H, N, D, seed=11, dtype=dtype)
    mask = patterns.head_masks(pattern, N, H, combine, layer, **params)
    want = truth(q, k, v, mask)
    cache = SparseKVCache(pattern, n_heads=H, key_dim=D, capacity=N, combine=combine,
                          layer=layer, mode=mode, **params)
    got = run(cache, q, k, v, 9, (1, 2))
    assert got.dtype == dtype
    m = torch.from_numpy(mask)
    s = (q @ k.transpose(-1, -2)) * (1.0 / D ** 0.5)                      # (B, H, n, n)
    low = torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1).nan_to_num(0.0) @ v
    err_fast = (got.double() - want[:, :, 9:]).abs().max().item()
    err_low = (low[:, :, 9:].double() - want[:, :, 9:]).abs().max().item()
    print(f"{dtype} {pattern} {combine} {mode}: err_cache {err_fast:.3e}  "
          f"err_ref_low {err_low:.3e}")
    assert err_fast <= 2 * err_low + floor


def test_value_width_and_scale():
    """Values narrower than keys, and a scale other than 1 / sqrt(key_dim)."""
    q, k, v = qkv(2, 4, N, D, seed=2, dv=24)
    want = truth(q, k, v, patterns.head_masks("fixed", N, 4, "merged", 0, stride=6, c=2), scale=0.3)
    cache = SparseKVCache("fixed", stride=6, c=2, n_heads=4, key_dim=D, value_dim=24,
                          capacity=N, scale=0.3)
    got = run(cache, q, k, v, 5)
    assert got.shape == (2, 4, N - 5, 24)
    assert (got - want[:, :, 5:]).abs().max().item() < 1e-10


# ----------------------------------------------------------------------------
# Grouped key/value heads, and the neighbours in dense mode.
# ----------------------------------------------------------------------------

# (pattern, params, combine, layer): every query head sharing a key/value head reads
# the same keys, so the sparse mode serves them; fixed l = c has one sub-block.
SHARED = [
    ("full", {}, "merged", 0),
    ("full", {}, "multihead", 0),
    ("strided", {"stride": 5}, "merged", 0),
    ("strided", {"stride": 5}, "interleaved", 1),
    ("fixed", {"stride": 6, "c": 2}, "interleaved", 0),
    ("fixed", {"stride": 4, "c": 4}, "merged", 0),
]
# ... and where they read different keys: the sparse mode refuses, dense serves.
NOT_SHARED = [
    ("strided", {"stride": 5}, "multihead", 0),
    ("fixed", {"stride": 6, "c": 2}, "merged", 0),
    ("fixed", {"stride": 6, "c": 2}, "multihead", 0),
    ("fixed", {"stride": 6, "c": 2}, "interleaved", 1),
]


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("pattern,params,combine,layer,mode",
                         [(*case, "sparse") for case in SHARED]
                         + [(*case, "dense") for case in SHARED + NOT_SHARED])
def test_grouped_key_value_heads(pattern, params, combine, layer, mode, kv_heads):
    """Query head h reads key/value head h // (4 / kv_heads): the reference with k, v
    repeated (repeat_interleave), float64 to 1e-10; the cache keeps kv_heads heads."""
    q, k, v = qkv(2, 4, N, D, seed=kv_heads, kv_heads=kv_heads)
    want = truth(q, k, v, patterns.head_masks(pattern, N, 4, combine, layer, **params))
    cache = SparseKVCache(pattern, n_heads=4, kv_heads=kv_heads, key_dim=D, capacity=N,
                          combine=combine, layer=layer, mode=mode, **params)
    got = run(cache, q, k, v, 6, (1, 3))
    assert (got - want[:, :, 6:]).abs().max().item() < 1e-10
    full = SparseKVCache(pattern, n_heads=4, key_dim=D, capacity=N, combine=combine,
                         layer=layer, mode=mode, **params)
    full.prefill(*qkv(2, 4, 1, D, seed=0)[1:])
    assert cache.nbytes() * 4 == full.nbytes() * kv_heads


@pytest.mark.parametrize("pattern,params,combine,layer", NOT_SHARED)
def test_sparse_mode_refuses_heads_that_read_differently(pattern, params, combine, layer):
    with pytest.raises(ValueError, match=r"kv_heads=2 shares each key/value head between 2 "
                                         r"query heads, but query heads \[0, 1\] of layer "
                                         rf"{layer} read different keys .*mode='dense'"):
        SparseKVCache(pattern, n_heads=4, kv_heads=2, key_dim=D, capacity=N, combine=combine,
                      layer=layer, **params)


@pytest.mark.parametrize("pattern,params", [
    ("longformer", dict(window=3, dilation=2, global_tokens=(0, 7))),
    ("bigbird", dict(window=3, n_random=2, n_global=2, seed=3)),
])
def test_neighbours_in_both_modes(pattern, params):
    """The neighbours in both modes: "dense" masks every key, "sparse" keeps every key and
    reads those its row holds (a pattern without laid-out stores, ``fast.backends.reads``)."""
    q, k, v = qkv(2, 2, N, D, seed=4)
    want = truth(q, k, v, patterns.head_masks(pattern, N, 2, "merged", 0, **params))
    for mode in CACHES:
        cache = SparseKVCache(pattern, n_heads=2, key_dim=D, capacity=N, mode=mode, **params)
        got = run(cache, q, k, v, 4, (1, 2))
        assert (got - want[:, :, 4:]).abs().max().item() < 1e-10, mode


# ----------------------------------------------------------------------------
# What it keeps, its position, autocast.
# ----------------------------------------------------------------------------

def test_what_the_cache_keeps():
    """Fixed keeps ceil(n / l) c + l keys per head, strided every key, dense n; bytes
    of the first tensors' dtype and batch, allocated at the first position."""
    n, l, c, H, B = 1000, 16, 4, 4, 2
    per_key = B * (D + 24) * 2                                            # bfloat16
    sizes = {}
    for pattern, params in (("fixed", dict(stride=l, c=c)), ("strided", dict(stride=l))):
        for mode in MODES:
            cache = SparseKVCache(pattern, n_heads=H, key_dim=D, value_dim=24, capacity=n,
                                  mode=mode, **params)
            assert cache.nbytes() == 0
            k, v = torch.zeros(B, H, 1, D, dtype=torch.bfloat16), torch.zeros(B, H, 1, 24,
                                                                             dtype=torch.bfloat16)
            cache.prefill(k, v)
            sizes[pattern, mode] = cache.nbytes()
    assert sizes["fixed", "sparse"] == H * (-(-n // l) * c + l) * per_key
    assert sizes["fixed", "dense"] == sizes["strided", "sparse"] == H * n * per_key


@pytest.mark.parametrize("copy_of", ["pickle", "deepcopy"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pattern,params,combine,H", [CASES[2], CASES[6], CASES[8]])
def test_a_copied_cache_goes_on_exactly(pattern, params, combine, H, mode, copy_of):
    """A cache copied mid-sequence (handed to another process, kept beside a branch) steps
    on exactly, and apart from the original: its steps read what its own steps wrote
    (pickle used to write the views into the stores as tensors of their own)."""
    layer = layers(combine)[-1]
    q, k, v = qkv(1, H, N, D, seed=7)
    want = truth(q, k, v, patterns.head_masks(pattern, N, H, combine, layer, **params))
    cache = SparseKVCache(pattern, n_heads=H, key_dim=D, capacity=N, combine=combine,
                          layer=layer, mode=mode, **params)
    empty = copy.deepcopy(cache)                               # nothing allocated yet
    cache.prefill(k[:, :, :10], v[:, :, :10])
    copied = pickle.loads(pickle.dumps(cache)) if copy_of == "pickle" else copy.deepcopy(cache)
    for c in (copied, cache, empty):
        if c is empty:
            c.prefill(k[:, :, :10], v[:, :, :10])
        got = torch.cat([c.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
                         for t in range(10, N)], dim=2)
        err = (got - want[:, :, 10:]).abs().max().item()
        assert err < 1e-10, (copy_of, err)


def test_position_and_reset():
    q, k, v = qkv(1, 2, 10, 8, seed=1)
    cache = SparseKVCache("strided", stride=3, n_heads=2, key_dim=8, capacity=10)
    first = run(cache, q, k, v, 4)
    with pytest.raises(ValueError, match="prefill starts a sequence at position 0; this cache "
                                         "is at position 10"):
        cache.prefill(k, v)
    cache.reset()
    assert cache.position == 0 and cache.nbytes() == 0
    again = run(cache, *(x.float() for x in (q, k, v)), 4)               # a new dtype
    assert again.dtype == torch.float32
    assert (again.double() - first).abs().max().item() < 1e-6
    assert "position=10" in repr(cache) and "stride=3" in repr(cache)


def test_step_under_autocast_computes_in_float32():
    """Under bfloat16 autocast the products still run in float32 (sec. 5.6): the same
    bits as without autocast."""
    q, k, v = qkv(2, 4, 20, D, seed=8, dtype=torch.float32)
    outs = []
    for on in (False, True):
        cache = SparseKVCache("fixed", stride=6, c=2, n_heads=4, key_dim=D, capacity=20,
                              combine="multihead")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
            outs.append(run(cache, q, k, v, 5))
    assert outs[1].dtype == torch.float32 and torch.equal(outs[0], outs[1])


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------

def _make(pattern="strided", **over):
    kw = dict(n_heads=4, key_dim=8, capacity=6, stride=3)
    kw.update(over)
    return SparseKVCache(pattern, **kw)


@pytest.mark.parametrize("over,error,message", [
    (dict(mode="paged"), ValueError, r"mode must be one of \('sparse', 'dense'\), got 'paged'"),
    (dict(capacity=0), ValueError, r"capacity must be an integer >= 1, got 0"),
    (dict(key_dim=2.5), ValueError, r"key_dim must be an integer >= 1, got 2.5"),
    (dict(value_dim=0), ValueError, r"value_dim must be an integer >= 1, got 0"),
    (dict(kv_heads=3), ValueError, r"kv_heads must divide n_heads=4 .*got kv_heads=3"),
    (dict(stride=None), ValueError, r"pattern 'strided' needs the parameter 'stride'"),
    (dict(window=4), ValueError, r"pattern 'strided' takes parameters \['stride'\], got "
                                 r"unexpected \['window'\]"),
    (dict(scale=float("nan")), ValueError, r"scale must be a finite real number or None"),
    (dict(combine="stacked"), ValueError, r"combine must be one of"),
    (dict(pattern="dilated"), ValueError, r"pattern must be one of"),
])
def test_bad_arguments(over, error, message):
    with pytest.raises(error, match=message):
        _make(**over)


def _t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize("call,error,message", [
    (lambda c: c.step(_t(1, 4, 1, 8).numpy(), _t(1, 4, 1, 8), _t(1, 4, 1, 8)), TypeError,
     r"q must be a torch.Tensor of shape \(B, 4, p, 8\), got ndarray"),
    (lambda c: c.step(_t(1, 2, 1, 8), _t(1, 4, 1, 8), _t(1, 4, 1, 8)), ValueError,
     r"q must have shape \(B, 4, p, 8\) .*n_heads=4, kv_heads=4, .*got shape \(1, 2, 1, 8\)"),
    (lambda c: c.prefill(_t(1, 4, 2, 7), _t(1, 4, 2, 8)), ValueError,
     r"k must have shape \(B, 4, p, 8\) .*key_dim=8.*got shape \(1, 4, 2, 7\)"),
    (lambda c: c.prefill(_t(4, 2, 8), _t(1, 4, 2, 8)), ValueError,
     r"k must have shape \(B, 4, p, 8\).*got shape \(4, 2, 8\)"),
    (lambda c: c.prefill(_t(1, 4, 2, 8), _t(1, 4, 3, 8)), ValueError,
     r"k, v must share the batch B and the positions p, got k \(1, 4, 2, 8\), v \(1, 4, 3, 8\)"),
    (lambda c: c.step(_t(2, 4, 1, 8), _t(1, 4, 1, 8), _t(1, 4, 1, 8)), ValueError,
     r"q, k, v must share the batch B and the positions p"),
    (lambda c: c.prefill(_t(1, 4, 2, 8, dtype=torch.int64), _t(1, 4, 2, 8)), ValueError,
     r"k has dtype torch.int64; allowed: torch.float64, torch.float32"),
    (lambda c: c.prefill(_t(1, 4, 2, 8), _t(1, 4, 2, 8, dtype=torch.float64)), ValueError,
     r"k, v must have one dtype, got k torch.float32, v torch.float64"),
    (lambda c: c.prefill(_t(1, 4, 2, 8), _t(1, 4, 2, 8).to("meta")), ValueError,
     r"k, v must be on one device, got k cpu, v meta"),
    (lambda c: (c.prefill(_t(1, 4, 2, 8), _t(1, 4, 2, 8)),
                c.step(*[_t(1, 4, 1, 8).to("meta")] * 3)), ValueError,
     r"this cache holds batch 1, dtype torch.float32 on cpu .*got batch 1, dtype "
     r"torch.float32 on meta"),
    (lambda c: c.prefill(_t(1, 4, 0, 8), _t(1, 4, 0, 8)), ValueError,
     r"B and p must be >= 1"),
    (lambda c: c.prefill(_t(1, 4, 7, 8), _t(1, 4, 7, 8)), ValueError,
     r"positions 0..6 do not fit: this cache holds capacity=6 positions \(0..5\) and stands "
     r"at position 0"),
    (lambda c: (c.prefill(_t(1, 4, 5, 8), _t(1, 4, 5, 8)),
                c.step(_t(1, 4, 2, 8), _t(1, 4, 2, 8), _t(1, 4, 2, 8))), ValueError,
     r"positions 5..6 do not fit: this cache holds capacity=6"),
    (lambda c: (c.prefill(_t(1, 4, 2, 8), _t(1, 4, 2, 8)),
                c.step(*[_t(1, 4, 1, 8, dtype=torch.float64)] * 3)), ValueError,
     r"this cache holds batch 1, dtype torch.float32 on cpu \(from its first tensors\), got "
     r"batch 1, dtype torch.float64 on cpu; reset\(\) starts a new sequence"),
    (lambda c: (c.prefill(_t(1, 4, 2, 8), _t(1, 4, 2, 8)),
                c.step(*[_t(3, 4, 1, 8)] * 3)), ValueError,
     r"this cache holds batch 1, .* got batch 3"),
])
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(_make())


def test_a_refused_step_changes_nothing():
    q, k, v = qkv(1, 4, 6, 8, seed=3)
    cache, whole = _make(), _make()
    cache.prefill(k[:, :, :5], v[:, :, :5])
    with pytest.raises(ValueError, match="do not fit"):
        cache.step(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:])
    assert cache.position == 5
    got = cache.step(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:])
    assert torch.equal(got, run(whole, q, k, v, 5))


# ----------------------------------------------------------------------------
# The project's decoder holds these caches.
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["torch", "numba"])
def test_decoder_caches_are_sparse_kv_caches(engine):
    """One class: the decoder's per-block caches are SparseKVCache, and their
    positions follow its steps on either engine."""
    from fast.transformer.config import ModelConfig
    from fast.transformer.network.model import SparseTransformer

    cfg = ModelConfig(vocab_size=11, n_ctx=20, d_model=12, n_heads=2, n_layers=2,
                      pattern="fixed", combine="multihead", stride=6, c=2, embedding="text")
    torch.manual_seed(0)
    dec = Decoder(SparseTransformer(cfg).eval(), 20, engine=engine)
    assert dec.engine == engine and Internal is SparseKVCache
    assert all(isinstance(c, SparseKVCache) for c in dec.caches)
    dec.prefill(torch.zeros(2, 5, dtype=torch.long))
    for _ in range(4):
        dec.step(torch.ones(2, dtype=torch.long))
    assert dec.t == 9 and [c.position for c in dec.caches] == [9, 9]
    assert dec.steps[engine] == 4
