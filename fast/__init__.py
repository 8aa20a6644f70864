"""Fast PyTorch and Triton Sparse Transformer attention, the model, and its training.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers".
Everything here is checked against the NumPy ground truth in ``reference/``.
"""

from fast.attention import sparse_attention

__all__ = ["sparse_attention"]
