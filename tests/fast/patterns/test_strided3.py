"""The pattern added in two files, "strided3" (p = 3, sec. 4.2), on every generic path.

Child et al., 2019, sec. 4.2 (p parts, "easily extended to higher dimensions") and sec.
5.1 (eq. 6 and 8: A(r mod p), A(h mod p)). The pattern is written in
``fast/patterns/strided3.py`` and ``reference/extensions/strided3.py`` and nowhere else;
here it runs on every path the registry reaches -- ``sparse_attention``'s naive, auto and
Triton backends (the last through the natural-order layout), FlexAttention, the one-query
step, ``fast.SparseKVCache`` in both modes, the model and its decoder -- and is held to its
reference twin on odd sizes (n = 37 > l^3 = 27 for l = 3, so all three parts matter; d =
48; one head and several; every combine mode; grouped key/value heads; padding), forward
and backward (FlexAttention: forward, as PyTorch has no FlexAttention backward on the CPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import SparseKVCache, patterns, sparse_attention
from fast.backends import one_query as row_step
from fast.backends import reads
from fast.backends.flex import flex_sparse_attention
from fast.layout import block_layout
from fast.transformer.config import PATTERNS, ModelConfig
from fast.transformer.decoding.decode import Decoder
from fast.transformer.network.model import SparseTransformer
from reference import model as ref_model
from reference import patterns as reference_patterns
from tests.fast.api_helpers import inputs, run, truth, truth_masks

N, L = 37, 3
PARAMS = {"stride": L}
HEADS = [  # (combine, layer, H): merged; multihead over 4 heads (parts 0, 1, 2, 0);
    ("merged", 0, 1), ("merged", 0, 3), ("multihead", 0, 4),   # each interleaved layer
    ("interleaved", 0, 2), ("interleaved", 1, 2), ("interleaved", 2, 2)]


def check(got, want, tol=1e-10, what=""):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = (a.double() - b).abs().max().item()
        print(f"{what} {name}: {err:.2e}")
        assert err < tol, f"{what} {name}: {err}"


def test_three_parts_each_read_by_its_heads():
    """The twin's masks: each part reads at most l keys per query while n <= l^3, their
    union reaches every j <= i in three hops, a multi-head layer gives head h A(h mod 3)
    and an interleaved model layer r A(r mod 3)."""
    local, column, depth = reference_patterns.factorized("strided3", 27, stride=3)
    assert [int(m.sum(1).max()) for m in (local, column, depth)] == [3, 3, 3]
    reach = local.astype(int)
    for hop in (column, depth):
        reach = (hop.astype(int) @ reach) > 0
    assert reach.sum() == 27 * 28 // 2
    heads = reference_patterns.head_masks("strided3", N, 4, "multihead", **PARAMS)
    parts = reference_patterns.factorized("strided3", N, **PARAMS)
    for h in range(4):
        np.testing.assert_array_equal(heads[h], parts[h % 3])
    # interleaved layers r and r + 3 read alike, and share what is built for them
    assert [patterns.get("strided3").layer_key("interleaved", r) for r in range(7)] == \
        [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("backend", ["naive", "auto"])
@pytest.mark.parametrize("combine,layer,H", HEADS)
def test_self_attention(combine, layer, H, backend):
    q, k, v, go = inputs(2, H, H, N, N, 48, seed=H + layer)
    want = truth(q, k, v, go, truth_masks("strided3", 2, H, N, N, combine, layer, **PARAMS))
    got = run(lambda q, k, v: sparse_attention(q, k, v, "strided3", combine=combine,
                                               layer=layer, backend=backend, **PARAMS),
              q, k, v, go)
    check(got, want, what=f"{backend} {combine}{layer} H={H}")


def test_fewer_queries_padding_and_grouped_heads():
    """7 queries against 37 keys, 4 query heads over 2 key/value heads, a left- and a
    right-padded sequence: each sequence reads its own pattern at its own positions."""
    B, H, Hkv, n_q = 2, 4, 2, 7
    lengths, offsets = [30, N - 4], [5, 0]
    q, k, v, go = inputs(B, H, Hkv, n_q, N, 48, seed=9)
    masks = truth_masks("strided3", B, H, n_q, N, "multihead", 0, lengths, offsets, **PARAMS)
    want = truth(q, k, v, go, masks)
    got = run(lambda q, k, v: sparse_attention(
        q, k, v, "strided3", combine="multihead", enable_gqa=True,
        lengths=torch.tensor(lengths), offsets=torch.tensor(offsets), **PARAMS), q, k, v, go)
    check(got, want, what="padded, grouped")


@pytest.mark.parametrize("combine,layer,H", [("merged", 0, 2), ("multihead", 0, 3),
                                             ("interleaved", 2, 2)])
def test_triton_backend_through_the_natural_layout(combine, layer, H):
    """The Triton kernels (in their CPU interpreter) walk the natural-order layout, the
    pattern's only one: float32 held to the flash-attention rule against float64."""
    pytest.importorskip("triton")
    q, k, v, go = inputs(1, H, H, N, N, 48, seed=3, dtype=torch.float32)
    mask = truth_masks("strided3", 1, H, N, N, combine, layer, **PARAMS)
    want = truth(q, k, v, go, mask)
    plain = run(lambda q, k, v: sparse_attention(q, k, v, "strided3", combine=combine,
                                                 layer=layer, backend="naive", **PARAMS),
                q, k, v, go)
    got = run(lambda q, k, v: sparse_attention(q, k, v, "strided3", combine=combine,
                                               layer=layer, backend="triton", **PARAMS),
              q, k, v, go)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, want, plain):
        err, err_plain = ((x.double() - b).abs().max().item() for x in (a, c))
        print(f"{name}: triton {err:.2e}, naive float32 {err_plain:.2e}")
        assert err <= 2 * err_plain + 1e-5, name


@pytest.mark.parametrize("order", ["natural", "structured"])
@pytest.mark.parametrize("combine,layer,H", HEADS)
def test_layout(combine, layer, H, order):
    """One natural-order part (a pattern without a structured layout has it under either
    order), equal to the reference tile by tile, with block 5 not dividing n."""
    layout = block_layout("strided3", N, H, combine, layer, block_size=5, order=order,
                          **PARAMS)
    assert [p.name for p in layout.parts] == ["natural"]
    want = reference_patterns.head_masks("strided3", N, H, combine, layer, **PARAMS)
    np.testing.assert_array_equal(layout.to_dense().numpy(), want)


def test_the_natural_layout_skips_tiles():
    """At n = 4096, l = 16, block 64 (l^2 = 4 blocks): A(1) and A(2) read the last 256
    positions, key blocks qb - 4 .. qb, and A(3) every 256th, key blocks qb - 4 m: a
    merged head touches exactly those tiles (about a third of the causal ones), and in a
    multi-head layer the local head fewest, the depth head most."""
    nb = 64
    want = sum(1 for qb in range(nb) for kb in range(qb + 1) if qb - kb <= 4 or
               (qb - kb) % 4 == 0)
    merged = block_layout("strided3", 4096, 1, block_size=64, order="natural", stride=16)
    assert merged.parts[0].n_blocks_computed == want < nb * (nb + 1) // 2 * 0.36
    heads = block_layout("strided3", 4096, 3, "multihead", block_size=64, order="natural",
                         stride=16)
    tiles = heads.parts[0].kv_count.sum(1).tolist()                     # per head
    assert tiles == [nb + nb - 1, sum(min(qb + 1, 5) for qb in range(nb)),
                     sum(qb // 4 + 1 for qb in range(nb))]


@pytest.mark.parametrize("combine,layer,H", [("merged", 0, 2), ("multihead", 0, 4),
                                             ("interleaved", 1, 1)])
def test_flex_attention(combine, layer, H):
    q, k, v, go = inputs(1, H, H, N, N, 48, seed=4)
    mask = truth_masks("strided3", 1, H, N, N, combine, layer, **PARAMS)
    want = truth(q, k, v, go, mask)[0]
    got = flex_sparse_attention(q, k, v, "strided3", combine=combine, layer=layer,
                                compile=False, **PARAMS)
    assert (got - want).abs().max().item() < 1e-10
    # 7 queries of a padded batch: the BlockMask made from the mask_mod at every pair
    lengths = torch.tensor([N - 3])
    want = truth(q[:, :, -7:], k, v, go[:, :, -7:], truth_masks(
        "strided3", 1, H, 7, N, combine, layer, lengths=[N - 3], **PARAMS))[0]
    got = flex_sparse_attention(q[:, :, -7:], k, v, "strided3", combine=combine, layer=layer,
                                compile=False, lengths=lengths, **PARAMS)
    assert (got - want).abs().max().item() < 1e-10


@pytest.mark.parametrize("combine,layer,H,Hkv", [("merged", 0, 2, 1), ("multihead", 0, 4, 2),
                                                 ("interleaved", 2, 2, 2)])
def test_one_query_step(combine, layer, H, Hkv, monkeypatch):
    """One query (the last of 37, and of sequences left-padded by 0 and 4) takes the
    one-query step, which gathers the keys its row reads."""
    calls = []
    monkeypatch.setattr(row_step, "head_groups", lambda *a, **kw: calls.append(a) or
                        reads.head_groups(*a, **kw))
    q, k, v, go = inputs(2, H, Hkv, 1, N, 48, seed=5)
    offsets = [0, 4]
    want = truth(q, k, v, go, truth_masks("strided3", 2, H, 1, N, combine, layer,
                                          offsets=offsets, **PARAMS))
    got = run(lambda q, k, v: sparse_attention(
        q, k, v, "strided3", combine=combine, layer=layer, enable_gqa=Hkv != H,
        offsets=torch.tensor(offsets), **PARAMS), q, k, v, go)
    check(got, want, what=f"one query {combine}{layer}")
    assert calls, "the one-query step was not taken"


@pytest.mark.parametrize("mode", ["sparse", "dense"])
@pytest.mark.parametrize("combine,layer,H,Hkv", [("merged", 0, 2, 2), ("multihead", 0, 4, 2),
                                                 ("interleaved", 2, 3, 3)])
def test_sparse_kv_cache(mode, combine, layer, H, Hkv):
    """Prefill 11 positions, then step one at a time and two at a time: each position's
    output equals row t of the reference's attention."""
    q, k, v, _ = inputs(1, H, Hkv, N, N, 48, seed=6)
    share = H // Hkv
    want = truth(q, k, v, torch.zeros_like(q), truth_masks("strided3", 1, H, N, N, combine,
                                                           layer, **PARAMS))[0]
    cache = SparseKVCache("strided3", n_heads=H, kv_heads=Hkv, key_dim=48, capacity=N,
                          combine=combine, layer=layer, mode=mode, **PARAMS)
    cache.prefill(k[:, :, :11], v[:, :, :11])
    outs, t = [], 11
    while t < N:
        p = 1 if t < 24 else 2
        p = min(p, N - t)
        outs.append(cache.step(q[:, :, t:t + p], k[:, :, t:t + p], v[:, :, t:t + p]))
        t += p
    got = torch.cat(outs, 2)
    assert share >= 1 and (got - want[:, :, 11:]).abs().max().item() < 1e-10


def test_the_model_and_its_decoder():
    """The model config takes the pattern (its one parameter is the stride field); the
    model's float32 logits against reference/model.py in float64, and its decoder's
    (sparse and dense caches, both engines) against the model re-run, layer by layer
    interleaved over three layers."""
    assert "strided3" in PATTERNS
    cfg = ModelConfig(vocab_size=11, n_ctx=N, d_model=24, n_heads=2, n_layers=3,
                      pattern="strided3", combine="interleaved", stride=L, embedding="text")
    assert cfg.pattern_params() == PARAMS
    with pytest.raises(ValueError, match="takes no c"):
        ModelConfig(n_ctx=N, d_model=8, n_heads=2, pattern="strided3", stride=3, c=1)
    torch.manual_seed(0)
    model = SparseTransformer(cfg).eval()
    idx = torch.randint(0, 11, (2, N), generator=torch.Generator().manual_seed(3))
    weights = {key: val.double().numpy() for key, val in model.state_dict().items()}
    want = ref_model.forward(weights, cfg, idx.numpy())                  # (2, N, 11)
    with torch.no_grad():
        logits = model(idx)
    assert np.abs(logits.double().numpy() - want).max() < 1e-4
    for kind in ("sparse", "dense"):
        for engine in ("torch", "numba"):
            dec = Decoder(model, N, kind, engine=engine)
            out = [dec.prefill(idx[:, :5])] + [dec.step(idx[:, t]) for t in range(5, N)]
            err = (torch.stack(out, 1) - logits[:, 4:]).abs().max().item()
            assert err < 1e-5, (kind, engine, err)


def test_the_structured_backend_refuses_it_by_name():
    q = torch.zeros(1, 1, 8, 4)
    with pytest.raises(ValueError, match="backend 'structured' serves the patterns"):
        sparse_attention(q, q, q, "strided3", backend="structured", **PARAMS)
