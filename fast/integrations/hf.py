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
(``transformers.AttentionMaskInterface``), which the model calls once per forward pass
in place of building a dense mask. It is a drop-in for ``attn_implementation="sdpa"``:
what sdpa serves, it serves -- with "full", the same attention -- or refuses by name.

Decisions:

* **The mask** (``fast.integrations.hf_masks``, which says it in full): head h's query i
  reads key j when the model's mask allows it (the mask sdpa would get: causal, padding
  with or without holes, a sliding window, packed sequences, a static cache's empty
  slots, a 4D mask given to the model) and the pattern's head h allows it at the
  positions of the two -- the model's position ids. A plain padding mask runs on every
  backend as lengths and offsets; any other runs as ``attn_mask`` on the naive backend
  ("auto" takes it; "structured" and "triton" refuse it, saying why).
* **The keywords** transformers passes to every attention call are read as sdpa reads
  them: those for the loss and for bookkeeping (``num_items_in_batch``, which
  ``Trainer`` adds to every step; ``shift_labels``; ``output_hidden_states``, ...:
  ``IGNORED``) change nothing; those that change attention are honoured
  (``position_ids``: the pattern's positions; ``sliding_window``: in the mask;
  ``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``seq_idx``: packed sequences, each reading
  only itself; ``scaling``; ``dropout``) or refused by name (``REFUSED``: soft-capping,
  attention sinks, an additive position bias, a head mask, a paged cache). A keyword
  it does not know is refused when it carries a value, never ignored.
* **output_attentions**, in the call or in the model's config, is answered as sdpa
  answers it in this transformers release: a warning, and no weights (the model's
  ``attentions`` come back empty); the weights of a sparse pattern are never formed.
* **Grouped-query attention**: k and v keep their Hkv heads (``enable_gqa``): nothing
  is repeated. **scaling** is the scale. **dropout** (the model's attention dropout
  in training mode) is ``dropout_p``: exact on the naive backend, which "auto" takes
  when dropout is on; a backend without dropout raises, naming it.
* **Interleaved heads** (sec. 5.1, combine="interleaved"): the layer is the module's
  ``layer_idx``.
* **torch.compile**: a model on the adapter compiles whole (``fullgraph=True``); the
  plan of a traced call is decided by shapes, and the checks that read values run
  inside operators (``hf_masks``).
* **Refused, by name**: non-causal attention (``is_causal=False``: encoders,
  cross-attention), a mask that lets a query read a later key, keys of another length
  than the mask was made for, and names that transformers reads as its own (a
  ``paged|`` prefix, a Hub kernel ``org/repo``, any name containing ``flash``): under
  them the pattern would never run.
"""

from __future__ import annotations

import warnings

import torch

try:
    from transformers import AttentionInterface, AttentionMaskInterface
except ModuleNotFoundError as err:                         # pragma: no cover - optional
    raise ImportError("fast.integrations.hf needs the optional dependency transformers: "
                      "pip install -e .[hf]") from err

from fast.attention import BACKENDS, sparse_attention
from fast.backends.masks import position_masks
from fast.integrations.hf_masks import (
    PLAN_KEYWORDS,
    Dense,
    ModelMask,
    given_mask,
    mask_function,
    plan,
)
from reference.params import COMBINES, MAX_INT, check_params

# What transformers passes down to attention for the loss and for bookkeeping: nothing
# here changes attention (sdpa ignores them too).
IGNORED = frozenset({
    "use_cache", "cache_position", "return_dict",
    "output_hidden_states", "output_router_logits",      # which outputs to collect
    "num_items_in_batch", "shift_labels", "ignore_index",   # the loss (Trainer's, ...)
    "max_length_q", "max_length_k",                      # sizes cu_seq_lens_* imply
})
# What changes attention and is honoured here: the plan's keywords (positions, packed
# sequences), the window (in the mask), output_attentions (warned, as sdpa warns).
HONOURED = frozenset({*PLAN_KEYWORDS, "sliding_window", "output_attentions"})
# What other attention functions take and this one cannot honour.
REFUSED = {
    "softcap": "attention logit soft-capping is not computed by sparse_attention",
    "s_aux": "attention sinks are not computed by sparse_attention",
    "sinks": "attention sinks are not computed by sparse_attention",
    "position_bias": "an additive position bias is not computed by sparse_attention",
    "cache": "a paged cache (continuous batching) is not served; use generate()'s "
             "dynamic or static cache",
    "head_mask": "a head mask is not applied by sparse_attention",
}
# The patterns that read no positions: every earlier key (the model's mask says which).
POSITION_FREE = ("full",)

_SPECS: dict[str, dict] = {}        # name -> what register() was given for it


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
    AttentionMaskInterface.register(name, mask_function(name))
    _SPECS[name] = spec
    return name


def _describe(spec: dict) -> str:
    params = ", ".join(f"{k}={v!r}" for k, v in spec["params"].items())
    return (f"pattern={spec['pattern']!r}{', ' + params if params else ''}, "
            f"combine={spec['combine']!r}, backend={spec['backend']!r}")


# ---------------------------------------------------------------------------------------
# The attention function
# ---------------------------------------------------------------------------------------

def _attention_function(name: str, spec: dict):
    pattern, combine, backend, params = (spec["pattern"], spec["combine"], spec["backend"],
                                         spec["params"])
    positional = pattern not in POSITION_FREE

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
        _warn_output_attentions(where, module, kwargs)
        mask = attention_mask if isinstance(attention_mask, ModelMask) else \
            given_mask(name, attention_mask, query, key, where)
        B, H, n_q, _ = query.shape
        if (n_q, key.shape[2]) != (mask.q_length, mask.kv_length):
            raise ValueError(f"{where}: {n_q} queries against {key.shape[2]} keys, but the "
                             f"mask was made for {mask.q_length} queries against "
                             f"{mask.kv_length} keys (cross-attention, or keys from "
                             f"elsewhere). Allowed: self-attention")
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
        _check_window(where, kwargs.get("sliding_window"), mask)
        how = plan(mask, kwargs, positional=positional,
                   dense_ok=backend in ("auto", "naive"), backend=backend, where=where)
        common = dict(scale=scaling, dropout_p=float(dropout), backend=backend,
                      enable_gqa=key.shape[1] != H)
        if isinstance(how, Dense):
            allowed = how.allowed                                       # (B|1, 1, n_q, n_k)
            if how.q_pos is not None:
                allowed = allowed & position_masks(pattern, how.n, H, combine, layer,
                                                   how.q_pos, how.k_pos, **params)
            # the pattern is in the mask, at the model's positions: "full" adds causality
            # by index, which the model's mask holds already
            out = sparse_attention(query, key, value, "full", attn_mask=allowed, **common)
        else:
            keys = slice(0, how.n_keys)                  # a static cache's empty slots off
            out = sparse_attention(query, key[:, :, keys], value[:, :, keys], pattern,
                                   combine=combine, layer=layer, lengths=how.lengths,
                                   offsets=how.offsets, **common, **params)
        return out.transpose(1, 2).contiguous(), None                   # (B, n_q, H, d)

    return sparse_attention_forward


def _check_kwargs(where: str, kwargs: dict) -> None:
    """Refuse what this attention cannot honour; a keyword it does not know is refused too
    when it carries a value (None and False say nothing)."""
    for key, value in kwargs.items():
        if key in IGNORED or key in HONOURED or value is None or value is False:
            continue
        why = REFUSED.get(key, f"it is not an argument this attention knows, and is not "
                               f"ignored (ignored: {sorted(IGNORED)}; honoured: "
                               f"{sorted(HONOURED)})")
        raise ValueError(f"{where}: got {key}={_short(value)}: {why}")


def _warn_output_attentions(where: str, module, kwargs: dict) -> None:
    """output_attentions=True, asked for as transformers reads it (the call's keyword, else
    the model's config): warned, as sdpa warns, since no weights come back."""
    asked = kwargs.get("output_attentions")
    if asked is None:
        asked = getattr(getattr(module, "config", None), "output_attentions", False)
    if asked and not torch.compiler.is_compiling():
        warnings.warn(f"{where}: output_attentions=True, but sparse attention forms no "
                      f"attention weights: the model's attentions come back empty, as "
                      f"with attn_implementation='sdpa'. For weights: "
                      f"attn_implementation='eager' (dense attention)", stacklevel=3)


def _check_window(where: str, window, mask: ModelMask) -> None:
    """The model's sliding_window keyword is honoured by the mask its mask function was
    given (transformers builds a window's mask and names the window to attention too); a
    4D mask given to the model is the whole mask, as sdpa reads it."""
    if window is None or mask.given is not None or window == mask.local_size:
        return
    reach = mask.q_length + mask.q_offset - 1 - mask.kv_offset     # the widest query-key gap
    if isinstance(reach, int) and reach < window:
        return                                                      # it cannot matter here
    has = "no window" if mask.local_size is None else f"a window of {mask.local_size}"
    raise ValueError(f"{where}: got sliding_window={window}, but the mask the model built "
                     f"for this layer has {has}; a window is honoured through the model's "
                     f"mask. Allowed: a model whose mask carries its window "
                     f"(create_sliding_window_causal_mask)")


def _short(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) \
        else repr(value)
