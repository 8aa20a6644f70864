"""The (query, key) pairs the CPU kernels compute for a pattern, and the ceiling they set
on its speed-up over dense attention.

Child et al., 2019, section 5.5 ("The upper triangle of the attention matrix is never
computed"). The
keys-read ideal (``fast.measure.bench.keys_read_ideal``) counts the pairs a pattern
needs. The structured path (``fast.backends.structured``) hands its pieces to PyTorch's
CPU flash kernel, which computes more than that: it takes queries in blocks of 32 rows
below 192, 64 below 768 and 256 beyond, and keys in blocks of 512 (all of them when
there are fewer), and skips only the key blocks that lie wholly above a causal
problem's diagonal -- so a causal problem of at most 512 keys is computed whole -- and
a masked problem is computed whole, mask or not (``problem_pairs``; the block sizes and
the skipping are those of aten/src/ATen/native/cpu/FlashAttentionKernel.cpp in torch
2.13.0). Dense causal attention is one such problem per head. At dense's rate per
computed pair, the speed-up cannot pass

    kernel ceiling = pairs computed for dense / pairs computed for the pattern,

which ``kernel_ceiling`` gives. The strided band and column and the fixed own block go,
in float32 and where a C compiler built it, through the CPU window kernel
(``fast.backends.cpu_window``): 16-row query blocks that score every key from the first
row's window start to the last row (``cpu_window.pairs``); the fixed summaries of earlier
blocks through its prefix mode, 16-row blocks that score every key their last row reads
(``cpu_window.prefix_pairs``). Its calls are counted too, so the ceiling is that of the
kernels the forward uses on this machine -- and since dense attention's own count keeps
PyTorch's causal blocks, a pattern whose kernels waste less than dense's can have a ceiling
above the keys-read ideal (the fixed pattern: 4.02x against 3.91x). The pattern's pairs
are counted from the kernel calls its forward makes (``forward_calls``): the plan's pieces
run on "meta" tensors (shapes, no data, no arithmetic), which take the kernel's own call
(``fast.backends.flash_cpu``), and a dispatch mode records every call of the kernel's
operator as it passes, so the count follows the pieces as they are, with nothing in them
swapped.

    >>> from fast.measure.kernel_pairs import kernel_ceiling
    >>> round(kernel_ceiling("fixed", 16384, stride=128, c=32), 2)      # dense / fixed
    4.02
"""

from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fast.backends import cpu_window
from fast.backends.structured import plan
from reference.params import check_int, check_params

KV_SPLIT = 512


def q_split(L: int) -> int:
    """The kernel's query block for a problem of L query rows."""
    return 256 if L >= 768 else 64 if L >= 192 else 32


def problem_pairs(L: int, S: int, causal: bool) -> int:
    """(query, key) pairs the kernel computes for one problem of L queries and S keys:
    every key block of each query block, except, when causal (top-left: query i reads
    keys j <= i), the key blocks that start after the query block's last row."""
    qs, kvs = q_split(L), min(KV_SPLIT, S)
    total = 0
    for m in range(0, L, qs):
        rows = min(qs, L - m)
        reach = min(m + rows, S) if causal else S          # keys the block needs, at most
        blocks = -(-reach // kvs)
        total += rows * min(S, blocks * kvs)
    return total


def forward_calls(pattern: str, n: int, heads: int = 4, combine: str = "merged",
                  layer: int = 0, d: int = 64, **params) -> list[tuple]:
    """[(problems, L, S, causal)] for the flash kernel, (problems, rows, window, "window")
    for the CPU window kernel, (problems, rows, block, keys, "prefix") for its prefix mode
    (``fast.backends.cpu_window``): the kernel calls the structured forward makes for one
    batch element of ``heads`` heads at length n (padded to a multiple of the stride, as
    ``fast.backends.structured`` does), in the order it makes them. ValueError for a bad
    pattern, size or parameter (``reference.params.check_params``)."""
    params = check_params(pattern, n, heads, combine, layer, params)
    check_int("head dimension d", d, 1)
    l = params["stride"]
    N = -(-n // l) * l
    with _KernelCalls() as recorder:
        for heads_slice, pieces in plan(pattern, combine, layer, heads, 1.0, l,
                                        params.get("c")):
            G = len(range(heads)[heads_slice])
            t = torch.empty(G, N, d, device="meta")                 # (G, N, d): no data
            for piece in pieces:
                piece.forward(t, t, t)
    return recorder.calls


class _KernelCalls(TorchDispatchMode):
    """Records (problems, L, S, causal) for every call of the CPU flash kernel's forward
    operator made while it is active, and the CPU window kernel's calls
    (``fast.backends.cpu_window``, told through its ``OBSERVERS``) as ``forward_calls``
    lists them, and lets every operator run as it would."""

    KERNEL = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def _window(self, kind: str, problems: int, rows: int, *geometry: int) -> None:
        self.calls.append((problems, rows, *geometry, kind))

    def __enter__(self):
        cpu_window.OBSERVERS.append(self._window)
        return super().__enter__()

    def __exit__(self, *exc):
        cpu_window.OBSERVERS.remove(self._window)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.KERNEL:
            q, k = args[0], args[1]
            is_causal = args[4] if len(args) > 4 else (kwargs or {}).get("is_causal", False)
            self.calls.append((math.prod(q.shape[:-2]), q.shape[-2], k.shape[-2],
                               bool(is_causal)))
        return func(*args, **(kwargs or {}))


def computed_pairs(pattern: str, n: int, heads: int = 4, **params) -> int:
    """Pairs the kernel computes for ``heads`` heads at length n: dense causal attention
    (``pattern="full"``) or the structured forward of a pattern (``forward_calls``).
    ValueError for a bad pattern, size or parameter (``reference.params.check_params``)."""
    if pattern == "full":
        check_params(pattern, n, heads, "merged", 0, params)
        return heads * problem_pairs(n, n, causal=True)
    return sum(count * _call_pairs(rows, *rest)
               for count, rows, *rest in forward_calls(pattern, n, heads, **params))


def _call_pairs(rows: int, *rest) -> int:
    """Pairs one problem of a recorded call computes (``forward_calls``' tuples, less the
    count)."""
    *geometry, kind = rest
    if kind == "window":
        return cpu_window.pairs(rows, *geometry)
    if kind == "prefix":
        return cpu_window.prefix_pairs(rows, *geometry)
    return problem_pairs(rows, *geometry, causal=kind)


def kernel_ceiling(pattern: str, n: int, heads: int = 4, **params) -> float:
    """The speed-up over dense causal attention that the pairs the kernel computes allow,
    at equal cost per computed pair (module docstring)."""
    return computed_pairs("full", n, heads) / computed_pairs(pattern, n, heads, **params)
