"""The CPU window kernel (fast/backends/cpu_window.c) against the float64 ground truth.

Child et al., 2019, section 4.3 (the band A(1) and the column A(2)) and section 5.5. The
kernel computes in float32, so it is held to the flash-attention rule: its error against
float64 at most twice that of plain float32 attention (matmul, masked softmax, matmul)
plus a small floor. Sizes are odd on purpose: rows not a multiple of the kernel's 16-row
blocks, d = 48 and d = 40 (a tail of 8 features), one and many heads, heads that are a
strided view, windows longer than the sequence. The structured layer is checked with the
kernel and without it (PyTorch's kernel), against reference/.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fast import sparse_attention
from fast.backends import cpu_window
from fast.backends.structured import strided
from reference import patterns
from reference.attention import attend, attend_backward

needs_kernel = pytest.mark.skipif(cpu_window.library() is None,
                                  reason=f"no CPU window kernel: {cpu_window.missing()}")


def test_the_kernel_is_built_wherever_there_is_a_compiler():
    """A machine with a C compiler must not fall back in silence."""
    if cpu_window._compiler() is None:
        pytest.skip("no C compiler on this machine")
    assert cpu_window.library() is not None, cpu_window.missing()


def _allowed(N, window, strict, S, rows, step, seqoff):
    """(N, N) bool: natural row a reads natural row b (the kernel's rule, written out)."""
    allowed = np.zeros((N, N), dtype=bool)
    for s in range(S):
        for i in range(rows):
            for j in range(max(0, i - window + 1), i + (0 if strict else 1)):
                allowed[s * seqoff + i * step, s * seqoff + j * step] = True
    return allowed


def _plain(q, k, v, allowed, scale):
    """out, lse of masked attention in q's dtype (rows that read nothing: 0, -inf)."""
    s = (q @ k.transpose(1, 2)) * scale
    s = s.masked_fill(~torch.from_numpy(allowed), float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, torch.logsumexp(s, -1)


def _heads(G, N, d, seed):
    """q, k, v, dO (G, N, d) float32; q a strided view (every other head of 2 G)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2 * G, N, d, generator=g)[::2]
    return [q] + [torch.randn(G, N, d, generator=g) for _ in range(3)]


def _rule(got, want, plain, floor, name):
    err, ref = (got.double() - want).abs().max().item(), (plain.double() - want).abs().max().item()
    print(f"{name}: err {err:.2e}  plain float32 {ref:.2e}")
    assert err <= 2 * ref + floor, name


# (G, N, d, window, strict, S, rows, step, seqoff): band, column, blocks
GEOMETRIES = [
    (1, 97, 48, 8, False, 1, 97, 1, 0),
    (3, 200, 40, 33, True, 1, 200, 1, 0),
    (2, 50, 64, 64, True, 1, 50, 1, 0),            # window longer than the sequence
    (2, 95, 48, 19, False, 5, 19, 5, 1),          # the column of l = 5: 19 rows 5 apart
    (1, 528, 16, 33, False, 16, 33, 16, 1),
    (2, 84, 24, 12, False, 7, 12, 1, 12),         # blocks of 12 (the fixed pattern's own block)
]


@needs_kernel
@pytest.mark.parametrize("G,N,d,window,strict,S,rows,step,seqoff", GEOMETRIES)
def test_kernel_forward_and_backward(G, N, d, window, strict, S, rows, step, seqoff):
    q, k, v, go = _heads(G, N, d, seed=N + d)
    scale = 0.7
    geo = dict(window=window, strict=strict, sequences=S, rows=rows, step=step, seqoff=seqoff)
    allowed = _allowed(N, window, strict, S, rows, step, seqoff)
    out, lse = torch.full((G, N, d), 7.0), torch.full((G, N), 7.0)
    cpu_window.forward(q, k, v, out, lse, scale=scale, **geo)
    x64 = [t.double().requires_grad_(True) for t in (q, k, v)]
    want, want_lse = _plain(*x64, allowed, scale)
    plain, plain_lse = _plain(q, k, v, allowed, scale)
    covered = np.zeros(N, dtype=bool)
    covered[[s * seqoff + i * step for s in range(S) for i in range(rows)]] = True
    _rule(out[:, covered], want[:, covered].detach(), plain[:, covered], 1e-6, "out")
    finite = torch.isfinite(want_lse) & torch.from_numpy(covered)
    _rule(lse[finite], want_lse[finite].detach(), plain_lse[finite], 1e-6, "lse")
    assert torch.isneginf(lse[~torch.isfinite(want_lse) & torch.from_numpy(covered)]).all()
    assert (out[:, ~covered] == 7).all() and (lse[:, ~covered] == 7).all()   # not touched

    grads = torch.autograd.grad((want * go.double()).sum(), x64)
    xp = [t.clone().requires_grad_(True) for t in (q, k, v)]
    plain_grads = torch.autograd.grad((_plain(*xp, allowed, scale)[0] * go).sum(), xp)
    lse_b = lse.masked_fill(torch.isneginf(lse), float("inf"))
    got = [torch.full((G, N, d), 0.5) for _ in range(3)]
    cpu_window.backward(q, k, v, go, out, lse_b, *got, scale=scale, **geo)
    for name, a, b, c in zip(("dq", "dk", "dv"), got, grads, plain_grads):
        _rule(a - 0.5, b, c, 1e-5, name)                # added to what was there


@needs_kernel
def test_merge_and_init_give_the_merged_strided_head():
    """The column written (init), the band merged into it: the strided 'merged' head."""
    G, l, M, d = 3, 6, 17, 48
    N = l * M
    q, k, v, go = _heads(G, N, d, seed=5)
    col = dict(window=M, sequences=l, rows=M, step=l, seqoff=1)
    out, lse = torch.empty(G, N, d), torch.empty(G, N)
    cpu_window.forward(q, k, v, out, lse, scale=0.3, **col)
    cpu_window.forward(q, k, v, out, lse, scale=0.3, window=l, strict=True, merge=True)
    allowed = patterns.union(*patterns.strided(N, l))
    x64 = [t.double().requires_grad_(True) for t in (q, k, v)]
    want, want_lse = _plain(*x64, allowed, 0.3)
    _rule(out, want.detach(), _plain(q, k, v, allowed, 0.3)[0], 1e-6, "out")
    _rule(lse, want_lse.detach(), _plain(q, k, v, allowed, 0.3)[1], 1e-6, "lse")
    grads = [torch.full((G, N, d), float("nan")) for _ in range(3)]   # init writes them all
    cpu_window.backward(q, k, v, go, out, lse, *grads, scale=0.3, init=True, **col)
    cpu_window.backward(q, k, v, go, out, lse, *grads, scale=0.3, window=l, strict=True)
    xp = [t.clone().requires_grad_(True) for t in (q, k, v)]
    plain = torch.autograd.grad((_plain(*xp, allowed, 0.3)[0] * go).sum(), xp)
    for name, a, b, c in zip(("dq", "dk", "dv"), grads,
                             torch.autograd.grad((want * go.double()).sum(), x64), plain):
        _rule(a, b, c, 1e-5, name)


# (G, N, d, block, keys): blocks of 16-row multiples (no mask inside) and not (a mask per
# row), a first block that reads nothing, a sequence shorter than one block
PREFIXES = [(3, 77, 48, 12, 5), (1, 100, 40, 7, 3), (2, 256, 64, 32, 8), (2, 45, 16, 50, 4),
            (4, 200, 24, 16, 16)]


@needs_kernel
@pytest.mark.parametrize("G,N,d,block,keys", PREFIXES)
def test_prefix_forward_and_backward(G, N, d, block, keys):
    """Prefix mode: row i reads keys t < (i // block) keys (the fixed pattern's summaries of
    earlier blocks), forward and backward, dq added or written, key gradients per segment."""
    q, _, _, go = _heads(G, N, d, seed=N + d)
    Nk = (N - 1) // block * keys + 3                               # 3 keys nobody reads
    gen = torch.Generator().manual_seed(d)
    ks, vs = (torch.randn(G, Nk, d, generator=gen) for _ in range(2))
    allowed = (np.arange(Nk)[None, :] < (np.arange(N)[:, None] // block) * keys)
    geo = dict(block=block, keys=keys, scale=0.6)
    out, lse = torch.full((G, N, d), 7.0), torch.full((G, N), 7.0)
    cpu_window.prefix_forward(q, ks, vs, out, lse, **geo)
    x64 = [t.double().requires_grad_(True) for t in (q, ks, vs)]
    want, want_lse = _plain(*x64, allowed, 0.6)
    plain, plain_lse = _plain(q, ks, vs, allowed, 0.6)
    _rule(out, want.detach(), plain, 1e-6, "out")
    reads = torch.from_numpy(allowed.any(1))
    if reads.any():
        _rule(lse[:, reads], want_lse[:, reads].detach(), plain_lse[:, reads], 1e-6, "lse")
    assert torch.isneginf(lse[:, ~reads]).all() and (out[:, ~reads] == 0).all()

    grads = torch.autograd.grad((want * go.double()).sum(), x64)
    xp = [t.clone().requires_grad_(True) for t in (q, ks, vs)]
    plain_grads = torch.autograd.grad((_plain(*xp, allowed, 0.6)[0] * go).sum(), xp)
    lse_b = lse.masked_fill(torch.isneginf(lse), float("inf"))
    segments = cpu_window.prefix_segments(G)
    for init in (False, True):
        dq = torch.full((G, N, d), float("nan") if init else 0.5)
        dks, dvs = (torch.full((G, segments, Nk, d), float("nan")) for _ in range(2))  # written
        cpu_window.prefix_backward(q, ks, vs, go, out, lse_b, dq, dks, dvs, init=init, **geo)
        got = [dq if init else dq - 0.5, dks.sum(1), dvs.sum(1)]
        for name, a, b, c in zip(("dq", "dk", "dv"), got, grads, plain_grads):
            _rule(a, b, c, 1e-5, f"{name} init={init}")


def test_bad_prefix_geometry_is_refused_with_what_is_wrong():
    q, ks = torch.zeros(1, 40, 8), torch.zeros(1, 6, 8)
    with pytest.raises(ValueError, match="40 rows in blocks of 8, each reading 2 more keys, "
                                         "do not fit 6 keys"):
        cpu_window.prefix_forward(q, ks, ks, q.clone(), torch.zeros(1, 40), block=8, keys=2,
                                  scale=1.0)
    with pytest.raises(ValueError, match=r"dks, dvs must be contiguous \(G, segments, Nk, d\)"):
        cpu_window.prefix_backward(q, ks, ks, q, q, torch.zeros(1, 40), q.clone(),
                                   torch.zeros(1, 6, 8), torch.zeros(1, 6, 8), block=8, keys=1,
                                   scale=1.0)


def test_bad_geometry_is_refused_with_what_is_wrong():
    q = torch.zeros(1, 10, 8)
    with pytest.raises(ValueError, match="3 sequences of 4 rows, 3 apart"):
        cpu_window._geometry(q, 3, 4, 3, 1, 4)
    with pytest.raises(ValueError, match="window of 0"):
        cpu_window._geometry(q, 1, None, 1, 0, 0)


@needs_kernel
def test_init_without_packed_sequences_is_refused():
    """init writes instead of adding, which only packed sequences (step >= 2) allow."""
    q = torch.zeros(1, 32, 8)
    lse = torch.zeros(1, 32)
    with pytest.raises(RuntimeError, match="refused its arguments"):
        cpu_window.backward(q, q, q, q, q, lse, q.clone(), q.clone(), q.clone(), window=4,
                            scale=1.0, init=True)


def test_without_a_compiler_it_says_why(monkeypatch):
    monkeypatch.setattr(cpu_window, "_STATE", {})
    monkeypatch.setattr(cpu_window, "_compiler", lambda: None)
    monkeypatch.delenv(cpu_window.ENV, raising=False)
    assert cpu_window.library() is None
    assert "no C compiler" in cpu_window.missing()
    assert not cpu_window.usable(torch.zeros(1, 4, 8))
    monkeypatch.setattr(cpu_window, "_STATE", {})
    monkeypatch.setenv(cpu_window.ENV, "1")
    with pytest.raises(RuntimeError, match="SPARSE_ATTENTION_CPU_KERNEL=1 asks for"):
        cpu_window.library()


def test_a_build_lands_in_the_cache_and_is_reused(monkeypatch, tmp_path):
    if cpu_window._compiler() is None:
        pytest.skip("no C compiler on this machine")
    monkeypatch.setenv("SPARSE_ATTENTION_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(cpu_window.ENV, raising=False)
    monkeypatch.setattr(cpu_window, "_STATE", {})
    assert cpu_window.library() is not None, cpu_window.missing()
    built = list((tmp_path / "cache").iterdir())
    assert [p.suffix for p in built] == [".so"]                  # one library, no leftovers
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(cpu_window, "_STATE", {})
    assert cpu_window.library() is not None
    assert [p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()] == [stamp]


def test_a_failed_build_says_why_and_can_be_turned_off(monkeypatch, tmp_path):
    if cpu_window._compiler() is None:
        pytest.skip("no C compiler on this machine")
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    monkeypatch.setattr(cpu_window, "SOURCE", bad)
    monkeypatch.setenv("SPARSE_ATTENTION_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(cpu_window.ENV, raising=False)
    monkeypatch.setattr(cpu_window, "_STATE", {})
    assert cpu_window.library() is None
    assert "building cpu_window.c failed" in cpu_window.missing()
    cache = tmp_path / "cache"
    assert not cache.exists() or list(cache.iterdir()) == []   # no half-written library
    monkeypatch.setattr(cpu_window, "_STATE", {})
    monkeypatch.setenv(cpu_window.ENV, "0")
    assert cpu_window.library() is None and "turned off" in cpu_window.missing()


# The strided and fixed layers in float32, kernel on and off, against reference/ in float64:
# (pattern, combine, n, d, H, params, the kernel's calls that must serve the layer). Fixed:
# c | l (the merged head's A(1) through the window, the earlier summaries through the
# prefix mode), c not dividing l (one head: BlockCausal, then the prefix merged into it),
# A(1) and A(2) on separate heads (the own block's summaries through PyTorch's kernel).
WINDOW, PREFIX = ("forward", "backward"), ("prefix_forward", "prefix_backward")
LAYERS = [("strided", "merged", 97, 48, 4, {"stride": 8}, WINDOW),
          ("strided", "multihead", 100, 48, 1, {"stride": 10}, WINDOW),
          ("strided", "interleaved", 61, 40, 4, {"stride": 6}, WINDOW),
          ("strided", "merged", 200, 64, 1, {"stride": 33}, WINDOW),
          ("fixed", "merged", 97, 48, 4, {"stride": 16, "c": 4}, WINDOW + PREFIX),
          ("fixed", "merged", 100, 40, 1, {"stride": 10, "c": 3}, WINDOW + PREFIX),
          ("fixed", "multihead", 150, 48, 2, {"stride": 12, "c": 4}, WINDOW + PREFIX),
          ("fixed", "interleaved", 61, 24, 3, {"stride": 8, "c": 2}, PREFIX),
          # dense attention with narrow heads: one causal band of n rows (dense_window)
          ("full", "merged", 300, 16, 4, {}, WINDOW),
          ("full", "merged", 257, 8, 2, {}, WINDOW)]


def _layer(q, k, v, g, pattern, combine, layer, params):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                           backend="structured", **params)
    out.backward(g)
    return [out.detach(), q.grad, k.grad, v.grad]


@needs_kernel
@pytest.mark.parametrize("pattern,combine,n,d,H,params,served", LAYERS)
def test_layer_float32_with_and_without_the_kernel(pattern, combine, n, d, H, params, served,
                                                   monkeypatch):
    _check_layer(pattern, combine, n, d, H, params, served, monkeypatch)


@needs_kernel
def test_fixed_blocks_longer_than_the_kernel_window_take_pytorchs_kernel(monkeypatch):
    """The merged head's A(1) beyond ``WINDOW_MAX`` rows: PyTorch's kernel, merged as a chunk
    beside the prefix mode (WINDOW_MAX lowered so that a small layer shows it)."""
    monkeypatch.setattr(cpu_window, "WINDOW_MAX", 8)
    _check_layer("fixed", "merged", 70, 48, 2, {"stride": 16, "c": 4}, PREFIX, monkeypatch)


def _check_layer(pattern, combine, n, d, H, params, served, monkeypatch):
    gen = torch.Generator().manual_seed(n)
    q, k, v, g = (torch.randn(1, H, n, d, generator=gen) for _ in range(4))
    masks = patterns.head_masks(pattern, n, H, combine, 1, **params)
    args = [t.double().numpy() for t in (q, k, v)]
    out, _ = attend(*args, masks)
    want = [torch.from_numpy(np.ascontiguousarray(a))
            for a in (out, *attend_backward(*args, masks, g.double().numpy()))]
    calls = []
    for name in WINDOW + PREFIX:
        real = getattr(cpu_window, name)
        monkeypatch.setattr(cpu_window, name, lambda *a, real=real, name=name, **kw:
                            calls.append(name) or real(*a, **kw))
    with_kernel = _layer(q, k, v, g, pattern, combine, 1, params)
    assert set(calls) == set(served)                          # the kernel served the layer
    monkeypatch.setattr(cpu_window, "_STATE", {"lib": None, "missing": "off for this test"})
    calls.clear()
    without = _layer(q, k, v, g, pattern, combine, 1, params)
    assert calls == []
    m = torch.from_numpy(masks)
    xp = [t.clone().requires_grad_(True) for t in (q, k, v)]
    s = (xp[0] @ xp[1].transpose(-1, -2)) / d ** 0.5
    plain = torch.softmax(s.masked_fill(~m, float("-inf")), -1).nan_to_num(0.0) @ xp[2]
    plain_all = [plain.detach(), *torch.autograd.grad((plain * g).sum(), xp)]
    for name, a, b, w, p in zip(("out", "dq", "dk", "dv"), with_kernel, without, want, plain_all):
        _rule(a, w, p, 1e-5, f"kernel {name}")
        _rule(b, w, p, 1e-5, f"PyTorch kernel {name}")


def test_full_takes_the_window_kernel_only_where_it_is_faster():
    """``structured.dense_window``: float32 CPU heads of width <= 16 (a multiple of 8) at
    n = 256..1024, as many queries as keys -- where dense_kernels measured the window kernel
    faster than SDPA; SDPA elsewhere."""
    from fast.backends import structured

    def takes(n=512, d=16, n_q=None, dtype=torch.float32, device="cpu"):
        q = torch.zeros(2, 4, n if n_q is None else n_q, d, dtype=dtype, device=device)
        k = torch.zeros(2, 4, n, d, dtype=dtype, device=device)
        return structured.dense_window(q, k)

    assert takes() == (cpu_window.library() is not None)
    if cpu_window.library() is None:
        return
    assert takes(n=256) and takes(n=1024) and takes(d=8)
    assert not takes(n=255) and not takes(n=1025)                    # lengths
    assert not takes(d=32) and not takes(d=64) and not takes(d=12)   # widths
    assert not takes(n_q=1) and not takes(n_q=300)                   # decoding, chunks
    assert not takes(dtype=torch.float64) and not takes(dtype=torch.bfloat16)
    assert not takes(device="meta")


@needs_kernel
def test_full_through_the_window_kernel_compiles_to_eagers_numbers():
    """The choice reads shapes and dtypes only, so a compiled dense layer takes the same
    kernel as eager: the same output and gradients, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, g = (torch.randn(1, 2, 260, 16, generator=gen) for _ in range(4))

    def run(fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        out.backward(g)
        return [out.detach()] + [t.grad for t in leaves]

    fn = lambda q, k, v: sparse_attention(q, k, v, "full", backend="structured")
    torch._dynamo.reset()
    eager, compiled = run(fn), run(torch.compile(fn, backend="aot_eager", fullgraph=True))
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
        assert torch.equal(a, b), name


def test_the_full_plan_band_stays_with_pytorch_beyond_the_kernel_window():
    """The "full" plan is one band of N rows: dense causal attention, PyTorch's job."""
    band = strided.LocalBand(strided.WINDOW_KERNEL_MAX + 16, 1.0)
    t = torch.zeros(1, strided.WINDOW_KERNEL_MAX + 16, 8)
    assert not band._window(t, t, t)


@needs_kernel
def test_results_do_not_depend_on_the_thread_count():
    """Every block is one thread's, in an order fixed by the geometry alone: bit for bit the
    same with 1, 2 or 3 threads (training stays reproducible whatever the machine's cores)."""
    runs, threads = [], torch.get_num_threads()
    try:
        for nt in (1, 2, 3):
            torch.set_num_threads(nt)
            q, k, v, go = _heads(1, 700, 48, seed=0)
            out, lse = torch.empty(1, 700, 48), torch.empty(1, 700)
            col = dict(window=70, sequences=10, rows=70, step=10, seqoff=1)
            cpu_window.forward(q, k, v, out, lse, scale=0.3, **col)
            cpu_window.forward(q, k, v, out, lse, scale=0.3, window=10, strict=True, merge=True)
            grads = [torch.empty(1, 700, 48) for _ in range(3)]
            cpu_window.backward(q, k, v, go, out, lse, *grads, scale=0.3, init=True, **col)
            cpu_window.backward(q, k, v, go, out, lse, *grads, scale=0.3, window=10, strict=True)
            runs.append([out, lse, *grads])
            ks, vs = k[:, :300], v[:, :300]                        # prefix mode, one head
            out, lse = torch.empty(1, 700, 48), torch.empty(1, 700)
            cpu_window.prefix_forward(q, ks, vs, out, lse, block=24, keys=10, scale=0.3)
            dks, dvs = (torch.empty(1, cpu_window.prefix_segments(1), 300, 48) for _ in range(2))
            dq = torch.empty(1, 700, 48)
            lse = lse.masked_fill(torch.isneginf(lse), float("inf"))
            cpu_window.prefix_backward(q, ks, vs, go, out, lse, dq, dks, dvs, block=24, keys=10,
                                       scale=0.3, init=True)
            runs[-1] += [out, lse, dq, dks.sum(1), dvs.sum(1)]
    finally:
        torch.set_num_threads(threads)
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))
