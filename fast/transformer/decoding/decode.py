"""Incremental decoding: a prefill pass over the prompt, then one token per step.

Child et al., 2019, sections 5.2-5.6 (the network of ``fast.transformer.network.model``)
and section 4.3 (which keys each head reads). Sampling draws one token at a
time; re-running the whole network on the prefix for every token costs O(t) full
layers per step. A ``Decoder`` keeps, per residual block, a key/value cache
(``fast.transformer.decoding.kv_cache``) and computes only the new position:

    prefill(idx)   the network's own forward pass over idx (B, p) -- the fast
                   attention path of ``sparse_attention`` -- storing every block's
                   keys and values; returns the logits of the last position;
    step(tokens)   the token at position t for each row (B,): embed it, and per
                   block project q, k, v, append k, v, attend row t over the keys
                   the pattern allows, W_p, the feed-forward; returns the logits
                   (B, vocab) that predict position t + 1.

A step runs the block's layers as the module does (same weights, same order of
operations), with q, k and v from one fused matrix product and attention from
the cache, so its logits equal those of ``model(idx)[:, -1]`` to float32
rounding (the tests ask 1e-5). q.k products, softmax and the weighted sum run in
float32 whatever the autocast precision (sec. 5.6: float16 q.k can overflow);
``qk_fp32=False`` turns that off only to show why it is there.

Two engines run a step (``engine``):

* "torch" -- the step written here in PyTorch: any device, any precision
  (float32, float64, autocast to bfloat16 or float16);
* "numba" -- the same step compiled for the CPU (``fast.transformer.decoding.cpu_step``,
  ``fast.transformer.decoding.cpu_kernel``): float32 only, without autocast. For small models
  PyTorch's per-operation dispatch, not the arithmetic, sets the pace of a step
  (about a hundred one-row products); as one compiled call, a whole photos32
  sample takes 2.5-3x less time (``python -m fast generate``). The caches and
  their reads are the same; the tests hold both engines to the re-run model.

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

import torch
import torch.nn.functional as F

from fast.transformer.decoding.kv_cache import CACHES, layer_cache
from fast.transformer.network.model import SparseTransformer

ENGINES = ("auto", "numba", "torch")

# What ``Decoder._weights`` holds for one block, in order (the step unpacks it so):
# LayerNorm 1 as torch.layer_norm takes it, the fused q/k/v product, W_p, LayerNorm 2,
# the feed-forward's W_1 and W_2 (weights as W^T, (in, out)).
BLOCK_FIELDS = ("ln1_shape", "ln1_w", "ln1_b", "ln1_eps", "qkv_b", "qkv_w", "proj_b", "proj_w",
                "ln2_shape", "ln2_w", "ln2_b", "ln2_eps", "fc1_b", "fc1_w", "fc2_b", "fc2_w")


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
        self.caches = [layer_cache(cache, capacity, H, self.dq // H, cfg.pattern, cfg.combine,
                                   i, params, qk_fp32) for i in range(cfg.n_layers)]
        self.scale = 1.0 / math.sqrt(self.dq // H)                        # folded into W_q
        self.t = 0
        with torch.no_grad():
            self.positions = model.embed.positions(capacity)             # (capacity, d)
            self.tokens = model.embed.tok.weight                         # (vocab, d)
            self.blocks = [self._weights(block, H, self.scale) for block in model.blocks]
            self.head = (*_norm(model.ln_f), model.head.bias,
                         model.head.weight.t().contiguous())
        self.requested, self.cpu_step = engine, None
        self.steps = {"numba": 0, "torch": 0}                          # steps each engine ran
        if engine != "torch" and not why:
            from fast.transformer.decoding.cpu_step import AUTO_MAX_KEYS, CpuStep  # imports Numba
            self.cpu_step = CpuStep(self, AUTO_MAX_KEYS if engine == "auto" else None)

    def named_blocks(self) -> list[dict]:
        """Every block's step weights by name (``BLOCK_FIELDS``)."""
        return [dict(zip(BLOCK_FIELDS, block)) for block in self.blocks]

    @property
    def engine(self) -> str:
        """The engine that runs the steps: "numba" or "torch" (module docstring)."""
        return "numba" if self.cpu_step is not None else "torch"

    @staticmethod
    def _weights(block, H: int, scale: float) -> tuple:
        """One block's weights as a step uses them (``BLOCK_FIELDS``), plain tensors
        read once here, not per step (a step is ~15 small products per block: Python
        and module attribute look-ups would cost as much as the arithmetic): LayerNorm 1's
        (shape, weight, bias, eps); the fused [scale W_q; W_k, W_v of head 0; ...;
        of head H-1]^T, with the attention's 1/sqrt(d) in W_q and each head's key
        and value side by side as the caches store them; W_p^T; LayerNorm 2; W_1^T
        and W_2^T with the GeLU's 1.702 moved into them, f(x) = x sigmoid(1.702 x)
        = silu(1.702 x) / 1.702 (sec. 5.2). (Float32 rounding aside, the same
        products as the module's.)"""
        a, ff = block.attn, block.ff
        w = [a.q.weight * scale] + [torch.cat(kv) for kv in zip(a.k.weight.chunk(H),
                                                                a.v.weight.chunk(H))]
        b = [a.q.bias * scale] + [torch.cat(kv) for kv in zip(a.k.bias.chunk(H),
                                                              a.v.bias.chunk(H))]
        return (*_norm(block.ln1), torch.cat(b), torch.cat(w).t().contiguous(), a.proj.bias,
                a.proj.weight.t().contiguous(), *_norm(block.ln2), ff.fc1.bias * 1.702,
                (ff.fc1.weight * 1.702).t().contiguous(), ff.fc2.bias,
                (ff.fc2.weight / 1.702).t().contiguous())

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
        h = model.embed(idx)                                             # (B, p, d)
        for block, cache in zip(model.blocks, self.caches):
            x = block.ln1(h)
            q, k, v = block.attn.project(x)                              # (B, H, p, *)
            cache.extend(torch.cat([k, v], dim=-1))                      # (B, H, p, dk + dv)
            flag, block.attn.qk_fp32 = block.attn.qk_fp32, self.qk_fp32  # the steps' rule
            try:
                out, _ = block.attn.attend(q, k, v, x.dtype)
            finally:
                block.attn.qk_fp32 = flag
            h = block.residual(h, block.attn.output(out))                # (B, p, d)
        self.t = p
        return model.head(model.ln_f(h[:, -1])).float()                  # (B, vocab)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Decode position t: tokens (B,) -> logits (B, vocab), float32, predicting t + 1."""
        t = self.t
        if t >= self.capacity:
            raise ValueError(f"the decoder holds {self.capacity} positions; position {t} does "
                             f"not fit")
        if t == 0:
            raise ValueError("step continues a sequence: call prefill first")
        autocast_on = _autocast_on(tokens.device)
        if self.cpu_step is not None:
            logits = None if autocast_on else self.cpu_step(tokens, t)  # (B, vocab)
            if logits is not None:
                self.t = t + 1
                self.steps["numba"] += 1
                return logits
            if self.requested == "numba":
                raise ValueError("engine 'numba' computes in float32: decode under autocast "
                                 "with engine='torch' or 'auto'")
        B, H, d, dq = tokens.shape[0], self.cfg.n_heads, self.cfg.d_model, self.dq
        h = self.tokens[tokens] + self.positions[t]                      # (B, d)
        reads: dict = {}                    # what step t reads, shared by the blocks' caches
        for (s1, w1, b1, e1, b_qkv, w_qkv, b_p, w_p, s2, w2, b2, e2, b_1, w_1, b_2, w_2), \
                cache in zip(self.blocks, self.caches):
            x = torch.layer_norm(h, s1, w1, b1, e1)
            qkv = torch.addmm(b_qkv, x, w_qkv)                           # (B, 2 dq + d)
            cache.append(t, qkv[:, dq:].view(B, H, 1, -1))               # (B, H, 1, dk + dv)
            q = qkv[:, :dq].view(B, H, 1, -1)                            # (B, H, 1, dk), scaled
            if autocast_on:                                  # q.k, softmax, sum in float32
                with torch.autocast(h.device.type, enabled=False):
                    o = cache.attend(q, t, 1.0, reads)                   # (B, H, 1, dv)
            else:
                o = cache.attend(q, t, 1.0, reads)
            o = o.view(B, d) if o.dtype == x.dtype else o.view(B, d).to(x.dtype)
            h = h + torch.addmm(b_p, o, w_p)                             # (B, d)
            y = torch.layer_norm(h, s2, w2, b2, e2)
            h = h + torch.addmm(b_2, F.silu(torch.addmm(b_1, y, w_1)), w_2)
        self.t = t + 1
        self.steps["torch"] += 1
        s_f, w_f, b_f, e_f, b_out, w_out = self.head
        h = torch.layer_norm(h, s_f, w_f, b_f, e_f)
        return torch.addmm(b_out, h, w_out).float()                      # (B, vocab)


def _norm(ln: torch.nn.LayerNorm) -> tuple:
    """A LayerNorm as torch.layer_norm's (normalized_shape, weight, bias, eps)."""
    return ln.normalized_shape, ln.weight, ln.bias, ln.eps
