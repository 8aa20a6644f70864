"""One call plan per call signature of ``sparse_attention``: every check once, then the path.

Child et al., 2019, section 5.5: a block-sparse kernel pays only for the tiles it
computes; around it, every call also spends host time, paid by every layer of every
step (docs/design.md §15). So the arguments are checked, and the path
chosen and bound, once per call signature, here.

A call's signature -- the shapes, strides, dtypes, devices and requires_grad of q, k,
v, grad mode, autocast, and every other argument with its type (the mask's and the
padding's metadata, not their values) -- names a ``CallPlan``, made by the first call of
that signature and kept (the ``MAX_CALL_PLANS`` most recently used;
``clear_call_plans``): it applies autocast's rule, runs every check that reads no value
(``fast.core.checks.check_call``), chooses the path in one place
(``fast.attention.paths.choose_path``) and binds the callable that runs it
(``fast.attention.paths.PATHS``). A later call of the signature runs only what depends
on the values: the value checks it asks for (``check_finite``; padding values), the
padding moved to the device, and the path -- on the Triton path the operator alone,
which allocates what the kernels write and launches them, reading nothing back (so it
can be captured in a CUDA graph). Bad input gets the same error on a kept plan as on a
fresh one: a new argument is a new signature, and values are checked on every call. A
call traced by torch.compile makes its plan in the trace (Python over shapes and Python
values) and keeps none.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fast.attention.paths import PATHS, choose_path
from fast.backends import host_checks
from fast.backends.padding import as_padding, to_device, zero_outside
from fast.core.checks import check_call
from fast.core.nonfinite import attention_reach, causal_reach, quarantine
from fast.core.precision import autocast_casts, autocast_off, cast_inputs

MAX_CALL_PLANS = 256      # call plans kept (least recently used dropped first)


def finite_default(device: torch.device) -> bool | None:
    """What ``check_finite=None`` means on ``device``: True on the CPU (the finite check
    costs a read of q, k, v and no wait), None elsewhere (nothing looks at the values)."""
    return True if device.type == "cpu" else None


class CallPlan:
    """Everything a call of one signature needs, checked and decided once (module
    docstring; docs/design.md §15): autocast's casts; every check of the
    arguments' types, shapes, strides, dtypes and devices, the pattern and its
    parameters, the scale, the mask's and the padding's metadata; the path
    (``choose_path``) and the callable that runs it; which value checks a call asks for;
    where the scale goes (``fold_dtype``); whether non-finite rows are isolated
    (``fast.core.nonfinite``). ``__call__`` then does only what depends on the values:
    the value checks asked for, the padding moved to the device, and the path.

    ``autocast``: (device type, the dtype each of q, k, v is cast to or None) when
    autocast was on for q's device, else None. Keeps no tensor."""

    def __init__(self, q, k, v, attn_mask, lengths, offsets, pattern, stride, c, combine,
                 layer, scale, dropout_p, is_causal, enable_gqa, backend, check_finite,
                 variant, pattern_params: dict):
        self.autocast = autocast_casts(q, k, v)
        q, k, v = cast_inputs(self.autocast, q, k, v)
        # the checks see what the call computes on: autocast's casts, autocast off inside
        with autocast_off(self.autocast):
            params, scale, dropout_p, fold = check_call(
                q, k, v, pattern, combine, layer, scale, attn_mask, dropout_p, is_causal,
                enable_gqa, check_finite, {"stride": stride, "c": c}, pattern_params)
            B, H, n_q, _ = q.shape
            n_k, device, dtype = k.shape[2], q.device, q.dtype
            padded = lengths is not None or offsets is not None
            backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
            which = choose_path(backend, pattern, combine, params, device, dtype, B, H, n_q,
                                n_k, backward=backward, attn_mask=attn_mask is not None,
                                dropout=dropout_p > 0, padded=padded)
            if variant is not None and which != "triton":
                raise ValueError(f"variant {variant!r} selects a Triton kernel variant, but "
                                 f"backend {backend!r} runs {which!r} here; allowed: "
                                 f"variant=None, or backend='triton'")
            if check_finite is None:
                check_finite = finite_default(device)
            self.path, self.B, self.n_k, self.device = which, B, n_k, device
            self.finite = bool(check_finite) and which != "row"  # the step looks at its reads
            self.values = bool(check_finite)     # the padding's values on a GPU too
            self.padded = padded
            # see fold_dtype: q * scale in the dtype it fits, scale 1 (the Triton kernels
            # take any scale: fast.kernels.launch.fold_scale)
            self.dtype, self.scale = dtype, scale
            self.fold = None if which == "triton" else fold
            if self.fold is not None:
                q, k, v, scale = q.to(self.fold), k.to(self.fold), v.to(self.fold), 1.0
            # non-finite values kept to the rows that read them (fast.core.nonfinite)
            self.isolate = check_finite is False and which in ("naive", "structured", "full")
            self.simple = (pattern == "full" and n_q == n_k and k.shape[1] == H
                           and attn_mask is None and not padded)
            self.always = device.type != "cpu" or torch.compiler.is_compiling()
            bind = PATHS[which]
            arguments = dict(pattern=pattern, combine=combine, layer=layer, params=params,
                             check_finite=check_finite, variant=variant, padded=padded,
                             backward=backward)
            self.attend = bind(q, k, v, scale=scale, dropout_p=dropout_p, **arguments)
            # the rows each position reaches: the path once more, without scale or dropout
            self.reach = None
            if self.isolate:
                self.reach = bind(q, k, v, scale=1.0, dropout_p=0.0, **arguments)
            # nothing to do but the path: no cast, value check, padding, fold or isolation
            self.direct = (self.autocast is None and not self.finite and not padded
                           and self.fold is None and not self.isolate)

    def __call__(self, q, k, v, attn_mask, lengths, offsets):
        """The path on this call's tensors: (B, H, n_q, d) in q's dtype (autocast's)."""
        if self.direct:
            return self.attend(q, k, v, attn_mask, lengths, offsets)
        if self.autocast is None:
            return self._run(q, k, v, attn_mask, lengths, offsets)
        q, k, v = cast_inputs(self.autocast, q, k, v)   # SDPA's rule: cast, then autocast
        with autocast_off(self.autocast):                # off inside
            return self._run(q, k, v, attn_mask, lengths, offsets)

    def _run(self, q, k, v, attn_mask, lengths, offsets):
        if self.padded:                   # not moved yet: values on the host are read there
            lengths, offsets, (host_l, host_o) = as_padding(lengths, offsets, self.B)
            values = (lengths is not None and (host_l or self.values),
                      offsets is not None and (host_o or self.values))
        else:
            values = (False, False)
        if self.finite or values[0] or values[1]:        # the host reads, in one operator
            with torch.no_grad():         # nothing to differentiate: no autograd node made
                host_checks.check(q, k, v, self.finite, lengths, offsets, *values)
        if self.padded:
            lengths, offsets = to_device(lengths, offsets, self.device)  # checked where given
        if self.fold is not None:
            q, k, v = q.to(self.fold) * self.scale, k.to(self.fold), v.to(self.fold)
        if self.isolate:
            out = self._isolated(q, k, v, attn_mask, lengths, offsets)
        else:
            out = self.attend(q, k, v, attn_mask, lengths, offsets)
        return out if self.fold is None else out.to(self.dtype)

    def _isolated(self, q, k, v, attn_mask, lengths, offsets):
        """The path with ``fast.core.nonfinite``'s promise: padded rows output 0 NaN or
        not, and a non-finite value reaches exactly the rows that read it."""
        q = zero_outside(q, lengths, offsets, self.n_k)
        reach = causal_reach if self.simple else attention_reach(
            lambda a, b, c: self.reach(a, b, c, attn_mask, lengths, offsets))
        return quarantine(lambda a, b, c: self.attend(a, b, c, attn_mask, lengths, offsets),
                          q, k, v, reach, always=self.always)


# ----------------------------------------------------------------------------
# The plans kept: one per signature
# ----------------------------------------------------------------------------

_PLANS: OrderedDict = OrderedDict()     # signature -> CallPlan, least recently used first


def clear_call_plans() -> None:
    """Forget every call plan (the next call of each signature checks and decides anew)."""
    _PLANS.clear()


def call_plans() -> int:
    """How many call plans are kept (at most ``MAX_CALL_PLANS``)."""
    return len(_PLANS)


def _metadata(x):
    """What a plan depends on of an optional tensor argument (a mask, lengths, offsets):
    its shape, dtype and device; of anything else its type (its values are read on
    every call)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x.shape, x.dtype, x.device
    return type(x)


def _signature(q, k, v, attn_mask, lengths, offsets, arguments: tuple,
               pattern_params: dict):
    """The key of a call's plan: every argument a plan depends on -- the shapes, strides,
    dtypes, devices and requires_grad of q, k, v, grad mode, autocast on q's device, the
    other ``arguments`` with their types (4 and 4.0 are one key otherwise, and only one
    of them is a stride), the mask's and the padding's metadata -- or None where there
    is none to make (traced by torch.compile; an argument that is not a tensor, a nested
    tensor: the plan's checks then name it)."""
    if torch.compiler.is_compiling():   # traced: the plan is made in the trace, once
        return None
    try:
        device = q.device
        autocast = torch.is_autocast_enabled(device.type)
        return (q.shape, q.stride(), q.dtype, device, q.requires_grad,
                k.shape, k.stride(), k.dtype, k.device, k.requires_grad,
                v.shape, v.stride(), v.dtype, v.device, v.requires_grad,
                torch.is_grad_enabled(), autocast,
                torch.get_autocast_dtype(device.type) if autocast else None,
                arguments, tuple(map(type, arguments)),
                None if attn_mask is None else _metadata(attn_mask),
                None if lengths is None else _metadata(lengths),
                None if offsets is None else _metadata(offsets),
                tuple(pattern_params.items()) if pattern_params else ())
    except (AttributeError, TypeError, RuntimeError):
        return None


def _kept(key) -> CallPlan | None:
    """The plan kept under ``key`` (now the most recently used), or None."""
    if key is None:
        return None
    try:
        plan = _PLANS.get(key)
    except TypeError:                     # an unhashable argument: checked by a new plan
        return None
    if plan is not None:
        try:
            _PLANS.move_to_end(key)
        except KeyError:                  # dropped meanwhile by another thread
            pass
    return plan


def plan_for(q, k, v, attn_mask, lengths, offsets, arguments, pattern_params) -> CallPlan:
    """The plan of this call's signature: the one kept, or a new one (every check runs
    then), kept when the call has a signature. ``arguments``: ``CallPlan``'s from
    ``pattern`` to ``variant``, in its order."""
    key = _signature(q, k, v, attn_mask, lengths, offsets, arguments, pattern_params)
    plan = _kept(key)
    if plan is None:
        plan = CallPlan(q, k, v, attn_mask, lengths, offsets, *arguments, pattern_params)
        if key is not None:
            try:
                _PLANS[key] = plan
            except TypeError:             # unhashable, yet the checks passed: not kept
                return plan
            while len(_PLANS) > MAX_CALL_PLANS:
                _PLANS.popitem(last=False)
    return plan
