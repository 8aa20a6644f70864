"""A small GPT with sparse attention under ``torch.compile(fullgraph=True)``: one graph, no
recompile across steps, the eager loss and gradients.

Child et al., 2019, sections 4.3 and 5.1-5.2 (the patterns in a pre-activation network).
Two models: the project's own ``SparseTransformer`` and ``TinyGPT`` below, a nanoGPT-style
GPT written as a user would, calling ``fast.sparse_attention``. Each is compiled with
``fullgraph=True`` (a graph break raises), trained a few steps beside an eager copy
(same weights, same batches, same optimizer), with ``error_on_recompile`` set after the
first step; dynamo's counters must show no graph break and one graph. Loss and gradients
(plain SGD, so that a rounding difference stays one) must equal eager's to float32
rounding (the compiled graph fuses and reorders float32
arithmetic around the attention, which it runs as the same operators: docs/design.md,
"torch.compile"). Sizes are odd on purpose: n = 37 positions (not a multiple of the
stride 8), heads of width 16 and 48.

The full matrix runs inductor (C++ code generation on the CPU, needs a C++ compiler: ``g++``
is on the machines this was written on) and takes minutes: slow. One quick case runs
``aot_eager`` (dynamo and AOT autograd, no code generation).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from fast import sparse_attention
from fast.transformer.config import ModelConfig
from fast.transformer.network.model import SparseTransformer

VOCAB, N, STEPS = 32, 37, 3
PARAMS = {"full": {}, "strided": {"stride": 8}, "fixed": {"stride": 8, "c": 2}}


class TinyGPT(nn.Module):
    """nanoGPT's model, cut down: pre-norm blocks, fused q/k/v projection, GELU MLP."""

    def __init__(self, n_embd=48, n_head=3, n_layer=2, block=64, **attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, n_embd), nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(n_embd), attn=nn.Linear(n_embd, 3 * n_embd),
            proj=nn.Linear(n_embd, n_embd), ln2=nn.LayerNorm(n_embd),
            mlp=nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                              nn.Linear(4 * n_embd, n_embd)))) for _ in range(n_layer))
        self.ln_f, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, VOCAB, bias=False)
        self.n_head, self.attention = n_head, attention

    def forward(self, idx):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))     # (B, T, C)
        for layer, b in enumerate(self.blocks):
            q, k, v = b.attn(b.ln1(x)).chunk(3, dim=-1)
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2)
                       for t in (q, k, v))                                   # (B, nh, T, hs)
            y = sparse_attention(q, k, v, layer=layer, **self.attention)
            x = x + b.proj(y.transpose(1, 2).reshape(B, T, -1))             # (B, T, C)
            x = x + b.mlp(b.ln2(x))
        return self.head(self.ln_f(x))                                       # (B, T, vocab)


def make(kind: str, pattern: str, backend: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "tiny_gpt":
        return TinyGPT(pattern=pattern, backend=backend, **PARAMS[pattern])
    stride = PARAMS[pattern].get("stride", 8)
    return SparseTransformer(ModelConfig(
        vocab_size=VOCAB, n_ctx=N, d_model=96, n_heads=2, n_layers=2, pattern=pattern,
        stride=stride, c=PARAMS[pattern].get("c"), attention_backend=backend))


def train_beside_eager(kind: str, pattern: str, backend: str, compiler: str):
    """Train an eager model and a compiled copy side by side; returns, per step, (eager
    loss, compiled loss, largest gradient difference / largest gradient)."""
    eager = make(kind, pattern, backend)
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    g = torch.Generator().manual_seed(1)
    history = []
    with torch._dynamo.config.patch(error_on_recompile=False):
        for _ in range(STEPS):
            idx = torch.randint(0, VOCAB, (2, N + 1), generator=g)
            losses = []
            for m, opt in zip((eager, compiled), opts):
                opt.zero_grad()
                logits = m(idx[:, :-1])                                   # (B, N, vocab)
                loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
                loss.backward()
                losses.append(loss.item())
            grads = [(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters())]
            top = max(a.abs().max().item() for a, _ in grads)
            diff = max((a - b).abs().max().item() for a, b in grads)
            history.append((*losses, diff / top))
            for opt in opts:
                opt.step()
            torch._dynamo.config.error_on_recompile = True   # after the first step
    return history


def check(kind, pattern, backend, compiler):
    history = train_beside_eager(kind, pattern, backend, compiler)
    breaks = dict(counters["graph_break"])
    graphs = counters["stats"]["unique_graphs"]
    for step, (e, c, rel) in enumerate(history):
        print(f"{kind} {pattern} {backend} {compiler} step {step}: loss eager {e:.7f} "
              f"compiled {c:.7f}; gradients differ by {rel:.2e} of the largest")
    print(f"graph breaks {breaks}, graphs {graphs}")
    assert breaks == {} and graphs == 1
    for e, c, rel in history:
        assert abs(e - c) <= 1e-6 * abs(e)
        assert rel <= 1e-5


CASES = [("full", "auto"), ("strided", "auto"), ("strided", "structured"),
         ("fixed", "auto"), ("fixed", "structured")]


@pytest.mark.parametrize("kind", ["sparse_transformer", "tiny_gpt"])
def test_gpt_compiles_whole_aot_eager(kind):
    check(kind, "strided", "structured", "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sparse_transformer", "tiny_gpt"])
@pytest.mark.parametrize("pattern,backend", CASES)
def test_gpt_compiles_whole_inductor(kind, pattern, backend):
    check(kind, pattern, backend, "inductor")
