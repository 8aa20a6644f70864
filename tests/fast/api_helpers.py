"""The truth for sparse_attention's arguments beyond self-attention, from ``reference/``.

Child et al., 2019, section 4 (eq. 2-4: output i reads the set S_i) and 4.3 (the
patterns). Imported by ``test_attention_api.py``, ``test_triton_attention.py`` and
``test_flex.py``. Everything here is built from ``reference.patterns`` and
``reference.attention`` (NumPy, float64):

* ``truth_masks``: which keys each query reads, (B, H, n_q, n_k) -- the last n_q rows of
  the pattern's masks at n_k; in a padded batch, sequence b's own masks (the pattern
  of its length, at its own positions 0..L-1) placed at its indices [P, P + L), every
  other pair False (a padded key is read by nobody, a padded query reads nothing);
  ANDed with a user's mask;
* ``truth``: out, dq, dk, dv of ``reference.attention`` over those masks, key/value
  heads repeated for the query heads that share them (and their gradients summed back),
  with dropout's kept weights when given.
"""

from __future__ import annotations

import numpy as np
import torch

from reference import patterns
from reference.attention import attend, attend_backward


def truth_masks(pattern, B, H, n_q, n_k, combine="merged", layer=0, lengths=None,
                offsets=None, attn_mask=None, **params) -> np.ndarray:
    """bool (B, H, n_q, n_k) (module docstring). A sequence of length L reads the
    pattern's masks at L positions: their first L rows and columns at n_k (every
    pattern's row i depends on positions <= i only)."""
    whole = patterns.head_masks(pattern, n_k, H, combine, layer, **params)     # (H, n_k, n_k)
    out = np.zeros((B, H, n_k, n_k), dtype=bool)
    for b in range(B):
        P = 0 if offsets is None else int(offsets[b])
        L = (n_k - P) if lengths is None else int(lengths[b])
        out[b, :, P:P + L, P:P + L] = whole[:, :L, :L]
    out = out[:, :, n_k - n_q:]
    if attn_mask is not None:
        out = out & np.asarray(attn_mask)
    return out


def truth(q, k, v, go, mask, scale=None, keep=None, dropout_p=0.0):
    """(out, dq, dk, dv) as float64 torch tensors from ``reference.attention``: q (B, H,
    n_q, d), k, v (B, Hkv, n_k, d) with Hkv dividing H (query head h reads key/value
    head h // (H / Hkv)), mask broadcastable to (B, H, n_q, n_k)."""
    H, Hkv = q.shape[1], k.shape[1]
    share = H // Hkv
    qn, kn, vn, gn = (t.detach().double().numpy() for t in (q, k, v, go))
    kn, vn = np.repeat(kn, share, axis=1), np.repeat(vn, share, axis=1)   # (B, H, n_k, d)
    out, _ = attend(qn, kn, vn, mask, scale=scale, keep=keep, dropout_p=dropout_p)
    dq, dk, dv = attend_backward(qn, kn, vn, mask, gn, scale=scale, keep=keep,
                                 dropout_p=dropout_p)
    B, _, n_k, d = kn.shape
    dk = dk.reshape(B, Hkv, share, n_k, d).sum(2)
    dv = dv.reshape(B, Hkv, share, n_k, d).sum(2)
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in (out, dq, dk, dv)]


def inputs(B, H, Hkv, n_q, n_k, d, seed, dtype=torch.float64):
    """Seeded q (B, H, n_q, d), k, v (B, Hkv, n_k, d) and an output gradient, drawn in
    float64, then cast."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return draw(B, H, n_q, d), draw(B, Hkv, n_k, d), draw(B, Hkv, n_k, d), draw(B, H, n_q, d)


def run(fn, q, k, v, go):
    """(out, dq, dk, dv) of fn on leaf copies of q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(go)
    return [out.detach(), q.grad, k.grad, v.grad]
