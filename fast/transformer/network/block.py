"""One residual block's arithmetic, written once: the model and the decoding step both call it.

Child et al., 2019, section 5.2 (eq. 10, 12-14), pre-activation residual blocks:

    a(H) = dropout(attention(norm(H)))
    b(H) = dropout(ff(norm(H + a(H))))
    H'   = H + a(H) + b(H)
    ff(x) = W_2 f(W_1 x + b_1) + b_2,   f(x) = x sigmoid(1.702 x)

``fast.transformer.network.model`` runs these over whole sequences (``Block``,
``FeedForward``, ``Attention``), ``fast.transformer.decoding.decode`` over one new
position per step, with the same functions on the same weights:

* ``gelu`` -- the paper's approximation f, with its slope ``GELU_SLOPE`` (the compiled
  CPU step, ``fast.transformer.decoding.cpu_kernel``, reads the slope from here too);
* ``feed_forward`` -- ff, from plain weight tensors as ``torch.nn.Linear`` holds them
  ((out, in) weights);
* ``split_heads`` / ``join_heads`` -- (B, n, H dh) <-> (B, H, n, dh), the attention
  projection's reshape into heads (sec. 5.1, eq. 8) and back;
* ``residual`` -- H + a + b given the attention branch a, the second norm and ff;
* ``Norm`` -- a LayerNorm as plain tensors (a named view of ``torch.nn.LayerNorm``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GELU_SLOPE = 1.702  # sec. 5.2: f(x) = x sigmoid(1.702 x), the paper's approximation of GeLU


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The paper's GeLU approximation f(x) = x * sigmoid(1.702 x) (sec. 5.2)."""
    return x * torch.sigmoid(GELU_SLOPE * x)


def feed_forward(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                 b2: torch.Tensor) -> torch.Tensor:
    """ff(x) = W_2 f(W_1 x + b_1) + b_2; x (..., d), w1 (m d, d), w2 (d, m d)."""
    return F.linear(gelu(F.linear(x, w1, b1)), w2, b2)


def split_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, n, H dh) -> (B, H, n, dh), a view: head h is features [h dh, (h + 1) dh)."""
    B, n, _ = t.shape
    return t.view(B, n, n_heads, -1).transpose(1, 2)                     # (B, H, n, dh)


def join_heads(t: torch.Tensor) -> torch.Tensor:
    """(B, H, n, dh) -> (B, n, H dh), the inverse of ``split_heads``."""
    B, H, n, dh = t.shape
    return t.transpose(1, 2).reshape(B, n, H * dh)                       # (B, n, H dh)


def residual(h: torch.Tensor, a: torch.Tensor, norm2, ff, dropout=None) -> torch.Tensor:
    """H + a(H) + b(H) with b = dropout(ff(norm2(H + a))), given the attention branch
    ``a`` (its dropout already applied) (eq. 10, 12-14)."""
    h = h + a
    b = ff(norm2(h))
    return h + (b if dropout is None else dropout(b))


@dataclass(frozen=True)
class Norm:
    """A LayerNorm as plain tensors, called like the module: ``Norm.of(ln)(x)``."""
    shape: tuple
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float

    @classmethod
    def of(cls, ln: torch.nn.LayerNorm) -> Norm:
        return cls(tuple(ln.normalized_shape), ln.weight, ln.bias, ln.eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)
