"""``fast.integrations.hf`` as a drop-in for ``attn_implementation="sdpa"``.

Child et al., 2019, section 4 (eq. 2-4: output i attends over a pattern's set S_i) and
4.3 (the strided and fixed patterns, made of positions). What transformers hands an
attention implementation, served as sdpa serves it (tiny random models from
``from_config``, float64 unless said):

* keywords: ``Trainer`` fine-tunes a tiny Llama with each pattern (it adds
  ``num_items_in_batch`` to every step); the loss's keywords change nothing; packed
  sequences given by ``cu_seq_lens_*`` or ``seq_idx`` each read only themselves;
* every mask transformers builds or is given -- holes, left padding with and without
  shifted position ids, packed position ids, 4D boolean and additive masks: "full" equals
  sdpa; "strided" and "fixed" equal ``reference.attention`` over ``reference.patterns``'
  masks read at the model's position ids, ANDed with sdpa's own mask -- for whole models
  and for the attention function (forward and backward, with cached keys, a static
  cache's empty slots, a sliding window, a 4D mask);
* every cache ``generate()`` uses: static, dynamic and none give the same tokens (and
  "full" sdpa's); Mistral's default window is served; a window that matters is
  composed with the pattern, past the window too;
* ``output_attentions``: a warning and no weights, as from sdpa;
* ``torch.compile(fullgraph=True)``: logits and ``generate()`` equal eager's, one graph
  each, no break.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.attention import attend
from reference.patterns import head_masks
from tests.fast.api_helpers import inputs, run, truth
from tests.fast.integrations.test_hf import (
    CONFIGS,
    PATTERNS,
    VOCAB,
    N,
    build,
    greedy,
    llama,
    max_err,
    tokens,
)

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AttentionInterface,
    AttentionMaskInterface,
    MistralConfig,
    Trainer,
    TrainingArguments,
)
from transformers.masking_utils import (  # noqa: E402
    sdpa_mask,
    sliding_window_causal_mask_function,
)

from fast.integrations import hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FULL = hf.register("test_dropin_full", "full")
CASES = [("strided", "merged"), ("fixed", "multihead"), ("strided", "interleaved")]


def mistral(**kw) -> MistralConfig:
    """Mistral as ``llama()``; its sliding window: the config's default unless given."""
    return MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, initializer_range=0.2,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, **kw)


def register(pattern: str, combine: str = "merged") -> str:
    params = PATTERNS.get(pattern, {})
    return hf.register(f"test_dropin_{pattern}_{combine}", pattern, combine=combine, **params)


def reference_at_positions(pattern: str, combine: str = "merged") -> str:
    """An attention implementation of the truth: ``reference.attention.attend`` over
    ``reference.patterns.head_masks`` read at the model's position ids (queries and keys
    alike: calls without a cache), ANDed with the mask sdpa is given (transformers' own
    ``sdpa_mask``, registered as its mask function, or the 4D mask given to the model)."""
    params = PATTERNS[pattern]
    name = f"test_truth_{pattern}_{combine}"

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                position_ids=None, **kwargs):
        B, H, n, _ = query.shape
        assert key.shape[2] == n and dropout == 0.0
        pos = position_ids.expand(B, n).numpy()
        whole = head_masks(pattern, int(pos.max()) + 1, H, combine, module.layer_idx,
                           **params)                                         # (H, m, m)
        reads = whole[:, pos[:, :, None], pos[:, None, :]].transpose(1, 0, 2, 3)
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        share = H // key.shape[1]
        k, v = (np.repeat(t.double().numpy(), share, axis=1) for t in (key, value))
        out, _ = attend(query.double().numpy(), k, v, reads & allowed.numpy(),
                        scale=scaling)                                       # (B, H, n, d)
        return torch.from_numpy(out).to(query.dtype).transpose(1, 2), None  # (B, n, H, d)

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(
        name, lambda **kw: sdpa_mask(**{**kw, "allow_is_causal_skip": False}))
    return name


def counted(mask: torch.Tensor) -> torch.Tensor:
    """The position ids generate() gives a 2D mask: the real tokens before each."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def mask_cases(B: int = 3) -> dict:
    """Keyword arguments of a forward pass over (B, N) tokens, one per kind of mask."""
    left = torch.ones(B, N, dtype=torch.long)
    left[0, :5], left[2, :2] = 0, 0
    holes = torch.ones(B, N, dtype=torch.long)
    holes[0, [10, 11, 25]] = 0
    holes[1, :3], holes[1, 20] = 0, 0
    holes[2, 30:] = 0
    packed = torch.cat([torch.arange(12), torch.arange(13), torch.arange(12)])[None]
    # a shared prefix of 20 tokens, then two continuations, each reading the prefix and
    # itself: its positions restart at 20 for the second
    tree = torch.ones(N, N).tril().bool()
    tree[29:, 20:29] = False
    tree_pos = torch.cat([torch.arange(29), torch.arange(20, 28)])[None]
    additive = torch.zeros(N, N, dtype=torch.float64).masked_fill(
        ~tree, torch.finfo(torch.float64).min)
    return {
        "holes, positions from the slots": dict(attention_mask=holes),
        "holes, generate's positions": dict(attention_mask=holes, position_ids=counted(holes)),
        "left padding, positions from the pad": dict(attention_mask=left),
        "left padding, shifted positions": dict(attention_mask=left, position_ids=counted(left)),
        "packed positions": dict(position_ids=packed),
        "4D boolean": dict(attention_mask=tree[None, None].expand(B, 1, N, N),
                           position_ids=tree_pos),
        "4D additive": dict(attention_mask=additive[None, None].expand(B, 1, N, N),
                            position_ids=tree_pos),
    }


def real_tokens(kw: dict, B: int) -> torch.Tensor:
    """(B, N, 1): 1 where the batch holds a token (a 2D mask's 1s; every token else)."""
    mask = kw.get("attention_mask")
    return (mask if mask is not None and mask.dim() == 2 else torch.ones(B, N))[..., None]


# ---------------------------------------------------------------------------------------
# Every mask
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", sorted(CONFIGS))
@torch.no_grad()
def test_full_equals_sdpa_for_every_mask(arch):
    """Logits on the real tokens, float64: the adapter's "full" against transformers'
    sdpa, for each kind of mask."""
    model = build(CONFIGS[arch](), dtype=torch.float64)
    ids = tokens(3, N, seed=4)
    for case, kw in mask_cases().items():
        model.set_attn_implementation("sdpa")
        want = model(ids, **kw).logits
        model.set_attn_implementation(FULL)
        got = model(ids, **kw).logits
        err = float(((got - want) * real_tokens(kw, 3)).abs().max())
        print(f"{arch} {case}: {err:.1e}")
        assert err < 1e-12, case


@pytest.mark.parametrize("pattern,combine", CASES)
@torch.no_grad()
def test_patterns_equal_the_reference_for_every_mask(pattern, combine):
    """Logits on the real tokens, float64, against ``reference_at_positions``; and the
    positions are read: a mask with holes gives other logits with positions from the
    slots than with generate()'s (the model's rotary embedding turned off, so that only
    the pattern could tell them apart)."""
    model = build(llama(), dtype=torch.float64)
    ids = tokens(3, N, seed=4)
    ours, truth_name = register(pattern, combine), reference_at_positions(pattern, combine)
    got = {}
    for case, kw in mask_cases().items():
        model.set_attn_implementation(truth_name)
        want = model(ids, **kw).logits
        model.set_attn_implementation(ours)
        got[case] = model(ids, **kw).logits
        err = max_err(got[case] * real_tokens(kw, 3), want * real_tokens(kw, 3))
        print(f"{pattern} {combine} {case}: {err:.1e}")
        assert err < 1e-10, case
    model.model.rotary_emb.inv_freq.zero_()           # positions now reach the pattern only
    holes = mask_cases()["holes, positions from the slots"]["attention_mask"]
    a = model(ids, attention_mask=holes).logits[0, 12:25]
    b = model(ids, attention_mask=holes, position_ids=counted(holes)).logits[0, 12:25]
    assert max_err(a, b) > 1e-3


def _truth_mask(n_q, n_k, q_offset, padding=None, window=None, given=None):
    """What the model lets each query read, built here from its definition: causal by
    slot, the padding's keys, a window's, a given 4D mask. bool (B|1, n_q, n_k)."""
    q_slots = np.arange(n_q)[:, None] + q_offset
    k_slots = np.arange(n_k)[None, :]
    allowed = (k_slots <= q_slots)[None]
    if padding is not None:
        width = padding.shape[1]
        keys = np.zeros((padding.shape[0], n_k), dtype=bool)
        keys[:, :min(width, n_k)] = padding[:, :n_k]
        allowed = allowed & keys[:, None, :]
    if window is not None:
        allowed = allowed & (k_slots > q_slots - window)[None]
    if given is not None:
        allowed = allowed & given[:, 0]
    return allowed


@pytest.mark.parametrize("case", ["holes", "static cache", "sliding window", "4D mask"])
@pytest.mark.parametrize("pattern,combine", [("strided", "interleaved"),
                                             ("fixed", "multihead")])
def test_attention_function_equals_the_reference_for_every_mask(pattern, combine, case):
    """The registered functions as a model calls them after a cache (7 queries against
    37 keys; a static cache: 8 empty slots after them), 4 query heads over 2 key/value
    heads, d = 48, layer_idx 1: out, dq, dk, dv against ``reference.attention`` over the
    reference's masks read at the positions (the queries' ids; the cached keys' as
    generate() numbers them), ANDed with the model's mask built here from its
    definition. The masks have holes and left padding; a pad has no position, so a
    pad's query reads nothing."""
    params = PATTERNS[pattern]
    name = register(pattern, combine)
    B, H, Hkv, n_q, n, d = 3, 4, 2, 7, N, 48
    n_k = n + 8 if case == "static cache" else n
    q, k, v, go = inputs(B, H, Hkv, n_q, n_k, d, seed=5)
    padding = torch.ones(B, n, dtype=torch.bool)
    padding[0, [10, 11]] = False
    padding[1, :3], padding[1, 20] = False, False
    padding[2, 25:27], padding[2, 33] = False, False       # a pad among the queries too
    q_offset = n - n_q
    kw = dict(batch_size=B, q_length=n_q, kv_length=n_k, q_offset=q_offset,
              attention_mask=padding)
    positions = counted(padding.long())                                  # (B, n)
    given = None
    if case == "static cache":
        kw["q_offset"] = torch.tensor(q_offset)          # as a static cache hands it over
    if case == "sliding window":
        kw.update(mask_function=sliding_window_causal_mask_function(9), local_size=9)
    made = transformers.AttentionMaskInterface._global_mapping[name](**kw)
    if case == "4D mask":       # a given mask: no padding; positions 3 on from the slots
        g = torch.Generator().manual_seed(6)
        later = torch.arange(n_k)[None, :] > torch.arange(q_offset, n)[:, None]
        given = (torch.rand(B, 1, n_q, n_k, generator=g) < 0.7) & ~later
        made = given
        padding, positions = None, torch.arange(n)[None].expand(B, n) + 3
    module = torch.nn.Module()
    module.layer_idx, module.is_causal = 1, True
    attend_fn = AttentionInterface._global_mapping[name]
    ids = positions[:, q_offset:]                                          # (B, n_q)

    def fn(q, k, v):
        out, weights = attend_fn(module, q, k, v, made, scaling=0.3, position_ids=ids)
        assert weights is None
        return out.transpose(1, 2)                                       # (B, H, n_q, d)

    got = run(fn, q, k, v, go)
    allowed = _truth_mask(n_q, n_k, q_offset, None if padding is None else padding.numpy(),
                          9 if case == "sliding window" else None,
                          None if given is None else given.numpy())       # (B|1, n_q, n_k)
    pos = positions.numpy()
    k_pos = np.concatenate([pos, np.zeros((B, n_k - n), dtype=pos.dtype)], axis=1)
    whole = head_masks(pattern, n + 3, H, combine, 1, **params)          # (H, m, m)
    reads = whole[:, pos[:, q_offset:, None], k_pos[:, None, :]].transpose(1, 0, 2, 3)
    if padding is not None:                              # a pad's query reads nothing
        allowed = allowed & padding.numpy()[:, q_offset:, None]
    want = truth(q, k, v, go, reads & allowed[:, None], scale=0.3)
    for what, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        err = float((a - b).abs().max())
        print(f"{pattern} {combine} {case} {what}: {err:.1e}")
        assert err < 1e-10


# ---------------------------------------------------------------------------------------
# Every cache
# ---------------------------------------------------------------------------------------

def prompts():
    """Three prompts of 11 tokens: left-padded by 4, right-padded by 3 (generate()
    extends it: a mask with holes), and whole."""
    ids = tokens(3, 11, seed=5)
    mask = torch.ones_like(ids)
    mask[0, :4], mask[1, 8:] = 0, 0
    return ids, mask


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("pattern", ["full", "strided", "fixed"])
def test_every_cache_gives_the_tokens_of_no_cache(pattern, arch):
    """Greedy, float64, 9 new tokens: the static cache (its empty slots are keys no query
    reads), the dynamic one and none give the same tokens; for "full", sdpa's. Mistral
    with its config's default window (4,096 tokens, wider than anything here)."""
    config = llama() if arch == "llama" else mistral()
    assert arch == "llama" or config.sliding_window == 4096
    model = build(config, FULL if pattern == "full" else register(pattern), torch.float64)
    ids, mask = prompts()
    runs = {cache: greedy(model, ids, 9, attention_mask=mask, use_cache=cache != "none",
                          **({"cache_implementation": "static"} if cache == "static" else {}))
            for cache in ("none", "dynamic", "static")}
    print(f"{arch} {pattern}: {runs['static'][:, 11:].tolist()}")
    assert torch.equal(runs["none"], runs["dynamic"]) and torch.equal(runs["none"],
                                                                      runs["static"])
    if pattern == "full":
        model.set_attn_implementation("sdpa")
        assert torch.equal(greedy(model, ids, 9, attention_mask=mask), runs["dynamic"])


@pytest.mark.parametrize("pattern", ["full", "strided"])
def test_a_window_that_matters_is_composed_with_the_pattern(pattern):
    """Mistral with a window of 8: logits of a left-padded batch equal sdpa's ("full") or
    the reference's over the window ANDed with the pattern; generating 14 tokens past
    the window, the dynamic cache (which drops the keys the window no longer reaches),
    the static one and none agree."""
    model = build(mistral(sliding_window=8), dtype=torch.float64)
    ids = tokens(3, N, seed=4)
    kw = mask_cases()["left padding, shifted positions"]
    with torch.no_grad():
        model.set_attn_implementation("sdpa" if pattern == "full"
                                      else reference_at_positions(pattern))
        want = model(ids, **kw).logits
        model.set_attn_implementation(FULL if pattern == "full" else register(pattern))
        got = model(ids, **kw).logits
    err = max_err(got * real_tokens(kw, 3), want * real_tokens(kw, 3))
    print(f"window 8, {pattern}: {err:.1e}")
    assert err < 1e-10
    ids, mask = prompts()
    runs = [greedy(model, ids, 14, attention_mask=mask, use_cache=use, **extra)
            for use, extra in ((False, {}), (True, {}),
                               (True, {"cache_implementation": "static"}))]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


# ---------------------------------------------------------------------------------------
# Keywords
# ---------------------------------------------------------------------------------------

class Sequences(torch.utils.data.Dataset):
    """Sequences of 20 to 37 tokens that count up by 7 (mod VOCAB) from a random start:
    a rule a tiny model learns in a few steps."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n = int(torch.randint(20, N + 1, (1,), generator=g))
        start = int(torch.randint(0, VOCAB, (1,), generator=g))
        return {"input_ids": (start + 7 * torch.arange(n)) % VOCAB}


def pad_right(rows):
    """A batch of right-padded rows: input_ids, attention_mask, labels (-100 on pads)."""
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r["input_ids"])], mask[b, :len(r["input_ids"])] = r["input_ids"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


@pytest.mark.parametrize("pattern", ["full", "strided", "fixed"])
def test_trainer_fine_tunes_a_tiny_llama(pattern, tmp_path):
    """``transformers.Trainer``, 8 steps of 4 right-padded sequences: every step passes
    ``num_items_in_batch`` down to attention, the loss falls."""
    model = build(llama(), FULL if pattern == "full" else register(pattern)).train()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=8,
                             per_device_train_batch_size=4, learning_rate=3e-3,
                             logging_steps=1, report_to="none", save_strategy="no",
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
                             seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Sequences(),
                      data_collator=pad_right)
    assert trainer.model_accepts_loss_kwargs          # so num_items_in_batch is passed
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    print(f"{pattern}: losses {np.round(losses, 3).tolist()}")
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.3


@torch.no_grad()
def test_the_loss_keywords_change_nothing():
    """``num_items_in_batch`` and ``shift_labels`` reach every attention call (the
    model's forward passes its keywords down): "full" gives sdpa's loss with them, and
    "strided" its own: summed over the 72 targets and divided by num_items_in_batch
    (transformers' loss) instead of averaged."""
    model = build(llama(), dtype=torch.float64)
    ids = tokens(2, N)
    shifted = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    kw = dict(labels=ids, num_items_in_batch=torch.tensor(50), shift_labels=shifted)
    want = model(ids, **kw).loss
    model.set_attn_implementation(FULL)
    assert max_err(model(ids, **kw).loss, want) < 1e-12
    model.set_attn_implementation(register("strided"))
    mean = model(ids, labels=ids).loss
    assert max_err(model(ids, **kw).loss, mean * 72 / 50) < 1e-12


@pytest.mark.parametrize("pattern", ["full", "strided"])
@torch.no_grad()
def test_packed_sequences_by_keyword_each_read_themselves(pattern):
    """Three sequences of 12, 13 and 12 tokens in one row, told apart by flash
    attention's ``cu_seq_lens_q`` / ``cu_seq_lens_k`` or by ``seq_idx``: the logits equal
    those of a block-diagonal 4D mask at the same positions (and, for "full", sdpa's with
    that mask)."""
    model = build(llama(), dtype=torch.float64)
    ids = tokens(1, N, seed=6)
    cu = torch.tensor([0, 12, 25, 37])
    seq = torch.cat([torch.full((12,), 0), torch.full((13,), 1), torch.full((12,), 2)])
    block = (seq[:, None] == seq[None, :]) & torch.ones(N, N).tril().bool()
    if pattern == "full":
        want = model(ids, attention_mask=block[None, None]).logits
    model.set_attn_implementation(FULL if pattern == "full" else register(pattern))
    blocked = model(ids, attention_mask=block[None, None]).logits
    if pattern == "full":
        assert max_err(blocked, want) < 1e-12
    by_cu = model(ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=13,
                  max_length_k=13).logits
    by_idx = model(ids, seq_idx=seq[None]).logits
    plain = model(ids).logits
    assert max_err(by_cu, blocked) < 1e-12 and max_err(by_idx, blocked) < 1e-12
    assert max_err(plain[:, 12:], blocked[:, 12:]) > 1e-3        # the packing was honoured
    with pytest.raises(ValueError, match=r"cu_seq_lens_q and cu_seq_lens_k must be the same "
                                         r"cumulative lengths \(0, \.\.\., 37\)"):
        model(ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu - 1)


# ---------------------------------------------------------------------------------------
# output_attentions
# ---------------------------------------------------------------------------------------

@torch.no_grad()
def test_output_attentions_as_sdpa():
    """sdpa warns and gives no weights (``attentions`` comes back empty); so does the
    adapter, asked in the call or in the config, with sdpa's logits ("full")."""
    model = build(llama(), dtype=torch.float64)
    ids = tokens(1, N)
    want = model(ids, output_attentions=True)
    assert want.attentions == ()
    model.set_attn_implementation(register("strided"))
    with pytest.warns(UserWarning, match="output_attentions=True, but sparse attention forms "
                                         "no attention weights.*'eager'"):
        assert model(ids, output_attentions=True).attentions == ()
    model = build(llama(output_attentions=True), FULL, torch.float64)   # as from_pretrained
    with pytest.warns(UserWarning, match="output_attentions=True"):      # (..., True) sets it
        got = model(ids)
    assert got.attentions == () and max_err(got.logits, want.logits) < 1e-12


# ---------------------------------------------------------------------------------------
# Compiled
# ---------------------------------------------------------------------------------------

def test_compiled_logits_and_generate_equal_eager():
    """A tiny Llama on "strided", compiled whole (``fullgraph=True``) with a backend that
    counts the graphs dynamo hands it: the logits of a plain and a left-padded batch, and
    greedy ``generate()`` with the static cache (its prefill and its decoding steps
    compiled), equal eager's; one graph per shape, no graph break; ``explain`` finds none
    inside the model."""
    torch._dynamo.reset()
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = build(llama(), register("strided"))
    compiled = torch.compile(model, fullgraph=True, backend=count)
    ids, mask = tokens(2, N), torch.ones(2, N, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        for kw in ({}, dict(attention_mask=mask, position_ids=counted(mask))):
            want, got = model(ids, **kw).logits, compiled(ids, **kw).logits
            assert max_err(got * real_tokens(kw, 2), want * real_tokens(kw, 2)) < 1e-6
    assert len(graphs) == 2
    prompt, prompt_mask = prompts()
    want = greedy(model, prompt, 4, attention_mask=prompt_mask, cache_implementation="static")
    model.forward = torch.compile(model.forward, fullgraph=True, backend=count)
    got = greedy(model, prompt, 4, attention_mask=prompt_mask, cache_implementation="static",
                 disable_compile=True)
    assert torch.equal(got, want)
    assert len(graphs) > 2 and not torch._dynamo.utils.counters["graph_break"]
    explained = torch._dynamo.explain(build(llama(), register("strided")))(
        ids, attention_mask=mask)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
