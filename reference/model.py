"""The Sparse Transformer forward pass in NumPy float64 (the ground truth for fast/model.py).

Child et al., 2019, sections 5.2-5.6 and eq. 9-15, written for reading:

    H_0 = tok[x] + sum_k pos_k[coordinate_k(position)]      (eq. 9, 15)
    a   = attention(norm(H))                                 (eq. 12, dropout off)
    b   = ff(norm(H + a))                                    (eq. 13)
    H  <- H + a + b                                          (eq. 10, 14)
    logits = norm(H_N) W_out + b_out                         (eq. 11, before its softmax)

Attention: q = x W_q + b_q (width d, or d/2 for half-size q/k), k, v likewise,
split into n_heads heads; head h of block r reads exactly
``reference.patterns.head_masks(pattern, n, n_heads, combine, layer=r)[h]``
through ``reference.attention.attend`` (scale 1/sqrt(per-head q/k width));
heads concatenated, then W_p. ff(x) = W_2 f(W_1 x + b_1) + b_2 with the
paper's GeLU f(x) = x sigmoid(1.702 x). Evaluation mode: no dropout.

``weights`` is a dict of arrays named as the PyTorch model's ``state_dict``
(``embed.tok.weight``, ``embed.pos.0.weight``, ``blocks.3.attn.q.weight``, ...);
linear weights are (out, in) as in ``torch.nn.Linear`` (y = x W^T + b). ``cfg`` is
anything with the ModelConfig attributes used below (fast.transformer.config.ModelConfig
works; this file does not import torch).
"""

from __future__ import annotations

import numpy as np

from reference.attention import attend
from reference.params import PARAMS
from reference.patterns import head_masks

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default


def gelu(x: np.ndarray) -> np.ndarray:
    """f(x) = x * sigmoid(1.702 x) (sec. 5.2)."""
    return x / (1.0 + np.exp(-1.702 * x))


def layer_norm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LAYER_NORM_EPS) * gain + bias


def linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def coordinates(cfg, n: int) -> list[np.ndarray]:
    """(row, col, channel) of raster order with channels interleaved for images;
    (row, col) of a width-l grid for text."""
    p = np.arange(n)
    if cfg.embedding == "image":
        _, width, channels = cfg.image_shape
        return [p // (width * channels), (p // channels) % width, p % channels]
    return [p // cfg.stride, p % cfg.stride]


def pattern_params(cfg) -> dict:
    """The config's fields the pattern takes as parameters (of stride and c)."""
    required, optional = PARAMS[cfg.pattern]
    return {name: getattr(cfg, name) for name in ("stride", "c")
            if name in required or name in optional}


def attention(x: np.ndarray, w: dict, cfg, layer: int) -> np.ndarray:
    """Multi-head masked attention of block ``layer``. x: (B, n, d) -> (B, n, d)."""
    B, n, d = x.shape
    H = cfg.n_heads
    prefix = f"blocks.{layer}.attn"
    q = linear(x, w, f"{prefix}.q").reshape(B, n, H, -1).transpose(0, 2, 1, 3)  # (B, H, n, dqk)
    k = linear(x, w, f"{prefix}.k").reshape(B, n, H, -1).transpose(0, 2, 1, 3)  # (B, H, n, dqk)
    v = linear(x, w, f"{prefix}.v").reshape(B, n, H, -1).transpose(0, 2, 1, 3)  # (B, H, n, dh)
    masks = head_masks(cfg.pattern, n, H, cfg.combine, layer, **pattern_params(cfg))  # (H, n, n)
    out, _ = attend(q, k, v, masks[None])                                          # (B, H, n, dh)
    out = out.transpose(0, 2, 1, 3).reshape(B, n, d)                               # (B, n, d)
    return linear(out, w, f"{prefix}.proj")


def forward(weights: dict, cfg, idx) -> np.ndarray:
    """Logits (B, n, vocab_size) in float64 for token ids idx (B, n)."""
    w = {name: np.asarray(a, dtype=np.float64) for name, a in weights.items()}
    idx = np.asarray(idx)
    if idx.ndim != 2 or idx.dtype.kind not in "iu":
        raise ValueError(f"idx must be integer token ids (B, n), got {idx.dtype} {idx.shape}")
    n = idx.shape[1]
    if not 1 <= n <= cfg.n_ctx:
        raise ValueError(f"sequence length must be in [1, n_ctx={cfg.n_ctx}], got {n}")
    h = w["embed.tok.weight"][idx]                                                 # (B, n, d)
    for i, coord in enumerate(coordinates(cfg, n)):
        h = h + w[f"embed.pos.{i}.weight"][coord][None]                            # (1, n, d)
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}"
        a = attention(layer_norm(h, w[f"{p}.ln1.weight"], w[f"{p}.ln1.bias"]), w, cfg, layer)
        x2 = layer_norm(h + a, w[f"{p}.ln2.weight"], w[f"{p}.ln2.bias"])
        b = linear(gelu(linear(x2, w, f"{p}.ff.fc1")), w, f"{p}.ff.fc2")
        h = h + a + b
    h = layer_norm(h, w["ln_f.weight"], w["ln_f.bias"])
    return linear(h, w, "head")
