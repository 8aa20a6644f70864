"""Measure the memory a training step needs: bytes saved for backward, and peak RSS.

Child et al., 2019, section 5.4 ("Saving memory by recomputing attention
weights"): with recomputation only each residual block's input is kept for the
backward pass; attention and feed-forward are recomputed from it. This file
measures what that buys, on the CPU, in two ways:

* ``count_saved()`` -- a context manager that installs
  ``torch.autograd.graph.saved_tensors_hooks`` and records every tensor autograd
  keeps for the backward pass: packed by a node of the graph that is still alive
  (a tensor packed by a side branch that was dropped, e.g. an input check run
  with gradients on, is freed with it and not counted). Tensors that share a
  storage (views, a tensor saved by two ops) are counted once, by storage.
  Storages of the parameters you pass (weights saved by a matmul) are reported
  apart from activations, since they exist whether or not autograd keeps them.
  Under non-reentrant ``torch.utils.checkpoint`` the region's inner tensors are
  packed by the checkpoint's own (innermost) hooks and never reach ours: what we
  see is what is really kept -- the block inputs.
* ``graph_saved(output)`` -- the same tensors read from the other side: walk
  the autograd graph that ends in ``output`` and list, per node (the op that
  saved it), each tensor it holds for backward -- which op keeps what.
* ``peak_rss()`` -- the process's peak resident memory above its level at the
  start, from Linux's VmHWM, which is reset by writing 5 to
  /proc/self/clear_refs. That is the honest number (allocator slack, temporary
  buffers, gradients, optimizer state all count) but it is Linux only; on
  other systems it reports ``None``.
* ``peak_memory(device)`` -- the same on the CPU; on CUDA the allocator's
  maximum (``torch.cuda.max_memory_allocated``) above its level at the start.
  The benchmark and the memory report both read peaks through it. A peak is a
  high-water mark of the whole process: measure in a fresh one
  (``fast.measure.child``) when earlier work may have left pages resident.
"""

from __future__ import annotations

import contextlib
import re
import sys
import weakref
from dataclasses import dataclass, field

import torch

__all__ = ["SavedLog", "count_saved", "saved_bytes", "graph_saved", "peak_rss", "peak_memory",
           "rss_bytes", "format_bytes"]


@dataclass
class SavedLog:
    """What autograd keeps for backward, recorded by ``count_saved``.

    Every tensor packed inside the ``with`` block is recorded, but only those
    that a live node of the autograd graph still holds are counted: a tensor
    packed by a branch of the graph that was dropped (a check such as
    ``torch.aminmax(q)`` run with gradients on, whose result is read once and
    thrown away) is freed with that branch and does not count. The numbers are
    those of the moment they are read inside the block, and are frozen when the
    block exits.

    ``tags[name]`` holds the activation bytes first saved while ``log.tag`` was
    ``name`` (set it from a forward pre-hook to split the total per layer).
    """

    tag: str = "other"          # label charged for newly seen storages
    n_packed: int = 0           # pack calls, kept or not (duplicates included)
    _records: list = field(default_factory=list, repr=False)   # one per pack call
    _frozen: dict | None = field(default=None, repr=False)

    def _count(self) -> dict:
        """The numbers, over the tensors still held by the graph (first pack wins)."""
        if self._frozen is not None:
            return self._frozen
        seen: set = set()
        out = {"activation_bytes": 0, "parameter_bytes": 0, "n_saved": 0, "n_storages": 0,
               "tags": {}, "shapes": []}
        for alive, tag, key, nbytes, is_param, shape, dtype in self._records:
            if alive() is None:                  # its graph node is gone: not kept
                continue
            out["n_saved"] += 1
            if key in seen:
                continue
            seen.add(key)
            if is_param:
                out["parameter_bytes"] += nbytes
                continue
            out["activation_bytes"] += nbytes
            out["n_storages"] += 1
            out["tags"][tag] = out["tags"].get(tag, 0) + nbytes
            out["shapes"].append((tag, shape, dtype, nbytes))
        return out

    def _freeze(self) -> None:
        self._frozen = self._count()
        self._records = []

    @property
    def activation_bytes(self) -> int:
        """Bytes of the distinct non-parameter storages kept."""
        return self._count()["activation_bytes"]

    @property
    def parameter_bytes(self) -> int:
        """Bytes of the distinct parameter storages autograd also holds."""
        return self._count()["parameter_bytes"]

    @property
    def n_saved(self) -> int:
        """Tensors kept (one per pack call still held, duplicates included)."""
        return self._count()["n_saved"]

    @property
    def n_storages(self) -> int:
        """Distinct activation storages kept."""
        return self._count()["n_storages"]

    @property
    def tags(self) -> dict:
        """tag -> activation bytes first saved under it."""
        return self._count()["tags"]

    @property
    def shapes(self) -> list:
        """(tag, shape, dtype, nbytes) per kept activation storage, in packing order."""
        return self._count()["shapes"]

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.parameter_bytes


class _Packed:
    """What autograd stores for one saved tensor while ``count_saved`` is active: the
    tensor itself. It lives exactly as long as the graph node that saved it, so a
    weak reference to it says whether the tensor is still kept."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _storage_key(t: torch.Tensor):
    """(device, data pointer) of the storage behind ``t``, and its size in bytes;
    ``None`` for tensors without a plain storage (e.g. some tensor subclasses)."""
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (str(t.device), s.data_ptr()), s.nbytes()


@contextlib.contextmanager
def count_saved(parameters=()):
    """Record the tensors autograd saves for backward inside the ``with`` block.

    parameters: tensors (e.g. ``model.parameters()``) whose storages are counted
    under ``parameter_bytes`` instead of ``activation_bytes``.
    Yields a ``SavedLog``: read inside the block, it counts what the graph holds
    at that moment; after the block, what it held when the block exited.

    Storages are told apart by address. Only tensors that are kept are counted,
    and those are all alive at once, so two of them never share an address by
    accident.
    """
    param_keys = set()
    for p in parameters:
        key = _storage_key(p)
        if key is not None:
            param_keys.add(key[0])
    log = SavedLog()

    def pack(t: torch.Tensor):
        log.n_packed += 1
        packed = _Packed(t.detach())   # no grad_fn: an output saved by its own node makes no cycle
        key = _storage_key(t)
        if key is not None:
            dtype = str(t.dtype).replace("torch.", "")
            log._records.append((weakref.ref(packed), log.tag, key[0], key[1],
                                 key[0] in param_keys, tuple(t.shape), dtype))
        return packed

    def unpack(packed: _Packed) -> torch.Tensor:
        return packed.tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield log
    finally:
        log._freeze()


def saved_bytes(fn, *args, parameters=(), **kwargs) -> tuple[object, SavedLog]:
    """Run ``fn(*args, **kwargs)`` under ``count_saved`` and return (result, log)."""
    with count_saved(parameters) as log:
        out = fn(*args, **kwargs)
    return out, log


def _node_saved(node) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of what one autograd node holds: built-in nodes expose
    ``_saved_<name>`` attributes, custom ``torch.autograd.Function`` nodes
    ``saved_tensors``."""
    out = []
    for attr in dir(node):
        if attr.startswith("_saved_"):
            try:
                value = getattr(node, attr)
            except RuntimeError:          # already freed by a backward pass
                continue
            if isinstance(value, torch.Tensor):
                out.append((attr[len("_saved_"):], value))
    if not out and hasattr(node, "saved_tensors"):
        try:
            out = [(f"saved_tensors[{i}]", t) for i, t in enumerate(node.saved_tensors)]
        except RuntimeError:
            out = []
    return out


def graph_saved(output: torch.Tensor, parameters=()) -> list[tuple[str, str, tuple, str, int]]:
    """What the autograd graph ending in ``output`` keeps for backward, op by op.

    Returns (op, name, shape, dtype, bytes) for every distinct activation storage,
    in the order the forward pass made the ops (``op`` is the backward node's name,
    e.g. "NativeLayerNormBackward0", ``name`` what it calls the tensor, e.g.
    "input" or "result1"). Parameters (``parameters``) and storages already listed
    are left out, as in ``count_saved``, and so are 0-d tensors (a number such as
    the 1.702 of the GeLU, which a node keeps as a wrapped scalar, not a saved
    tensor). Not for a graph with regions under ``torch.utils.checkpoint``
    (non-reentrant): reading a tensor such a region saved recomputes the region, so the
    list would show what it makes when recomputed, not what it keeps; ``count_saved``
    measures those. The graph must not have run backward yet.
    """
    params = {k[0] for k in map(_storage_key, parameters) if k is not None}
    nodes, stack, seen = [], [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        stack.extend(next_node for next_node, _ in node.next_functions)
    nodes.sort(key=lambda node: node._sequence_nr())      # forward order
    rows, listed = [], set()
    for node in nodes:
        for name, t in _node_saved(node):
            key = _storage_key(t)
            if key is None or t.dim() == 0 or key[0] in params or key[0] in listed:
                continue
            listed.add(key[0])
            rows.append((node.name(), name, tuple(t.shape), str(t.dtype).replace("torch.", ""),
                         key[1]))
    return rows


# ----------------------------------------------------------------------------
# Peak resident memory of this process (Linux).
# ----------------------------------------------------------------------------

def _status_field(name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(rf"^{name}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def rss_bytes() -> int | None:
    """Current resident set size of this process in bytes (None off Linux)."""
    return _status_field("VmRSS")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5 = reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


@contextlib.contextmanager
def peak_rss():
    """Peak resident memory of the ``with`` block above the RSS at its start.

    Yields a dict; on exit ``result["peak_bytes"]`` holds the peak increase and
    ``result["start_bytes"]`` the RSS at the start (both None where the kernel
    does not let us reset the high-water mark, e.g. not Linux).
    """
    result = {"peak_bytes": None, "start_bytes": None}
    ok = sys.platform.startswith("linux") and _reset_peak()
    start = rss_bytes() if ok else None
    try:
        yield result
    finally:
        peak = _status_field("VmHWM") if ok else None
        if start is not None and peak is not None:
            result["start_bytes"] = start
            result["peak_bytes"] = max(0, peak - start)


@contextlib.contextmanager
def peak_memory(device="cpu"):
    """Peak memory of the ``with`` block above its start, on ``device``.

    CPU: ``peak_rss`` (Linux VmHWM). CUDA: ``torch.cuda.max_memory_allocated``
    above ``memory_allocated`` at the start, the device synchronised at both
    ends (what the caching allocator handed out; its reserved slack is not
    counted). Yields a dict; on exit ``result["peak_bytes"]`` holds the peak
    increase and ``result["start_bytes"]`` the level at the start (None on a CPU
    where the high-water mark cannot be reset).
    """
    if torch.device(device).type != "cuda":
        with peak_rss() as result:
            yield result
        return
    result = {"peak_bytes": None, "start_bytes": None}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    try:
        yield result
    finally:
        torch.cuda.synchronize()
        result["start_bytes"] = start
        result["peak_bytes"] = torch.cuda.max_memory_allocated() - start


def format_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB' (binary units); None -> 'n/a'."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
