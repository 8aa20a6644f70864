"""A decoder's step on the CPU as one compiled call: ``fast.transformer.decoding.cpu_kernel``.

Child et al., 2019, sections 5.2-5.6 (the network) and 4.3 (which keys a head
reads). ``fast.transformer.decoding.decode.Decoder`` uses this for float32 models on the
CPU (its ``engine`` "numba"); the arithmetic is the kernel's, the bookkeeping is
here:

* once: every block's weights, as the PyTorch step uses them
  (``decode.BlockWeights``, by name), stacked over the blocks into NumPy arrays,
  linear weights transposed to (in, out) as the kernel reads them; after the
  prefill, every cache's stores as NumPy views of the same memory (the kernel
  writes position t into them, so the caches stay whole: ``nbytes``, the PyTorch
  step and the tests read the same stores); and per block and head, its store
  and slot;
* per step: each cache's ``plan`` (which rows receive position t, which rows each
  head reads), worked out once per signature -- blocks whose heads read alike
  share one -- and laid out in the flat tables the kernel takes.

With ``max_keys`` set (the decoder's "auto" engine: ``AUTO_MAX_KEYS``), a step
whose heads read more keys than that is handed back (``None``) to the PyTorch
step: the kernel wins by skipping PyTorch's per-operation dispatch, which is a
fixed cost per step, and loses where a step is mostly attention over many keys,
which PyTorch computes with vectorised matrix products. ``AUTO_MAX_KEYS`` is where
the two cross on this project's 2-core machine: ``python -m fast generate`` times
both engines side by side, alternating, on its Enwik8-shaped model and records the
crossover (figures/data/generation.json, "engines"; notebook 09 prints it). On
2026-11-29 the compiled step led at 1,632 keys per head (1.06x) and trailed at 2,400
(0.85x); the straight line between them crosses 1 near 1,850 keys, so 1,792 (14 x 128).
The limit was 1,024 before, from an earlier run on the same machine: it sent steps to
PyTorch that the compiled step ran faster.
"""

from __future__ import annotations

import numpy as np
import torch

from fast.transformer.decoding import cpu_kernel

NO_FLAGS = np.zeros(0, dtype=bool)                   # every head reads every row
AUTO_MAX_KEYS = 1792            # "auto": steps reading more keys per head run in PyTorch

# The per-block weights in the order ``cpu_kernel.decode_step`` takes them, read from a
# ``decode.BlockWeights`` by name; linear weights as W^T, (in, out).
KERNEL_WEIGHTS = (lambda b: b.ln1.weight, lambda b: b.ln1.bias,
                  lambda b: b.qkv_w.t(), lambda b: b.qkv_b,
                  lambda b: b.proj_w.t(), lambda b: b.proj_b,
                  lambda b: b.ln2.weight, lambda b: b.ln2.bias,
                  lambda b: b.fc1_w.t(), lambda b: b.fc1_b,
                  lambda b: b.fc2_w.t(), lambda b: b.fc2_b)


def _numpy(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().cpu().numpy())


class CpuStep:
    """``step(tokens, t)`` for ``decoder``'s weights and caches (module docstring)."""

    def __init__(self, decoder, max_keys: int | None = None):
        if cpu_kernel.MISSING:
            raise ValueError(cpu_kernel.MISSING)
        self.decoder, self.max_keys = decoder, max_keys
        blocks, ln_f, head = decoder.blocks, decoder.ln_f, decoder.head
        self.weights = tuple(np.stack([_numpy(take(b)) for b in blocks])
                             for take in KERNEL_WEIGHTS)                    # (L, ...) each
        self.eps = np.array([[b.ln1.eps, b.ln2.eps] for b in blocks] + [[ln_f.eps, ln_f.eps]],
                            dtype=np.float64)
        self.head = (_numpy(ln_f.weight), _numpy(ln_f.bias), _numpy(head.weight.t()),
                     _numpy(head.bias))
        self.embed, self.positions = _numpy(decoder.tokens), _numpy(decoder.positions)
        self.stores = None                      # after the prefill, at the first step

    def _bind(self) -> None:
        """The stores as one list of NumPy views, each block and head's place in it,
        and one cache and group per signature to plan the steps with."""
        from numba.typed import List

        caches, H = [c.store for c in self.decoder.caches], self.decoder.cfg.n_heads
        stores, self.reps, n_rows = [], {}, 0
        self.table = np.zeros((len(caches), H, 7), np.int64)   # cpu_kernel's table
        self.where = np.zeros((len(caches), H), np.int64)      # block, head -> plan row
        for layer, cache in enumerate(caches):
            for g, (heads, key, signature) in enumerate(cache.plan_groups()):
                if signature not in self.reps:                  # (cache, group, first row)
                    self.reps[signature] = (cache, g, n_rows)
                    n_rows += len(heads)
                self.table[layer, heads, 0] = len(stores)
                self.table[layer, heads, 1] = np.arange(len(heads))
                self.where[layer, heads] = self.reps[signature][2] + np.arange(len(heads))
                stores.append(cache.stores[key].numpy())
        self.plans = np.zeros((int(self.where.max()) + 1, 5), np.int64)  # per plan row
        self.stores = List(stores)

    def __call__(self, tokens: torch.Tensor, t: int) -> torch.Tensor | None:
        """Position t: tokens (B,) -> logits (B, vocab), float32; None when a head
        reads more than ``max_keys`` keys (the caller runs the PyTorch step)."""
        if self.stores is None:
            self._bind()
        # the kernel does not bound-check: Decoder.step checked the ids (shape, range)
        ids = np.ascontiguousarray(tokens.numpy(), dtype=np.int64)
        shared: dict = {}
        rows, keep, n_rows, n_keep = [], [], 0, 0
        for cache, g, first in self.reps.values():     # one plan per signature
            writes, r, k = cache.plan(g, t, shared)
            heads, m = writes.shape[0], len(r)
            plan = self.plans[first:first + heads]     # w0, w1, lo, hi, first keep flag
            plan[:, :2], plan[:, 2], plan[:, 3] = writes, n_rows, n_rows + m
            if k is None:
                plan[:, 4] = -1
            else:
                plan[:, 4] = n_keep + m * np.arange(heads)
                keep.append(k.ravel())
                n_keep += k.size
            rows.append(r)
            n_rows += m
            if self.max_keys is not None and m > self.max_keys:
                return None
        self.table[:, :, 2:] = self.plans[self.where]
        logits = cpu_kernel.decode_step(
            ids, self.embed, self.positions[t], *self.weights, self.eps, *self.head,
            self.stores, self.table, rows[0] if len(rows) == 1 else np.concatenate(rows),
            keep[0] if len(keep) == 1 else np.concatenate(keep) if keep else NO_FLAGS)
        return torch.from_numpy(logits)                                   # (B, vocab)
