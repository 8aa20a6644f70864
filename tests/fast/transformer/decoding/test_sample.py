"""The sampler: cached draws equal re-run draws, the draw rules, checks before work, the CLI.

Child et al., 2019, section 7 (unconditional samples and completions of held-out
images from their top half) and section 5.6 (q.k in float32 when sampling).
``sample(cache=False)`` re-runs the model on the prefix for every token; it is
the reference that the sparse and dense caches must reproduce token for token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast.transformer.config import ModelConfig, preset
from fast.transformer.decoding import sample as sampling
from fast.transformer.decoding.draw import draw
from fast.transformer.decoding.request import check_request
from fast.transformer.decoding.sample import sample
from fast.transformer.network.model import SparseTransformer

pytestmark = pytest.mark.usefixtures("one_thread")


def model_for(pattern: str, combine: str, image: bool, heads: int = 2) -> SparseTransformer:
    """n = 26 (not a multiple of l = 4 or 6; images 13x1x2), vocab 9."""
    params = {"full": {}, "strided": {"stride": 4}, "fixed": {"stride": 6, "c": 3}}[pattern]
    fields = dict(vocab_size=9, n_ctx=26, d_model=8 * heads, n_heads=heads, n_layers=2,
                  pattern=pattern, combine=combine, stride=4, **{k: v for k, v in params.items()
                                                                 if k != "stride"})
    fields["stride"] = params.get("stride", 4)
    fields.update(dict(embedding="image", image_shape=(13, 1, 2)) if image else
                  dict(embedding="text"))
    torch.manual_seed(0)
    model = SparseTransformer(ModelConfig(**fields))
    with torch.no_grad():                                  # sharper than the init: real choices
        model.head.weight.mul_(20.0)
    return model


@pytest.mark.parametrize("pattern", ["full", "strided", "fixed"])
@pytest.mark.parametrize("combine", ["merged", "multihead", "interleaved"])
@pytest.mark.parametrize("image", [True, False], ids=["image", "text"])
def test_cached_sampler_draws_the_rerun_tokens(pattern, combine, image):
    model = model_for(pattern, combine, image)
    prompts = [None, torch.tensor([[1, 2, 3, 4, 5, 6, 7], [0, 0, 8, 8, 1, 1, 2],
                                   [5, 4, 3, 2, 1, 0, 1]])]
    for prompt in prompts:
        if prompt is None and not image:
            prompt = torch.tensor([3])                     # text needs one token to start
        kw = dict(prompt=prompt, temperature=1.3, top_k=7, top_p=0.95, batch_size=2)
        runs = {(cache, engine): sample(model, 3, cache=cache, engine=engine, **kw,
                                       generator=torch.Generator().manual_seed(5))
                for cache in (True, "dense") for engine in ("numba", "torch")}
        runs = {False: sample(model, 3, cache=False, generator=torch.Generator().manual_seed(5),
                              **kw), True: runs[True, "numba"], **runs}
        assert runs[False].shape == (3, 26)
        for key, tokens in runs.items():
            assert torch.equal(tokens, runs[False]), key
        if prompt is not None:
            p = prompt.shape[-1]
            assert torch.equal(runs[True][:, :p], prompt.expand(3, p))
        assert len({tuple(r) for r in runs[True].tolist()}) == 3    # rows differ


def test_a_seed_gives_the_same_samples_however_they_are_batched():
    """Sample r draws from a stream of its own (draw.row_generators): batch sizes 1, 2, 3
    and 5, with and without the cache, give the same five samples for one seed; another
    seed gives others; a prefix of the samples is the samples of a smaller num."""
    model = model_for("strided", "merged", image=True)
    runs = [sample(model, 5, batch_size=b, cache=cache, temperature=1.3,
                   generator=torch.Generator().manual_seed(7))
            for b in (1, 2, 3, 5) for cache in (True, False)]
    for tokens in runs[1:]:
        assert torch.equal(tokens, runs[0])
    assert len({tuple(r) for r in runs[0].tolist()}) == 5
    other = sample(model, 5, temperature=1.3, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(other, runs[0])
    three = sample(model, 3, batch_size=2, temperature=1.3,
                   generator=torch.Generator().manual_seed(7))
    assert torch.equal(three, runs[0][:3])


def test_draw_takes_one_generator_per_row():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    rows = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    together = draw(logits, generator=rows)
    alone = [draw(logits[b:b + 1], generator=[torch.Generator().manual_seed(s)])
             for b, s in enumerate((1, 2, 3))]
    assert torch.equal(together, torch.cat(alone))
    with pytest.raises(ValueError, match="one generator per row: got 2 generators for 3"):
        draw(logits, generator=rows[:2])


def test_sampler_restores_state_and_reports_stats():
    model = model_for("fixed", "merged", True)
    model.train()
    stats = {}
    threads = torch.get_num_threads()
    out = sample(model, 2, generator=torch.Generator().manual_seed(0), stats=stats, threads=2)
    assert model.training and not model.blocks[0].attn.qk_fp32
    assert torch.get_num_threads() == threads
    assert stats["tokens"] == 2 * 26 and stats["cache"] == "sparse" and stats["seconds"] > 0
    assert stats["engine"] == "numba"                      # float32 on the CPU
    assert stats["steps"] == {"numba": 25, "torch": 0}     # one batch: 25 steps after the prefill
    # keys and values side by side: (B=2) x heads x (ceil(26/6) c + l rows) x (dk + dv) x 4 bytes
    per_layer = 2 * 2 * (5 * 3 + 6) * (8 + 8) * 4
    assert stats["cache_bytes"] == 2 * per_layer
    assert int(out.min()) >= 0 and int(out.max()) < 9
    again = sample(model, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    full = sample(model, 2, length=26, prompt=out, generator=torch.Generator().manual_seed(0))
    assert torch.equal(full, out)                          # nothing left to draw


def test_draw_rules():
    gen = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))[None].expand(20000, 4)
    counts = lambda tokens: np.bincount(tokens.numpy(), minlength=4) / len(tokens)
    plain = counts(draw(logits, generator=gen))
    print("frequencies", plain.round(3))
    assert np.abs(plain - [0.5, 0.3, 0.15, 0.05]).max() < 0.015
    assert set(counts(draw(logits, top_k=2, generator=gen)).nonzero()[0]) == {0, 1}
    # top-p: the smallest set whose mass reaches p -- 0.5 + 0.3 >= 0.8
    assert set(counts(draw(logits, top_p=0.8, generator=gen)).nonzero()[0]) == {0, 1}
    assert set(counts(draw(logits, top_p=0.81, generator=gen)).nonzero()[0]) == {0, 1, 2}
    assert set(counts(draw(logits, top_p=0.2, generator=gen)).nonzero()[0]) == {0}
    cold = counts(draw(logits, temperature=0.25, generator=gen))   # p^4, renormalised
    want = np.array([0.5, 0.3, 0.15, 0.05]) ** 4
    assert np.abs(cold - want / want.sum()).max() < 0.015
    hot = counts(draw(logits, temperature=100.0, generator=gen))
    assert np.abs(hot - 0.25).max() < 0.02


BAD = [
    (dict(temperature=0.0), "temperature must be a finite number > 0, got 0.0"),
    (dict(temperature=float("nan")), "temperature must be a finite number > 0, got nan"),
    (dict(temperature=-1), "temperature must be a finite number > 0"),
    (dict(top_p=0.0), r"top_p must be None or a number in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), r"top_p must be None or a number in \(0, 1\], got 1.5"),
    (dict(top_k=0), r"top_k must be None or an integer in \[1, vocab_size=9\], got 0"),
    (dict(top_k=10), r"top_k must be None or an integer in \[1, vocab_size=9\], got 10"),
    (dict(length=27), r"length must be an integer in \[1, n_ctx=26\].*got 27"),
    (dict(length=2.5), r"length must be an integer"),
    (dict(prompt=torch.zeros(27, dtype=torch.long)), "longer than the context n_ctx=26"),
    (dict(prompt=torch.zeros(5, dtype=torch.long), length=4), "more than length=4"),
    (dict(prompt=torch.tensor([1, 9])), r"must lie in \[0, vocab_size=9\).*\[1, 9\]"),
    (dict(prompt=torch.tensor([-1, 2])), r"must lie in \[0, vocab_size=9\)"),
    (dict(prompt=torch.tensor([1.5, 2.0])), "prompt must hold integer token ids"),
    (dict(prompt=torch.zeros(3, 2, dtype=torch.long)), r"prompt must be \(p,\) or \(num=2, p\)"),
    (dict(precision="fp8"), "precision must be one of"),
    (dict(cache="paged"), "cache must be True, False, 'sparse', 'dense' or 'none'"),
    (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
    (dict(start_token=False), "nothing to condition on"),
    (dict(threads=0), "threads must be None or an integer >= 1, got 0"),
    (dict(engine="jax"), "engine must be one of \\('auto', 'numba', 'torch'\\), got 'jax'"),
]


@pytest.mark.parametrize("bad,message", BAD)
def test_bad_requests_fail_before_any_work(bad, message, monkeypatch):
    model = model_for("strided", "merged", True)
    calls = []
    monkeypatch.setattr(SparseTransformer, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match=message):
        sample(model, 2, **bad)
    assert not calls                                       # the model never ran
    with pytest.raises(ValueError, match="num must be an integer >= 1"):
        check_request(model.cfg, 0, None, None, 1.0, None, None, "fp32", None, True, None)




def test_text_sampling_continues_a_prompt():
    m, _ = preset("quick_text", d_model=16, n_heads=2, n_layers=1, n_ctx=24, stride=8, c=2)
    torch.manual_seed(0)
    model = SparseTransformer(m)
    prompt = torch.tensor(list(b"def "))
    out = sampling.sample(model, 2, length=12, prompt=prompt,
                          generator=torch.Generator().manual_seed(1))
    assert out.shape == (2, 12) and torch.equal(out[:, :4], prompt.expand(2, 4))
    assert model.training and not model.blocks[0].attn.qk_fp32     # state restored
    with pytest.raises(ValueError, match="length must be"):
        sampling.sample(model, 1, length=25)


def test_sample_takes_what_a_user_would_pass():
    """A compiled model (torch.compile's wrapper) samples as the model does; an empty
    prompt with the start token is no prompt; a seed where a generator belongs is named."""
    model = model_for("strided", "merged", image=True)
    want = sample(model, 2, generator=torch.Generator().manual_seed(3))
    got = sample(torch.compile(model), 2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(got, want)
    assert torch.equal(sample(model, 2, prompt=[], start_token=True,
                              generator=torch.Generator().manual_seed(3)), want)
    with pytest.raises(ValueError, match=r"generator must be a torch.Generator or None, got "
                                         r"int \(a seed: torch.Generator\(\).manual_seed"):
        sample(model, 2, generator=42)
