"""Sparse attention in Hugging Face transformers models: ``attn_implementation="NAME"``.

Child et al., 2019, section 4 (eq. 2-4: output i attends over the set S_i of a
pattern) and section 4.3 (the strided and fixed patterns): a transformers model's
causal self-attention reads a pattern's positions through ``fast.sparse_attention``,
with no change to the model's code::

    from fast.integrations import hf
    name = hf.register("sparse_strided", "strided", stride=8)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)
    # or, on a model already built: model.set_attn_implementation(name)

``register`` puts two functions under one name: the attention function
(``transformers.AttentionInterface``), which the model's attention modules call with
q (B, H, n_q, d) and k, v (B, Hkv, n_k, d) and which returns (B, n_q, H, d) and no
weights, as ``sdpa_attention_forward`` does; and its mask function
(``transformers.AttentionMaskInterface``), which the model calls once per forward
pass in place of building a dense mask. Without a registered mask function
transformers hands a custom attention ``attention_mask=None`` and a padded batch
would be computed as if it were not padded; so the attention function takes only
what its own mask function made (a ``Padding``) and refuses anything else.

Decisions:

* **Padding becomes lengths and offsets.** The model's 2D mask (B, n_k) -- 1 for a
  token, 0 for a pad -- is read on the host once per forward pass (a wait for the
  device on a GPU) and must hold one run of tokens per row: right padding (pads
  after) becomes ``lengths=``, left padding (pads before, as ``generate()`` pads a
  batch of prompts) ``offsets=`` (``fast.backends.padding``). A row with pads inside
  it is refused: it has no reading as a sequence of positions.
* **torch.compile**: a model on the adapter compiles whole (``fullgraph=True``). When
  traced, the mask becomes both lengths and offsets whatever it holds (a graph cannot
  branch on values; padding nothing changes no number), and the two checks that read
  values on the host -- holes in the mask, position ids against the pattern's -- run
  inside operators (``sparse_transformer::hf_refuse_holes``, ``::hf_refuse_positions``,
  as ``fast.backends.host_checks`` does), so they raise eager's errors and break no
  graph.
* **Positions start at each sequence's first token.** The patterns are made of
  positions (row i reads j with (i - j) mod l == 0, ...), so under left padding the
  first real token of each row is position 0 for the pattern, as it is for the
  position ids ``generate()`` computes (``attention_mask.cumsum(-1) - 1``): a
  left-padded row reads what it reads unpadded. When the model passes
  ``position_ids`` the adapter checks once per forward pass that, on the real
  tokens, they are these positions, and raises otherwise (a model's own position
  embedding and its attention pattern would disagree): in a forward call on a
  left-padded batch, pass ``position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0)``.
* **The cache**: transformers' dynamic cache hands the attention every key so far and
  the new queries (n_q < n_k), queries aligned to the end; ``sparse_attention`` takes
  that as it is (a one-query step reads only the keys its row allows). A cache whose
  keys do not end at the last query (a static cache's empty slots, a sliding-window
  cache) is refused.
* **Grouped-query attention**: k and v keep their Hkv heads (``enable_gqa``): nothing
  is repeated. **scaling** is the scale. **dropout** (the model's attention dropout
  in training mode) is ``dropout_p``: exact on the naive backend, which "auto" takes
  when dropout is on; a backend without dropout raises, naming it.
* **Interleaved heads** (sec. 5.1, combine="interleaved"): the layer is the module's
  ``layer_idx``.
* **Refused, by name**: non-causal attention (``is_causal=False``: encoders,
  cross-attention), a mask other than the plain causal one (sliding windows, chunked
  attention, packed sequences, image-token overlays: refused by the attention of a
  layer that receives it, since many models build every mask their config names
  whether or not a layer uses it -- a ``Refusal``), a 4D ``attention_mask`` given to
  the model, keys of another length than the mask function was told (cross-attention),
  ``output_attentions`` (asked for in the call or in the model's config), and the
  extras of other attention functions (``sliding_window``, ``softcap``, attention
  sinks ``s_aux``, ``position_bias``, a paged ``cache``); any other keyword with a
  value is refused rather than ignored. So are names that transformers reads as its
  own (a ``paged|`` prefix, a Hub kernel ``org/repo``, any name containing ``flash``):
  under them the pattern would never run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch._library.effects import EffectType

try:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import causal_mask_function
except ModuleNotFoundError as err:                         # pragma: no cover - optional
    raise ImportError("fast.integrations.hf needs the optional dependency transformers: "
                      "pip install -e .[hf]") from err

from fast.attention import BACKENDS, sparse_attention
from fast.backends.padding import inside
from reference.params import COMBINES, MAX_INT, check_params

# The keywords a transformers model passes that do not change attention here.
HARMLESS = ("use_cache", "cache_position", "output_hidden_states", "return_dict")
# What other attention functions take and this one cannot honour.
REFUSED = {
    "sliding_window": "a sliding window is a pattern of its own; register the sparse "
                      "pattern on a model without one",
    "softcap": "attention logit soft-capping is not computed by sparse_attention",
    "s_aux": "attention sinks are not computed by sparse_attention",
    "sinks": "attention sinks are not computed by sparse_attention",
    "position_bias": "an additive position bias is not computed by sparse_attention",
    "cache": "a paged cache (continuous batching) is not served; use generate()'s "
             "dynamic cache",
    "head_mask": "a head mask is not applied by sparse_attention",
}

_SPECS: dict[str, dict] = {}        # name -> what register() was given for it


@dataclass(frozen=True, eq=False)
class Padding:
    """What the mask function hands the attention function for one forward pass.

    name: the registration that made it; q_length, kv_length: the queries and keys the
    attention will see; lengths, offsets: (B,) int64 on the model's device, or None --
    sequence b holds ``lengths[b]`` tokens after ``offsets[b]`` pads (``sparse_attention``'s
    arguments, ``fast.backends.padding``); both None: no padding."""

    name: str
    q_length: int
    kv_length: int
    lengths: torch.Tensor | None
    offsets: torch.Tensor | None
    _checked: list = field(default_factory=list, repr=False)    # position_ids seen


@dataclass(frozen=True)
class Refusal:
    """What the mask function hands on for a mask the attention cannot serve (a sliding
    window, a chunked or bidirectional mask): many models build every kind of mask
    their config names, whether or not a layer uses it, so the refusal is raised by the
    attention of a layer that receives it, not when the mask is made."""

    message: str


def register(name: str, pattern: str, *, combine: str = "merged", backend: str = "auto",
             **params) -> str:
    """Register ``pattern`` with transformers under ``name`` and return ``name``.

    pattern and params: as ``fast.sparse_attention`` takes them ("full"; "strided",
    stride=; "fixed", stride=, c=; the neighbours "longformer", "bigbird"); combine:
    "merged" | "multihead" | "interleaved" (sec. 5.1; interleaved takes the layer from
    the module's ``layer_idx``); backend: ``sparse_attention``'s. Then
    ``attn_implementation=name`` in ``from_config`` / ``from_pretrained``, or
    ``model.set_attn_implementation(name)``.

    Registering a name again with the same arguments does nothing; with other
    arguments, or a name transformers already uses ("sdpa", "eager", ...), raises a
    ValueError (nothing is overwritten)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if any(ch in name for ch in "|/:@") or "flash" in name:
        raise ValueError(f"name {name!r} would not reach this attention: transformers reads "
                         f"a 'paged|' prefix, a Hub kernel 'org/repo[@rev][:fn]' and any name "
                         f"containing 'flash' as implementations of its own. Allowed: a "
                         f"name without '|', '/', ':', '@' or 'flash', e.g. 'sparse_strided'")
    if not isinstance(combine, str) or combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if "layer" in params:
        raise ValueError("layer is not a parameter here: each attention module's layer_idx "
                         "is its layer (it matters for combine='interleaved' only)")
    # the pattern and the values of its parameters, checked now (c against the number of
    # heads, and n, are checked at each call by sparse_attention)
    check_params(pattern, MAX_INT, 1, "merged", 0, params)
    spec = dict(pattern=pattern, combine=combine, backend=backend, params=dict(params))
    if name in _SPECS:
        if _SPECS[name] != spec:
            raise ValueError(f"attention implementation {name!r} is registered already, as "
                             f"{_describe(_SPECS[name])}; got {_describe(spec)}. Allowed: "
                             f"the same arguments, or another name")
        return name
    taken = set(AttentionInterface._global_mapping) | set(AttentionMaskInterface._global_mapping)
    if name in taken | {"eager"}:
        raise ValueError(f"name {name!r} is taken in transformers' attention interface "
                         f"(by transformers itself, or by a registration made outside "
                         f"fast.integrations.hf); taken: {sorted(taken | {'eager'})}. "
                         f"Allowed: another name")
    AttentionInterface.register(name, _attention_function(name, spec))
    AttentionMaskInterface.register(name, _mask_function(name))
    _SPECS[name] = spec
    return name


def _describe(spec: dict) -> str:
    params = ", ".join(f"{k}={v!r}" for k, v in spec["params"].items())
    return (f"pattern={spec['pattern']!r}{', ' + params if params else ''}, "
            f"combine={spec['combine']!r}, backend={spec['backend']!r}")


# ---------------------------------------------------------------------------------------
# The mask function: the model's 2D padding mask -> lengths and offsets
# ---------------------------------------------------------------------------------------

def _mask_function(name: str):
    def sparse_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0,
                    kv_offset: int = 0, mask_function=causal_mask_function,
                    attention_mask: torch.Tensor | None = None, local_size=None,
                    device="cpu", **kwargs) -> Padding:
        """transformers' mask interface (``masking_utils.sdpa_mask``'s arguments); the
        rest of its keywords (dtype, config, allow_is_causal_skip, use_vmap, ...) say how
        to build a dense mask, which is not built here."""
        if mask_function is not causal_mask_function or local_size is not None:
            what = getattr(mask_function, "__qualname__", repr(mask_function))
            return Refusal(
                f"it serves causal self-attention with a padding mask only; the model "
                f"asked for the mask {what!r}"
                f"{f' with local_size={local_size}' if local_size is not None else ''} (a "
                f"bidirectional, sliding-window or chunked mask, packed sequences, or an "
                f"overlay). Allowed: the plain causal mask (causal_mask_function)")
        q_offset = int(q_offset)
        if kv_offset != 0 or q_offset + q_length != kv_length:
            raise ValueError(
                f"attention implementation {name!r} needs the keys to be positions "
                f"0..n_k-1 with the queries at their end; got queries at positions "
                f"{q_offset}..{q_offset + q_length - 1} against {kv_length} keys from "
                f"position {kv_offset} (a static or sliding-window cache). Allowed: no "
                f"cache, or transformers' dynamic cache (generate()'s default)")
        lengths, offsets = _padding(name, attention_mask, batch_size, kv_length)
        move = lambda t: None if t is None else t.to(device)
        return Padding(name, q_length, kv_length, move(lengths), move(offsets))

    return sparse_mask


def _padding(name: str, mask: torch.Tensor | None, B: int, n_k: int):
    """(lengths, offsets) of a 2D padding mask (B, n_k), each None when not needed."""
    if mask is None:
        return None, None
    if not isinstance(mask, torch.Tensor) or mask.shape != (B, n_k):
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention implementation {name!r} takes a 2D padding mask of "
                         f"shape (batch, keys) = ({B}, {n_k}) (1 = token, 0 = pad); got "
                         f"{got}")
    # traced, the holes are looked for inside an operator, where the host read breaks no
    # graph; eager, the mask is read on the host once per pass
    traced = torch.compiler.is_compiling()
    m = mask.detach().to(torch.bool) if traced else mask.detach().to("cpu", torch.bool)
    count, first, holes = _runs(m)                                      # (B,) each
    (refuse_holes if traced else _refuse_holes)(m, holes, name)
    if traced:      # no value may decide the graph: both kept (padding nothing is exact)
        return count, first
    offsets = first if bool((first > 0).any()) else None
    lengths = count if bool((first + count < n_k).any()) else None
    return lengths, offsets


def _runs(m: torch.Tensor):
    """(count, first, holes), each (B,), of a bool padding mask m (B, n_k): the tokens of
    each row, where its first one is (n_k if none), and whether its tokens are not one run."""
    n_k = m.shape[1]
    count = m.sum(1)                                                    # (B,)
    first = torch.where(count > 0, m.to(torch.int8).argmax(1), n_k)     # (B,)
    index = torch.arange(n_k, device=m.device)
    run = (index >= first[:, None]) & (index < (first + count)[:, None])  # (B, n_k)
    return count, first, (run != m).any(1)


def _refuse_holes(m: torch.Tensor, holes: torch.Tensor, name: str) -> None:
    if bool(holes.any()):
        b = int(holes.nonzero()[0, 0])
        raise ValueError(f"attention implementation {name!r} takes padding before or "
                         f"after each sequence (one run of 1s per row of the mask); row "
                         f"{b} is {m[b].int().tolist()}, with pads between tokens")


@torch.library.custom_op("sparse_transformer::hf_refuse_holes", mutates_args=())
def refuse_holes(m: torch.Tensor, holes: torch.Tensor, name: str) -> None:
    """``_refuse_holes`` as one operator, kept in a compiled graph where it stands (its
    host read breaks no graph; ``fast.backends.host_checks`` explains the pattern)."""
    _refuse_holes(m, holes, name)


@refuse_holes.register_fake
def _(m, holes, name):
    return None


refuse_holes.register_effect(EffectType.ORDERED)


# ---------------------------------------------------------------------------------------
# The attention function
# ---------------------------------------------------------------------------------------

def _attention_function(name: str, spec: dict):
    pattern, combine, backend, params = (spec["pattern"], spec["combine"], spec["backend"],
                                         spec["params"])

    def sparse_attention_forward(module: torch.nn.Module, query: torch.Tensor,
                                 key: torch.Tensor, value: torch.Tensor, attention_mask,
                                 dropout: float = 0.0, scaling: float | None = None,
                                 is_causal: bool | None = None, **kwargs):
        """q (B, H, n_q, d), k, v (B, Hkv, n_k, d) -> ((B, n_q, H, d), None)."""
        where = f"attention implementation {name!r} in {type(module).__name__}"
        causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        if causal is not True:
            raise ValueError(f"{where}: every pattern is causal (row i reads j <= i); got "
                             f"is_causal={causal!r} (an encoder or cross-attention). "
                             f"Allowed: causal self-attention")
        _check_kwargs(where, kwargs)
        _check_output_attentions(where, module, kwargs)
        if isinstance(attention_mask, Refusal):
            raise ValueError(f"{where}: {attention_mask.message}")
        if not isinstance(attention_mask, Padding):
            got = (f"a tensor of shape {tuple(attention_mask.shape)}"
                   if isinstance(attention_mask, torch.Tensor) else repr(attention_mask))
            raise ValueError(f"{where}: the attention mask must come from the mask function "
                             f"registered with it (the model's 2D padding mask, read as "
                             f"lengths and offsets); got {got} -- a 4D mask given to the "
                             f"model, or a model that does not build its mask through "
                             f"transformers' mask interface. Allowed: attention_mask of "
                             f"shape (batch, keys), or none")
        if (query.shape[2], key.shape[2]) != (attention_mask.q_length,
                                              attention_mask.kv_length):
            raise ValueError(f"{where}: {query.shape[2]} queries against {key.shape[2]} "
                             f"keys, but the mask was made for {attention_mask.q_length} "
                             f"queries against {attention_mask.kv_length} keys (cross-"
                             f"attention, or keys from elsewhere). Allowed: self-attention")
        if dropout and backend not in ("auto", "naive"):
            raise ValueError(f"{where}: the model asks for attention dropout {dropout} (its "
                             f"config's attention dropout, in training mode); backend "
                             f"{backend!r} has none. Allowed: backend 'auto' or 'naive', "
                             f"model.eval(), or an attention dropout of 0 in the config")
        layer = 0
        if combine == "interleaved":
            layer = getattr(module, "layer_idx", None)
            if not isinstance(layer, int) or isinstance(layer, bool):
                raise ValueError(f"{where}: combine='interleaved' takes the layer from the "
                                 f"module's layer_idx, which is {layer!r}. Allowed: an "
                                 f"attention module with an integer layer_idx")
        _check_positions(where, kwargs.get("position_ids"), attention_mask)
        out = sparse_attention(query, key, value, pattern, combine=combine, layer=layer,
                               scale=scaling, lengths=attention_mask.lengths,
                               offsets=attention_mask.offsets, dropout_p=float(dropout),
                               enable_gqa=key.shape[1] != query.shape[1], backend=backend,
                               **params)                                 # (B, H, n_q, d)
        return out.transpose(1, 2).contiguous(), None                   # (B, n_q, H, d)

    return sparse_attention_forward


def _check_kwargs(where: str, kwargs: dict) -> None:
    """Refuse what this attention cannot honour; a keyword it does not know is refused too
    when it carries a value (None and False say nothing)."""
    for key, value in kwargs.items():
        if key in HARMLESS or key == "position_ids" or value is None or value is False:
            continue
        if key == "output_attentions":
            continue                                      # _check_output_attentions
        why = REFUSED.get(key, "it is not an argument of sparse attention, and is not "
                               "ignored")
        raise ValueError(f"{where}: got {key}={_short(value)}: {why}")


def _check_output_attentions(where: str, module, kwargs: dict) -> None:
    """Refuse output_attentions=True, asked for as transformers reads it: the keyword of
    the call, else the model's config (``from_pretrained(..., output_attentions=True)``),
    whose weights would otherwise come back as an empty tuple."""
    asked = kwargs.get("output_attentions")
    if asked is None:
        asked = getattr(getattr(module, "config", None), "output_attentions", False)
    if asked:
        raise ValueError(f"{where}: output_attentions=True (in the call or the model's "
                         f"config), but sparse_attention returns no attention weights. "
                         f"Allowed: output_attentions=False, or attn_implementation='eager' "
                         f"to see weights")


def _short(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) \
        else repr(value)


def _check_positions(where: str, position_ids, padding: Padding) -> None:
    """The model's position ids agree with the pattern's positions on the real query
    tokens (module docstring); checked once per forward pass."""
    traced = torch.compiler.is_compiling()            # then every layer checks, in an op
    if position_ids is None or (not traced and any(p is position_ids
                                                   for p in padding._checked)):
        return
    per_row = padding.lengths if padding.lengths is not None else padding.offsets
    n_q, n_k = padding.q_length, padding.kv_length
    if (not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2
            or position_ids.shape[1] != n_q
            or (per_row is not None and position_ids.shape[0] not in (1, len(per_row)))):
        raise ValueError(f"{where}: position_ids must have shape (batch or 1, {n_q}) to be "
                         f"compared with the pattern's positions; got {_short(position_ids)}")
    index = torch.arange(n_k - n_q, n_k, device=position_ids.device)       # (n_q,)
    offsets = padding.offsets
    want = index if offsets is None else index[None, :] - offsets[:, None]  # (B or 1, n_q)
    wrong = position_ids != want                                            # (B or 1, n_q)
    real = inside(index, padding.lengths, offsets, n_k)                     # (B, n_q) | None
    if real is not None:
        wrong = wrong & real
    (refuse_positions if traced else _refuse_positions)(wrong, position_ids, want, where)
    if not traced:
        padding._checked.append(position_ids)


def _refuse_positions(wrong, position_ids, want, where: str) -> None:
    if bool(wrong.any()):
        b, i = (int(x) for x in wrong.nonzero()[0])
        given, pos = (int(t.expand_as(wrong)[b, i]) for t in (position_ids, want))
        raise ValueError(
            f"{where}: position_ids[{b}, {i}] = {given}, but the sparse pattern puts that "
            f"token at position {pos}: the pattern's positions start at each sequence's "
            f"first token (left padding shifts them, as generate() does; a model given "
            f"no position_ids numbers every row from its first slot, pads included). "
            f"Allowed: position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)")


@torch.library.custom_op("sparse_transformer::hf_refuse_positions", mutates_args=())
def refuse_positions(wrong: torch.Tensor, position_ids: torch.Tensor, want: torch.Tensor,
                     where: str) -> None:
    """``_refuse_positions`` as one operator, kept in a compiled graph where it stands."""
    _refuse_positions(wrong, position_ids, want, where)


@refuse_positions.register_fake
def _(wrong, position_ids, want, where):
    return None


refuse_positions.register_effect(EffectType.ORDERED)
