"""The Triton kernels as custom operators: opcheck, and compiled calls equal to eager ones.

Child et al., 2019, section 5.5 (block-sparse kernels) over the patterns of section 4.3.
``sparse_transformer::triton`` and its backward (``fast.kernels.triton_attention``) are
what every call of the "triton" backend runs, eager or compiled (docs/design.md,
"torch.compile"); their autograd formula is ``TritonAttention``, a Function that calls
them, so opcheck checks each operator on inputs that require no grad.
Under ``TRITON_INTERPRET=1`` they run on the CPU in Triton's interpreter (float32), which
is slow: one small odd case each (n = 37, d = 48, grouped key/value heads).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fast import sparse_attention
from tests.fast.api_helpers import inputs, run, truth, truth_masks
from tests.fast.kernels.triton_helpers import needs_interpreter, triton_attention

OPS = torch.ops.sparse_transformer


@pytest.mark.parametrize("text,params", [
    ("stride=5", {"stride": 5}),
    ("c=2;stride=8", {"stride": 8, "c": 2}),
    ("global_tokens=t:0,5;window=3", {"window": 3, "global_tokens": (0, 5)}),
    ("global_tokens=t:;window=3", {"window": 3, "global_tokens": ()}),
])
def test_params_text_round_trip(text, params):
    assert triton_attention.params_text(params) == text
    assert triton_attention.params_of(text) == params


def test_layout_text_round_trip():
    """The operators' one text attribute names the layout and its kernels: read back as
    written (a variant built by the caller too), interleaved layers r and r + p as one."""
    custom = dataclasses.replace(triton_attention.VARIANTS["fused"], name="mine|x")
    for variant in (triton_attention.VARIANTS["baseline"], custom):
        text = triton_attention.layout_text("fixed", "interleaved", 3, {"stride": 8, "c": 2},
                                            32, "structured", variant)
        assert triton_attention.layout_of(text) == (
            "fixed", "interleaved", 1, {"stride": 8, "c": 2}, 32, "structured", variant)
    longformer = triton_attention.layout_text("longformer", "merged", 5,
                                              {"window": 3, "global_tokens": (0, 5)}, 64,
                                              "natural", triton_attention.VARIANTS["fused"])
    assert triton_attention.layout_of(longformer)[2:4] == (0, {"window": 3,
                                                               "global_tokens": (0, 5)})


@pytest.mark.slow
@needs_interpreter
def test_opcheck_triton():
    q, k, v, _ = inputs(1, 2, 1, 37, 37, 48, seed=1, dtype=torch.float32)
    layout = triton_attention.layout_text("fixed", "merged", 0, {"stride": 8, "c": 2}, 32,
                                          "structured", triton_attention.VARIANTS["baseline"])
    args = (layout, 48 ** -0.5)
    torch.library.opcheck(OPS.triton, (q, k, v, *args))
    out, stats = OPS.triton(q, k, v, *args)
    torch.library.opcheck(OPS.triton_backward,
                          (torch.randn_like(out), q, k, v, out, stats, *args))


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("pattern,params", [
    ("strided", {"stride": 5}),
    ("longformer", {"window": 3, "global_tokens": (0, 5)}),
])
def test_compiled_triton_equals_eager_and_reference(pattern, params):
    """fullgraph=True through the operator: the same bits as eager; the reference within
    float32 error (n_q < n_k, two query heads per key/value head)."""
    q, k, v, go = inputs(2, 4, 2, 20, 37, 48, seed=2, dtype=torch.float32)
    fn = lambda q, k, v: sparse_attention(q, k, v, pattern, backend="triton",
                                          enable_gqa=True, **params)
    eager = run(fn, q, k, v, go)
    torch._dynamo.reset()
    compiled = run(torch.compile(fn, backend="aot_eager", fullgraph=True), q, k, v, go)
    want = truth(q, k, v, go, truth_masks(pattern, 2, 4, 20, 37, **params))
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), eager, compiled, want):
        err = (a.double() - c).abs().max().item()
        print(f"{pattern} {name}: error {err:.2e}")
        assert torch.equal(a, b), name
        assert err < 1e-5, name
