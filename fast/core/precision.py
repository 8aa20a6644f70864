"""The accumulation dtype: in which precision sums of scores, softmax weights and gradients run.

Child et al., 2019, section 5.6 (mixed-precision training: activations and
gradients in half precision, weights in single). Every fast path keeps its running sums
(log-sum-exp, merged outputs, gradient buffers) in float32, and in float64 when
the inputs are float64 (the exact checks against ``reference/`` need it).

Under autocast an attention call takes scaled_dot_product_attention's rule
(``autocast_casts``): its floating inputs other than float64 are cast to the autocast
dtype of their device, the call runs in that dtype (with autocast off inside, so that
every backend computes alike: the sums still in float32), and its output is in it.
"""

from __future__ import annotations

import contextlib
import math

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
    to 0; torch 2.13.0) up to ``wide_scale``. Otherwise the dtype in which to fold it
    into q instead (q * scale, then scale 1) and run the call: the accumulation dtype,
    or float64 for a float32 call whose scale is beyond ``wide_scale``."""
    acc = acc_dtype(dtype)
    info, wide = torch.finfo(acc), wide_scale(acc)
    if info.tiny <= scale <= wide:
        return None
    return torch.float64 if abs(scale) > wide else acc


def wide_scale(acc: torch.dtype) -> float:
    """The largest scale a float32 call computes in float32: the square root of
    float32's largest number (about 1.8e19), beyond which scale * (q . k) overflows
    float32 for a q . k that float32 holds easily (at scale 1e38, any |q . k| > 3.4):
    inf scores, NaN rows. A float64 call has no wider dtype: its limit is float64's
    largest number."""
    info = torch.finfo(acc)
    return math.sqrt(info.max) if acc == torch.float32 else info.max


def score_bound(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """An upper bound, per query row, of |scale q_i . k_j| and of every partial sum of it,
    over every key of its head: d |scale| max_c |q_ic| max_(j, c) |k_jc|, (B, H, n_q) in
    the accumulation dtype (+inf where that overflows). q (B, H, n_q, d), k (B, Hkv, n_k,
    d), Hkv dividing H (query head h reads key head h // (H / Hkv)). One read-only pass
    over q and one over k, no host read."""
    acc = acc_dtype(q.dtype)
    qa = torch.linalg.vector_norm(q, float("inf"), dim=-1, dtype=acc)           # (B, H, n_q)
    ka = torch.linalg.vector_norm(k.flatten(2), float("inf"), dim=-1, dtype=acc)  # (B, Hkv)
    if k.shape[1] != q.shape[1]:
        ka = ka.repeat_interleave(q.shape[1] // k.shape[1], dim=1)               # (B, H)
    return qa * (ka * (q.shape[-1] * abs(scale)))[..., None]


def may_overflow(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """A 0-dim bool: whether some score may overflow the accumulation dtype (``score_bound``
    of the largest row past half its largest number). One pass over q and one over k."""
    acc = acc_dtype(q.dtype)
    top = (torch.linalg.vector_norm(q, float("inf"), dtype=acc)
           * torch.linalg.vector_norm(k, float("inf"), dtype=acc))
    return top * (q.shape[-1] * abs(scale)) >= torch.finfo(acc).max / 2


def overflow_rows(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """(B, H, n_q, 1) bool: the query rows whose scores may overflow the accumulation
    dtype (``score_bound`` past half its largest number): finite inputs whose products
    do not fit -- entries near 1e20 in float32. PyTorch's fused kernels give such a row 0
    when every score it reads overflows to -inf (a row they take for one that reads
    nothing), so the paths through them mark it NaN instead (docs/design.md, "Failing
    loudly"). The bound is loose: a row it marks may not overflow (its keys need not
    align with it), but only where |q| |k| |scale| d reaches 1e38."""
    return (score_bound(q, k, scale) >= torch.finfo(acc_dtype(q.dtype)).max / 2)[..., None]


def autocast_casts(*tensors) -> tuple[str, tuple] | None:
    """SDPA's autocast rule for one attention call: when autocast is on for the first
    tensor's device, (that device type, for each tensor the dtype it is cast to -- the
    autocast dtype, for a floating tensor other than float64 of another dtype -- or
    None); else None. Anything that is not a tensor is left alone, for the caller's
    checks to name."""
    first = tensors[0]
    if not isinstance(first, torch.Tensor):
        return None
    device = first.device.type
    if not (torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)):
        return None
    low = torch.get_autocast_dtype(device)
    return device, tuple(low if isinstance(t, torch.Tensor) and t.is_floating_point()
                         and t.dtype not in (torch.float64, low) else None for t in tensors)


def cast_inputs(casts: tuple[str, tuple] | None, *tensors) -> tuple:
    """The tensors as ``casts`` (``autocast_casts``'s answer for them) casts them."""
    if casts is None:
        return tensors
    return tuple(t if c is None else t.to(c) for t, c in zip(tensors, casts[1]))


def autocast_off(casts: tuple[str, tuple] | None):
    """Autocast off on the device of ``casts`` (a no-op context where there are none):
    the attention computes in the dtype its inputs were cast to."""
    if casts is None:
        return contextlib.nullcontext()
    return torch.autocast(casts[0], enabled=False)
