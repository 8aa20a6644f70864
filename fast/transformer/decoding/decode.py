"""Incremental decoding: a prefill pass over the prompt, then one token per step.

Child et al., 2019, sections 5.2-5.6 (the network of ``fast.transformer.network.model``)
and section 4.3 (which keys each head reads). Sampling draws one token at a
time; re-running the whole network on the prefix for every token costs O(t) full
layers per step. A ``Decoder`` keeps, per residual block, a key/value cache -- a
``SparseKVCache`` (``fast.transformer.decoding.sparse_kv_cache``, the class any model
uses; it tracks the position) -- and computes only the new position:

    prefill(idx)   the network's own forward pass over idx (B, p) -- the fast
                   attention path of ``sparse_attention`` -- storing every block's
                   keys and values; returns the logits of the last position;
    step(tokens)   the token at position t for each row (B,): embed it, and per
                   block project q, k, v, append k, v, attend row t over the keys
                   the pattern allows, W_p, the feed-forward; returns the logits
                   (B, vocab) that predict position t + 1.

A step runs the block's arithmetic of ``fast.transformer.network.block`` as the module
does (same functions, same weights, same order of operations), with q, k and v from one
fused matrix product (``BlockWeights``) and attention from the cache, so its logits
equal those of ``model(idx)[:, -1]`` to float32 rounding (the tests ask 1e-5). q.k
products, softmax and the weighted sum run in float32 whatever the autocast precision
(sec. 5.6: float16 q.k can overflow); ``qk_fp32=False`` turns that off only to show why
it is there.

Two engines run a step (``engine``):

* "torch" -- the step written here in PyTorch: any device, any precision
  (float32, float64, autocast to bfloat16 or float16);
* "numba" -- the same step compiled for the CPU (``fast.transformer.decoding.cpu_step``,
  ``fast.transformer.decoding.cpu_kernel``): float32 only, without autocast. For small
  models PyTorch's per-operation dispatch, not the arithmetic, sets the pace of a step
  (about a hundred one-row products); one compiled call skips it (``python -m fast
  generate`` times both: figures/data/generation.json). The caches and their reads are
  the same; the tests hold both engines to the re-run model.

"auto" (the default) takes "numba" where it applies (a float32 model on the CPU,
Numba installed), and "torch" otherwise, for any step under autocast, and for a
step whose heads read more than ``cpu_step.AUTO_MAX_KEYS`` keys (there the
PyTorch step's vectorised products over many keys are faster). ``steps`` counts
the steps each engine ran.

Decoding needs eval mode (dropout off), as sampling does.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fast.transformer.decoding.kv_cache import CACHES
from fast.transformer.decoding.sparse_kv_cache import SparseKVCache
from fast.transformer.network.block import Norm, feed_forward, residual, split_heads
from fast.transformer.network.model import Block, SparseTransformer, check_token_ids

ENGINES = ("auto", "numba", "torch")


@dataclass(frozen=True)
class BlockWeights:
    """One block's weights as a decoding step uses them: plain tensors, read once (a step
    is ~15 small products per block, and Python and module attribute look-ups would cost
    as much as the arithmetic). Linear weights as ``torch.nn.Linear`` holds them, (out, in).

    qkv_w, qkv_b: the fused [scale W_q; W_k, W_v of head 0; ...; of head H-1], with the
    attention's 1/sqrt(d) folded into W_q and each head's key and value side by side, as
    the caches store them: one product gives q and what step t appends.
    """
    ln1: Norm
    qkv_w: torch.Tensor          # (dq + H (dk + dv), d)
    qkv_b: torch.Tensor
    proj_w: torch.Tensor         # W_p (d, d)
    proj_b: torch.Tensor
    ln2: Norm
    fc1_w: torch.Tensor          # W_1 (m d, d)
    fc1_b: torch.Tensor
    fc2_w: torch.Tensor          # W_2 (d, m d)
    fc2_b: torch.Tensor

    @classmethod
    def of(cls, block: Block, n_heads: int, scale: float) -> BlockWeights:
        a, ff = block.attn, block.ff
        w = [a.q.weight * scale] + [torch.cat(kv) for kv in zip(a.k.weight.chunk(n_heads),
                                                                a.v.weight.chunk(n_heads))]
        b = [a.q.bias * scale] + [torch.cat(kv) for kv in zip(a.k.bias.chunk(n_heads),
                                                              a.v.bias.chunk(n_heads))]
        return cls(Norm.of(block.ln1), torch.cat(w), torch.cat(b), a.proj.weight, a.proj.bias,
                   Norm.of(block.ln2), ff.fc1.weight, ff.fc1.bias, ff.fc2.weight, ff.fc2.bias)

    def feed_forward(self, y: torch.Tensor) -> torch.Tensor:
        return feed_forward(y, self.fc1_w, self.fc1_b, self.fc2_w, self.fc2_b)


def _autocast_on(device: torch.device) -> bool:
    return torch.is_autocast_enabled(device.type)


def numba_unusable(model: SparseTransformer) -> str:
    """Why the "numba" engine cannot decode ``model`` ("" when it can)."""
    param = next(model.parameters())
    if param.device.type != "cpu":
        return f"runs on the CPU, and the model is on {param.device}"
    if param.dtype != torch.float32:
        return f"computes in float32, and the model is {param.dtype}"
    if importlib.util.find_spec("numba") is None:
        return "needs Numba (pip install numba)"
    return ""


class Decoder:
    """Decode ``model`` for up to ``capacity`` positions with a ``cache`` in CACHES.

    >>> dec = Decoder(model, capacity=256)
    >>> logits = dec.prefill(idx)          # idx (B, p): positions 0..p-1
    >>> logits = dec.step(next_tokens)     # (B,): position p, and so on
    """

    def __init__(self, model: SparseTransformer, capacity: int, cache: str = "sparse", *,
                 qk_fp32: bool = True, engine: str = "auto"):
        model = getattr(model, "module", model)
        if not isinstance(model, SparseTransformer):
            raise ValueError(f"Decoder needs a SparseTransformer, got {type(model).__name__}")
        if model.training:
            raise ValueError("Decoder needs the model in eval mode (dropout off): call "
                             "model.eval() first")
        cfg = model.cfg
        if not isinstance(capacity, int) or not 1 <= capacity <= cfg.n_ctx:
            raise ValueError(f"capacity must be an integer in [1, n_ctx={cfg.n_ctx}], got "
                             f"{capacity!r}")
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        why = "" if engine == "torch" else numba_unusable(model)
        if engine == "numba" and why:
            raise ValueError(f"engine 'numba' {why}; use engine='torch' (any device and "
                             f"precision) or 'auto'")
        self.model, self.cfg, self.capacity, self.kind = model, cfg, capacity, cache
        self.qk_fp32 = qk_fp32
        H, self.dq = cfg.n_heads, cfg.qk_dim
        params = cfg.pattern_params()
        self.scale = 1.0 / math.sqrt(self.dq // H)                        # folded into W_q
        self.caches = [SparseKVCache(cfg.pattern, n_heads=H, key_dim=self.dq // H,
                                     value_dim=cfg.d_model // H, capacity=capacity,
                                     combine=cfg.combine, layer=i, scale=1.0, mode=cache,
                                     qk_fp32=qk_fp32, **params)          # q arrives scaled
                       for i in range(cfg.n_layers)]
        with torch.no_grad():
            self.positions = model.embed.positions(capacity)             # (capacity, d)
            self.tokens = model.embed.tok.weight                         # (vocab, d)
            self.blocks = [BlockWeights.of(block, H, self.scale) for block in model.blocks]
            self.ln_f, self.head = Norm.of(model.ln_f), model.head
        self.requested, self.cpu_step = engine, None
        self.steps = {"numba": 0, "torch": 0}                          # steps each engine ran
        if engine != "torch" and not why:
            from fast.transformer.decoding.cpu_step import AUTO_MAX_KEYS, CpuStep  # imports Numba
            self.cpu_step = CpuStep(self, AUTO_MAX_KEYS if engine == "auto" else None)

    @property
    def t(self) -> int:
        """The next position to decode (the caches track it)."""
        return self.caches[0].position

    @property
    def engine(self) -> str:
        """The engine that runs the steps: "numba" or "torch" (module docstring)."""
        return "numba" if self.cpu_step is not None else "torch"

    def nbytes(self) -> int:
        """Bytes of keys and values the caches hold (allocated at the first position)."""
        return sum(c.nbytes() for c in self.caches)

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Run the network over idx (B, p) from position 0, filling the caches.
        Returns the logits of position p - 1: (B, vocab), float32."""
        if self.t:
            raise ValueError(f"prefill starts a sequence; this decoder is at position {self.t}")
        p = idx.shape[1]
        if not 1 <= p <= self.capacity:
            raise ValueError(f"the prompt must hold 1..capacity={self.capacity} positions, "
                             f"got {p}")
        model = self.model
        self.batch = idx.shape[0]                    # every step takes one token per row
        h = model.embed(idx)                                             # (B, p, d)
        for block, cache in zip(model.blocks, self.caches):
            x = block.ln1(h)
            q, k, v = block.attn.project(x)                              # (B, H, p, *)
            cache.prefill(k, v)                                          # positions 0..p-1
            flag, block.attn.qk_fp32 = block.attn.qk_fp32, self.qk_fp32  # the steps' rule
            try:
                out, _ = block.attn.attend(q, k, v, x.dtype)
            finally:
                block.attn.qk_fp32 = flag
            h = block.residual(h, block.attn.output(out))                # (B, p, d)
        return model.head(model.ln_f(h[:, -1])).float()                  # (B, vocab)

    def _check_tokens(self, tokens) -> None:
        """The same refusals on every engine: an integer tensor (B,), one token per row
        of the prefill, and ids in [0, vocab_size] where reading them costs no wait
        (``check_token_ids``, the model's own check)."""
        if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point \
                or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            got = tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be an integer tensor (B,) of token ids, got {got}")
        if tuple(tokens.shape) != (self.batch,):
            raise ValueError(f"tokens must be ({self.batch},), one per sequence of the "
                             f"prefill, got shape {tuple(tokens.shape)}")
        check_token_ids(tokens, self.cfg.vocab_size)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Decode position t: tokens (B,) -> logits (B, vocab), float32, predicting t + 1."""
        t = self.t
        if t >= self.capacity:
            raise ValueError(f"the decoder holds {self.capacity} positions; position {t} does "
                             f"not fit")
        if t == 0:
            raise ValueError("step continues a sequence: call prefill first")
        self._check_tokens(tokens)
        autocast_on = _autocast_on(tokens.device)
        if self.cpu_step is not None:
            logits = None if autocast_on else self.cpu_step(tokens, t)  # (B, vocab)
            if logits is not None:
                for cache in self.caches:                    # the kernel wrote position t
                    cache._written(t)
                self.steps["numba"] += 1
                return logits
            if self.requested == "numba":
                raise ValueError("engine 'numba' computes in float32: decode under autocast "
                                 "with engine='torch' or 'auto'")
        B, H, d, dq = tokens.shape[0], self.cfg.n_heads, self.cfg.d_model, self.dq
        h = self.tokens[tokens] + self.positions[t]                      # (B, d)
        reads: dict = {}                    # what step t reads, shared by the blocks' caches
        for w, cache in zip(self.blocks, self.caches):
            x = w.ln1(h)
            qkv = F.linear(x, w.qkv_w, w.qkv_b)                          # (B, dq + H (dk + dv))
            q = split_heads(qkv[:, None, :dq], H)                        # (B, H, 1, dk), scaled
            kv = split_heads(qkv[:, None, dq:], H)                       # (B, H, 1, dk + dv)
            o = cache._step(q, kv, reads)                                # (B, H, 1, dv), fp32
            o = o.view(B, d) if o.dtype == x.dtype else o.view(B, d).to(x.dtype)
            h = residual(h, F.linear(o, w.proj_w, w.proj_b), w.ln2, w.feed_forward)
        self.steps["torch"] += 1
        return self.head(self.ln_f(h)).float()                           # (B, vocab)
