"""Fast PyTorch and Triton Sparse Transformer attention, the model, and its training.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers".
Everything here is checked against the NumPy ground truth in ``reference/``.
The two names any model needs: ``sparse_attention`` (sec. 4: attention over a
pattern's positions) and ``SparseKVCache`` (sampling one position at a time,
reading only the keys the pattern allows).
"""

from fast.attention import sparse_attention
from fast.transformer.decoding.sparse_kv_cache import SparseKVCache

__all__ = ["SparseKVCache", "sparse_attention"]
