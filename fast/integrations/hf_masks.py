"""What a transformers model's attention mask means for a sparse pattern, and how it is run.

Child et al., 2019, section 4 (eq. 2-4: output i attends over the set S_i of a pattern)
and section 4.3 (the strided and fixed patterns, made of positions: row i reads j with
(i - j) mod l == 0, the summaries of the blocks floor(i / l) counts, ...).

transformers describes the mask of a forward pass by its arguments -- a mask function of
(batch, head, query slot, key slot) that is causal, perhaps with a sliding window, chunks,
packed sequences or an overlay; the model's 2D padding mask (1 = token, 0 = pad); where the
queries and the keys sit in the cache -- and each attention implementation builds what it
needs from them (``masking_utils.sdpa_mask`` builds sdpa's dense boolean mask). The mask
function registered here keeps those arguments as they are (``ModelMask``), and the
attention turns them, once per forward pass, into one of two plans:

* **Padded** (the fast path, on every backend of ``fast.sparse_attention``): the mask is
  the plain causal one and the 2D mask holds one run of tokens per row; pads before it
  become ``offsets=``, pads after it ``lengths=`` (``fast.backends.padding``), and a static
  cache's empty slots (keys after the last query) are cut off, since no query reads them.
* **Dense** (any mask): M, the boolean (B, 1, n_q, n_k) mask that sdpa would be given
  (transformers' own ``sdpa_mask`` over the same arguments, or the 4D mask given to the
  model), ANDed with the pattern evaluated at the positions of the queries and the keys
  (``fast.backends.masks.position_masks``), as ``attn_mask`` of the naive backend.

On either path, head h's query i reads key j when M allows it and the pattern's head h,
at the positions of the two, does: reads[b, h, i, j] = M[b, i, j] and
S_h(pos_q[b, i], pos_k[b, j]). The padded plan is taken only where it computes exactly
that. So for "full" (which reads every earlier position: no positions needed) every mask
gives sdpa's attention, and for "strided" and "fixed" the reference's masks at those
positions, ANDed with M.

**Positions are the model's position ids** (its rotary or learned position embedding reads
the same numbers): a left-padded row given ids counted from its first token reads what it
reads alone; one given ids counted from the first slot reads the pattern at those; packed
sequences (ids that restart) each read their own pattern. Where the model passes none, a
token's position is the number of real tokens before it (``generate()``'s numbering).
The keys of a call with a cache include earlier tokens, whose ids are not passed again:
their positions continue the convention the new tokens' ids follow -- the count of real
tokens before each (``generate()``'s ``attention_mask.cumsum(-1) - 1``) or the slot itself
(a model numbering from the first slot); new tokens that follow neither are refused, since
the cached keys' positions would be guesses.

**A mask with holes** (pads between tokens: a right-padded prompt that ``generate()``
extends, a classification batch from ``input_ids.ne(pad)``) and any mask but the plain
causal one (a sliding window that can matter, packed sequences, chunks) take the dense
plan; a sliding window whose width exceeds every query-key distance of the call (Mistral's
4,096 on short inputs) cannot change anything and does not. A mask that lets a query read a
later key (bidirectional attention, an image-token overlay) is refused: every pattern is
causal. A 4D mask given to the model is its whole mask, as sdpa reads it: boolean (True =
may read), or additive (0 = may read, the dtype's minimum or -inf = may not; any other
value is a bias, refused).

**Once per forward pass**, eagerly: the plan is made by the first layer, with the values
read on the host (the mask, the ids: a wait for the device on a GPU), and kept for the
others. **Traced** (torch.compile), no value may decide the graph, so the plan is decided
by shapes: a call with no 2D mask, the plain causal mask and the dynamic cache is padded
(the ids, when the pattern needs them, must then be the slots: checked inside an operator);
a call with a 2D mask or anything else is dense. A backend that takes no ``attn_mask``
("structured", "triton") runs the padded plan or refuses, saying why; traced, its value
checks (holes, positions) run inside operators (``sparse_transformer::hf_refuse``, as
``fast.backends.host_checks`` does), so they raise eager's errors and break no graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._library.effects import EffectType
from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

# what a refusal allows where a backend without attn_mask cannot serve a call
ALLOWED_DENSE = "backend 'auto' or 'naive', which take any mask"


@dataclass(eq=False)
class ModelMask:
    """The mask of one forward pass as transformers describes it, unevaluated.

    name: the registration; batch, q_length, kv_length: the call's sizes; q_offset,
    kv_offset: the slots of the first query and the first key (a tensor for q_offset from
    a static cache); mask_function: transformers' (batch, head, q_slot, kv_slot) -> bool;
    padding: the 2D mask (B, >= kv_offset + kv_length), bool, or None; plain: the mask is
    causal by slot and the padding, nothing else; given: a 4D mask given to the model, as
    bool (then the rest describes its sizes only)."""

    name: str
    batch: int
    q_length: int
    kv_length: int
    q_offset: int | torch.Tensor
    kv_offset: int
    mask_function: Callable | None
    padding: torch.Tensor | None
    local_size: int | None
    plain: bool
    use_vmap: bool = False
    device: torch.device | str = "cpu"
    given: torch.Tensor | None = None
    _plans: list = field(default_factory=list, repr=False)   # (position_ids, segments, plan)

    # generate() builds the mask of a step with a static cache ahead of the forward pass
    # (create_masks_for_generate), makes it contiguous and hands it to the model as its
    # attention_mask, whose mask function then gets it back: it is a 4D mask to both
    @property
    def shape(self) -> tuple:
        return (self.batch, 1, self.q_length, self.kv_length)

    @property
    def ndim(self) -> int:
        return 4

    def dim(self) -> int:
        return 4

    def contiguous(self) -> ModelMask:
        return self

    def dense(self) -> torch.Tensor:
        """M: what the model lets each query read, bool (B or 1, 1, n_q, n_k) -- sdpa's
        mask, built by transformers' own ``sdpa_mask`` from the same arguments."""
        if self.given is not None:
            return self.given
        return sdpa_mask(batch_size=self.batch, q_length=self.q_length,
                         kv_length=self.kv_length, q_offset=self.q_offset,
                         kv_offset=self.kv_offset, mask_function=self.mask_function,
                         attention_mask=self.padding, local_size=self.local_size,
                         allow_is_causal_skip=False, use_vmap=self.use_vmap,
                         device=self.device)


@dataclass(frozen=True)
class Padded:
    """The fast path: keys [0, n_keys), sequence b holding ``lengths[b]`` tokens after
    ``offsets[b]`` pads (``sparse_attention``'s arguments; None: no such padding)."""

    n_keys: int
    lengths: torch.Tensor | None
    offsets: torch.Tensor | None


@dataclass(frozen=True)
class Dense:
    """Any mask: ``allowed`` M, bool (B or 1, 1, n_q, n_k); the positions of the queries
    (B, n_q) and of the keys (B, n_k) at which the pattern is read (None: the pattern
    needs none); n: the pattern's sequence length (``position_masks``' n)."""

    allowed: torch.Tensor
    q_pos: torch.Tensor | None
    k_pos: torch.Tensor | None
    n: int


def mask_function(name: str):
    """The function registered in ``transformers.AttentionMaskInterface`` under ``name``."""
    def sparse_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0,
                    kv_offset: int = 0, mask_function: Callable = causal_mask_function,
                    attention_mask: torch.Tensor | None = None, local_size=None,
                    allow_is_causal_skip: bool = True, use_vmap: bool = False,
                    device="cpu", **kwargs) -> ModelMask:
        """transformers' mask interface (``masking_utils.sdpa_mask``'s arguments); the
        rest of its keywords (dtype, config, ...) say how to build a dense mask, which is
        built only if the attention needs it (``ModelMask.dense``)."""
        if isinstance(attention_mask, ModelMask):        # made ahead by generate(): as is
            if attention_mask.shape != (batch_size, 1, q_length, kv_length):
                raise ValueError(f"attention implementation {name!r}: a mask made for "
                                 f"{attention_mask.shape} is given to a call of "
                                 f"{(batch_size, 1, q_length, kv_length)} (batch, 1, queries, "
                                 f"keys)")
            return attention_mask
        if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                           or attention_mask.dim() != 2
                                           or attention_mask.shape[0] != batch_size):
            got = (tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor)
                   else type(attention_mask).__name__)
            raise ValueError(f"attention implementation {name!r} takes a 2D padding mask of "
                             f"shape (batch, keys) with batch {batch_size} (1 = token, 0 = "
                             f"pad); got {got}")
        if isinstance(q_offset, torch.Tensor):
            # a static cache's counter, which each layer's cache update moves on in place
            # before its attention runs: the value now is this pass's
            q_offset = q_offset.clone()
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is not None:
            padding = padding.to(device=device, dtype=torch.bool)
        # a sliding window or chunk no wider than the keys of the call cannot matter; an
        # overlay or packing makes transformers pass allow_is_causal_skip=False
        plain = mask_function is causal_mask_function or (
            local_size is not None and allow_is_causal_skip and kv_length < local_size)
        return ModelMask(name, batch_size, q_length, kv_length, q_offset, int(kv_offset),
                         mask_function, padding, local_size, plain, use_vmap, device)

    return sparse_mask


def given_mask(name: str, mask, q: torch.Tensor, k: torch.Tensor, where: str) -> ModelMask:
    """A 4D mask given to the model (transformers hands it over as it is) as a
    ``ModelMask``: bool, or additive (0 may read; the dtype's minimum or -inf may not),
    broadcastable to (B, H, n_q, n_k); queries aligned to the end of the keys."""
    B, H, n_q, _ = q.shape
    n_k = k.shape[2]
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{where}: the attention mask must come from the mask function "
                         f"registered with it, or be a 4D mask given to the model; got "
                         f"{mask!r} -- a model that does not build its mask through "
                         f"transformers' mask interface. Allowed: attention_mask of shape "
                         f"(batch, keys), (batch, 1, queries, keys), or none")
    shape = tuple(mask.shape)
    fits = (mask.dim() == 4 and mask.shape[-2:] == (n_q, n_k) and mask.shape[0] in (1, B)
            and mask.shape[1] in (1, H))
    if not fits:
        raise ValueError(f"{where}: a mask given to the model must be 4D, broadcastable to "
                         f"(batch, heads, queries, keys) = {(B, H, n_q, n_k)}; got a tensor "
                         f"of shape {shape}. Allowed: a 2D padding mask (batch, keys), or "
                         f"a 4D one of that shape")
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        allowed = mask == 0
        blocked = mask <= torch.finfo(mask.dtype).min / 2                # -inf included
        refuse(~(allowed | blocked), [mask],
               f"{where}: an additive 4D mask must hold 0 (may read) or the dtype's "
               f"minimum / -inf (may not); entry {{index}} is {{values[0]}}, a bias, which "
               f"sparse attention does not add. Allowed: a boolean mask, or 0 and the "
               f"minimum")
    else:
        raise ValueError(f"{where}: a 4D mask must be boolean (True = may read) or "
                         f"additive (floating point); got {mask.dtype}")
    return ModelMask(name, B, n_q, n_k, n_k - n_q, 0, None, None, None, False,
                     device=q.device, given=allowed.to(q.device))


# ---------------------------------------------------------------------------------------
# The plan of one call
# ---------------------------------------------------------------------------------------

# the keywords a plan reads: the positions, and packed sequences (``segments``)
PLAN_KEYWORDS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")


def plan(mask: ModelMask, kwargs: dict, *, positional: bool, dense_ok: bool, backend: str,
         where: str) -> Padded | Dense:
    """The plan of this call (module docstring), made once per forward pass eagerly (the
    layers of a pass get the same mask and the same keyword tensors).

    kwargs: the attention's keywords (``PLAN_KEYWORDS`` are read); positional: the
    pattern reads positions (all but "full"); dense_ok: the backend takes ``attn_mask``."""
    traced = torch.compiler.is_compiling()
    given = tuple(kwargs.get(key) for key in PLAN_KEYWORDS)
    if not traced:
        for seen, done in mask._plans:
            if all(a is b for a, b in zip(seen, given)):
                return done
        if isinstance(mask.q_offset, torch.Tensor):      # a static cache's: read once
            mask.q_offset = int(mask.q_offset)
    packed = segments(kwargs, mask.batch, mask.q_length, mask.kv_length, mask.device, where)
    pos = _query_positions(mask, kwargs.get("position_ids"), where) if positional else None
    padded, why = _padded(mask, pos, packed, positional, traced, dense_ok, backend, where)
    if padded is None:
        if not dense_ok:
            raise ValueError(f"{where}: backend {backend!r} runs padding before or after "
                             f"each sequence only, and this call needs the general path: "
                             f"{why}. Allowed: {ALLOWED_DENSE}")
        padded = _dense(mask, pos, packed, positional, traced, where)
    if not traced:
        mask._plans.append((given, padded))
    return padded


def _query_positions(mask: ModelMask, position_ids, where: str) -> torch.Tensor | None:
    """The model's position ids of the queries as (B, n_q) int64, or None if not given."""
    if position_ids is None:
        return None
    B, n_q = mask.batch, mask.q_length
    if (not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2
            or position_ids.shape[0] not in (1, B) or position_ids.shape[1] != n_q
            or position_ids.is_floating_point() or position_ids.dtype == torch.bool):
        raise ValueError(f"{where}: the pattern reads one position per token: position_ids "
                         f"must be integers of shape (batch or 1, {n_q}); got "
                         f"{_short(position_ids)}")
    return position_ids.to(torch.long).expand(B, n_q)


def _padded(mask: ModelMask, pos, segments, positional: bool, traced: bool, dense_ok: bool,
            backend: str, where: str):
    """(Padded, None) when the fast path computes this call exactly, else (None, why)."""
    if mask.given is not None:
        return None, "a 4D mask was given to the model"
    if not mask.plain:
        return None, (f"the model's mask is not the plain causal one (a sliding window of "
                      f"{mask.local_size} that can matter here, chunks, packed sequences "
                      f"or an overlay)" if mask.local_size is not None else
                      "the model's mask is not the plain causal one (packed sequences or "
                      "an overlay)")
    if segments is not None:
        return None, "packed sequences (cu_seq_lens / seq_idx)"
    if mask.kv_offset != 0:
        return None, f"the cache dropped its first {mask.kv_offset} keys (a sliding window)"
    if isinstance(mask.q_offset, torch.Tensor) and traced:
        return None, "a static cache, traced (its query offset is a tensor)"
    n_q, n_k = mask.q_length, mask.kv_length
    end = int(mask.q_offset) + n_q                   # keys after it: a static cache's empty
    if end > n_k:
        raise ValueError(f"{where}: {n_q} queries from slot {int(mask.q_offset)} against "
                         f"{n_k} keys: the keys must include the queries")
    padding = None if mask.padding is None else mask.padding[:, :end]    # (B, end)
    q_slots = torch.arange(end - n_q, end, device=mask.device)           # (n_q,)
    if traced:
        if padding is not None and dense_ok:
            return None, "a padding mask, traced"    # holes cannot be ruled out: exact path
        if padding is None:
            count = first = None
        else:
            count, first, holes = _runs(padding)
            refuse(holes[:, None] & padding, [],
                   f"{where}: backend {backend!r} runs padding before or after each "
                   f"sequence only, and row {{index[0]}} of the mask has pads between "
                   f"tokens. Allowed: {ALLOWED_DENSE}")
        if pos is not None:
            want = q_slots[None, :] if first is None else q_slots[None, :] - first[:, None]
            real = None if padding is None else padding[:, end - n_q:]
            wrong = (pos != want) if real is None else (pos != want) & real
            how = ("a compiled call with no padding mask runs the padded path" if dense_ok
                   else f"backend {backend!r} runs the padded path")
            other = ("an attention_mask (the general path)" if dense_ok else ALLOWED_DENSE)
            refuse(wrong, [pos, want.expand_as(pos)],
                   f"{where}: position_ids[{{index[0]}}, {{index[1]}}] = {{values[0]}}, but "
                   f"{how}, which puts that token at position {{values[1]}} (counted from "
                   f"its sequence's first token). Allowed: those position ids, or {other}")
        return Padded(end, count, first), None
    m = None if padding is None else padding.detach().to("cpu")
    first = None
    if m is not None:
        count, first, holes = _runs(m)                                  # (B,) each
        if bool(holes.any()):
            b = int(holes.nonzero()[0, 0])
            return None, f"row {b} of the mask, {m[b].int().tolist()}, has pads between tokens"
        if not positional and dense_ok:     # sdpa's pad queries after a token read it
            late = ~m[:, end - n_q:] & (q_slots.to("cpu")[None, :] > first[:, None])
            if bool(late.any()):
                return None, "a pad after a token is a query, which reads the tokens before it"
    if pos is not None:
        slots = q_slots.to("cpu")
        want = slots[None, :] if first is None else slots[None, :] - first[:, None]  # (B, n_q)
        got = pos.detach().to("cpu")
        wrong = got != want
        if m is not None:
            wrong &= m[:, end - n_q:]
        if bool(wrong.any()):
            b, i = (int(x) for x in wrong.nonzero()[0])
            return None, (f"position_ids[{b}, {i}] = {int(got[b, i])}, where the padded run "
                          f"puts position {int(want.expand_as(got)[b, i])} (positions counted "
                          f"from each sequence's first token)")
    if m is None:
        return Padded(end, None, None), None
    move = lambda t: t.to(mask.device)
    offsets = move(first) if bool((first > 0).any()) else None
    lengths = move(count) if bool((first + count < end).any()) else None
    return Padded(end, lengths, offsets), None


def _runs(m: torch.Tensor):
    """(count, first, holes), each (B,), of a bool padding mask m (B, n): the tokens of each
    row, where its first one is (n if none), and whether its tokens are not one run."""
    n = m.shape[1]
    count = m.sum(1)                                                    # (B,)
    first = torch.where(count > 0, m.to(torch.int8).argmax(1), n)       # (B,)
    index = torch.arange(n, device=m.device)
    run = (index >= first[:, None]) & (index < (first + count)[:, None])  # (B, n)
    return count, first, (run != m).any(1)


def _dense(mask: ModelMask, pos, segments, positional: bool, traced: bool,
           where: str) -> Dense:
    """M, the model's own mask, and the positions the pattern is read at."""
    allowed = mask.dense()                                              # (B|1, 1, n_q, n_k)
    n_q, n_k = mask.q_length, mask.kv_length
    q_slots = torch.arange(n_q, device=allowed.device) + mask.q_offset   # (n_q,)
    k_slots = torch.arange(n_k, device=allowed.device) + mask.kv_offset  # (n_k,)
    if not mask.plain:
        later = k_slots[None, :] > q_slots[:, None]                     # (n_q, n_k)
        refuse(allowed & later, [],
               f"{where}: the model's mask lets query {{index[2]}} read a later key "
               f"({{index[3]}}) -- bidirectional attention or an overlay (image tokens "
               f"reading each other) -- but every sparse pattern is causal (row i reads j "
               f"<= i). Allowed: causal masks (padding, sliding windows, packed sequences)",
               eager=not traced)
    if segments is not None:
        q_seg, k_seg = segments                                          # (B, n_q), (B, n_k)
        allowed = allowed & (q_seg[:, None, :, None] == k_seg[:, None, None, :])
    n = n_k + mask.kv_offset
    if not positional:
        return Dense(allowed, None, None, n)
    real = None if mask.padding is None else mask.padding[:, q_slots]   # (B, n_q)
    if real is not None:                  # a pad has no position: its query reads nothing
        allowed = allowed & real[:, None, :, None]
    return Dense(allowed, *_positions(mask, pos, real, q_slots, k_slots), n)


def _positions(mask: ModelMask, pos, real, q_slots, k_slots):
    """(query positions (B, n_q), key positions (B, n_k)) at which the pattern is read;
    pos: the model's ids of the queries, or None (then the count of real tokens before
    each); real: which queries are tokens (B, n_q), or None (all). A cached key's id is
    not passed again, so it is taken as ``generate()`` numbers tokens (module docstring):
    the keys of the run of tokens that holds the first real query (after the last pad
    before it) count back from that query's id, one per slot; the tokens before that run
    are numbered by the count of real tokens before each. Tensor operations only: the
    same eagerly and traced."""
    B, n_q = mask.batch, mask.q_length
    padding = mask.padding
    first = torch.zeros(B, 1, dtype=torch.long, device=q_slots.device)  # the anchor query
    if padding is None:
        counted = k_slots[None, :]                                         # (1, n_k)
        last_pad = torch.full((B,), -1, device=k_slots.device)
    else:
        counts = (padding.long().cumsum(-1) - 1).clamp(min=0)              # (B, width)
        counted = counts[:, k_slots]                                        # (B, n_k)
        first = real.to(torch.int8).argmax(1, keepdim=True)                # (B, 1)
        index = torch.arange(padding.shape[1], device=padding.device)      # (width,)
        pads = ~padding & (index[None, :] < q_slots[first])                # (B, width)
        last_pad = torch.where(pads, index, -1).amax(1)                     # (B,)
    if pos is None:                                  # no ids: the count of real tokens
        pos = (q_slots[None, :] if padding is None else counts[:, q_slots]).expand(B, n_q)
    back = pos.gather(1, first) - (q_slots[first] - k_slots[None, :])     # (B, n_k)
    k_pos = torch.where(k_slots[None, :] > last_pad[:, None], back, counted)
    own = k_slots - q_slots[0]                              # a key that is a query: its id
    is_query = (own >= 0) & (own < n_q)                                      # (n_k,)
    k_pos = torch.where(is_query[None, :], pos.gather(1, own.clamp(0, n_q - 1)
                                                      .expand(B, -1)), k_pos)
    return pos, k_pos                                                        # (B, n_k)


def segments(kwargs: dict, B: int, n_q: int, n_k: int, device, where: str):
    """Packed sequences given by flash attention's keywords, as (query ids (B, n_q), key ids
    (B, n_k)) -- a query reads only keys of its own sequence -- or None.

    ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (cumulative lengths, one batch row of packed
    tokens) or ``seq_idx`` (B, n) (a sequence number per token), for self-attention over
    the packed tokens (n_q = n_k)."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    seq_idx = kwargs.get("seq_idx")
    if cu_q is None and cu_k is None and seq_idx is None:
        return None
    if n_q != n_k:
        raise ValueError(f"{where}: packed sequences (cu_seq_lens / seq_idx) are taken for "
                         f"self-attention over the packed tokens; got {n_q} queries against "
                         f"{n_k} keys (a cache). Allowed: no cache with packed sequences")
    if seq_idx is not None:
        if (not isinstance(seq_idx, torch.Tensor) or seq_idx.dim() != 2
                or seq_idx.shape[1] != n_q or seq_idx.shape[0] not in (1, B)):
            raise ValueError(f"{where}: seq_idx must have shape (batch or 1, {n_q}); got "
                             f"{_short(seq_idx)}")
        ids = seq_idx.to(device=device, dtype=torch.long).expand(B, n_q)
        return ids, ids
    shapes = (isinstance(cu_q, torch.Tensor) and isinstance(cu_k, torch.Tensor) and B == 1
              and cu_q.dim() == 1 and cu_q.shape == cu_k.shape)
    # traced, the values are not read (a graph cannot branch on them)
    if not shapes or not (torch.compiler.is_compiling() or (
            bool((cu_q == cu_k).all()) and int(cu_q[0]) == 0 and int(cu_q[-1]) == n_q)):
        raise ValueError(f"{where}: cu_seq_lens_q and cu_seq_lens_k must be the same "
                         f"cumulative lengths (0, ..., {n_q}) of the sequences packed in one "
                         f"batch row; got {_short(cu_q)} and {_short(cu_k)} with batch {B}")
    index = torch.arange(n_q, device=device)
    ids = torch.searchsorted(cu_q.to(device)[1:].contiguous(), index, right=True)[None, :]
    return ids, ids


def _short(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) \
        else repr(value)


# ---------------------------------------------------------------------------------------
# Refusals that read values: on the host eagerly, inside one operator when traced
# ---------------------------------------------------------------------------------------

def _refuse(bad: torch.Tensor, shown: list[torch.Tensor], message: str) -> None:
    """Raise ValueError(message) where any entry of ``bad`` is True; the message is
    formatted with ``index`` (the first such entry's index) and ``values`` (the entries
    of ``shown``, each broadcast to bad's shape, there)."""
    if bool(bad.any()):
        index = tuple(int(x) for x in bad.nonzero()[0])
        values = [t.expand_as(bad)[index].item() for t in shown]
        raise ValueError(message.format(index=index, values=values))


@torch.library.custom_op("sparse_transformer::hf_refuse", mutates_args=())
def refuse_op(bad: torch.Tensor, shown: list[torch.Tensor], message: str) -> None:
    """``_refuse`` as one operator, kept in a compiled graph where it stands (its host
    read breaks no graph; ``fast.backends.host_checks`` explains the pattern)."""
    _refuse(bad, shown, message)


@refuse_op.register_fake
def _(bad, shown, message):
    return None


refuse_op.register_effect(EffectType.ORDERED)


def refuse(bad: torch.Tensor, shown: list[torch.Tensor], message: str, *,
           eager: bool | None = None) -> None:
    """``_refuse`` eagerly, its operator when traced (``eager``: None = as the call runs)."""
    if eager is None:
        eager = not torch.compiler.is_compiling()
    (_refuse if eager else refuse_op)(bad, shown, message)
