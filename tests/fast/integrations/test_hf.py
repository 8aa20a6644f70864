"""``fast.integrations.hf``: sparse attention in Hugging Face transformers models.

Child et al., 2019, section 4 (eq. 2-4: output i attends over a pattern's set S_i) and
4.3 (strided, fixed). Tiny random models built with ``from_config`` (nothing from the
Hub): Llama with grouped-query attention (4 query heads, 2 key/value heads) and GPT-2.

* "full" through the adapter equals transformers' own ``sdpa`` within float32 error
  (flash-attention's rule against a float64 run), logits and parameter gradients;
* "strided" and "fixed" equal attention over ``reference.patterns``' masks (a naive
  float64 attention function registered here), logits and gradients to 1e-10; the
  attention function itself equals ``reference.attention`` on odd sizes with grouped
  heads, padding and fewer queries than keys, forward and backward;
* they train; dropout is applied, not ignored;
* ``generate()`` with the cache gives the tokens of ``generate()`` without it, and a
  left-padded batch the tokens of each prompt alone;
* left- and right-padded batches equal each row run unpadded;
* what the adapter cannot serve raises, naming it.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reference.patterns import head_masks
from tests.conftest import ROOT
from tests.fast.api_helpers import inputs, run, truth, truth_masks

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AttentionInterface,
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
)

from fast.integrations import hf, hf_masks  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, N = 61, 37                       # odd: n is no multiple of any stride below
PATTERNS = {"strided": dict(stride=6), "fixed": dict(stride=8, c=2)}


def llama(**kw) -> LlamaConfig:
    """2 layers, d_model 64, 4 query heads over 2 key/value heads (head size 16)."""
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, initializer_range=0.2,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, **kw)


def gpt2(**kw) -> GPT2Config:
    """2 layers, d_model 48, 4 heads (head size 12); dropout off unless asked."""
    kw = {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, **kw}
    return GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=128,
                      initializer_range=0.2, bos_token_id=None, eos_token_id=None, **kw)


CONFIGS = {"llama": llama, "gpt2": gpt2}


def build(config, impl: str = "sdpa", dtype=torch.float32, seed: int = 0):
    """The model of ``config`` with seeded weights, in evaluation mode."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl)
    return model.to(dtype).eval()


def tokens(B: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, n), generator=torch.Generator().manual_seed(seed))


def logits_and_grads(model, ids, **kw):
    """Logits (B, n, V) and every parameter's gradient of the mean next-token loss."""
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids, **kw)
    out.loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()
             if p.grad is not None}
    return out.logits.detach(), grads


def _reference_attention(pattern, combine, params):
    """An attention function over ``reference.patterns.head_masks``: SDPA with the
    reference's boolean (H, n_q, n_k) mask, queries aligned to the end, in the model's
    dtype (float64 here). No padding: a test of unpadded batches only."""
    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                **kwargs):
        assert attention_mask is None and dropout == 0.0
        H, n_q, n_k = query.shape[1], query.shape[2], key.shape[2]
        mask = head_masks(pattern, n_k, H, combine, module.layer_idx, **params)[:, n_k - n_q:]
        out = F.scaled_dot_product_attention(query, key, value,
                                             attn_mask=torch.from_numpy(mask), scale=scaling,
                                             enable_gqa=key.shape[1] != H)  # (B, H, n_q, d)
        return out.transpose(1, 2).contiguous(), None                       # (B, n_q, H, d)
    return forward


def reference_impl(pattern, combine="merged", **params) -> str:
    name = f"test_reference_{pattern}_{combine}_" + "_".join(f"{k}{v}" for k, v in
                                                            params.items())
    AttentionInterface.register(name, _reference_attention(pattern, combine, params))
    return name


def max_err(a: dict | torch.Tensor, b: dict | torch.Tensor) -> float:
    """The largest |a - b| over a tensor or a dict of tensors, relative to max |b|."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max(max_err(a[k], b[k]) for k in a)
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


# ---------------------------------------------------------------------------------------
# "full" is sdpa
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_full_equals_sdpa_within_float32_error(arch):
    """Logits and parameter gradients: err(adapter, float32) <= 2 err(sdpa, float32) +
    a floor, both against sdpa in float64 (the flash-attention rule)."""
    model = build(CONFIGS[arch]())
    ids = tokens(2, N)
    sdpa = logits_and_grads(model, ids)
    model.set_attn_implementation(hf.register("test_full", "full"))
    ours = logits_and_grads(model, ids)
    model.to(torch.float64).set_attn_implementation("sdpa")
    exact = logits_and_grads(model, ids)
    for what, i in (("logits", 0), ("gradients", 1)):
        err, err_sdpa = max_err(ours[i], exact[i]), max_err(sdpa[i], exact[i])
        print(f"{arch} {what}: adapter {err:.2e}, sdpa {err_sdpa:.2e} (float32 vs float64)")
        assert err <= 2 * err_sdpa + 1e-6


# ---------------------------------------------------------------------------------------
# strided and fixed are the reference's patterns
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["naive", "structured"])
@pytest.mark.parametrize("arch,pattern,combine", [
    ("llama", "strided", "merged"), ("llama", "fixed", "multihead"),
    ("llama", "fixed", "interleaved"), ("gpt2", "strided", "interleaved"),
    ("gpt2", "fixed", "merged")])
def test_patterns_equal_the_reference_masks(arch, pattern, combine, backend):
    """float64 logits and parameter gradients equal those of attention over
    ``reference.patterns.head_masks`` (interleaved: each layer's own, by layer_idx), and
    differ from full attention's (the pattern is not ignored)."""
    params = PATTERNS[pattern]
    model = build(CONFIGS[arch](), dtype=torch.float64)
    ids = tokens(2, N)
    full = logits_and_grads(model, ids)
    model.set_attn_implementation(reference_impl(pattern, combine, **params))
    want = logits_and_grads(model, ids)
    model.set_attn_implementation(hf.register(f"test_{pattern}_{combine}_{backend}", pattern,
                                              combine=combine, backend=backend, **params))
    got = logits_and_grads(model, ids)
    errs = [max_err(got[i], want[i]) for i in (0, 1)]
    print(f"{arch} {pattern} {combine} {backend}: logits {errs[0]:.1e}, gradients "
          f"{errs[1]:.1e}; full differs by {max_err(full[0], want[0]):.1e}")
    assert max(errs) < 1e-10
    assert max_err(full[0], want[0]) > 1e-3


@pytest.mark.parametrize("pad", ["left", "right", "both"])
@pytest.mark.parametrize("pattern,combine", [("strided", "interleaved"),
                                             ("fixed", "multihead")])
def test_attention_function_equals_the_reference(pattern, combine, pad):
    """The registered functions called as a model calls them: 7 queries against 37 keys
    (a cached chunk), 4 query heads over 2 key/value heads, d = 48, layer_idx 1, a padded
    batch -- out, dq, dk, dv against ``reference.attention`` over the reference's masks
    of each sequence at its own positions."""
    params = PATTERNS[pattern]
    name = hf.register(f"test_fn_{pattern}_{combine}", pattern, combine=combine, **params)
    B, H, Hkv, n_q, n_k, d = 3, 4, 2, 7, N, 48
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=3)
    offsets = {"left": [5, 0, 2], "right": [0, 0, 0], "both": [3, 0, 1]}[pad]
    lengths = {"left": [n_k - 5, n_k, n_k - 2], "right": [n_k - 4, n_k, 30],
               "both": [n_k - 6, n_k, 33]}[pad]
    mask2d = torch.zeros(B, n_k, dtype=torch.bool)
    for b, (P, L) in enumerate(zip(offsets, lengths)):
        mask2d[b, P:P + L] = True
    padding = transformers.AttentionMaskInterface._global_mapping[name](
        batch_size=B, q_length=n_q, kv_length=n_k, q_offset=n_k - n_q, attention_mask=mask2d)
    module = torch.nn.Module()
    module.layer_idx, module.is_causal = 1, True
    attend = AttentionInterface._global_mapping[name]
    scale = 0.3

    def fn(q, k, v):
        out, weights = attend(module, q, k, v, padding, scaling=scale)
        assert weights is None and out.shape == (B, n_q, H, d)
        return out.transpose(1, 2)                                       # (B, H, n_q, d)

    got = run(fn, q, k, v, go)
    masks = truth_masks(pattern, B, H, n_q, n_k, combine, 1, lengths, offsets, **params)
    want = truth(q, k, v, go, masks, scale=scale)
    for what, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = float((a - b).abs().max())
        print(f"{pattern} {combine} {pad} {what}: {err:.1e}")
        assert err < 1e-10


# ---------------------------------------------------------------------------------------
# Training and dropout
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_patterns_train(arch, pattern):
    """Six AdamW steps on one batch: the loss falls, every gradient is finite."""
    model = build(CONFIGS[arch](), hf.register(f"test_train_{pattern}", pattern,
                                               **PATTERNS[pattern])).train()
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids, losses = tokens(4, N), []
    for _ in range(6):
        optim.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        optim.step()
        losses.append(loss.item())
    print(f"{arch} {pattern}: losses {np.round(losses, 3).tolist()}")
    assert losses[-1] < losses[0] - 0.1


def test_dropout_is_applied_in_training_and_repeatable():
    """GPT-2's attention dropout reaches ``sparse_attention`` (the naive backend, which
    "auto" takes when dropout is on): training-mode logits differ from evaluation-mode
    ones and repeat under the same seed; a backend without dropout raises."""
    model = build(gpt2(attn_pdrop=0.3), hf.register("test_drop", "strided", stride=6))
    ids = tokens(2, N)
    quiet = model(ids).logits
    model.train()
    torch.manual_seed(7)
    a = model(ids).logits
    torch.manual_seed(7)
    b = model(ids).logits
    assert torch.equal(a, b) and max_err(a, quiet) > 1e-3
    model.set_attn_implementation(hf.register("test_drop_structured", "strided", stride=6,
                                              backend="structured"))
    with pytest.raises(ValueError, match=r"dropout 0.3.*backend 'structured'"):
        model(ids)
    model.eval()                                       # evaluation: no dropout, served
    assert max_err(model(ids).logits, quiet) < 1e-5


# ---------------------------------------------------------------------------------------
# Generation with the cache
# ---------------------------------------------------------------------------------------

def greedy(model, ids, new, **kw):
    return model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("backend", ["auto", "structured"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_generate_with_the_cache_gives_the_tokens_without_it(pattern, arch, backend):
    """Greedy, float64, odd lengths: prompts of 11 tokens (one left-padded to start at
    4) and 15 new ones, with and without the cache; and the padded prompt's tokens are
    those of the prompt alone."""
    model = build(CONFIGS[arch](), hf.register(f"test_gen_{pattern}_{backend}", pattern,
                                               backend=backend, **PATTERNS[pattern]),
                  dtype=torch.float64)
    ids = tokens(2, 11, seed=5)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    cached = greedy(model, ids, 15, attention_mask=mask, use_cache=True)
    rerun = greedy(model, ids, 15, attention_mask=mask, use_cache=False)
    alone = greedy(model, ids[1:, 4:], 15, use_cache=True)
    print(f"{arch} {pattern} {backend}: {cached[:, 11:].tolist()}")
    assert torch.equal(cached, rerun)
    assert torch.equal(cached[1, 4:], alone[0])
    assert len(set(cached[0, 11:].tolist())) > 2           # not one repeated token


# ---------------------------------------------------------------------------------------
# Padded batches
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["naive", "structured"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
@torch.no_grad()
def test_padded_batches_equal_each_row_unpadded(pattern, arch, backend):
    """Left padding (positions from the mask, as generate() makes them), right padding
    and both: each row's logits on its tokens equal the row run alone (float64)."""
    model = build(CONFIGS[arch](), hf.register(f"test_pad_{pattern}_{backend}", pattern,
                                               backend=backend, **PATTERNS[pattern]),
                  dtype=torch.float64)
    ids = tokens(3, N, seed=2)
    runs = {"left": [(5, N - 5), (0, N), (1, N - 1)], "right": [(0, N - 7), (0, N), (0, 30)],
            "both": [(3, N - 9), (0, N), (2, 29)]}
    for pad, rows in runs.items():
        mask = torch.zeros_like(ids)
        for b, (P, L) in enumerate(rows):
            mask[b, P:P + L] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        batch = model(ids, attention_mask=mask, position_ids=positions).logits
        for b, (P, L) in enumerate(rows):
            alone = model(ids[b:b + 1, P:P + L]).logits[0]
            err = float((batch[b, P:P + L] - alone).abs().max())
            assert err < 1e-10, (pad, b, err)


# ---------------------------------------------------------------------------------------
# What is refused
# ---------------------------------------------------------------------------------------

def test_register_checks_its_arguments():
    assert hf.register("test_same", "strided", stride=4) == "test_same"
    assert hf.register("test_same", "strided", stride=4) == "test_same"   # idempotent
    with pytest.raises(ValueError, match=r"'test_same' is registered already.*stride=4.*"
                                         r"stride=5"):
        hf.register("test_same", "strided", stride=5)
    with pytest.raises(ValueError, match="'sdpa' is taken in transformers' attention"):
        hf.register("sdpa", "full")
    with pytest.raises(ValueError, match="'eager' is taken in transformers' attention"):
        hf.register("eager", "full")
    # names transformers rewrites or reads as its own: the pattern would never run
    # ("paged|sdpa" would silently be transformers' sdpa)
    for name in ("paged|sdpa", "paged|test_x", "me/sparse", "me/sparse@v1:fn", "flash_sparse",
                 "my_flash"):
        with pytest.raises(ValueError, match=r"would not reach this attention.*'paged\|'"):
            hf.register(name, "full")
    with pytest.raises(ValueError, match="needs the parameter 'stride'"):
        hf.register("test_bad", "strided")
    with pytest.raises(ValueError, match="unknown pattern|pattern must be"):
        hf.register("test_bad", "diagonal")
    with pytest.raises(ValueError, match="combine must be one of"):
        hf.register("test_bad", "full", combine="sum")
    with pytest.raises(ValueError, match="backend must be one of"):
        hf.register("test_bad", "full", backend="cuda")
    with pytest.raises(ValueError, match="layer_idx is its layer"):
        hf.register("test_bad", "full", layer=1)
    with pytest.raises(ValueError, match="non-empty string"):
        hf.register("", "full")
    assert "test_bad" not in AttentionInterface._global_mapping


@pytest.fixture(scope="module")
def strided_llama():
    return build(llama(), hf.register("test_refuse", "strided", stride=6))


def test_a_4d_mask_that_reads_later_keys_is_refused(strided_llama):
    """A 4D mask given to the model is served (test_hf_dropin.py), unless it lets a query
    read a later key: an additive mask of zeros is bidirectional attention."""
    ids = tokens(2, N)
    mask = torch.zeros(2, 1, N, N)
    with pytest.raises(ValueError, match=r"lets query 0 read a later key \(1\).*every sparse "
                                         r"pattern is causal"):
        strided_llama(ids, attention_mask=mask)
    with pytest.raises(ValueError, match=r"must be 4D, broadcastable to \(batch, heads, "
                                         r"queries, keys\) = \(2, 4, 37, 37\); got a tensor "
                                         r"of shape \(2, 1, 37, 36\)"):
        strided_llama(ids, attention_mask=torch.zeros(2, 1, N, N - 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"entry \(0, 0, 3, 1\) is 1.0, a bias"):
        bias = torch.zeros(2, 1, N, N).masked_fill(~torch.ones(N, N).tril().bool(),
                                                   torch.finfo(torch.float32).min)
        bias[0, 0, 3, 1] = 1.0
        strided_llama(ids, attention_mask=bias)


@pytest.mark.parametrize("config", ["qwen2_moe", "olmo3"])
def test_a_sliding_mask_no_layer_uses_is_not_refused(config):
    """Some models build a sliding-window mask whatever their layers are (Qwen2-MoE with
    no sliding layer, Olmo3 with full-attention layers only): the mask function only keeps
    its arguments, so a mask no layer uses costs nothing, and "full" equals the model's
    own sdpa."""
    from transformers import Olmo3Config, Qwen2MoeConfig
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
    cfg = (Qwen2MoeConfig(**kw) if config == "qwen2_moe"
           else Olmo3Config(layer_types=["full_attention"] * 2, **kw))
    ids = tokens(2, N)
    # float32: the MoE takes no float64; a copy of the config each, since from_config
    # writes the implementation into the config it is given
    model = build(copy.deepcopy(cfg), hf.register("test_unused_window", "full"))
    want = build(copy.deepcopy(cfg), "sdpa")
    assert model.config._attn_implementation == "test_unused_window"
    want.load_state_dict(model.state_dict())
    with torch.no_grad():
        err = (model(ids).logits - want(ids).logits).abs().max().item()
    print(f"{config}: error {err:.2e} against sdpa")
    assert err < 1e-5


def test_cross_attention_is_refused():
    model = build(gpt2(add_cross_attention=True), hf.register("test_refuse_x", "full"))
    with pytest.raises(ValueError, match=r"is_causal=False \(an encoder or cross-attention\)"):
        model(tokens(1, N), encoder_hidden_states=torch.randn(1, 5, 48))


def test_the_attention_function_refuses_what_it_cannot_serve():
    """Called directly, as other models might call it: no mask, a mask that reads later
    keys, non-causal, keys of another length, a keyword it does not know or cannot
    honour, interleaved without a layer."""
    name = hf.register("test_direct", "strided", stride=6, combine="interleaved")
    attend = AttentionInterface._global_mapping[name]
    make_mask = transformers.AttentionMaskInterface._global_mapping[name]
    q, k, v, _ = inputs(1, 2, 2, 5, 5, 8, seed=0)
    module = torch.nn.Module()
    module.layer_idx = 0
    padding = make_mask(batch_size=1, q_length=5, kv_length=5)
    with pytest.raises(ValueError, match="must come from the mask function.*got None"):
        attend(module, q, k, v, None)
    # a mask it cannot serve is refused by the attention that receives it, not when made
    both_ways = make_mask(batch_size=1, q_length=5, kv_length=5,
                          mask_function=transformers.masking_utils.bidirectional_mask_function)
    with pytest.raises(ValueError, match=r"lets query 0 read a later key \(1\)"):
        attend(module, q, k, v, both_ways)
    with pytest.raises(ValueError, match="is_causal=False"):
        attend(module, q, k, v, padding, is_causal=False)
    module.is_causal = False                                  # a cross-attention module
    with pytest.raises(ValueError, match="is_causal=False"):
        attend(module, q, k, v, padding)
    module.is_causal = True
    with pytest.raises(ValueError, match="5 queries against 3 keys.*self-attention"):
        attend(module, q, k[:, :, :3], v[:, :, :3], padding)
    with pytest.raises(ValueError, match="softcap=30.0: attention logit soft-capping"):
        attend(module, q, k, v, padding, softcap=30.0)
    with pytest.raises(ValueError, match="temperature=2.0: it is not an argument"):
        attend(module, q, k, v, padding, temperature=2.0)
    with pytest.raises(ValueError, match=r"s_aux=a tensor of shape \(2,\): attention sinks"):
        attend(module, q, k, v, padding, s_aux=torch.zeros(2))
    with pytest.raises(ValueError, match=r"position_bias=.*additive position bias"):
        attend(module, q, k, v, padding, position_bias=torch.zeros(1, 2, 5, 5))
    with pytest.raises(ValueError, match=r"got sliding_window=3, but the mask the model built "
                                         r"for this layer has no window"):
        attend(module, q, k, v, padding, sliding_window=3)
    # a window wider than every query-key gap of the call cannot matter
    attend(module, q, k, v, padding, sliding_window=5)
    del module.layer_idx
    with pytest.raises(ValueError, match="interleaved.*layer_idx, which is None"):
        attend(module, q, k, v, padding)


def test_a_model_compiles_whole_with_padding_and_positions():
    """torch.compile(fullgraph=True) of a model on the adapter: no graph break, with no
    mask, a left-padded batch (with its position ids, and without: positions from the
    pad), a right-padded one and one with holes; eager's logits on the real tokens; a
    training step. On a backend that takes no attn_mask, eager's errors for a mask with
    holes and for positions that disagree with the padded run (their host reads run
    inside an operator)."""
    torch._dynamo.reset()
    model = build(llama(), hf.register("test_compiled", "strided", stride=6))
    compiled = torch.compile(model, fullgraph=True)
    ids = tokens(2, N)
    left, right = torch.ones(2, N, dtype=torch.long), torch.ones(2, N, dtype=torch.long)
    left[0, :4], right[1, 29:] = 0, 0
    holes = right.clone()
    holes[0, 10] = 0
    shifted = lambda mask: dict(attention_mask=mask,
                                position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    for what, kw in (("none", {}), ("left", shifted(left)), ("right", shifted(right)),
                     ("holes", dict(attention_mask=holes)),
                     ("left, positions from the pad", dict(attention_mask=left))):
        with torch.no_grad():
            want, got = model(ids, **kw).logits, compiled(ids, **kw).logits  # (B, N, V)
        real = kw.get("attention_mask", torch.ones(2, N))[..., None]
        err = ((got - want) * real).abs().max().item()
        print(f"mask {what}: error {err:.2e}")
        assert err < 1e-5
    loss = compiled(ids, attention_mask=right, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert not torch._dynamo.utils.counters["graph_break"]
    model.set_attn_implementation(hf.register("test_compiled_structured", "strided", stride=6,
                                              backend="structured"))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"backend 'structured' runs padding before or "
                                             r"after each sequence only.*row 0 .*pads "
                                             r"between tokens"):
            compiled(ids, attention_mask=holes)
        with pytest.raises(ValueError, match=r"position_ids\[0, 4\] = 4, .*position 0"):
            compiled(ids, attention_mask=left)
    assert not torch._dynamo.utils.counters["graph_break"]
    torch.library.opcheck(hf_masks.refuse_op, (torch.zeros(2, N, dtype=torch.bool),
                                               [torch.arange(N)], "x {index} {values}"))


@pytest.mark.slow
def test_importing_fast_does_not_import_transformers():
    """``import fast`` and ``import fast.integrations`` leave transformers alone; without
    transformers, ``import fast.integrations.hf`` names the extra to install."""
    code = ("import sys, fast, fast.integrations; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    code = ("import sys; sys.modules['transformers'] = None\n"
            "try:\n    import fast.integrations.hf\n"
            "except ImportError as err:\n    print(err)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    assert "needs the optional dependency transformers: pip install -e .[hf]" in out
