"""Attention backends in PyTorch: the same patterns, computed three ways.

Child et al., 2019, section 4 (Attend(X, S), eq. 2-4) and section 5.5 (kernels).

* ``naive``      -- scaled_dot_product_attention with the boolean (H, n, n) mask of
                    ``masks``: O(n^2), obviously correct, every pattern;
* ``structured`` -- strided and fixed at O(n sqrt n) without any n x n tensor:
                    the transposed grid, bands and gathered summaries
                    (``strided``, ``fixed``), each through the fused kernel of
                    ``flash_cpu``, merged exactly (``fast.core.merge``);
* ``flex``       -- the patterns as a FlexAttention ``mask_mod`` and ``BlockMask``,
                    the peer the benchmarks compare with.

The Triton kernels live beside this package, in ``fast.kernels``; the public
entry point that chooses among them is ``fast.attention.sparse_attention``.
"""
