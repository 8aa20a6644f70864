"""Sampling from the Sparse Transformer, one position at a time (Child et al., 2019, sec. 7).

``sample`` (the sampler: a prompt, then one token per step), ``request`` (its
arguments checked before any work), ``draw`` (one token from the logits:
temperature, top-k, top-p), ``decode`` (the ``Decoder``: prefill, then one position
per step from key/value caches), ``kv_cache`` (the dense and the sparse stores, reading
the keys of ``fast.backends.reads``: row t of every head's mask, sec. 4.3),
``sparse_kv_cache`` (``SparseKVCache``: one layer's cache, checked, tracking its
position; the decoder's and any model's, exported as ``fast.SparseKVCache``),
``cpu_step`` and ``cpu_kernel`` (the step compiled for the CPU with Numba).
"""
