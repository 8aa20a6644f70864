"""A nanoGPT-style GPT with ``fast.sparse_attention``, sampled with ``fast.SparseKVCache``.

The model is karpathy/nanoGPT's ``model.py`` cut down (no dropout, no training
code): one line changes for sparse attention (Child et al., 2019, section 4.3: each
head reads the positions of a strided or fixed pattern instead of all earlier
ones), and a few more take a key/value cache per layer. Two samplers draw from it:

* ``generate`` -- nanoGPT's: re-run the model over the whole prefix for every new
  token (O(t) positions of every layer per token);
* ``generate_cached`` -- the prompt through the model once, keeping every layer's
  keys and values in a ``SparseKVCache``, then one position per token: each layer
  appends the new key and value and attends one query over the keys its pattern
  allows (about l + t / l for strided).

With the same generator both draw the same tokens
(tests/fast/transformer/decoding/test_tiny_gpt.py: greedy and seeded sampling, every
pattern; logits to float32 rounding). Run as a script, it
times the two samplers on a sequence of 1024 positions, in turns, and writes
figures/data/kv_cache_generate.json::

    PYTHONPATH=. python docs/examples/tiny_gpt.py --overwrite   # --help for the options

(without ``--overwrite`` it refuses to replace an existing file, the committed one
included; ``--out`` writes elsewhere).
"""

from __future__ import annotations

import argparse
import functools
import math
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from fast import SparseKVCache, sparse_attention


@dataclass
class GPTConfig:
    block_size: int = 1024     # the longest sequence: position embeddings, cache capacity
    vocab_size: int = 65       # tiny Shakespeare's characters
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    pattern: str = "strided"   # fast.sparse_attention's pattern: "full", "strided", "fixed"
    stride: int | None = 32    # l, about sqrt(block_size) (sec. 4.3)
    c: int | None = None       # "fixed" only: the summary width
    combine: str = "merged"    # how heads use the pattern's two parts (sec. 5.1)

    def attention(self, layer: int) -> dict:
        """The pattern of layer ``layer`` as sparse_attention and SparseKVCache take it."""
        return dict(pattern=self.pattern, stride=self.stride, c=self.c, combine=self.combine,
                    layer=layer)


class CausalSelfAttention(nn.Module):

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)   # q, k, v of all heads
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.pattern = config.attention(layer)

    def forward(self, x: torch.Tensor, cache: SparseKVCache | None = None) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))                                   # (B, nh, T, hs)
        if cache is not None and cache.position > 0:
            y = cache.step(q, k, v)               # positions the cache has not seen yet
        else:
            y = sparse_attention(q, k, v, **self.pattern)               # (B, nh, T, hs)
            if cache is not None:
                cache.prefill(k, v)               # the prompt's keys and values
        y = y.transpose(1, 2).contiguous().view(B, T, C)                 # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: SparseKVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight               # weight tying
        for name, p in self.named_parameters():                         # nanoGPT's init
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def make_caches(self, capacity: int) -> list[SparseKVCache]:
        """One SparseKVCache per layer, for ``capacity`` positions."""
        cfg = self.config
        return [SparseKVCache(n_heads=cfg.n_head, key_dim=cfg.n_embd // cfg.n_head,
                              capacity=capacity, **cfg.attention(i))
                for i in range(cfg.n_layer)]

    def forward(self, idx: torch.Tensor, caches: list[SparseKVCache] | None = None
                ) -> torch.Tensor:
        """Logits (B, T, vocab) of the tokens idx (B, T); with ``caches``, idx holds the
        positions after those the caches have seen."""
        b, t = idx.size()
        start = caches[0].position if caches else 0
        if start + t > self.config.block_size:
            raise ValueError(f"positions {start}..{start + t - 1} do not fit block_size="
                             f"{self.config.block_size}")
        pos = torch.arange(start, start + t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)       # (B, T, C)
        for block, cache in zip(self.transformer.h, caches or [None] * len(self.transformer.h)):
            x = block(x, cache)
        return self.lm_head(self.transformer.ln_f(x))                   # (B, T, vocab)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """nanoGPT's sampler: the model re-run over the prefix for every token. top_k=1
        is greedy decoding."""
        for _ in range(max_new_tokens):
            block = self.config.block_size
            idx_cond = idx if idx.size(1) <= block else idx[:, -block:]
            idx_next = draw(self(idx_cond), temperature, top_k, generator)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    @torch.no_grad()
    def generate_cached(self, idx, max_new_tokens, temperature=1.0, top_k=None,
                        generator=None):
        """``generate``'s tokens, one position per step from a cache per layer. The
        whole sequence must fit block_size (a cache does not slide)."""
        n = idx.size(1) + max_new_tokens - 1                            # positions read
        if n > self.config.block_size:
            raise ValueError(f"the prompt ({idx.size(1)}) and max_new_tokens "
                             f"({max_new_tokens}) need {n} positions; block_size is "
                             f"{self.config.block_size}")
        caches = self.make_caches(max(n, idx.size(1)))
        logits = self(idx, caches)                      # the prompt, positions 0..p-1
        for i in range(max_new_tokens):
            idx_next = draw(logits, temperature, top_k, generator)
            idx = torch.cat((idx, idx_next), dim=1)
            if i + 1 < max_new_tokens:
                logits = self(idx_next, caches)         # one position: (B, 1, vocab)
        return idx


def draw(logits: torch.Tensor, temperature: float, top_k: int | None, generator
         ) -> torch.Tensor:
    """nanoGPT's draw from the last position's logits (B, T, vocab): (B, 1) tokens."""
    logits = logits[:, -1, :] / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("Inf")
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


# ----------------------------------------------------------------------------
# The measurement: python docs/examples/tiny_gpt.py
# ----------------------------------------------------------------------------

PATTERNS = {"strided": dict(stride=32), "fixed": dict(stride=32, c=8)}


def _sample(tokens: dict, name: str, generate, prompt, new: int, seed: int) -> None:
    tokens[name] = generate(prompt, new, generator=torch.Generator().manual_seed(seed))


def measure(n: int = 1024, rounds: int = 3, threads: int = 1, seed: int = 0) -> dict:
    """For each pattern: a GPTConfig model of block_size n sampling n - 1 tokens after a
    one-token prompt, both samplers timed in turns (``fast.measure.in_turns``: the
    ratio of their fastest rounds), after a short warm-up of each; "same_tokens" says
    whether their last rounds drew the same tokens."""
    from fast.measure.in_turns import in_turns

    out = {"n": n, "prompt": 1, "torch": torch.__version__, "machine": platform.processor()
           or platform.machine(), "patterns": {}}
    for pattern, params in PATTERNS.items():
        cfg = GPTConfig(block_size=n, pattern=pattern, **params)
        torch.manual_seed(seed)
        model = GPT(cfg).eval()
        prompt, tokens = torch.zeros((1, 1), dtype=torch.long), {}
        samplers = {"rerun": model.generate, "cached": model.generate_cached}
        for generate in samplers.values():                               # warm-up
            generate(prompt, 32, generator=torch.Generator().manual_seed(seed))
        times = in_turns({name: functools.partial(_sample, tokens, name, generate, prompt,
                                                  n - 1, seed)
                          for name, generate in samplers.items()},
                         rounds=rounds, threads=threads)
        same = torch.equal(tokens["rerun"], tokens["cached"])
        out["patterns"][pattern] = {
            "config": asdict(cfg), "same_tokens": same, **times,
            "speedup": times["min_s"]["rerun"] / times["min_s"]["cached"]}
        print(f"{pattern}: re-run {times['min_s']['rerun']:.2f} s, cached "
              f"{times['min_s']['cached']:.2f} s, {out['patterns'][pattern]['speedup']:.1f}x; "
              f"same tokens: {same}", flush=True)
    return out


def main(argv=None) -> int:
    from fast.experiments.provenance import write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024,
                        help="sequence length (block_size), at least 33: the warm-up draws "
                             "32 tokens after a one-token prompt")
    parser.add_argument("--rounds", type=int, default=3, help="turns of each sampler (>= 1)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op torch threads (>= 1)")
    parser.add_argument("--out", default="figures/data/kv_cache_generate.json")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out if it exists (the default --out is the committed "
                             "measurement the README quotes)")
    args = parser.parse_args(argv)
    for name, value, least in (("--n", args.n, 33), ("--rounds", args.rounds, 1),
                               ("--threads", args.threads, 1)):
        if value < least:
            parser.error(f"{name} {value}: allowed: an integer >= {least}")
    if Path(args.out).exists() and not args.overwrite:
        parser.error(f"--out {args.out} exists; allowed: another --out, or --overwrite to "
                     f"replace it")
    result = measure(args.n, args.rounds, args.threads)
    write_result(args.out, result, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
