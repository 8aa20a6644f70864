"""Measure the memory a training step needs: bytes saved for backward, and peak RSS.

Child et al., 2019, section 5.4 ("Saving memory by recomputing attention
weights"): with recomputation only each residual block's input is kept for the
backward pass; attention and feed-forward are recomputed from it. This file
measures what that buys, on the CPU, in two ways:

* ``count_saved()`` -- a context manager that installs
  ``torch.autograd.graph.saved_tensors_hooks`` and records every tensor autograd
  keeps for the backward pass. Tensors that share a storage (views, a tensor
  saved by two ops) are counted once, by storage. Storages of the parameters you
  pass (weights saved by a matmul) are reported apart from activations, since
  they exist whether or not autograd keeps them. Under non-reentrant
  ``torch.utils.checkpoint`` the region's inner tensors are packed by the
  checkpoint's own (innermost) hooks and never reach ours: what we see is what
  is really kept -- the block inputs.
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
from dataclasses import dataclass, field

import torch

__all__ = ["SavedLog", "count_saved", "saved_bytes", "peak_rss", "peak_memory", "rss_bytes",
           "format_bytes"]


@dataclass
class SavedLog:
    """What autograd kept for backward while ``count_saved`` was active.

    ``tags[name]`` holds the activation bytes first saved while ``log.tag`` was
    ``name`` (set it from a forward pre-hook to split the total per layer).
    """

    activation_bytes: int = 0   # unique non-parameter storages, in bytes
    parameter_bytes: int = 0    # unique parameter storages autograd also holds
    n_saved: int = 0            # pack calls (one per tensor saved, duplicates included)
    n_storages: int = 0         # distinct activation storages
    tag: str = "other"          # label charged for newly seen storages
    tags: dict = field(default_factory=dict)       # tag -> activation bytes
    shapes: list = field(default_factory=list)     # (tag, shape, dtype, nbytes) per new storage

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.parameter_bytes


def _storage_key(t: torch.Tensor):
    """(device, data pointer) of the storage behind ``t``, and its size in bytes;
    ``None`` for tensors without a plain storage (e.g. some tensor subclasses)."""
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (str(t.device), s.data_ptr()), s.nbytes(), s


@contextlib.contextmanager
def count_saved(parameters=()):
    """Record the tensors autograd saves for backward inside the ``with`` block.

    parameters: tensors (e.g. ``model.parameters()``) whose storages are counted
    under ``parameter_bytes`` instead of ``activation_bytes``.
    Yields a ``SavedLog`` that is filled in as the forward pass runs.

    The storages seen are kept referenced until the block exits, so that a
    storage freed mid-way cannot have its address re-used and be missed; for an
    ordinary forward pass that changes nothing (autograd holds them anyway).
    """
    param_keys = set()
    for p in parameters:
        key = _storage_key(p)
        if key is not None:
            param_keys.add(key[0])
    log = SavedLog()
    seen: dict = {}

    def pack(t: torch.Tensor):
        log.n_saved += 1
        key = _storage_key(t)
        if key is not None and key[0] not in seen:
            k, nbytes, storage = key
            seen[k] = storage
            if k in param_keys:
                log.parameter_bytes += nbytes
            else:
                log.activation_bytes += nbytes
                log.n_storages += 1
                log.tags[log.tag] = log.tags.get(log.tag, 0) + nbytes
                dtype = str(t.dtype).replace("torch.", "")
                log.shapes.append((log.tag, tuple(t.shape), dtype, nbytes))
        return t

    def unpack(t: torch.Tensor):
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield log
    finally:
        seen.clear()


def saved_bytes(fn, *args, parameters=(), **kwargs) -> tuple[object, SavedLog]:
    """Run ``fn(*args, **kwargs)`` under ``count_saved`` and return (result, log)."""
    with count_saved(parameters) as log:
        out = fn(*args, **kwargs)
    return out, log


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
