"""Sparse attention inside other people's models.

Child et al., 2019, section 4 (attention over a pattern's positions): any causal
self-attention can read a strided or fixed pattern instead of every earlier
position. The modules here plug ``fast.sparse_attention`` into a library's own
models, each behind an optional dependency:

* ``hf`` -- Hugging Face transformers (``pip install -e .[hf]``): registers an attention
  function and its mask function under one name, for ``attn_implementation=``.

This package imports none of them: ``import fast`` and ``import fast.integrations``
never import transformers; ``import fast.integrations.hf`` does.
"""
