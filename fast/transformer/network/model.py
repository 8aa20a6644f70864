"""The Sparse Transformer network in PyTorch.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers",
sections 5.2-5.6 and 6:

    H_0 = embed(X, W_e)                                  (eq. 9; embed: eq. 15)
    a(H) = dropout(attention(norm(H)))                   (eq. 12)
    b(H) = dropout(ff(norm(H + a(H))))                   (eq. 13)
    H_k = H_{k-1} + a(H_{k-1}) + b(H_{k-1})              (eq. 10, 14)
    y   = softmax(norm(H_N) W_out)                       (eq. 11)

* norm = LayerNorm; ff(x) = W_2 f(W_1 x + b_1) + b_2 with f(x) = x sigmoid(1.702 x),
  W_1 widening by ``ff_mult`` (4, or 2 for the "half-size" network);
* attention: q, k, v projections (q and k of width d/2 with ``qk_half``), heads
  of width d / n_heads, ``fast.sparse_attention`` with the configured pattern,
  combine mode and -- for "interleaved" -- the block index as ``layer``; output
  projection W_p;
* embeddings: a token embedding (vocab_size + 1 rows: the last row is the start
  token that images are shifted by) plus learned embeddings of each position's
  coordinates: (row, column, channel) for images in raster order with channels
  interleaved, (row, column) of a grid of width l (the stride) for text;
* init (sec. 6): W_e ~ N(0, 0.125/sqrt(d)), position embeddings
  N(0, 0.125/sqrt(d n_emb)), other weights N(0, 0.125/sqrt(d_in)) (standard
  deviations), biases 0; W_2 and W_p further scaled by 1/sqrt(2N). The paper's
  "The weight matrix for the output logits was initialized to 0" is
  ``output_init="zero"``; by default W_out is drawn like the other weights
  (``ModelConfig.output_init``: at the CPU scale of Table 2 the zero W_out cost
  held-out bits, docs/design.md §4);
* dropout only at the end of each residual branch, never inside attention, so
  recomputation (``recompute=True``: torch.utils.checkpoint of every block,
  use_reentrant=False, RNG state preserved) gives the same loss and gradients.

Two attention paths, chosen by one flag (``ModelConfig.attention_impl``):
"sparse" calls ``fast.sparse_attention``; "masked" builds the (H, n, n) masks
(``fast.backends.masks.head_masks``, equal to ``reference.patterns.head_masks``) and
runs an explicit masked softmax. ``forward(..., return_attention=True)`` always
takes the masked path and returns the attention weights: for figures at tiny sizes.

Attention is split into ``project`` (q, k, v), ``attend`` and ``output`` (W_p),
and a block's residual sum into ``Block.residual``, so that incremental decoding
(``fast.transformer.decoding.decode``: a prefill through this forward pass, then one
position per step with a key/value cache) runs the same layers; the arithmetic of a
block (the GeLU, the feed-forward, the split into heads, the residual sum) is
``fast.transformer.network.block``, which the decoding step calls too.

``reference/model.py`` is the NumPy float64 twin of this forward pass.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from fast.attention import sparse_attention
from fast.backends import masks as masks_torch
from fast.transformer.config import ModelConfig
from fast.transformer.network.block import feed_forward, join_heads, residual, split_heads

INIT_SCALE = 0.125  # sec. 6: every init standard deviation is 0.125 / sqrt(fan-in)


def position_coordinates(cfg: ModelConfig, n: int) -> list[torch.Tensor]:
    """Coordinates of positions 0..n-1 (eq. 15): [row, col, channel] for images in
    raster order with channels interleaved (position p = (row*W + col)*C + ch),
    [row, col] of a width-l grid for text. Each a LongTensor (n,)."""
    p = torch.arange(n)
    if cfg.embedding == "image":
        _, w, ch = cfg.image_shape
        return [p // (w * ch), (p // ch) % w, p % ch]
    return [p // cfg.stride, p % cfg.stride]


def position_table_sizes(cfg: ModelConfig) -> list[int]:
    """Rows of each position-embedding table."""
    if cfg.embedding == "image":
        return list(cfg.image_shape)
    return [math.ceil(cfg.n_ctx / cfg.stride), cfg.stride]


class Embedding(nn.Module):
    """Token embedding plus the sum of the coordinate embeddings (eq. 15)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size + 1, cfg.d_model)   # last row: start token
        self.pos = nn.ModuleList(nn.Embedding(s, cfg.d_model) for s in position_table_sizes(cfg))
        for i, coords in enumerate(position_coordinates(cfg, cfg.n_ctx)):
            self.register_buffer(f"coord{i}", coords, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[1]
        h = self.tok(idx)                                                # (B, n, d)
        for i, table in enumerate(self.pos):
            h = h + table(getattr(self, f"coord{i}")[:n])                # (n, d) broadcast
        return h

    def positions(self, n: int) -> torch.Tensor:
        """The summed position embeddings of positions 0..n-1: (n, d); decoding adds
        row t to the embedding of the token at position t."""
        h = None
        for i, table in enumerate(self.pos):
            e = table(getattr(self, f"coord{i}")[:n])                    # (n, d)
            h = e if h is None else h + e
        return h


class Attention(nn.Module):
    """Multi-head sparse self-attention with its projections (sec. 5.1-5.2)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.q = nn.Linear(cfg.d_model, cfg.qk_dim)
        self.k = nn.Linear(cfg.d_model, cfg.qk_dim)
        self.v = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)                # W_p
        self.qk_fp32 = False   # sampling sets this: q.k products in fp32 (sec. 5.6)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        q, k, v = self.project(x)
        out, weights = self.attend(q, k, v, x.dtype, return_attention)
        out = self.output(out)
        return (out, weights) if return_attention else out

    def project(self, x: torch.Tensor):
        """x (B, n, d) -> q, k (B, H, n, dqk) and v (B, H, n, dh): the projections,
        split into heads (what a decoding cache stores: k and v)."""
        H = self.cfg.n_heads
        q = split_heads(self.q(x), H)                                    # (B, H, n, dqk)
        k = split_heads(self.k(x), H)                                    # (B, H, n, dqk)
        v = split_heads(self.v(x), H)                                    # (B, H, n, dh)
        return q, k, v

    def attend(self, q, k, v, dtype: torch.dtype, return_attention: bool = False):
        """(out (B, H, n, dh) in ``dtype`` when qk_fp32, attention weights or None)."""
        scale = 1.0 / math.sqrt(q.shape[-1])
        if self.qk_fp32:
            q, k, v = q.float(), k.float(), v.float()
        fp32 = torch.autocast(q.device.type, enabled=False) if self.qk_fp32 else None
        with fp32 or contextlib.nullcontext():
            if return_attention or self.cfg.attention_impl == "masked":
                out, weights = self._masked(q, k, v, scale)
            else:
                out, weights = self._sparse(q, k, v, scale), None
        return (out.to(dtype) if self.qk_fp32 else out), weights

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, H, n, dh) -> W_p applied to them joined: (B, n, d)."""
        return self.proj(join_heads(out))                                # (B, n, d)

    def _sparse(self, q, k, v, scale):
        cfg = self.cfg
        if q.shape[-1] != v.shape[-1]:
            # Half-size q/k: sparse_attention wants one head width, so pad q and k
            # with zeros (q.k is unchanged) and keep the scale of the true width.
            pad = v.shape[-1] - q.shape[-1]
            q, k = F.pad(q, (0, pad)), F.pad(k, (0, pad))               # (B, H, n, dh)
        if not q.dtype == k.dtype == v.dtype:   # (a dispatch each: only when they differ)
            dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        return sparse_attention(q, k, v, cfg.pattern, combine=cfg.combine, layer=self.layer,
                                scale=scale, backend=cfg.attention_backend,
                                **cfg.pattern_params())

    def _masked(self, q, k, v, scale):
        """Explicit masked softmax from the pattern's masks; returns (out, weights)."""
        cfg = self.cfg
        n = q.shape[2]
        mask = masks_torch.head_masks(cfg.pattern, n, cfg.n_heads, cfg.combine, self.layer,
                                      device=q.device, **cfg.pattern_params())   # (H, n, n)
        dtype = torch.promote_types(q.dtype, torch.float32)              # fp32 at least
        with torch.autocast(q.device.type, enabled=False):
            scores = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale   # (B, H, n, n)
            scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            weights = torch.nan_to_num(weights, nan=0.0)                 # rows that read nothing
            out = (weights @ v.to(dtype)).to(v.dtype)                    # (B, H, n, dh)
        return out, weights


class FeedForward(nn.Module):
    """ff(x) = W_2 f(W_1 x + b_1) + b_2 (sec. 5.2)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.ff_mult * cfg.d_model)     # W_1
        self.fc2 = nn.Linear(cfg.ff_mult * cfg.d_model, cfg.d_model)     # W_2

    def forward(self, x):
        return feed_forward(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)


class Block(nn.Module):
    """One pre-activation residual block: H + a(H) + b(H) (eq. 10, 12-14)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, layer)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h: torch.Tensor, return_attention: bool = False):
        if return_attention:
            a, weights = self.attn(self.ln1(h), return_attention=True)
        else:
            a, weights = self.attn(self.ln1(h)), None
        out = self.residual(h, a)
        return (out, weights) if return_attention else out

    def residual(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """H + a(H) + b(H) given the attention branch a before its dropout (eq. 10, 13-14)."""
        return residual(h, self.drop(a), self.ln2, self.ff, self.drop)


def check_token_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """ValueError unless every id lies in [0, vocab_size] (vocab_size is the start
    token: the embedding's last row), read only where that costs no wait -- on the CPU,
    outside torch.compile (on a GPU, or traced, nothing is read)."""
    if ids.device.type != "cpu" or torch.compiler.is_compiling() or ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi > vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size + 1}), got values in "
                         f"[{lo}, {hi}] ({vocab_size} is the start token)")


class SparseTransformer(nn.Module):
    """The Sparse Transformer: ``model(idx) -> logits``.

    idx: LongTensor (B, n) with 1 <= n <= cfg.n_ctx and values in [0, vocab_size]
    (vocab_size is the start token; the values are checked on the CPU, outside
    torch.compile, where reading them costs no wait). Returns logits (B, n, vocab_size); position
    i predicts the token that follows idx[:, :i+1]. With ``return_attention=True``
    returns ``(logits, [weights per block])``, each (B, H, n, n) (float32, or float64
    for a float64 model), from the explicit masked path (figures only; no
    recomputation there).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"SparseTransformer needs a fast.transformer.config.ModelConfig, got "
                             f"{type(cfg).__name__}")
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)              # W_out
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The paper's initialisation (sec. 6), W_out as ``cfg.output_init`` says; call after
        seeding. W_out is drawn in either case, so the other weights do not depend on it."""
        cfg = self.cfg
        d = cfg.d_model
        self.embed.tok.weight.normal_(0.0, INIT_SCALE / math.sqrt(d))
        n_emb = len(self.embed.pos)
        for table in self.embed.pos:
            table.weight.normal_(0.0, INIT_SCALE / math.sqrt(d * n_emb))
        residual_scale = 1.0 / math.sqrt(2 * cfg.n_layers)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, INIT_SCALE / math.sqrt(module.in_features))
                module.bias.zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        for block in self.blocks:
            block.ff.fc2.weight.mul_(residual_scale)                      # W_2
            block.attn.proj.weight.mul_(residual_scale)                   # W_p
        if cfg.output_init == "zero":
            self.head.weight.zero_()                                      # W_out, sec. 6

    def forward(self, idx: torch.Tensor, *, return_attention: bool = False):
        cfg = self.cfg
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be a LongTensor of shape (B, n), got "
                             f"{getattr(idx, 'dtype', type(idx).__name__)} of shape "
                             f"{tuple(getattr(idx, 'shape', ()))}")
        n = idx.shape[1]
        if not 1 <= n <= cfg.n_ctx:
            raise ValueError(f"sequence length must be in [1, n_ctx={cfg.n_ctx}], got {n}")
        if idx.shape[0] == 0:
            raise ValueError(f"idx must hold at least one sequence (B >= 1), got shape "
                             f"{tuple(idx.shape)}")
        check_token_ids(idx, cfg.vocab_size)
        h = self.embed(idx)                                              # (B, n, d)
        weights = []
        for block in self.blocks:
            if return_attention:
                h, w = block(h, return_attention=True)
                weights.append(w)
            elif cfg.recompute and torch.is_grad_enabled():      # train or eval mode
                # Keep only the block input; recompute attention and ff in backward.
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False,
                                                      preserve_rng_state=True)
            else:
                h = block(h)
        logits = self.head(self.ln_f(h))                                 # (B, n, vocab)
        return (logits, weights) if return_attention else logits

    def set_qk_fp32(self, on: bool = True) -> None:
        """Compute q.k products (and attention) in fp32 even under autocast (sampling)."""
        for block in self.blocks:
            block.attn.qk_fp32 = on

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

