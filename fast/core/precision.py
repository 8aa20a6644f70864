"""The accumulation dtype: in which precision sums of scores, softmax weights and gradients run.

Child et al., 2019, section 5.6 (mixed-precision training: activations and
gradients in half precision, weights in single). Every fast path keeps its running sums
(log-sum-exp, merged outputs, gradient buffers) in float32, and in float64 when
the inputs are float64 (the exact checks against ``reference/`` need it).
"""

from __future__ import annotations

import torch


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 -> float64; every other dtype (float32, bfloat16, float16) -> float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
