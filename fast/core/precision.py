"""The accumulation dtype: in which precision sums of scores, softmax weights and gradients run.

Child et al., 2019, section 5.6 (mixed-precision training: activations and
gradients in half precision, weights in single). Every fast path keeps its running sums
(log-sum-exp, merged outputs, gradient buffers) in float32, and in float64 when
the inputs are float64 (the exact checks against ``reference/`` need it).
"""

from __future__ import annotations

import torch


class PrecisionWarning(UserWarning):
    """A call was recomputed in a wider dtype than its inputs' to stay exact: the answer
    is right, the call slower (``fast.backends.structured``, "Precision")."""


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 -> float64; every other dtype (float32, bfloat16, float16) -> float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def fold_dtype(scale: float, dtype: torch.dtype) -> torch.dtype | None:
    """Where the score scale goes. None: the kernels apply it, which they do exactly
    for a positive normal number of the accumulation dtype (the fused CPU kernel
    keeps the scale in that dtype and returns NaN for a scale <= 0 or one that rounds
    to 0; torch 2.13.0). Otherwise the dtype in which to fold it into q instead
    (q * scale, then scale 1) and run the call: the accumulation dtype, or float64
    for a scale beyond float32's range."""
    acc = acc_dtype(dtype)
    info = torch.finfo(acc)
    if info.tiny <= scale <= info.max:
        return None
    return torch.float64 if abs(scale) > info.max else acc
