"""Where the structured backend's time goes: each piece's forward and backward, and the glue.

Child et al., 2019, section 5.5: a sparse pattern is fast when every part of it
runs as a dense kernel over exactly the positions it reads. The structured
backend (``fast.backends.structured``) cuts a layer into pieces -- the strided
local band and transposed column, the fixed block and summary pieces -- each a
fused attention kernel, merged through the log-sum-exp. ``piece_times`` times,
on one set of inputs:

* every piece's forward and backward alone (its backward given the merged out
  and lse; the group's first piece making the gradient buffers, the others adding
  into them, as in a real backward);
* the glue around them: padding and casting q, k, v (``prepare``), merging the
  pieces' outputs (``merge``, the copies it is timed on subtracted), casting and
  padding the incoming gradient (``grad_prepare``), and the public entry's input
  checks (``checks``);
* the whole call through ``fast.sparse_attention`` (forward alone, and forward
  plus backward) and dense causal ``scaled_dot_product_attention`` on the same
  inputs;

and counts the (query, key) pairs each piece reads (``pairs``; its share of the
pattern's ideal work) beside the pairs dense causal attention reads. Each
measurement is repeated in ``rounds`` interleaved rounds (every item once per
round, so that a disturbance on a shared machine hits them alike); the minimum
is reported and every repetition kept, with its CPU seconds and minor page faults
(``fast.measure.timing.repeat``: the wall clock also counts the time other
processes held the cores; page faults show memory touched for the first time).

With ``ops=True`` each piece's backward is also run once under
``torch.profiler`` and its time split by operator: the attention kernel
(``kernel``), zero-fills (``fill``), copies (``copy``), additions and folds
(``add``), the rest (``other``) -- what a piece spends besides the kernel.

It returns numbers (a dict that ``json.dump`` takes); docs/design.md, section 5,
says what they showed and under which conditions.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from fast.attention import sparse_attention
from fast.backends import structured
from fast.core.checks import check_tensors
from fast.core.precision import acc_dtype
from fast.measure.timing import repeat

PIECE_OPS = {  # category -> substrings of the profiler's operator names
    "kernel": ("scaled_dot_product_flash_attention", "scaled_dot_product_attention",
               "cpu_window"),                       # fast.backends.cpu_window's calls
    "fill": ("fill_", "zero_", "aten::zeros"),
    "copy": ("copy_", "aten::cat", "gather", "clone", "contiguous"),
    "add": ("add_", "scatter_add", "aten::sum", "lerp", "logaddexp", "sigmoid"),
}


def _interleaved(calls: dict, rounds: int) -> dict:
    """{name: {"s": [...], "cpu_s": [...], "faults": [...]}}: every call once per round
    (after one warm-up call each), timed by ``fast.measure.timing.repeat``."""
    times = {name: {"s": [], "cpu_s": [], "faults": []} for name in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            for key, values in repeat(call, "cpu", 1).items():
                times[name][key] += values
    return times


def _whole(best: dict, times: dict, who: str) -> dict:
    """Forward and forward + backward of ``who`` ("whole" or "dense"): best times, and
    every repetition's wall and CPU seconds and page faults."""
    out = {"fwd_s": best[f"{who} fwd"], "fb_s": best[f"{who} fb"],
           "bwd_s": best[f"{who} fb"] - best[f"{who} fwd"]}
    for what in ("fwd", "fb"):
        t = times[f"{who} {what}"]
        out.update({f"{what}_s_all": t["s"], f"{what}_cpu_s_all": t["cpu_s"],
                    f"{what}_faults_all": t["faults"]})
    return out


def _op_split(call) -> dict:
    """Seconds of one ``call()`` by operator category (``PIECE_OPS``), self time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    split = dict.fromkeys((*PIECE_OPS, "other"), 0.0)
    for event in prof.key_averages():
        kind = next((k for k, names in PIECE_OPS.items()
                     if any(s in event.key for s in names)), "other")
        split[kind] += event.self_cpu_time_total / 1e6
    return split


def piece_times(pattern: str = "strided", n: int = 16384, *, B: int = 1, H: int = 4,
                d: int = 64, stride: int = 128, c: int | None = None,
                combine: str = "merged", layer: int = 0, dtype: torch.dtype = torch.float32,
                rounds: int = 3, dense: bool = True, ops: bool = False,
                seed: int = 0) -> dict:
    """Times of the structured backend's pieces and glue for one layer (see the module
    docstring). ``c`` defaults to 32 for "fixed". Returns

    {"conditions": {...}, "pieces": [{"group", "piece", "pairs", "pair_share",
     "fwd_s", "bwd_s", "fwd_s_all", "bwd_s_all", "fwd_cpu_s_all", "fwd_faults_all", ...
     [, "bwd_ops_s"]}, ...], "glue": {name: seconds}, "glue_all": {name: [seconds]},
     "whole": {"fwd_s", "fb_s", "bwd_s", "fwd_s_all", "fwd_cpu_s_all", "fwd_faults_all",
     ...}, "dense": the same or None, "pairs": {"pattern", "dense"}}

    Times are the minimum over ``rounds`` (CPU wall clock, this process's torch threads).
    """
    if pattern not in ("strided", "fixed"):
        raise ValueError(f"piece_times measures 'strided' or 'fixed', got {pattern!r}")
    if pattern == "fixed" and c is None:
        c = 32
    params = {"stride": stride} if pattern == "strided" else {"stride": stride, "c": c}
    if n < stride:
        raise ValueError(f"n must be at least the stride (shorter sequences take the naive "
                         f"path), got n={n}, stride={stride}")
    gen = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(B, H, n, d, generator=gen).to(dtype) for _ in range(4))
    groups = structured.plan(pattern, combine, layer, H, d ** -0.5, stride, c)
    calls, rows, total_pairs = _piece_calls(groups, q, k, v, go, n, -(-n // stride) * stride)
    calls["checks"] = lambda: check_tensors(q, k, v, finite=True)
    calls.update(_whole_calls(q, k, v, go, pattern, combine, layer, params, dense))
    times = _interleaved(calls, rounds)
    best = {name: min(t["s"]) for name, t in times.items()}
    for row in rows:
        for what in ("fwd", "bwd"):
            t = times[f"{row['name']} {what}"]
            row[f"{what}_s"] = best[f"{row['name']} {what}"]
            row[f"{what}_s_all"] = t["s"]
            row[f"{what}_cpu_s_all"], row[f"{what}_faults_all"] = t["cpu_s"], t["faults"]
        if ops:
            row["bwd_ops_s"] = _op_split(calls[f"{row['name']} bwd"])
        del row["name"]
    glue = [name for name in calls if name.startswith(("merge", "prepare", "grad_prepare",
                                                        "checks"))]
    for name in [g for g in glue if g.startswith("merge") and not g.endswith("copies")]:
        best[name] = max(0.0, best[name] - best[name + " copies"])      # the merge alone
    glue = [g for g in glue if not g.endswith("copies")]
    return {
        "conditions": {"pattern": pattern, "n": n, "B": B, "H": H, "d": d, "stride": stride,
                       "c": c, "combine": combine, "layer": layer, "dtype": str(dtype),
                       "rounds": rounds, "torch_threads": torch.get_num_threads(),
                       "cpu_count": os.cpu_count(), "torch": torch.__version__,
                       "statistic": "minimum over interleaved rounds, perf_counter"},
        "pieces": rows,
        "glue": {name: best[name] for name in glue},
        "glue_all": {name: times[name]["s"] for name in glue},
        "whole": _whole(best, times, "whole"),
        "dense": _whole(best, times, "dense") if dense else None,
        "pairs": {"pattern": total_pairs, "dense": B * H * n * (n + 1) // 2},
    }


def _piece_calls(groups, q, k, v, go, n: int, N: int) -> tuple[dict, list[dict], int]:
    """(calls, rows, pairs): every piece's forward and backward alone on the layer's padded
    tensors (the backward given the merged out and lse; a piece after its group's first
    adds into buffers), each group's merge (and the copies it works on, to subtract), the
    padding and casting before the forward and the backward; a row per piece; the pairs
    the pattern reads."""
    B, H = q.shape[:2]
    acc = acc_dtype(q.dtype)

    def prepare():
        return [structured.pad_rows(t, N).to(acc) for t in (q, k, v)]   # (B, H, N, d)

    qa, ka, va = prepare()
    out, lse = (t.clone() for t in structured.layer_forward(groups, (qa, ka, va), acc))
    goa = structured.pad_rows(go.to(acc), N)
    lse_b = lse.masked_fill(lse == float("-inf"), float("inf"))
    calls, rows = {}, []
    rows_of = lambda heads: B * len(range(H)[heads])                   # G of a group
    total_pairs = sum(p.pairs(n, rows_of(heads)) for heads, pieces in groups for p in pieces)
    for gi, (heads, pieces) in enumerate(groups):
        qg, kg, vg = (structured.group(t, heads)[0] for t in (qa, ka, va))
        gviews = [structured.group(t, heads)[0] for t in (qa, ka, va, goa, out, lse_b)]
        buffers = [torch.zeros_like(qg) for _ in range(3)]      # what a later piece adds into
        chunks = [p.forward(qg, kg, vg) for p in pieces]
        label = f"heads {heads.start}::{heads.step}"
        for pi, p in enumerate(pieces):
            name = f"{gi}.{pi} {type(p).__name__}"
            calls[name + " fwd"] = lambda p=p, qg=qg, kg=kg, vg=vg: p.forward(qg, kg, vg)
            calls[name + " bwd"] = (lambda p=p, gv=gviews, first=pi == 0, buf=buffers:
                                    p.backward(*gv, None if first else buf))
            pairs = p.pairs(n, rows_of(heads))
            rows.append({"group": label, "piece": type(p).__name__, "name": name,
                         "pairs": pairs, "pair_share": pairs / total_pairs})
        # the merge may write into a chunk that holds every row: merge copies of them
        calls[f"merge {gi}"] = (lambda chunks=chunks: structured.merge_chunks(
            [[(s, o.clone(), m.clone()) for s, o, m in ch] for ch in chunks], N))
        calls[f"merge {gi} copies"] = (lambda chunks=chunks: [
            (o.clone(), m.clone()) for ch in chunks for _, o, m in ch])
    calls["prepare"] = prepare
    calls["grad_prepare"] = lambda: (structured.pad_rows(go.to(acc), N),
                                     lse.masked_fill(lse == float("-inf"), float("inf")))
    return calls, rows, total_pairs


def _whole_calls(q, k, v, go, pattern: str, combine: str, layer: int, params: dict,
                 dense: bool) -> dict:
    """The whole call through ``sparse_attention``, forward and forward + backward, and
    dense causal SDPA on the same inputs when ``dense``."""
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def clear():
        for t in (qg, kg, vg):
            t.grad = None

    def whole_fwd():
        with torch.no_grad():
            sparse_attention(q, k, v, pattern, combine=combine, layer=layer,
                             backend="structured", **params)

    def whole_fb():
        clear()
        sparse_attention(qg, kg, vg, pattern, combine=combine, layer=layer,
                         backend="structured", **params).backward(go)

    calls = {"whole fwd": whole_fwd, "whole fb": whole_fb}
    if dense:
        def dense_fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def dense_fb():
            clear()
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(go)

        calls["dense fwd"], calls["dense fb"] = dense_fwd, dense_fb
    return calls


def measure_specs(specs: list[dict]) -> list[dict]:
    """``piece_times(**spec)`` for every spec (its "dtype" a name: "float32", ...), one
    after another in this process: what the benchmark runs in one fresh process
    (``fast.measure.child``) after its sweep."""
    return [piece_times(**{**spec, "dtype": getattr(torch, spec.get("dtype", "float32"))})
            for spec in specs]
