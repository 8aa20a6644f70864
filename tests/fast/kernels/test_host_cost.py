"""What a repeated call costs the host, counted: kernel launches and every other op.

Child et al., 2019, section 5.5 (block-sparse kernels): the kernels are the work; around
them a call of ``fast.sparse_attention`` should dispatch nothing but what they need.
Counted, not timed (``fast.measure.host_cost``: the Triton launches recorded but not run,
every PyTorch op counted by a dispatch mode), on the second and later calls of one
signature:

* a Triton forward launches once per part of the layout and dispatches nothing but the
  operator and the allocations of what the kernels write (before: an ``arange`` for an
  unpadded batch, and the baseline's fills);
* a fused Triton forward and backward: no zero-fill, no cast, no ``delta`` pass and no
  host read outside the kernels, with the model's transposed views too (before: a copy
  of each of q, k, v per call, and of the gradients);
* the dense "full" path with the finite check off (a GPU's default) is SDPA's one op and
  nothing else (before: an isfinite pass and the quarantine's masked fills);
* the structured backward reads nothing back on the host (before: the float64 decision
  was read again from the log-sum-exp).
"""

from __future__ import annotations

import pytest
import torch

from fast import sparse_attention
from fast.measure.host_cost import LaunchCounter, OpCounter, kind
from tests.fast.kernels.triton_helpers import needs_interpreter, triton_attention

B, H, N, D, STRIDE = 1, 2, 64, 16, 8


def _count(call, calls: int = 3) -> tuple[dict, dict, dict]:
    """(launches by kernel, ops by name, host reads by what they read) of one call of
    ``call`` after a warm-up call."""
    launches = LaunchCounter()
    with launches.stubbed():
        call()                                        # the plan, the layout, the launches
        launches.launches.clear()
        counter = OpCounter()
        with counter:
            for _ in range(calls):
                call()
    per = lambda c: {name: n / calls for name, n in c.items()}
    return per(launches.launches), per(counter.ops), per(counter.reads)


def _tensors(requires_grad: bool, transposed: bool = False):
    g = torch.Generator().manual_seed(0)
    if transposed:             # as a model's split into heads leaves them: (B, n, H d) views
        made = [torch.randn(B, N, H * D, generator=g).view(B, N, H, D).transpose(1, 2)
                for _ in range(4)]
    else:
        made = [torch.randn(B, H, N, D, generator=g) for _ in range(4)]
    *qkv, go = made
    return [t.detach().requires_grad_(requires_grad) for t in qkv], go


def _live_parts(variant: str) -> int:
    parts = triton_attention.variant_parts("strided", N, H, "merged", 0, {"stride": STRIDE}, 32,
                                           "cpu",
                            "structured", triton_attention.VARIANTS[variant], torch.float32, D)
    return sum(p.facts.tiles > 0 for p in parts)


def _attend(q, k, v, variant):
    return sparse_attention(q, k, v, "strided", stride=STRIDE, backend="triton",
                            variant=variant, check_finite=False)


@needs_interpreter
@pytest.mark.parametrize("variant", ["fused", "baseline"])
def test_a_triton_forward_launches_once_per_part_and_only_allocates(variant):
    (q, k, v), _ = _tensors(False)
    launches, ops, _ = _count(lambda: _attend(q, k, v, variant))
    print(launches, ops)
    parts = _live_parts(variant)
    assert launches == {"_fwd_kernel": parts} and parts == 2
    allowed = {"allocation", "operator"} | ({"fill"} if variant == "baseline" else set())
    assert {kind(name) for name in ops} <= allowed, ops
    assert ops["sparse_transformer.triton.default"] == 1
    # what the kernels write: out and the row statistics (m and l, one tensor)
    assert sum(n for name, n in ops.items() if kind(name) in ("allocation", "fill")) == 2


@needs_interpreter
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "model-views"])
def test_a_fused_triton_backward_fills_casts_and_sums_nothing(transposed):
    """Forward and backward, the fused variant: 2 forward launches, 2 dQ (the first forms
    delta), 2 dK/dV; the ops are the operators, the allocations of what the kernels write
    (out, the row statistics; delta, dq, dk, dv) and the views autograd makes of the
    gradients it accumulates -- no fill, cast, copy, reduction or host read."""
    (q, k, v), go = _tensors(True, transposed)

    def step():
        for t in (q, k, v):
            t.grad = None
        _attend(q, k, v, "fused").backward(go)
    launches, ops, _ = _count(step)
    print(launches, ops)
    assert launches == {"_fwd_kernel": 2, "_dq_kernel": 2, "_dkdv_kernel": 2}
    kinds = {kind(name) for name in ops}
    assert kinds <= {"allocation", "operator", "view"}, ops
    assert sum(n for name, n in ops.items() if kind(name) == "allocation") == 6
    assert q.grad.stride() == q.stride() and k.grad.stride() == k.stride()


def test_full_by_a_gpus_default_is_sdpa_alone(monkeypatch):
    """The dense "full" pattern with check_finite's default as on a GPU (nothing looks at
    the values: no finite check, no quarantine, no look for overflowing scores) is causal
    SDPA's one op under "auto": nothing before it, nothing after."""
    import fast.attention as fast_attention
    from fast.backends.structured import attention as structured

    monkeypatch.setattr(fast_attention.plan, "finite_default", lambda device: None)
    monkeypatch.setattr(structured, "looks_for_overflow", lambda device: False)   # a GPU's
    (q, k, v), _ = _tensors(False)
    _, ops, _ = _count(lambda: sparse_attention(q, k, v, "full"))
    assert ops == {"aten._scaled_dot_product_flash_attention_for_cpu.default": 1}, ops


def test_the_structured_backward_reads_no_tensor_back():
    """The float64 decision is read once, in the forward, from the log-sum-exp the
    pieces computed, and handed to the backward as a one-element bool tensor on the host:
    a forward and backward reads back what the forward alone reads (the CPU's finite
    check and the log-sum-exp's extremes) and that flag, nothing else."""
    (q, k, v), go = _tensors(True)
    attend = lambda: sparse_attention(q, k, v, "strided", stride=STRIDE,
                                      backend="structured")

    def step():
        for t in (q, k, v):
            t.grad = None
        attend().backward(go)
    forward, both = _count(attend)[2], _count(step)[2]
    print(forward, both)
    flag = ("cpu", torch.bool, 1)
    assert forward and both == {**forward, flag: forward.get(flag, 0) + 1}
