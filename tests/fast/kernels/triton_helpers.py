"""What the Triton tests share: where the kernels run, inputs, the reference, one check.

Child et al., 2019, sections 4.3 and 5.1 (patterns, head combinations) and 5.5
(block-sparse kernels). Imported by ``test_triton_attention.py`` (the kernels
under the interpreter, the wrapper, the errors) and ``test_triton_gpu.py`` (every
pattern x combine mode x dtype, compiled on a GPU, and the same checks on the
CPU under the interpreter).

Where the kernels run is fixed when Triton is first imported: TRITON_INTERPRET=1
(set here when unset, as ``make test`` does) runs them in Triton's NumPy
interpreter on CPU tensors; TRITON_INTERPRET=0 compiles them for CUDA tensors
(``make test`` runs that second pass, ``pytest -m gpu``, on a machine with CUDA).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from fast.kernels import triton_attention  # noqa: E402
from reference import patterns  # noqa: E402

if triton_attention.interpreted():
    DEVICE = "cpu"                 # the interpreter reads CPU tensors only
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    DEVICE = None
needs_runner = pytest.mark.skipif(
    DEVICE is None, reason="Triton compiled for GPU but no CUDA device; set TRITON_INTERPRET=1")
needs_interpreter = pytest.mark.skipif(
    not triton_attention.interpreted(),
    reason="the CPU twin of a GPU test runs under TRITON_INTERPRET=1")
# A GPU test: CUDA, and the kernels compiled (``TRITON_INTERPRET=0 pytest -m gpu``).
gpu = pytest.mark.skipif(triton_attention.interpreted() or not torch.cuda.is_available(),
                         reason="needs CUDA and TRITON_INTERPRET unset (or 0)")


# bool (H, n, n): which keys every head reads (the contract; Longformer and BigBird: the
# one mask, every head).
ref_masks = patterns.head_masks


def make_inputs(B, H, n, d, seed=0, dtype=torch.float32, device=DEVICE):
    """Seeded q, k, v and an output gradient, (B, H, n, d) each, drawn in float64 on the
    CPU (the same numbers on every device), then cast and moved."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, n, d, generator=g, dtype=torch.float64) for _ in range(4))
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, do)]


def torch_reference(q, k, v, mask, scale):
    """Masked softmax attention in q's dtype (the low-precision reference)."""
    s = (q @ k.transpose(-1, -2)) * scale                                # (B, H, n, n)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                         # empty rows -> 0
    return p @ v


def _run(fn, inputs, do, dtype):
    """(out, dq, dk, dv) of fn on leaf copies of ``inputs`` in ``dtype``."""
    ins = [t.detach().to(dtype).clone().requires_grad_(True) for t in inputs]
    out = fn(*ins)
    out.backward(do.to(dtype))
    return [out.detach()] + [t.grad for t in ins]


def flash_rule(kernel, inputs, do, masks, scale, dtype, floor, label) -> list:
    """Forward and q, k, v gradients of ``kernel`` in ``dtype`` against float64 by the
    flash-attention rule: err(kernel) <= 2 err(masked softmax run in ``dtype``) + floor
    (both printed first), no NaN or inf. Returns the kernel's (out, dq, dk, dv)."""

    def reference(a, b, c):
        return torch_reference(a, b, c, masks, scale)

    exact = _run(reference, inputs, do, torch.float64)
    low = _run(reference, inputs, do, dtype)
    got = _run(kernel, inputs, do, dtype)
    for name, e, lo, f in zip(("out", "dq", "dk", "dv"), exact, low, got):
        err_ref = (lo.double() - e).abs().max().item()
        err_fast = (f.double() - e).abs().max().item()
        print(f"{label} {dtype} {name}: err_fast {err_fast:.2e}  err_ref_lowprec {err_ref:.2e}")
        assert bool(torch.isfinite(f).all()), f"{name} holds NaN or inf"
        assert err_fast <= 2 * err_ref + floor, name
    return got


def check_case(pattern, combine, layer, params, dtype, device, *, B, H, n, d,
               block_size=None, repeat=True, variant=None) -> None:
    """The kernel (``variant``) against float64 by ``flash_rule``; also rows that read
    nothing give out 0 and dq 0, and a second forward+backward is bitwise equal
    (``repeat``)."""
    masks = torch.from_numpy(np.ascontiguousarray(
        ref_masks(pattern, n, H, combine, layer, **params))).to(device)  # (H, n, n)
    q, k, v, do = make_inputs(B, H, n, d, device=device, dtype=torch.float64)

    def kernel(a, b, c):
        return triton_attention.triton_sparse_attention(a, b, c, pattern, combine=combine,
                                                        layer=layer,
                                         block_size=block_size, variant=variant, **params)

    floor = 1e-4 if dtype == torch.float32 else 1e-5  # float32 runs as tf32x3 on a GPU
    got = flash_rule(kernel, (q, k, v), do, masks, d ** -0.5, dtype, floor,
                     f"{pattern} {combine}{layer} {variant or 'default'}")
    empty = ~masks.any(-1)                                               # (H, n)
    assert bool((got[0][:, empty] == 0).all()), "a row that reads nothing is not 0"
    assert bool((got[1][:, empty] == 0).all()), "a row that reads nothing has dq != 0"
    if repeat:
        again = _run(kernel, (q, k, v), do, dtype)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, again):
            assert torch.equal(a, b), f"{name} differs on a repeat (not bitwise repeatable)"
