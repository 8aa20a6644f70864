"""The one-query step: one query row against a longer key tensor, reading only its row's keys.

Child et al., 2019, section 4.2 (eq. 2-4: output i attends to the set S_i) and
section 4.3 (the strided and fixed patterns: a row reads about sqrt(n) earlier
positions). Decoding with a key/value cache that holds every position (a model's
own cache, as Hugging Face's) asks for one query at position t = n_k - 1 against
n_k keys. A dense masked row would read all n_k keys; this step gathers the keys
row t reads and attends over them only: O(keys read), not O(n_k).

Which keys: ``fast.backends.reads`` (``head_groups``, ``step_pieces``, the pieces a
key/value cache reads from its stores), turned into sequence positions by
``store_positions``; nothing here re-derives the pattern. A piece whose positions
are a slice (the whole prefix, the strided column) is a view of k and v; the others
are gathered (copies of the keys read). The attention over the pieces is
``attend_pieces``, which the caches of ``fast.transformer.decoding.kv_cache`` call too.

Grouped key/value heads: query head h reads key/value head h // share (as
``repeat_interleave`` and SDPA's ``enable_gqa`` pair them). Where the query heads of
a group that share a key/value head are consecutive and read the same positions,
they are the rows of one product with that head's keys (no copy of a head);
otherwise each query head gets its own gathered keys.

Padded batches (``fast.backends.padding``): sequence b's query stands at position
t_b = n_k - 1 - offsets[b]; the offsets are read on the host (a wait on a GPU), and
each run of consecutive sequences with one offset is one step over views of k and v.
A query row outside its sequence outputs 0.

Precision: q.k, the softmax and the weighted sum run in the accumulation dtype
(``fast.core.precision.acc_dtype``: float32 for float16 and bfloat16); the output is
rounded once, to q's dtype. A row that reads nothing outputs 0, and its gradients
are 0. Differentiable (plain tensor operations).
"""

from __future__ import annotations

import torch

from fast.backends.padding import query_rows
from fast.backends.reads import head_groups, step_pieces, store_positions, summary_mask
from fast.core.checks import check_finite as reject_non_finite
from fast.core.nonfinite import attention_reach, quarantine
from fast.core.precision import acc_dtype


def attend_pieces(q: torch.Tensor, scale: float, pieces: list, share: int = 1,
                  empty_rows: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    """softmax(scale q K^T) V over the concatenated pieces [(K^T, V, drop)].

    q (B, Hg, 1, dk); K^T (B Hk, dk, m), V (B Hk, m, dv) with Hk = Hg / share: the
    ``share`` consecutive query heads of a key/value head are the rows of one product
    with its keys (batch and key/value heads folded into one dimension, so every product
    is a single bmm). drop: None, a slice of the m keys that no head reads, or (Hg, 1, m)
    bool, True where a head does not read. ``empty_rows``: some row may read nothing
    (it outputs 0, and gets no gradient). Computed in ``dtype`` (None: the accumulation
    dtype of q); returns (B, Hg, 1, dv) in that dtype."""
    B, Hg, _, dk = q.shape
    G = share
    dtype = acc_dtype(q.dtype) if dtype is None else dtype
    q = q.reshape(B * Hg // G, G, dk)                                    # (B Hk, G, dk)
    q = q if q.dtype == dtype else q.to(dtype)
    q = q if scale == 1.0 else q * scale
    scores = []
    for kt, _, drop in pieces:
        s = torch.bmm(q, kt if kt.dtype == dtype else kt.to(dtype))      # (B Hk, G, m)
        if isinstance(drop, slice):                                      # no head reads these
            s[..., drop] = float("-inf")
        elif drop is not None:                                           # per head (Hg, 1, m)
            s = s.view(B, Hg, 1, -1).masked_fill(drop, float("-inf")).view(B * Hg // G, G, -1)
        scores.append(s)
    scores = scores[0] if len(scores) == 1 else torch.cat(scores, -1)
    if empty_rows:             # a row that reads nothing: uniform weights, then times 0
        reads = ~torch.isneginf(scores.amax(-1, keepdim=True))           # (B Hk, G, 1)
        w = torch.softmax(scores.masked_fill(~reads, 0.0), dim=-1) * reads
    else:
        w = torch.softmax(scores, dim=-1)
    if len(pieces) == 1:                                                 # the common case
        v = pieces[0][1]
        out = torch.bmm(w, v if v.dtype == dtype else v.to(dtype))       # (B Hk, G, dv)
        return out.view(B, Hg, 1, -1)
    out, start = None, 0
    for kt, v, _ in pieces:
        m = kt.shape[2]
        wp, v = w.narrow(2, start, m), v if v.dtype == dtype else v.to(dtype)
        out = torch.bmm(wp, v) if out is None else torch.baddbmm(out, wp, v)   # (B Hk, G, dv)
        start += m
    return out.view(B, Hg, 1, -1)                                        # (B, Hg, 1, dv)


def _kv_heads(heads: slice, n_heads: int, share: int):
    """The key/value heads of the query heads ``heads``: (a slice of them, G) when every G
    consecutive query heads of the group share one and those heads are consecutive, else
    (a LongTensor: the key/value head of each query head, 1)."""
    kv = [h // share for h in range(n_heads)[heads]]
    for G in range(min(share, len(kv)), 0, -1):
        if len(kv) % G == 0 and kv == [kv[0] + i // G for i in range(len(kv))]:
            return slice(kv[0], kv[-1] + 1), G
    return torch.tensor(kv), 1


def _piece(k: torch.Tensor, v: torch.Tensor, heads, pos) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, V) (B, Hk, m, d) of the key/value heads ``heads`` (a slice, or a LongTensor with
    one per query head) at positions ``pos`` (a slice: views of k and v; a LongTensor
    (m,), or (Hg, m) with one row per query head: gathered)."""
    if isinstance(heads, slice):
        if isinstance(pos, slice):
            return k[:, heads, pos], v[:, heads, pos]                    # (B, Hk, m, d) views
        return k[:, heads][:, :, pos], v[:, heads][:, :, pos]            # (B, Hk, m, d)
    if isinstance(pos, slice):
        return k[:, :, pos][:, heads], v[:, :, pos][:, heads]            # (B, Hg, m, d)
    return k[:, heads[:, None], pos], v[:, heads[:, None], pos]          # (B, Hg, m, d)


def _drop(drop, Hg: int, m: int, device) -> torch.Tensor:
    """A piece's drop (None, a slice of its m keys, or (Hg, 1, m)) as bool (Hg, 1, m)."""
    if isinstance(drop, torch.Tensor):
        return drop
    out = torch.zeros(Hg, 1, m, dtype=torch.bool, device=device)
    if drop is not None:
        out[..., drop] = True
    return out


def _group_keys(q, k, v, group, t: int, params: dict, reads: list):
    """The keys and values row t of ``group``'s heads reads (``reads``: its
    ``step_pieces``), as one small dense problem: (K, V) (B, Hk, m, d), drop (Hg, 1, m)
    bool or None (True where a head does not read a key), G (the consecutive query heads
    per key/value head of K)."""
    H, share = q.shape[1], q.shape[1] // k.shape[1]
    l, c = params.get("stride"), params.get("c")
    pieces = [(drop, store_positions(group, rows, t, l, c, q.device)) for rows, drop in reads]
    heads, G = _kv_heads(group.heads, H, share)
    if G == 1 and share > 1 or any(not isinstance(p, slice) and p.dim() == 2
                                   for _, p in pieces):
        # query heads that read their own positions, or share no key/value head with a
        # neighbour of their group: each query head gets its own keys
        heads = torch.tensor([h // share for h in range(H)[group.heads]], device=q.device)
        G = 1
    Hg = len(range(H)[group.heads])
    kvs = [_piece(k, v, heads, pos) for _, pos in pieces]
    drops = [drop if not isinstance(drop, tuple)                    # ("summary", s)
             else ~summary_mask(group, c, drop[1]).to(q.device) for drop, _ in pieces]
    if len(kvs) == 1:
        (K, V), = kvs
    else:
        K, V = torch.cat([a for a, _ in kvs], 2), torch.cat([b for _, b in kvs], 2)
    if all(d is None for d in drops):
        drop = None
    else:
        drop = torch.cat([_drop(d, Hg, kv[0].shape[2], q.device) for d, kv in zip(drops, kvs)],
                         -1)                                               # (Hg, 1, m)
    return K, V, drop, G


def read_nothing(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape) -> torch.Tensor:
    """The output of rows that read nothing: zeros of ``shape`` in the accumulation dtype,
    differentiable in q, k and v with zero gradients ("rows that read nothing output 0,
    with zero gradients", ``fast.sparse_attention``), as on every other path. The graph
    comes from sums over empty slices: 0 exactly, whatever q, k and v hold (no value is
    read, so a NaN elsewhere does not reach these rows)."""
    nothing = q[..., :0].sum() + k[..., :0].sum() + v[..., :0].sum()    # 0, with a graph
    return q.new_zeros(shape, dtype=acc_dtype(q.dtype)) + nothing.to(acc_dtype(q.dtype))


def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: int, pattern: str,
         combine: str, layer: int, scale: float, params: dict,
         check_finite: bool | None = True, n: int | None = None) -> torch.Tensor:
    """Row t of every head, one sequence position for the whole batch: q (B, H, 1, d),
    k, v (B, Hkv, >= t + 1, d) -> (B, H, 1, dv) in the accumulation dtype. Keys past t
    are never read. ``check_finite``: True rejects NaN and inf in q and in the keys and
    values the row reads; False keeps ``fast.core.nonfinite``'s promise over them (a head
    whose query, or a key or value it reads, is not finite outputs NaN); None looks at no
    value (``fast.sparse_attention``'s default on a GPU). ``n``: the sequence length the
    parameters were checked at (None: t + 1)."""
    B, H = q.shape[:2]
    groups = head_groups(pattern, H, combine, layer, n=t + 1 if n is None else n, **params)
    outs = []
    for group in groups:
        qg = q[:, group.heads]                                           # (B, Hg, 1, d)
        reads = step_pieces(group, t, params.get("stride"), params.get("c"), q.device)
        if not reads:
            # a summary head before its first summary: reads nothing
            outs.append(read_nothing(qg, k, v, (*qg.shape[:3], v.shape[-1])))
            continue
        K, V, drop, G = _group_keys(q, k, v, group, t, params, reads)
        empty = group.may_read_nothing

        def attend(a, b, c, drop=drop, G=G, empty=empty):
            B_, Hk, m, _ = b.shape                             # one piece: K^T, V, drop
            piece = (b.reshape(B_ * Hk, m, -1).transpose(1, 2), c.reshape(B_ * Hk, m, -1), drop)
            return attend_pieces(a, scale, [piece], G, empty)

        if check_finite is False:
            outs.append(quarantine(attend, qg, K, V, attention_reach(attend)))
            continue
        if check_finite:
            reject_non_finite(qg, K, V)
        outs.append(attend(qg, K, V))
    if len(groups) == 1:
        return outs[0]
    out = q.new_empty(B, H, 1, v.shape[-1], dtype=outs[0].dtype)
    for group, part in zip(groups, outs):
        out[:, group.heads] = part
    return out


def row_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: str, *,
                  combine: str, layer: int, scale: float, params: dict,
                  lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
                  check_finite: bool | None = True) -> torch.Tensor:
    """The one-query step: q (B, H, 1, d) at position n_k - 1 (of each sequence, minus
    its offset), k, v (B, Hkv, n_k, d), Hkv dividing H; any registered pattern, its
    parameters checked at n_k. ``lengths`` and ``offsets``:
    (B,) integer tensors, checked (``fast.backends.padding``). ``check_finite`` as
    ``step``: only q and what the row reads are looked at. Returns (B, H, 1, d) in q's
    dtype (module docstring)."""
    B, n_k = q.shape[0], k.shape[2]
    run = lambda qq, kk, vv, t: step(qq, kk, vv, t, pattern, combine, layer, scale, params,
                                     check_finite, n_k)
    inside = None
    if lengths is not None:                  # the query outside its sequence outputs 0 ...
        inside = query_rows(1, lengths, offsets, n_k, q.device)          # (B, 1, 1, 1)
        # ... and reads zeros: its sequence's keys are read by no one else, so nothing in
        # them (a NaN under check_finite=False) reaches its output or any gradient
        q, k, v = (torch.where(inside, t, t.new_zeros(())) for t in (q, k, v))
    if offsets is None:
        out = run(q, k, v, n_k - 1)
    else:
        starts = offsets.tolist()                       # host values: one wait on a GPU
        parts, b = [], 0
        while b < B:                                    # runs of one offset: views of k, v
            e = b
            while e < B and starts[e] == starts[b]:
                e += 1
            P = starts[b]
            if P >= n_k:                                # an empty sequence
                parts.append(read_nothing(q[b:e], k, v, (e - b, q.shape[1], 1, v.shape[-1])))
            else:
                parts.append(run(q[b:e], k[b:e, :, P:], v[b:e, :, P:], n_k - 1 - P))
            b = e
        out = parts[0] if len(parts) == 1 else torch.cat(parts)           # (B, H, 1, dv)
    if inside is not None:
        out = torch.where(inside, out, out.new_zeros(()))
    return out.to(q.dtype)
