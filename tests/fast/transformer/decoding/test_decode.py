"""Incremental decoding against the contract and against re-running the model.

Child et al., 2019, section 4.3 (which keys each head reads), section 5.1
(merged, multi-head and interleaved heads) and section 5.6 (q.k in float32 when
sampling). Three levels, each of which can fail on its own:

* the keys: ``fast.backends.reads.row_mask`` (all five patterns) and the positions a
  cache actually hands to attention at step t (its stores filled with keys that
  encode their own position) equal row t of ``reference.patterns.head_masks``,
  each key once;
* the memory: a fixed-pattern cache keeps (ceil(n / l) c + l) keys per head, a
  strided cache every key, and ``nbytes`` says so;
* the network: the decoder's logits equal ``model(idx)[:, t]`` to 1e-5 (float32)
  for every pattern and combine mode, image and text models, with and without a
  prompt, n not a multiple of the stride, batch 2, odd head widths; and under
  float16 autocast the q.k products stay finite where float16 ones overflow.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fast.backends.reads import head_groups, row_mask
from fast.transformer.config import ModelConfig
from fast.transformer.decoding import cpu_step, decode
from fast.transformer.decoding.decode import Decoder
from fast.transformer.decoding.kv_cache import DenseCache, SparseCache, layer_cache
from fast.transformer.network.devices import autocast
from fast.transformer.network.model import SparseTransformer
from reference import model as ref_model
from reference import patterns

pytestmark = pytest.mark.usefixtures("one_thread")

COMBINES = ("merged", "multihead", "interleaved")


def model_params(pattern: str, heads: int) -> dict:
    """Odd sizes: strided l = 5, fixed l = 6 with c = 2 (three sub-blocks, so four
    heads wrap around to head 0's), full none; strided3 l = 3 (l^3 = 27: its third part
    matters at n = 29)."""
    return {"full": {}, "strided": {"stride": 5}, "fixed": {"stride": 6, "c": 2},
            "strided3": {"stride": 3}}[pattern]


# ----------------------------------------------------------------------------
# The keys.
# ----------------------------------------------------------------------------

NEIGHBOURS = {"longformer": dict(window=3, dilation=2, global_tokens=(0, 7)),
              "bigbird": dict(window=3, n_random=2, n_global=2, seed=3)}


@pytest.mark.parametrize("pattern", patterns.PATTERNS)
@pytest.mark.parametrize("combine", COMBINES)
@pytest.mark.parametrize("heads", [1, 4])
def test_row_mask_is_row_t_of_head_masks(pattern, combine, heads):
    n = 23
    params = NEIGHBOURS.get(pattern) or model_params(pattern, heads)
    for layer in (0, 1):
        masks = patterns.head_masks(pattern, n, heads, combine, layer, **params)      # (H, n, n)
        for t in range(n):
            row = row_mask(pattern, n, heads, combine, layer, t, **params).numpy()
            assert row.shape == (heads, t + 1)
            assert (row == masks[:, t, :t + 1]).all(), (pattern, combine, layer, t)
            assert not masks[:, t, t + 1:].any()                                 # causal


def read_positions(cache, t: int, heads: int) -> list[list[int]]:
    """The positions each head reads at step t, from the cache's own pieces (keys
    hold their position in feature 0); duplicates kept, so a test can see them."""
    out = [[] for _ in range(heads)]
    for group_heads, pieces in cache.pieces(t, {}):
        members = list(range(heads))[group_heads]
        for kt, _, drop in pieces:
            pos = kt[:, 0, :].view(1, len(members), -1)[0]                     # (Hg, m)
            for i, h in enumerate(members):
                keep = torch.ones(pos.shape[1], dtype=torch.bool)
                if isinstance(drop, slice):
                    keep[drop] = False
                elif drop is not None:
                    keep = ~drop[i, 0]
                out[h] += pos[i][keep].round().long().tolist()
    return out


@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("pattern,combine,heads",
                         [(p, c, h) for p in ("full", "strided", "fixed", "strided3")
                          for c in COMBINES for h in (1, 3, 4)])
def test_cache_reads_exactly_row_t(kind, pattern, combine, heads):
    n, dk, dv = 29, 3, 2
    params = model_params(pattern, heads)
    for layer, prompt in itertools.product((0, 1), (1, 8, 13)):
        masks = patterns.head_masks(pattern, n, heads, combine, layer, **params)
        cache = layer_cache(kind, n, heads, dk, pattern, combine, layer, params)
        code = torch.arange(n, dtype=torch.float32)[None, None, :, None].expand(1, heads, n,
                                                                                 dk + dv)
        cache.extend(code[:, :, :prompt].contiguous())                       # the prompt
        for t in range(prompt, n):
            cache.append(t, code[:, :, t:t + 1].contiguous())
            for h, got in enumerate(read_positions(cache, t, heads)):
                want = masks[h, t].nonzero()[0].tolist()
                assert sorted(got) == want, (layer, prompt, t, h, sorted(got), want)


@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("pattern,combine,heads",
                         [(p, c, h) for p in ("full", "strided", "fixed", "strided3")
                          for c in COMBINES for h in (1, 3, 4)])
def test_kernel_plan_writes_and_reads_what_the_cache_does(kind, pattern, combine, heads):
    """The CPU kernel's plan (``LayerCache.plan``): writing position t where it
    says leaves the stores equal to ``append``'s, and the rows it reads, with the
    keep flags, are row t of the contract -- each key once."""
    n, dk, dv = 29, 3, 2
    params = model_params(pattern, heads)
    for layer, prompt in itertools.product((0, 1), (1, 8, 13)):
        masks = patterns.head_masks(pattern, n, heads, combine, layer, **params)
        cache, planned = (layer_cache(kind, n, heads, dk, pattern, combine, layer, params)
                          for _ in range(2))
        code = torch.arange(n, dtype=torch.float32)[None, None, :, None].expand(1, heads, n,
                                                                                 dk + dv)
        cache.extend(code[:, :, :prompt].contiguous())
        planned.extend(code[:, :, :prompt].contiguous())
        for t in range(prompt, n):
            cache.append(t, code[:, :, t:t + 1].contiguous())
            for g, (members, key, _) in enumerate(planned.plan_groups()):
                writes, rows, keep = planned.plan(g, t, {})
                store = planned.stores[key]                           # (1, Hg, rows, dk + dv)
                assert writes.shape == (len(members), 2) and rows.dtype == np.int64
                for i, h in enumerate(members):
                    for row in writes[i][writes[i] >= 0]:
                        store[0, i, row] = t
                    read = store[0, i, rows[keep[i]] if keep is not None else rows, 0]
                    want = masks[h, t].nonzero()[0].tolist()
                    assert sorted(read.long().tolist()) == want, (layer, prompt, t, h)
            for key, store in cache.stores.items():
                assert torch.equal(planned.stores[key], store), (layer, prompt, t, key)


def test_sparse_cache_memory():
    """Fixed keeps ceil(n/l) c + l keys per head; strided every key; dense n."""
    n, l, c, H, dk, dv = 1000, 16, 4, 4, 8, 8
    kv = torch.zeros(2, H, 1, dk + dv)
    per_key = 2 * (dk + dv) * 4                                     # B = 2, float32
    sizes = {}
    for pattern, combine in [("fixed", "merged"), ("fixed", "multihead"), ("strided", "merged"),
                             ("fixed", "interleaved")]:
        params = {"stride": l, "c": c} if pattern == "fixed" else {"stride": l}
        for kind in ("sparse", "dense"):
            cache = layer_cache(kind, n, H, dk, pattern, combine, 1, params)
            cache.append(0, kv)
            sizes[pattern, combine, kind] = cache.nbytes()
    summaries = -(-n // l) * c
    assert sizes["fixed", "merged", "dense"] == H * n * per_key
    assert sizes["fixed", "merged", "sparse"] == H * (summaries + l) * per_key
    # multihead: the two block heads keep the block, the two summary heads their summaries
    assert sizes["fixed", "multihead", "sparse"] == 2 * (summaries + l) * per_key
    # interleaved layer 1 reads only summaries
    assert sizes["fixed", "interleaved", "sparse"] == H * summaries * per_key
    assert sizes["strided", "merged", "sparse"] == sizes["strided", "merged", "dense"]
    assert sizes["fixed", "merged", "sparse"] < sizes["fixed", "merged", "dense"] / 3


def test_head_groups():
    groups = head_groups("fixed", 4, "multihead", 0, stride=6, c=2)
    assert [g.parts for g in groups] == [("block",), ("summary",)]
    assert [list(range(4))[g.heads] for g in groups] == [[0, 2], [1, 3]]
    assert groups[1].summaries == ((4, 6), (2, 4))            # ranks 0 and 1
    # a pattern without laid-out stores is one group read through its rows, at the n its
    # parameters are checked at
    with pytest.raises(ValueError, match="read through its rows of the mask"):
        head_groups("longformer", 2, "merged", 0, window=4)
    (group,) = head_groups("longformer", 2, "merged", 0, n=10, window=4)
    assert group.store() == "all" and group.may_read_nothing
    assert group.rows.at(9, "cpu").shape == (2, 10)
    with pytest.raises(ValueError, match="cache must be one of"):
        layer_cache("paged", 10, 2, 4, "full", "merged", 0, {})
    with pytest.raises(ValueError, match=r"row t must lie in \[0, n=5\)"):
        row_mask("full", 5, 1, "merged", 0, 5)


# ----------------------------------------------------------------------------
# The network: decoder logits against model(idx).
# ----------------------------------------------------------------------------

def tiny_model(pattern: str, combine: str, heads: int, image: bool, seed: int = 0,
               **over) -> SparseTransformer:
    """n = 28 (not a multiple of l = 5 or 6; images 7x2x2), head width 6 (odd
    sizes), three blocks so interleaved layers alternate."""
    fields = dict(vocab_size=13, n_ctx=28, d_model=6 * heads, n_heads=heads, n_layers=3,
                  pattern=pattern, combine=combine, stride=4)
    fields.update(model_params(pattern, heads))
    fields.update(dict(embedding="image", image_shape=(7, 2, 2)) if image else
                  dict(embedding="text"))
    cfg = ModelConfig(**{**fields, **over})
    torch.manual_seed(seed)
    return SparseTransformer(cfg).eval()


def decode_all(model, idx: torch.Tensor, prompt: int, kind: str, **kw) -> torch.Tensor:
    """Logits of positions prompt-1 .. n-1 through a Decoder: (B, n - prompt + 1, V)."""
    dec = Decoder(model, idx.shape[1], kind, **kw)
    assert dec.engine == kw.get("engine", dec.engine)
    out = [dec.prefill(idx[:, :prompt])]
    for t in range(prompt, idx.shape[1]):
        out.append(dec.step(idx[:, t]))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("pattern,combine,heads",
                         [(p, c, h) for p in ("full", "strided", "fixed") for c in COMBINES
                          for h in (1, 4)])
@pytest.mark.parametrize("image", [True, False], ids=["image", "text"])
def test_decoder_logits_equal_rerun(pattern, combine, heads, image):
    model = tiny_model(pattern, combine, heads, image, qk_half=heads == 4)
    idx = torch.randint(0, 13, (2, 28), generator=torch.Generator().manual_seed(1))
    if image:
        idx[:, 0] = 13                                                    # the start token
    with torch.no_grad():
        want = model(idx)                                                 # (2, 28, 13)
    for kind, prompt, engine in itertools.product(("sparse", "dense"), (1, 11),
                                                  ("torch", "numba")):
        got = decode_all(model, idx, prompt, kind, engine=engine)
        err = (got - want[:, prompt - 1:]).abs().max().item()
        assert err < 1e-5, (kind, prompt, engine, err)


@pytest.mark.parametrize("engine", ["numba", "torch"])
@pytest.mark.parametrize("pattern,combine,heads", [("strided", "merged", 1), ("full", "merged", 2),
                                                   ("fixed", "multihead", 2),
                                                   ("fixed", "interleaved", 2)])
def test_decoder_against_the_numpy_reference(engine, pattern, combine, heads):
    """The reference is truth: decoded float32 logits against reference/model.py in
    float64 (n = 23, not a multiple of l = 6; d = 48 with two heads), held to the
    rule for low precision: at most twice the float32 model's own error, plus 1e-6."""
    cfg = ModelConfig(vocab_size=11, n_ctx=23, d_model=24 * heads, n_heads=heads, n_layers=3,
                      pattern=pattern, combine=combine, stride=6,
                      c=2 if pattern == "fixed" else None, embedding="text")
    torch.manual_seed(0)
    model = SparseTransformer(cfg).eval()
    with torch.no_grad():                                   # non-trivial norms and biases
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    idx = torch.randint(0, 11, (2, 23), generator=torch.Generator().manual_seed(3))
    weights = {k: v.double().numpy() for k, v in model.state_dict().items()}
    truth = ref_model.forward(weights, cfg, idx.numpy())                  # (2, 23, 11)
    with torch.no_grad():
        own = np.abs(model(idx).double().numpy() - truth).max()
    got = decode_all(model, idx, 5, "sparse", engine=engine).double().numpy()  # positions 4..
    err = np.abs(got - truth[:, 4:]).max()
    print(f"{pattern} {combine} {engine}: decoder {err:.2e}, float32 model {own:.2e}")
    assert err <= 2 * own + 1e-6


def test_decoder_checks():
    model = tiny_model("strided", "merged", 2, False)
    with pytest.raises(ValueError, match="capacity must be an integer in \\[1, n_ctx=28\\]"):
        Decoder(model, 29)
    with pytest.raises(ValueError, match="cache must be one of"):
        Decoder(model, 10, "paged")
    dec = Decoder(model, 4)
    with pytest.raises(ValueError, match="call prefill first"):
        dec.step(torch.zeros(1, dtype=torch.long))
    dec.prefill(torch.zeros(1, 3, dtype=torch.long))
    dec.step(torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="holds 4 positions; position 4 does not fit"):
        dec.step(torch.zeros(1, dtype=torch.long))
    model.train()
    with pytest.raises(ValueError, match="eval mode"):
        Decoder(model, 4)


def test_decoder_engines():
    """"auto" takes the compiled CPU step for a float32 model on the CPU and the
    PyTorch one under autocast or in float64; asking for "numba" where it cannot
    run, or feeding its step bad tokens, is a clear error, and without Numba
    "auto" falls back to PyTorch."""
    model = tiny_model("fixed", "multihead", 4, True)
    assert Decoder(model, 10).engine == "numba" and Decoder(model, 10, engine="torch").engine \
        == "torch"
    with pytest.raises(ValueError, match="engine must be one of .*'auto', 'numba', 'torch'"):
        Decoder(model, 10, engine="gpu")
    for engine in ("torch", "numba"):                  # the same refusals on both engines
        dec = Decoder(model, 10, engine=engine)
        dec.prefill(torch.full((2, 1), 13))
        for bad, message in ((torch.tensor([3, 99]), r"token ids must lie in \[0, 14\), "
                                                     r"got values in \[3, 99\]"),
                             (torch.tensor([-1, 4]), r"got values in \[-1, 4\]"),
                             (torch.tensor([3]), r"tokens must be \(2,\), one per sequence"),
                             (torch.tensor([1.7, 2.9]), r"integer tensor .*torch.float32")):
            with pytest.raises(ValueError, match=message):
                dec.step(bad)
        assert dec.t == 1
    with autocast("bf16", torch.device("cpu")), \
            pytest.raises(ValueError, match="engine 'numba' computes in float32"):
        dec.step(torch.tensor([3, 4]))
    assert dec.t == 1                                                # nothing was decoded
    auto = Decoder(model, 10)
    auto.prefill(torch.full((2, 1), 13))
    with autocast("bf16", torch.device("cpu")):
        assert torch.isfinite(auto.step(torch.tensor([3, 4]))).all()  # the PyTorch step
    double = tiny_model("fixed", "multihead", 4, True).double()
    assert Decoder(double, 10).engine == "torch"
    with pytest.raises(ValueError, match="engine 'numba' computes in float32, and the model "
                                         "is torch.float64; use engine='torch'"):
        Decoder(double, 10, engine="numba")


def test_auto_engine_hands_long_reads_to_pytorch(monkeypatch):
    """"auto" runs a step whose heads read more than AUTO_MAX_KEYS keys in PyTorch,
    the others compiled; the logits stay those of the re-run model either way."""
    monkeypatch.setattr(cpu_step, "AUTO_MAX_KEYS", 8)
    model = tiny_model("fixed", "merged", 4, False)
    idx = torch.randint(0, 13, (2, 28), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(idx)
    dec = Decoder(model, 28)
    got = [dec.prefill(idx[:, :1])] + [dec.step(idx[:, t]) for t in range(1, 28)]
    assert (torch.stack(got, 1) - want).abs().max().item() < 1e-5
    # fixed l = 6, c = 2: t - (t mod 6) + 2 (t // 6) + ... keys; more than 8 from t = 8 on
    assert 0 < dec.steps["numba"] < 27 and dec.steps["torch"] > 0
    assert dec.steps["numba"] + dec.steps["torch"] == 27
    forced = Decoder(model, 28, engine="numba")
    forced.prefill(idx[:, :1])
    for t in range(1, 28):
        forced.step(idx[:, t])
    assert forced.steps == {"numba": 27, "torch": 0}


def test_decoder_without_numba(monkeypatch):
    real = decode.importlib.util.find_spec
    monkeypatch.setattr(decode.importlib.util, "find_spec",
                        lambda name, *a: None if name == "numba" else real(name, *a))
    model = tiny_model("strided", "merged", 2, False)
    assert Decoder(model, 10).engine == "torch"
    with pytest.raises(ValueError, match=r"engine 'numba' needs Numba \(pip install numba\)"):
        Decoder(model, 10, engine="numba")


@pytest.mark.parametrize("pattern,combine", [("strided", "merged"), ("fixed", "merged"),
                                              ("fixed", "multihead"), ("full", "merged")])
def test_fp32_qk_products_under_fp16_autocast(pattern, combine):
    """Sec. 5.6: q.k products overflow float16 (> 65504) once queries and keys are
    large and aligned (here W_k = W_q, scaled up: every position's score with
    itself is large and positive). The caches compute them in float32, so the
    logits stay finite and close to the float32 model's; the same steps with
    float16 products give NaN (softmax of +inf), which nothing hides."""
    model = tiny_model(pattern, combine, 2, False)
    with torch.no_grad():
        for block in model.blocks:
            attn = block.attn
            attn.k.weight.copy_(attn.q.weight)
            attn.k.bias.copy_(attn.q.bias)
            for p in (attn.q.weight, attn.q.bias, attn.k.weight, attn.k.bias):
                p.mul_(1000.0)
        idx = torch.randint(0, 13, (2, 28), generator=torch.Generator().manual_seed(2))
        model.set_qk_fp32(True)
        want = model(idx)
        x = model.blocks[0].ln1(model.embed(idx))
        q, k, _ = model.blocks[0].attn.project(x)
        largest = ((q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5).max().item()
    print(f"largest scaled q.k = {largest:.3g} (float16 max 65504)")
    assert largest > 65504
    cpu = torch.device("cpu")
    for kind in ("sparse", "dense"):
        with autocast("fp16", cpu):
            good = decode_all(model, idx, 4, kind)
            bad = decode_all(model, idx, 4, kind, qk_fp32=False)
        err = (good - want[:, 3:]).abs().max().item()
        print(f"{kind}: float32 q.k max error {err:.3g}; float16 q.k finite: "
              f"{bool(torch.isfinite(bad).all())}")
        assert torch.isfinite(good).all() and err < 0.05 * want.abs().max().item()
        assert not torch.isfinite(bad).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decoder_on_cuda():
    model = tiny_model("fixed", "multihead", 4, True).cuda()
    idx = torch.randint(0, 13, (2, 28), device="cuda")
    idx[:, 0] = 13
    with torch.no_grad():
        want = model(idx)
    for kind in ("sparse", "dense"):
        got = decode_all(model, idx, 5, kind)
        assert (got - want[:, 4:]).abs().max().item() < 1e-4


def test_dense_and_sparse_cache_classes():
    assert isinstance(layer_cache("dense", 4, 1, 2, "full", "merged", 0, {}), DenseCache)
    assert isinstance(layer_cache("sparse", 4, 1, 2, "full", "merged", 0, {}), SparseCache)
