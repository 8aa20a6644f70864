"""The documented loop: a nanoGPT-style model sampled with SparseKVCache draws nanoGPT's tokens.

Child et al., 2019, section 4.3 (the patterns) and section 7 (sampling one token at
a time). docs/examples/tiny_gpt.py is someone else's model (karpathy/nanoGPT's, cut
down) whose attention calls ``fast.sparse_attention``: its ``generate`` re-runs the
model over the prefix for every token, its ``generate_cached`` keeps one
``fast.SparseKVCache`` per layer. With the same generator they must draw the same
tokens (greedy and seeded sampling, every pattern, batch 2, odd sizes: n = 57, not a
multiple of the stride 6; head width 48), and the cached logits must equal the
re-run ones to float32 rounding, position by position.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLE = ROOT / "docs" / "examples" / "tiny_gpt.py"


def _load():
    spec = importlib.util.spec_from_file_location("tiny_gpt_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                     # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tiny_gpt = _load()

PATTERNS = [dict(pattern="full", stride=None), dict(pattern="strided", stride=6),
            dict(pattern="fixed", stride=6, c=2),
            dict(pattern="fixed", stride=6, c=2, combine="multihead"),
            dict(pattern="strided", stride=6, combine="interleaved")]


def model(seed: int = 0, **pattern) -> torch.nn.Module:
    cfg = tiny_gpt.GPTConfig(block_size=57, vocab_size=13, n_layer=3, n_head=2, n_embd=96,
                             **pattern)
    torch.manual_seed(seed)
    gpt = tiny_gpt.GPT(cfg).eval()
    # an output layer of its own: with the tied one an untrained model repeats its last
    # token, and greedy decoding would test one token over and over
    gpt.lm_head.weight = torch.nn.Parameter(0.3 * torch.randn(13, 96))
    return gpt


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("draw", [dict(top_k=1), dict(temperature=1.0),
                                  dict(temperature=0.8, top_k=5)],
                         ids=["greedy", "sampled", "top-k"])
def test_cached_generate_draws_the_rerun_tokens(pattern, draw):
    gpt = model(**pattern)
    prompt = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(1))
    runs = [generate(prompt, 52, generator=torch.Generator().manual_seed(7), **draw)
            for generate in (gpt.generate, gpt.generate_cached)]
    assert runs[0].shape == (2, 57)
    assert torch.equal(runs[0], runs[1])
    assert len(set(runs[0][0, 5:].tolist())) > 5                   # not a constant run


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: "-".join(map(str, p.values())))
def test_cached_logits_equal_rerun_logits(pattern):
    """Position by position: the prompt, one-position steps and a chunk of four, against
    the model re-run over each prefix (what ``generate`` computes)."""
    gpt = model(**pattern)
    idx = torch.randint(0, 13, (2, 57), generator=torch.Generator().manual_seed(2))
    caches = gpt.make_caches(57)
    with torch.no_grad():
        got = [gpt(idx[:, :5], caches)]                                   # positions 0..4
        got.append(gpt(idx[:, 5:9], caches))                              # 5..8 at once
        got += [gpt(idx[:, t:t + 1], caches) for t in range(9, 57)]
        got = torch.cat(got, dim=1)                                       # (2, 57, 13)
        want = torch.stack([gpt(idx[:, :t + 1])[:, -1] for t in range(57)], dim=1)
    err = (got - want).abs().max().item()
    print(f"{pattern}: max |cached - re-run| logit {err:.2e} (logits up to "
          f"{want.abs().max().item():.1f})")
    assert err < 1e-5
    assert [c.position for c in caches] == [57] * 3


def test_cached_generate_needs_the_sequence_to_fit():
    gpt = model(pattern="strided", stride=6)
    with pytest.raises(ValueError, match=r"the prompt \(5\) and max_new_tokens \(54\) need 58 "
                                         r"positions; block_size is 57"):
        gpt.generate_cached(torch.zeros(1, 5, dtype=torch.long), 54)


def test_measurement_script(tmp_path):
    """The script behind figures/data/kv_cache_generate.json, on a short sequence."""
    out = tmp_path / "generate.json"
    assert tiny_gpt.main(["--n", "40", "--rounds", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["n"] == 40 and set(data["patterns"]) == {"strided", "fixed"}
    for record in data["patterns"].values():
        assert record["same_tokens"] is True and record["threads"] == 1
        assert set(record["min_s"]) == {"rerun", "cached"} and record["speedup"] > 0


@pytest.mark.parametrize("argv,message", [
    (["--n", "-5"], "--n -5: allowed: an integer >= 33"),
    (["--n", "32"], "--n 32: allowed"),
    (["--rounds", "0"], "--rounds 0: allowed: an integer >= 1"),
    (["--threads", "0"], "--threads 0: allowed"),
    ([], "exists; allowed: another --out, or --overwrite"),
])
def test_measurement_script_refuses(argv, message, tmp_path, capsys):
    """Bad sizes in one line, and an existing --out (the committed measurement, by
    default) is not replaced without --overwrite; nothing is measured or written."""
    out = tmp_path / "generate.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        tiny_gpt.main([*argv, "--out", str(out)])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert out.read_text() == "{}"
