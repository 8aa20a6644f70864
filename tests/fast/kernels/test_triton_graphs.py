"""The Triton path in a CUDA graph: captured once, replayed, the eager answer every time.

Child et al., 2019, section 5.5 (block-sparse kernels). At small and medium shapes a
call's host time, not its kernels, sets its speed; a CUDA graph replays the kernels with
no host work at all. A call of ``fast.sparse_attention`` on the Triton path can be
captured because, once its call plan and layout exist (the warm-up calls), it reads
nothing back from the GPU, makes no tensor on the CPU and allocates only what the
kernels write (``fast.kernels.triton_attention.TritonCall``; docs/design.md, "The call
plan"). Two ways in:

* ``torch.cuda.CUDAGraph``: a forward and backward captured after three warm-up calls
  on a side stream, replayed on new inputs copied into the captured ones, equal bitwise
  to eager calls on those inputs (the kernels use no atomics: bitwise repeatable);
* ``torch.compile(mode="reduce-overhead")`` (inductor with CUDA graphs) on the project's
  model: the loss and gradients of a training step equal eager's to float32 rounding,
  step after step.

GPU only (``gpu`` marker: CUDA, and the kernels compiled, TRITON_INTERPRET unset).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from fast import sparse_attention
from fast.transformer.config import ModelConfig
from fast.transformer.network.model import SparseTransformer
from tests.fast.kernels.triton_helpers import gpu, make_inputs

SHAPE = (2, 4, 1000, 64)           # (B, H, n, d): n not a multiple of the block or stride


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("variant", ["fused", "baseline"])
@pytest.mark.parametrize("pattern,params", [("strided", dict(stride=32)),
                                            ("fixed", dict(stride=64, c=16))])
def test_a_forward_and_backward_replay_from_a_cuda_graph(pattern, params, variant):
    static = [t.requires_grad_(i < 3) for i, t in enumerate(
        make_inputs(*SHAPE, seed=0, device="cuda", dtype=torch.float16))]
    q, k, v, do = static

    def step():
        out = sparse_attention(q, k, v, pattern, variant=variant, **params)
        return out, torch.autograd.grad(out, (q, k, v), do)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # the plan, the layout, the compiled kernels
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, grads = step()
    for seed in (1, 2):
        new = make_inputs(*SHAPE, seed=seed, device="cuda", dtype=torch.float16)
        with torch.no_grad():
            for t, n in zip(static, new):
                t.copy_(n)
        graph.replay()
        eager = [t.clone().requires_grad_(True) for t in new[:3]]
        want = sparse_attention(*eager, pattern, variant=variant, **params)
        want_grads = torch.autograd.grad(want, eager, new[3])
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"seed {seed}: out"
        for name, a, b in zip(("dq", "dk", "dv"), grads, want_grads):
            assert torch.equal(a, b), f"seed {seed}: {name}"


@pytest.mark.gpu
@gpu
def test_a_model_compiled_with_cuda_graphs_trains_as_eager():
    """The project's model on the Triton path (float32, so that eager and compiled differ
    by rounding alone), compiled with mode="reduce-overhead": four training steps beside
    an eager copy (plain SGD), loss and gradients equal to float32 rounding; the steps
    after the warm-up replay a CUDA graph."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, n_ctx=257, d_model=128, n_heads=4, n_layers=2,
                      pattern="strided", stride=16, attention_backend="triton")
    eager = SparseTransformer(cfg).cuda()
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        idx = torch.randint(0, cfg.vocab_size, (2, cfg.n_ctx + 1), generator=g).cuda()
        losses = []
        for m, opt in zip((eager, compiled), opts):
            opt.zero_grad(set_to_none=True)
            logits = m(idx[:, :-1])                                       # (B, n, vocab)
            loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
            loss.backward()
            losses.append(loss.item())
        grads = [(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters())]
        top = max(a.abs().max().item() for a, _ in grads)
        rel = max((a - b).abs().max().item() for a, b in grads) / top
        print(f"step {step}: loss eager {losses[0]:.7f} compiled {losses[1]:.7f}; "
              f"gradients differ by {rel:.2e} of the largest")
        assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[0])
        assert rel <= 1e-4
        for opt in opts:
            opt.step()


@pytest.mark.gpu
@gpu
def test_full_on_a_gpu_is_sdpa_alone():
    """The dense "full" pattern under "auto" on CUDA, check_finite's default: exactly
    SDPA's op, nothing before or after it (no isfinite pass, no quarantine, no second
    attention), forward alone and forward and backward."""
    from fast.measure.host_cost import OpCounter

    q, k, v, do = make_inputs(*SHAPE, device="cuda", dtype=torch.float16)
    sparse_attention(q, k, v, "full")                                     # the plan
    counter = OpCounter()
    with counter:
        sparse_attention(q, k, v, "full")
    sdpa = {name for name in counter.ops if "scaled_dot_product" in name}
    assert len(sdpa) == 1 and sum(counter.ops.values()) == 1, counter.ops
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    sparse_attention(qg, kg, vg, "full").backward(do)
    dense = OpCounter()
    with dense:
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)
    ours = OpCounter()
    with ours:
        sparse_attention(qg, kg, vg, "full").backward(do)
    assert ours.ops == dense.ops, (ours.ops, dense.ops)
