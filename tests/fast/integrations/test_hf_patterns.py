"""``fast.integrations.hf`` takes any registered pattern (``fast.patterns``).

Child et al., 2019, sec. 4.2 (p parts) and sec. 4.3; Longformer and BigBird as
neighbours. A tiny random Llama (4 query heads over 2 key/value heads, nothing from the
Hub) on the adapter, for every registered pattern but "full" (held to SDPA in
``test_hf.py``) -- the paper's, the neighbours and "strided3", added to the registry in
two files: float64 logits and parameter gradients equal those of attention over
``reference.patterns.head_masks`` (interleaved layers by ``layer_idx``), and greedy
``generate()`` gives the same tokens with the cache (one query at a time: the one-query
step) as without it, a left-padded prompt those of the prompt alone.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference.params import PATTERNS
from reference.patterns import head_masks

transformers = pytest.importorskip("transformers")
from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig  # noqa: E402

from fast.integrations import hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, N = 61, 37
PARAMS = {"strided": dict(stride=6), "fixed": dict(stride=8, c=2),
          "longformer": dict(window=4, dilation=2, global_tokens=(0, 11)),
          "bigbird": dict(window=3, n_random=2, n_global=1, seed=4),
          "strided3": dict(stride=3)}


def test_every_registered_pattern_has_a_case_here():
    assert set(PARAMS) == set(PATTERNS) - {"full"}


def llama_model(impl: str = "sdpa") -> torch.nn.Module:
    """2 layers, d_model 64, 4 query heads over 2 key/value heads, float64, seeded."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, initializer_range=0.2,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=impl).double().eval()


def reference_impl(pattern: str, combine: str) -> str:
    """An attention function over the reference's masks (SDPA with its boolean mask,
    queries aligned to the end), registered with transformers under a name of its own."""
    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                **kwargs):
        H, n_q, n_k = query.shape[1], query.shape[2], key.shape[2]
        mask = head_masks(pattern, n_k, H, combine, module.layer_idx,
                          **PARAMS[pattern])[:, n_k - n_q:]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=torch.from_numpy(mask),
                                             scale=scaling, enable_gqa=key.shape[1] != H)
        return out.transpose(1, 2).contiguous(), None                   # (B, n_q, H, d)
    name = f"test_patterns_reference_{pattern}_{combine}"
    AttentionInterface.register(name, forward)
    return name


def logits_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return [out.logits.detach()] + [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("combine", ["merged", "multihead", "interleaved"])
@pytest.mark.parametrize("pattern", sorted(PARAMS))
def test_a_registered_pattern_equals_the_reference(pattern, combine):
    model = llama_model()
    ids = torch.randint(0, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation(reference_impl(pattern, combine))
    want = logits_and_grads(model, ids)
    model.set_attn_implementation(hf.register(f"test_patterns_{pattern}_{combine}", pattern,
                                              combine=combine, **PARAMS[pattern]))
    got = logits_and_grads(model, ids)
    err = max(float((a - b).abs().max()) for a, b in zip(got, want))
    print(f"{pattern} {combine}: logits and gradients within {err:.1e}")
    assert err < 1e-10


@pytest.mark.parametrize("pattern", ["strided3", "longformer"])
def test_generate_with_the_cache_gives_the_tokens_without_it(pattern):
    """Greedy, 15 new tokens after prompts of 11 (one left-padded to start at 4: 7 tokens,
    so Longformer's second global token is moved inside it)."""
    params = {**PARAMS[pattern], **({"global_tokens": (0, 5)} if pattern == "longformer"
                                    else {})}
    model = llama_model(hf.register(f"test_patterns_gen_{pattern}", pattern, combine="multihead",
                                    **params))
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    greedy = lambda ids, **kw: model.generate(ids, max_new_tokens=15, do_sample=False,
                                              pad_token_id=0, **kw)
    cached = greedy(ids, attention_mask=mask, use_cache=True)
    rerun = greedy(ids, attention_mask=mask, use_cache=False)
    alone = greedy(ids[1:, 4:], use_cache=True)
    assert torch.equal(cached, rerun)
    assert torch.equal(cached[1, 4:], alone[0])
