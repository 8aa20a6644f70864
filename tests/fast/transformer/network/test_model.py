"""fast/transformer/network/model.py and config.py: config errors, shapes, init (sec. 6),
recomputation exactness (sec. 5.4), the sparse and masked paths, attention weights."""

import dataclasses
import math

import pytest
import torch

from fast.backends import masks as masks_torch
from fast.transformer.config import PRESETS, ModelConfig, preset
from fast.transformer.network.block import gelu
from fast.transformer.network.model import SparseTransformer

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=13, n_ctx=19, d_model=24, n_heads=2, n_layers=2,
                pattern="strided", stride=5, embedding="text")
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("kw, words", [
    (dict(d_model=25, n_heads=2), "divisible by n_heads"),
    (dict(d_model=24, n_heads=8, qk_half=True), "qk_half"),
    (dict(pattern="dense"), "pattern must be one of"),
    (dict(combine="sum"), "combine must be one of"),
    (dict(stride=None), "needs a stride"),
    (dict(stride=0), "stride"),
    (dict(pattern="fixed", c=None), "summary width c"),
    (dict(pattern="fixed", c=6), "at most the stride"),
    (dict(pattern="fixed", stride=6, c=4), "multiple of c"),
    (dict(c=2), "takes no c"),
    (dict(embedding="image", image_shape=(4, 4, 1)), "n_ctx must equal"),
    (dict(embedding="image", image_shape=None), "image_shape"),
    (dict(dropout=1.0), "dropout"),
    (dict(n_layers=0), "n_layers"),
    (dict(attention_impl="fast"), "attention_impl"),
])
def test_bad_config_raises(kw, words):
    with pytest.raises(ValueError, match=words):
        tiny(**kw)


def test_presets_valid_and_overridable():
    assert {"quick", "quick_text", "digits", "cifar10", "enwik8", "imagenet64"} <= set(PRESETS)
    m, t = preset("quick", n_layers=1, max_iters=5)
    assert m.n_layers == 1 and t.max_iters == 5
    assert PRESETS["quick"][0].n_layers != 1           # the preset itself is untouched
    m, _ = preset("enwik8")
    assert (m.n_layers, m.n_heads, m.d_model, m.stride, m.c, m.n_ctx) == \
        (30, 8, 512, 128, 32, 12288)
    with pytest.raises(ValueError, match="unknown config fields"):
        preset("quick", n_layer=3)
    with pytest.raises(ValueError, match="preset must be one of"):
        preset("nope")


def test_forward_shapes_and_input_errors():
    torch.manual_seed(0)
    model = SparseTransformer(tiny())
    x = torch.randint(0, 14, (3, 19))
    assert model(x).shape == (3, 19, 13)
    assert model(x[:, :7]).shape == (3, 7, 13)         # shorter prefixes work (sampling)
    with pytest.raises(ValueError, match="sequence length"):
        model(torch.zeros(1, 20, dtype=torch.long))
    with pytest.raises(ValueError, match="LongTensor"):
        model(torch.zeros(1, 5))
    with pytest.raises(ValueError, match="ModelConfig"):
        SparseTransformer({"d_model": 8})


def test_gelu_is_the_papers_sigmoid_approximation():
    x = torch.linspace(-4, 4, 9, dtype=torch.float64)
    assert torch.allclose(gelu(x), x / (1 + torch.exp(-1.702 * x)))


def test_init_statistics():
    """Sec. 6: std 0.125/sqrt(d_in); W_2, W_p also / sqrt(2N); position tables
    0.125/sqrt(d n_emb); biases 0; W_out drawn like the other weights by default (the
    checks on untrained models in these tests rely on it: their logits, and every
    gradient, depend on every weight), and 0 with output_init="zero", sec. 6's "The
    weight matrix for the output logits was initialized to 0", the rest unchanged."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, n_ctx=3072, d_model=256, n_heads=2, n_layers=3,
                      pattern="strided", stride=96, embedding="image",
                      image_shape=(32, 32, 3), ff_mult=4)
    assert cfg.output_init == "normal"
    model = SparseTransformer(cfg)
    torch.manual_seed(0)
    paper = SparseTransformer(dataclasses.replace(cfg, output_init="zero"))
    assert torch.count_nonzero(paper.head.weight) == 0                    # W_out = 0
    x = torch.randint(0, 256, (1, 40))
    assert torch.count_nonzero(paper(x)) == 0             # uniform predictions before training
    drawn, zero = model.state_dict(), paper.state_dict()
    assert all(torch.equal(drawn[k], zero[k]) for k in drawn if k != "head.weight")
    with pytest.raises(ValueError, match="output_init"):
        ModelConfig(output_init="zeros")
    d, N = 256, 3
    expect = {
        "embed.tok.weight": 0.125 / math.sqrt(d),
        "embed.pos.0.weight": 0.125 / math.sqrt(d * 3),
        "blocks.0.attn.q.weight": 0.125 / math.sqrt(d),
        "blocks.1.ff.fc1.weight": 0.125 / math.sqrt(d),
        "blocks.1.ff.fc2.weight": 0.125 / math.sqrt(4 * d) / math.sqrt(2 * N),
        "blocks.2.attn.proj.weight": 0.125 / math.sqrt(d) / math.sqrt(2 * N),
        "head.weight": 0.125 / math.sqrt(d),
    }
    params = dict(model.named_parameters())
    for name, std in expect.items():
        got = params[name].std().item()
        print(name, got, std)
        assert abs(got / std - 1) < 0.1, name
    for name, p in params.items():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        if "ln" in name and name.endswith("weight"):
            assert torch.all(p == 1), name


def _loss_and_grads(cfg, x, y, seed):
    torch.manual_seed(0)
    model = SparseTransformer(cfg).train()
    torch.manual_seed(seed)                           # dropout masks
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("pattern, combine", [("strided", "merged"), ("fixed", "interleaved")])
def test_recomputation_is_exact_with_dropout(pattern, combine):
    cfg = tiny(pattern=pattern, combine=combine, c=1 if pattern == "fixed" else None,
               dropout=0.3, n_layers=3)
    x = torch.randint(0, 14, (2, 19))
    y = torch.randint(0, 13, (2, 19))
    loss_a, grads_a = _loss_and_grads(cfg, x, y, seed=7)
    loss_b, grads_b = _loss_and_grads(dataclasses.replace(cfg, recompute=True), x, y, seed=7)
    loss_c, _ = _loss_and_grads(cfg, x, y, seed=8)
    assert loss_c != loss_a                                       # dropout really is on
    assert torch.equal(loss_a, loss_b)
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], rtol=0, atol=1e-7), name


def test_recomputation_keeps_only_block_inputs_in_eval_mode_too():
    """recompute=True checkpoints every block whenever autograd records, in eval mode as
    in train mode (a saliency map through model.eval() kept every activation): far less
    kept, the same gradients."""
    from fast.measure.memory import count_saved
    cfg = tiny(dropout=0.0, n_layers=3)
    x = torch.randint(0, 14, (2, 19))
    kept, grads = {}, {}
    for recompute in (False, True):
        torch.manual_seed(0)
        model = SparseTransformer(dataclasses.replace(cfg, recompute=recompute)).eval()
        with count_saved(model.parameters()) as log:
            loss = model(x).square().mean()
            kept[recompute] = log.activation_bytes
        loss.backward()
        grads[recompute] = [p.grad for p in model.parameters()]
    print(kept)
    assert kept[True] * 3 < kept[False]
    assert all(torch.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(*grads.values()))


@pytest.mark.parametrize("pattern, combine, c", [
    ("full", "merged", None), ("strided", "merged", None), ("strided", "multihead", None),
    ("strided", "interleaved", None), ("fixed", "merged", 1), ("fixed", "multihead", 1),
    ("fixed", "interleaved", 1)])
def test_sparse_path_equals_masked_path(pattern, combine, c):
    cfg = tiny(pattern=pattern, combine=combine, c=c, n_heads=2, qk_half=(pattern == "strided"))
    torch.manual_seed(0)
    model = SparseTransformer(cfg).double().eval()
    masked = SparseTransformer(dataclasses.replace(cfg, attention_impl="masked")).double().eval()
    masked.load_state_dict(model.state_dict())
    x = torch.randint(0, 14, (2, 19))
    assert torch.allclose(model(x), masked(x), rtol=0, atol=1e-10)


def test_return_attention_weights_follow_the_masks():
    cfg = tiny(pattern="fixed", combine="multihead", c=1, n_heads=2, n_layers=2)
    torch.manual_seed(0)
    model = SparseTransformer(cfg).eval()
    x = torch.randint(0, 14, (1, 19))
    logits, weights = model(x, return_attention=True)
    assert torch.allclose(logits, model(x), atol=1e-5)
    assert len(weights) == 2
    for layer, w in enumerate(weights):
        assert w.shape == (1, 2, 19, 19)
        mask = masks_torch.head_masks("fixed", 19, 2, "multihead", layer, stride=5, c=1)
        assert torch.all(w[0][~mask] == 0)
        reads = mask.any(-1)
        sums = w[0].sum(-1)
        assert torch.allclose(sums[reads], torch.ones_like(sums[reads]), atol=1e-5)
        assert torch.all(sums[~reads] == 0)                        # empty rows: zeros, not NaN


def test_bf16_autocast_and_qk_fp32():
    torch.manual_seed(0)
    model = SparseTransformer(tiny(pattern="fixed", c=1)).eval()
    x = torch.randint(0, 14, (2, 19))
    ref = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(x).float()
        model.set_qk_fp32(True)
        mixed = model(x).float()
        model.set_qk_fp32(False)
    assert torch.isfinite(low).all() and torch.isfinite(mixed).all()
    assert (low - ref).abs().max() < 0.1 and (mixed - ref).abs().max() < 0.1


@pytest.mark.parametrize("name, millions", [("cifar10", 59), ("enwik8", 95), ("imagenet64", 152)])
def test_paper_presets_have_table1_parameter_counts(name, millions):
    """Table 1: 59M (CIFAR-10), 95M (Enwik8), 152M (ImageNet 64x64); built on the meta device."""
    m, _ = preset(name)
    with torch.device("meta"):
        model = SparseTransformer(m)
    got = model.num_params() / 1e6
    print(name, got)
    assert abs(got / millions - 1) < 0.02


@pytest.mark.parametrize("idx,words", [
    (torch.tensor([[1, 2, 99]]), r"token ids must lie in \[0, 14\), got values in "
                                 r"\[1, 99\] \(13 is the start token\)"),
    (torch.tensor([[-1, 2, 3]]), r"got values in \[-1, 3\]"),
    (torch.zeros(0, 5, dtype=torch.long), r"at least one sequence \(B >= 1\), got shape "
                                          r"\(0, 5\)"),
    (torch.zeros(1, 0, dtype=torch.long), r"sequence length must be in \[1, n_ctx=19\], "
                                          r"got 0"),
    (torch.zeros(1, 3), r"idx must be a LongTensor"),
])
def test_bad_idx_is_named(idx, words):
    """Ids outside the embedding (a -1 would silently read the start token's row), an
    empty batch or sequence, a float tensor: one clear ValueError each."""
    model = SparseTransformer(tiny())
    with pytest.raises(ValueError, match=words):
        model(idx)
    top = torch.tensor([[model.cfg.vocab_size, 0]])                       # the start token
    assert model(top).shape == (1, 2, model.cfg.vocab_size)
