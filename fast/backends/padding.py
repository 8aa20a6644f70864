"""Padded batches: sequences of different lengths in one (B, H, n, d) tensor.

Child et al., 2019, section 4.3: the strided and fixed patterns are defined by
positions -- row i reads j with (i - j) mod l == 0, or the summaries of the blocks
floor(i / l) counts -- so a padded batch must say where each sequence's positions
start, or a pattern reads the wrong keys.

A batch is padded by two (B,) integer tensors, and the rule is the same on every
backend:

* ``lengths[b]``: how many real tokens sequence b holds (default: all that follow
  its offset);
* ``offsets[b]``: how many pad tokens precede it (left padding; default 0).

Sequence b holds the indices [offsets[b], offsets[b] + lengths[b]) of the key axis,
and index i is its position i - offsets[b]: positions are shifted per sequence, so a
left-padded sequence reads exactly what it reads unpadded (its first real token is
position 0, as Hugging Face's position ids make it). Right padding (offsets 0) keeps
the positions as they are. A padded index is no position of the sequence: its key
is never read, and its query row outputs 0, with zero gradients. Queries are the
last n_q indices of the key axis, as everywhere (``fast.attention``).

Why lengths and offsets rather than a boolean key mask (B, n_k): (1) they say where
positions start, which a mask does not (a mask whose True entries start late is left
padding only if the positions are taken to start there; reading it so needs the mask
on the host, a wait on a GPU, and a mask with holes has no such reading); (2) the
fast paths honour them without any mask at all (below). A mask of any shape, holes
included, is ``attn_mask`` (positions absolute), which the naive backend ANDs with the
pattern.

How each path honours them:

* naive: the pattern's mask at each sequence's own positions (``positions``), ANDed
  with ``inside`` for keys and queries;
* the full-length paths (structured, Triton): ``padded_run`` -- each sequence is
  rolled so that it starts at index 0 (a gather of q, k, v: one copy each), the
  unmasked pattern runs, and the rows outside the sequence are set to 0 before the
  output is rolled back. A real row never reads a key after its sequence's end
  (every pattern is causal), so the pad keys rolled to the end are never read by it:
  exact, with no mask. Without offsets nothing is rolled;
* the one-query step (``fast.backends.one_query``): each sequence's row at its own
  position t_b = n_k - 1 - offsets[b].

Values are checked on the host (``check_padding_values``): for CPU tensors and sequences
always (free), for GPU tensors only when asked (a wait for the device; the caller's
``check_finite`` decides, as it decides the finite check). ``fast.sparse_attention``
reads them inside one operator (``fast.backends.host_checks``), so that torch.compile
keeps a call whole; ``check_padding`` does it all at once for the other entry points.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _as_index(name: str, x, B: int) -> torch.Tensor:
    """``x`` (a (B,) integer tensor or a sequence of B ints) as an int64 tensor where it
    is: on the host for a sequence or a CPU tensor, on its device for a GPU tensor."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.dtype.is_floating_point or x.dtype.is_complex:
            raise ValueError(f"{name} must hold integers (a (B,) integer tensor, one per "
                             f"sequence), got dtype {x.dtype}")
        t = x
    else:
        try:
            values = list(x)
        except TypeError:
            raise ValueError(f"{name} must be a (B,) integer tensor or a sequence of B "
                             f"integers, got {type(x).__name__}") from None
        if not all(isinstance(a, int) and not isinstance(a, bool) for a in values):
            raise ValueError(f"{name} must hold integers, got {values!r}")
        t = torch.tensor(values, dtype=torch.int64)
    if t.shape != (B,):
        raise ValueError(f"{name} must have shape (B,) = ({B},), one per sequence, got shape "
                         f"{tuple(t.shape)}")
    return t.to(dtype=torch.int64)


def as_padding(lengths, offsets, B: int) -> tuple:
    """(lengths, offsets, host): each an int64 tensor (B,) where it was given -- a
    sequence or a CPU tensor stays on the host, so that its values are checked there
    before it moves, at no wait for a GPU (``to_device``) -- or None when not given,
    after checking its type and shape (no value is read); and for each whether it is on
    the host."""
    out, host = [], []
    for name, x in (("lengths", lengths), ("offsets", offsets)):
        out.append(None if x is None else _as_index(name, x, B))
        host.append(not isinstance(x, torch.Tensor) or x.device.type == "cpu")
    return out[0], out[1], tuple(host)


def to_device(lengths, offsets, device) -> tuple:
    """(lengths, offsets) on ``device``, the attention's (None stays None): after their
    values were checked where they were given (``as_padding``)."""
    return tuple(None if t is None else t.to(device) for t in (lengths, offsets))


def check_padding_values(lengths, offsets, n_k: int, check_lengths: bool = True,
                         check_offsets: bool = True) -> None:
    """Raise a ValueError naming the first sequence whose offset is outside [0, n_k] or
    whose length is outside [0, n_k - offsets] (``check_lengths``, ``check_offsets``:
    which of the two given to look at). Reads the values on the host."""
    for name, t, wanted in (("lengths", lengths, check_lengths),
                            ("offsets", offsets, check_offsets)):
        if t is None or not wanted:
            continue
        # a length's bound needs its offset where the length is (a read of the offsets
        # from the GPU only when the lengths are checked on the host and they are not)
        top = n_k if name == "offsets" or offsets is None else n_k - offsets.to(t.device)
        bad = (t < 0) | (t > top)
        if bool(bad.any()):
            b = int(bad.nonzero()[0, 0])
            limit = (f"n_k = {n_k}" if name == "offsets" or offsets is None
                     else f"n_k - offsets[{b}] = {int(top[b])}")
            raise ValueError(f"{name}[{b}] = {int(t[b])} is outside [0, {limit}] (sequence "
                             f"{b} of a batch padded to n_k = {n_k} keys)")


def check_padding(lengths, offsets, B: int, n_k: int, device, values: bool):
    """(lengths, offsets) as int64 tensors (B,) on ``device`` (each None when not given),
    after checking their shape, and their values -- 0 <= offsets <= n_k and 0 <= lengths
    <= n_k - offsets -- on the host when they are there already or ``values`` asks
    (``as_padding``, then ``check_padding_values``)."""
    lengths, offsets, (host_l, host_o) = as_padding(lengths, offsets, B)
    check_padding_values(lengths, offsets, n_k, host_l or values, host_o or values)
    return to_device(lengths, offsets, device)


def positions(index: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """The positions of the indices ``index`` (m,) in each sequence: (B, m) with
    offsets, else ``index`` itself (one row for every sequence)."""
    return index if offsets is None else index[None, :] - offsets[:, None]


def inside(index: torch.Tensor, lengths: torch.Tensor | None,
           offsets: torch.Tensor | None, n_k: int) -> torch.Tensor | None:
    """Whether each of the indices ``index`` (m,) lies inside its sequence: bool (B, m),
    or None when the batch is not padded."""
    if lengths is None and offsets is None:
        return None
    start = 0 if offsets is None else offsets[:, None]
    length = (n_k - start) if lengths is None else lengths[:, None]
    pos = index[None, :] - start
    return (pos >= 0) & (pos < length)                                   # (B, m)


def query_rows(n_q: int, lengths: torch.Tensor | None, offsets: torch.Tensor | None,
               n_k: int, device) -> torch.Tensor | None:
    """Whether each of the n_q queries, aligned to the end of n_k keys, lies inside its
    sequence: bool (B, 1, n_q, 1), to broadcast over (B, H, n_q, d); None unpadded."""
    rows = inside(torch.arange(n_k - n_q, n_k, device=device), lengths, offsets, n_k)
    return None if rows is None else rows[:, None, :, None]


def zero_outside(q: torch.Tensor, lengths: torch.Tensor | None,
                 offsets: torch.Tensor | None, n_k: int) -> torch.Tensor:
    """q (B, H, n_q, d), queries aligned to the end of n_k keys, with its rows outside
    their sequences set to 0 (where, so their gradient is 0): a padded query row outputs
    0 whatever it holds, a NaN included when the finite check is off (without it,
    ``fast.core.nonfinite`` would give that row NaN as a row of a sequence)."""
    rows = query_rows(q.shape[2], lengths, offsets, n_k, q.device)
    return q if rows is None else torch.where(rows, q, q.new_zeros(()))  # (B, H, n_q, d)


def padded_run(run, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               lengths: torch.Tensor | None, offsets: torch.Tensor | None) -> torch.Tensor:
    """``run(q, k, v)`` -- a path that attends queries aligned to the end of the key axis
    over unpadded sequences -- on a padded batch (module docstring): q (B, H, n_q, d),
    k, v (B, Hkv, n_k, d) -> (B, H, n_q, d), the rows outside their sequence 0."""
    B, n_q, n_k = q.shape[0], q.shape[2], k.shape[2]
    if offsets is None:
        out = run(q, k, v)                                               # (B, H, n_q, d)
        if lengths is None:
            return out
        rows = inside(torch.arange(n_k - n_q, n_k, device=q.device), lengths, None, n_k)
        return torch.where(rows[:, None, :, None], out, 0.0)
    if n_q < n_k:                      # every row gets its own shift: the full length first
        q = F.pad(q, (0, 0, n_k - n_q, 0))                               # (B, H, n_k, d)
    index = torch.arange(n_k, device=q.device)

    def take(t, rows):                 # t (B, H, n_k, d) at rows (B, n_k) of each sequence
        return t.gather(2, rows[:, None, :, None].expand(B, t.shape[1], n_k, t.shape[3]))

    start = (index[None, :] + offsets[:, None]) % n_k                    # (B, n_k)
    out = run(take(q, start), take(k, start), take(v, start))            # rolled: from 0
    length = (n_k - offsets) if lengths is None else lengths
    rows = index[None, :] < length[:, None]                              # (B, n_k)
    out = torch.where(rows[:, None, :, None], out, 0.0)
    out = take(out, (index[None, :] - offsets[:, None]) % n_k)           # rolled back
    return out[:, :, n_k - n_q:]                                          # (B, H, n_q, d)
