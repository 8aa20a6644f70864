"""``SparseKVCache``: the key/value cache of one attention layer, for sampling from any model.

Child et al., 2019, section 4.3 (the strided and fixed patterns: a head reads about
sqrt(n) earlier positions), section 5.1 (eq. 5-8: merged, multi-head and interleaved
heads) and section 5.6 (query-key products in float32 when sampling). Sampling
draws one token at a time; re-running the model over the whole prefix for each one
costs O(t) positions of every layer per token. A cache keeps each layer's keys and
values and computes only the new position's row of attention: the keys that row
reads, nothing else. In a model whose attention calls ``fast.sparse_attention``::

    cache = SparseKVCache("strided", stride=32, n_heads=4, key_dim=48, capacity=1024)
    # the prompt, positions 0..p-1: the model's own attention, then keep its keys
    y = sparse_attention(q, k, v, "strided", stride=32)          # (B, H, p, d)
    cache.prefill(k, v)
    # every later position: append its key and value, attend its query
    y = cache.step(q, k, v)                                     # (B, H, 1, dv)

(a whole nanoGPT-style model and its ``generate()``: docs/examples/tiny_gpt.py; that
prompt step needs values as wide as keys, since ``sparse_attention`` takes k and v of
one shape: a cache made with another ``value_dim`` is filled by ``prefill`` after the
prompt's attention however the model computes it, or by ``step`` over the prompt).
Position t reads exactly row t of
``reference.patterns.head_masks(pattern, capacity, n_heads, combine, layer, **params)``
(``fast.backends.reads``), so the cached sampler is the re-run sampler
to rounding.

Decisions:

* **What it keeps** (mode "sparse"): only what a later query can still read, the
  project's rule (``fast.transformer.decoding.kv_cache.SparseCache``): strided keeps
  every key and reads l + t / l of them, fixed keeps each head's own summaries and
  the current block (stores laid out for the paper's patterns full, strided, fixed);
  any other registered pattern keeps every key and reads only those its row of the
  mask holds (``fast.backends.reads``: the row found by O(t) index arithmetic, the
  attention over the keys read). Mode "dense" keeps every key, reads all t + 1 and
  masks the row: the baseline to compare with.
* **The position is the cache's**: ``prefill`` starts at position 0 (a cache that
  holds positions refuses it: ``reset`` first); ``step`` appends at ``position``.
  It is one position for the whole batch: the cache takes no padding, so prompts of
  different lengths need a cache each (or ``sparse_attention`` with ``lengths`` /
  ``offsets``, which takes padded batches, over the whole prefix).
  ``step`` takes p >= 1 positions: p = 1 is the decoding step; p > 1 continues a
  sequence by several positions at once (a chunk of a long prompt, or a prompt
  without ``prefill``), computed as p one-position steps: exact, and a chunk costs
  what its steps cost (the stores hold only what later rows read, not every key a
  chunk's product would take). A caller that still holds every key computes a chunk
  in one call, ``sparse_attention(q_chunk, k_all, v_all, ...)`` (fewer queries than
  keys, aligned to the end). The fast way to start a sequence is the model's own
  ``sparse_attention`` over the prompt, then ``prefill``.
* **Sizes fixed at creation, dtype and device at the first tensors**: the stores
  are allocated for ``capacity`` positions when the first keys arrive, in their
  dtype (float64, float32, bfloat16 or float16), on their device, for their batch;
  later tensors must match, and a position past ``capacity`` is refused.
  ``reset`` forgets the sequence and the stores (the next tensors choose again).
  A copy (``copy.deepcopy``, ``pickle``) taken mid-sequence steps on by itself from
  the same position: its views into its stores are made again, not copied apart.
* **Precision**: q.k, the softmax and the weighted sum run in float32 (float64 for
  float64 input) whatever the input dtype, with autocast off for them (sec. 5.6:
  float16 q.k can overflow); the output has q's dtype. A row that reads nothing
  outputs 0. Values are not checked for NaN or inf (a check per step would cost as
  much as a small step's arithmetic): a NaN in comes out as a NaN, never hidden.
* **Grouped key/value heads** (grouped-query attention): ``kv_heads`` dividing
  ``n_heads``; query head h reads key/value head h // (n_heads / kv_heads), as
  ``torch.repeat_interleave`` and SDPA's ``enable_gqa`` pair them. A key/value head
  must keep the union of what its query heads read. Mode "dense" keeps every key:
  any pattern. Mode "sparse" keeps one set per head for the paper's patterns, so it
  takes grouped heads where every query head of a key/value head reads the same keys
  -- "full", strided "merged" and "interleaved", a fixed layer whose heads read only
  the block -- and refuses the rest with a ValueError naming ``kv_heads`` (multi-head
  layers pair an A(1) head with an A(2) head, and fixed heads read distinct summary
  sub-blocks); the other patterns keep every key, so they take any grouping.
* **One implementation**: the project's ``Decoder`` holds one of these per residual
  block. It checks its input once and computes q, k and v in one fused product, so it
  calls ``_step`` (one position, key and value side by side, unchecked); its compiled
  CPU step writes position t into ``store``'s stores itself and reports it with
  ``_written``. Bad input to the public methods raises ValueError (TypeError for a
  non-tensor) saying what was given and what is allowed.
"""

from __future__ import annotations

import torch

from fast.core.checks import DTYPES, check_scale
from fast.transformer.decoding.kv_cache import CACHES, layer_cache
from reference.params import check_int, check_params


class SparseKVCache:
    """Keys and values of one attention layer for ``capacity`` positions (module docstring).

    pattern, stride, c, combine, layer and the neighbours' parameters: as
    ``fast.sparse_attention`` takes them. n_heads query heads of width ``key_dim``;
    ``kv_heads`` key/value heads (None: n_heads), keys of width ``key_dim`` and values
    of width ``value_dim`` (None: key_dim). scale: of q.k, 1 / sqrt(key_dim) for None.
    mode: "sparse" (keep and read only what the pattern allows) or "dense" (every key,
    the row masked). qk_fp32=False computes q.k in the keys' dtype: only to show the
    float16 overflow it avoids (sec. 5.6).

    >>> cache = SparseKVCache("fixed", stride=6, c=2, n_heads=2, key_dim=4, capacity=20)
    >>> cache.prefill(k, v)              # k, v (B, 2, p, 4): positions 0..p-1
    >>> out = cache.step(q, k1, v1)      # (B, 2, 1, 4): position p
    """

    def __init__(self, pattern: str, *, n_heads: int, key_dim: int, capacity: int,
                 value_dim: int | None = None, kv_heads: int | None = None,
                 stride: int | None = None, c: int | None = None, combine: str = "merged",
                 layer: int = 0, scale: float | None = None, mode: str = "sparse",
                 qk_fp32: bool = True, **pattern_params):
        if mode not in CACHES:
            raise ValueError(f"mode must be one of {CACHES}, got {mode!r}")
        capacity = check_int("capacity", capacity, 1)
        params = check_params(pattern, capacity, n_heads, combine, layer,
                              {"stride": stride, "c": c, **pattern_params})
        self.key_dim = check_int("key_dim", key_dim, 1)
        self.value_dim = self.key_dim if value_dim is None else check_int("value_dim",
                                                                           value_dim, 1)
        self.kv_heads = n_heads if kv_heads is None else check_int("kv_heads", kv_heads, 1)
        if n_heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide n_heads={n_heads} (each key/value head "
                             f"serves n_heads / kv_heads query heads), got kv_heads="
                             f"{self.kv_heads}")
        self.pattern, self.params, self.n_heads = pattern, params, int(n_heads)
        self.combine, self.layer, self.capacity, self.mode = combine, int(layer), capacity, mode
        self.scale = check_scale(scale, self.key_dim)
        self.qk_fp32 = qk_fp32
        self.reset()

    def reset(self) -> None:
        """Forget the sequence: position 0, no stores (the next tensors allocate them)."""
        self.store = layer_cache(self.mode, self.capacity, self.n_heads, self.key_dim,
                                 self.pattern, self.combine, self.layer, self.params,
                                 self.qk_fp32, self.kv_heads)
        self._t = 0
        self._batch = self._dtype = self._device = None    # of the first tensors

    @property
    def position(self) -> int:
        """The next position: how many positions the cache has seen."""
        return self._t

    def nbytes(self) -> int:
        """Bytes of keys and values held (the stores are allocated at the first position,
        for ``capacity`` positions: the size of a whole sequence)."""
        return self.store.nbytes()

    def __repr__(self) -> str:
        params = "".join(f", {key}={val!r}" for key, val in self.params.items())
        return (f"SparseKVCache({self.pattern!r}{params}, n_heads={self.n_heads}, "
                f"kv_heads={self.kv_heads}, key_dim={self.key_dim}, value_dim={self.value_dim}, "
                f"capacity={self.capacity}, combine={self.combine!r}, layer={self.layer}, "
                f"mode={self.mode!r}, position={self._t})")

    # ------------------------------------------------------------------
    # The public calls, checked.
    # ------------------------------------------------------------------

    def prefill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep the keys and values of positions 0..p-1: k (B, kv_heads, p, key_dim), v
        (B, kv_heads, p, value_dim). Their attention is the model's own (``sparse_attention``
        over the prompt); the cache then stands at position p."""
        if self._t:
            raise ValueError(f"prefill starts a sequence at position 0; this cache is at "
                             f"position {self._t} (step continues it, reset starts again)")
        p = self._check(k, v)
        self.store.extend(torch.cat([k, v], dim=-1))                   # (B, Hk, p, dk + dv)
        self._t = p

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append positions t..t+p-1 (t = ``position``) and attend their queries:
        q (B, n_heads, p, key_dim), k (B, kv_heads, p, key_dim), v (B, kv_heads, p,
        value_dim) -> (B, n_heads, p, value_dim) in q's dtype. Query t + i reads row
        t + i of the pattern, the positions appended with it included; p > 1 runs as
        p one-position steps."""
        p = self._check(k, v, q)
        kv = torch.cat([k, v], dim=-1)                                   # (B, Hk, p, dk + dv)
        outs = [self._step(q[:, :, i:i + 1], kv[:, :, i:i + 1]) for i in range(p)]
        out = outs[0] if p == 1 else torch.cat(outs, dim=2)              # (B, H, p, dv)
        return out.to(q.dtype)

    def _check(self, k, v, q=None) -> int:
        """The number of positions p that k, v (and q) hold, after checking them
        against the cache's sizes, against each other, against the first tensors'
        batch, dtype and device, and against ``capacity``."""
        named = (("q", q, self.n_heads, self.key_dim),) if q is not None else ()
        named += (("k", k, self.kv_heads, self.key_dim), ("v", v, self.kv_heads,
                                                           self.value_dim))
        for name, x, heads, width in named:
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor of shape (B, {heads}, p, "
                                f"{width}), got {type(x).__name__}")
            if x.dim() != 4 or x.shape[1] != heads or x.shape[3] != width:
                raise ValueError(f"{name} must have shape (B, {heads}, p, {width}) (B, heads, "
                                 f"positions, width; this cache has n_heads={self.n_heads}, "
                                 f"kv_heads={self.kv_heads}, key_dim={self.key_dim}, "
                                 f"value_dim={self.value_dim}), got shape {tuple(x.shape)}")
            if x.dtype not in DTYPES:
                raise ValueError(f"{name} has dtype {x.dtype}; allowed: "
                                 f"{', '.join(str(d) for d in DTYPES)}")
        tensors = [x for _, x, _, _ in named]
        shapes = ", ".join(f"{name} {tuple(x.shape)}" for name, x, _, _ in named)
        if len({(x.shape[0], x.shape[2]) for x in tensors}) != 1:
            raise ValueError(f"{', '.join(name for name, *_ in named)} must share the batch B "
                             f"and the positions p, got {shapes}")
        if len({x.dtype for x in tensors}) != 1:
            raise ValueError(f"{', '.join(name for name, *_ in named)} must have one dtype, "
                             f"got {', '.join(f'{n} {x.dtype}' for n, x, _, _ in named)}")
        if len({x.device for x in tensors}) != 1:
            raise ValueError(f"{', '.join(name for name, *_ in named)} must be on one device, "
                             f"got {', '.join(f'{n} {x.device}' for n, x, _, _ in named)}")
        B, p = k.shape[0], k.shape[2]
        if B == 0 or p == 0:
            raise ValueError(f"B and p must be >= 1, got {shapes}")
        if self._dtype is not None and (B, k.dtype, k.device) != (self._batch, self._dtype,
                                                                   self._device):
            raise ValueError(f"this cache holds batch {self._batch}, dtype {self._dtype} on "
                             f"{self._device} (from its first tensors), got batch {B}, "
                             f"dtype {k.dtype} on {k.device}; reset() starts a new sequence")
        if self._t + p > self.capacity:
            raise ValueError(f"positions {self._t}..{self._t + p - 1} do not fit: this cache "
                             f"holds capacity={self.capacity} positions (0..{self.capacity - 1}) "
                             f"and stands at position {self._t}")
        self._batch, self._dtype, self._device = B, k.dtype, k.device
        return p

    # ------------------------------------------------------------------
    # The decoder's calls (fast.transformer.decoding.decode), unchecked.
    # ------------------------------------------------------------------

    def _step(self, q: torch.Tensor, kv: torch.Tensor, reads: dict | None = None
              ) -> torch.Tensor:
        """One position, t = ``position``: append kv (B, kv_heads, 1, key_dim + value_dim),
        the key then the value, and attend q (B, n_heads, 1, key_dim). Returns
        (B, n_heads, 1, value_dim) in float32 (float64 for float64). ``reads`` shares
        what step t reads between the layers of one step (the decoder's blocks)."""
        t = self._t
        self.store.append(t, kv)
        if torch.is_autocast_enabled(q.device.type):                # q.k, softmax in float32
            with torch.autocast(q.device.type, enabled=False):
                out = self.store.attend(q, t, self.scale, reads)
        else:
            out = self.store.attend(q, t, self.scale, reads)
        self._t = t + 1
        return out

    def _written(self, t: int) -> None:
        """Position t was written into the stores by the compiled CPU step
        (``fast.transformer.decoding.cpu_step``)."""
        if t != self._t:
            raise AssertionError(f"the compiled step wrote position {t}; the cache is at "
                                 f"{self._t}")
        self._t = t + 1
