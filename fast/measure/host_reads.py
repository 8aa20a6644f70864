"""Where the host waits for the device: every read of a tensor's value, with its Python stack.

Child et al., 2019, section 5.5 (kernels that keep the GPU busy) and section 6
(training): a GPU runs ahead of the Python that feeds it until the host needs a
value the GPU computes -- ``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``if t:``,
``torch.equal``, a copy to the CPU, an op whose output size depends on the values
(``nonzero``). Each one is a wait: the queue of kernels runs dry behind it. A
training step needs one (the loss scaler's check for inf, ``GradScaler.step``);
every other one is time lost. Two ways to find them, both naming each read by its
stack:

* ``host_reads(fn)`` -- anywhere, the CPU included: a ``TorchDispatchMode``
  (``HostReads``) records every op of ``READ_OPS`` that ``fn()`` dispatches, the
  device of the tensor it reads, and the Python stack (``traceback.extract_stack``)
  where it was asked for. On the CPU a read waits for nothing, but the same line of
  Python reads a GPU tensor on a GPU: this is how the waits of a step are found and
  counted without one. Reads of tensors PyTorch keeps on the host on every device
  (AdamW's step counters: ``host_state``) are left out; copies count only from a
  device to the CPU;
* ``device_waits(fn)`` -- on CUDA: ``torch.cuda.set_sync_debug_mode("warn")``, with
  each warning's Python stack (the warning is raised inside the call that waits):
  what the CUDA runtime itself calls a synchronisation.

``Read.where`` is the innermost frame of this repository that asked (the line to
change, or the line that calls PyTorch's reading code); ``Read.origin`` the innermost
frame that is not PyTorch's own dispatch machinery; ``describe`` prints each read with
its stack (what a test prints when it counts too many). ``on_the_cpu_only`` tells the
reads this repository makes only where they wait for nothing (``CPU_ONLY``: checks of
values run on the CPU and skipped on a GPU) from those a GPU would wait for.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

ROOT = Path(__file__).resolve().parents[2]          # the repository
HERE = Path(__file__).resolve()

# What reads a value on the host: .item() / bool() / int() / float() dispatch to
# _local_scalar_dense (bool may reach is_nonzero first), torch.equal answers a bool,
# nonzero and masked_select size their output by the values.
READ_OPS = {aten._local_scalar_dense.default: "item", aten.is_nonzero.default: "bool",
            aten.equal.default: "equal", aten.nonzero.default: "nonzero",
            aten.masked_select.default: "masked_select"}
COPY_OPS = (aten._to_copy.default, aten.copy_.default)
# PyTorch's frames between a read and the line that asked for it
MACHINERY = ("torch/utils/_python_dispatch", "torch/_tensor.py", "torch/_compile.py",
             "torch/_dynamo/")

# Reads this repository makes on the CPU only, where they wait for nothing; on a GPU
# the same call reads nothing (the function: why).
CPU_ONLY = {
    ("fast/core/checks.py", "check_finite"):
        "sparse_attention checks q, k, v for NaN and inf where that costs no wait: on the "
        "CPU (check_finite=None), never on a GPU unless asked",
    ("fast/transformer/network/model.py", "check_token_ids"):
        "the model checks its token ids on the CPU only, outside torch.compile",
    ("fast/backends/naive.py", "masked_attention"):
        "the naive path looks for rows that read nothing on the CPU only; on a GPU it "
        "handles them without looking",
}


@dataclass(frozen=True)
class Read:
    """One read of a tensor's value by the host."""
    op: str                                   # "item", "bool", "equal", "copy to cpu", ...
    device: str                               # where the tensor read lives
    stack: tuple[traceback.FrameSummary, ...]  # outermost first, the read's own frame last

    @property
    def where(self) -> str:
        """The innermost frame of this repository: 'path:line function'."""
        mine = [f for f in self.stack if _ours(f)]
        return _frame(mine[-1]) if mine else self.origin

    @property
    def origin(self) -> str:
        """The innermost frame outside torch's dispatch machinery (PyTorch's own code
        included, e.g. ``torch/amp/grad_scaler.py``)."""
        outer = [f for f in self.stack if not any(part in f.filename for part in MACHINERY)]
        return _frame((outer or list(self.stack))[-1])

    def lines(self) -> list[str]:
        """The stack, one frame a line, outermost first (pytest's and runpy's frames cut)."""
        keep = [f for f in self.stack if "_pytest" not in f.filename
                and "pluggy" not in f.filename and "runpy" not in f.filename]
        return [f"    {_frame(f)}: {(f.line or '').strip()}" for f in keep]


def _ours(frame: traceback.FrameSummary) -> bool:
    path = Path(frame.filename)
    return path.is_relative_to(ROOT) and path != HERE and ".venv" not in path.parts \
        and "site-packages" not in path.parts


def _frame(f: traceback.FrameSummary) -> str:
    path = Path(f.filename)
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    name = str(name).split("site-packages/")[-1]
    return f"{name}:{f.lineno} {f.name}"


def _stack() -> tuple[traceback.FrameSummary, ...]:
    """The Python stack of the caller that asked for the read (this module's frames cut)."""
    return tuple(f for f in traceback.extract_stack()[:-1] if Path(f.filename) != HERE)


class HostReads(TorchDispatchMode):
    """``with HostReads() as r: ...`` -- ``r.reads``: every read of ``READ_OPS`` and every
    copy from a device to the CPU dispatched inside, with its stack. ``on_host``:
    tensors whose reads are left out (PyTorch keeps them on the host whatever the
    device: ``host_state``)."""

    def __init__(self, on_host: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.reads: list[Read] = []
        self._host = {id(t) for t in on_host}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func in READ_OPS and source is not None and id(source) not in self._host:
            self.reads.append(Read(READ_OPS[func], str(source.device), _stack()))
        elif func in COPY_OPS:
            src = args[1] if func is aten.copy_.default else args[0]
            dst = (args[0].device if func is aten.copy_.default
                   else kwargs.get("device") or src.device)
            if src.device.type != "cpu" and torch.device(dst).type == "cpu":
                self.reads.append(Read("copy to cpu", str(src.device), _stack()))
        return func(*args, **kwargs)


def host_reads(fn: Callable[[], object], on_host: Iterable[torch.Tensor] = ()) -> list[Read]:
    """The reads of ``fn()`` (``HostReads``), in order."""
    with HostReads(on_host) as mode:
        fn()
    return mode.reads


def host_state(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """Tensors of ``optimizer`` that PyTorch keeps on the host on every device: the step
    counters of Adam, AdamW and the like unless ``capturable`` or ``fused`` (then they
    live on the device). Reading them waits for nothing."""
    if optimizer is None:
        return []
    out = []
    for group in optimizer.param_groups:
        if group.get("capturable") or group.get("fused"):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and step.device.type == "cpu":
                out.append(step)
    return out


def on_the_cpu_only(read: Read) -> str | None:
    """Why ``read`` happens on the CPU only (``CPU_ONLY``), or None: a GPU waits there."""
    for (path, name), why in CPU_ONLY.items():
        if any(_ours(f) and f.name == name and Path(f.filename) == ROOT / path
               for f in read.stack):
            return why
    return None


def device_waits(fn: Callable[[], object]) -> list[Read]:
    """On CUDA: every wait of ``fn()`` that ``torch.cuda.set_sync_debug_mode("warn")``
    reports, each with the Python stack of the call that waited."""
    if not torch.cuda.is_available():
        raise ValueError("device_waits needs CUDA (torch.cuda.is_available() is False); "
                         "allowed: host_reads, which runs anywhere")
    waits: list[Read] = []

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            waits.append(Read(str(message).split("\n")[0][:80], "cuda", _stack()))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show        # restored by catch_warnings
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return waits


def describe(reads: list[Read], title: str = "host reads") -> str:
    """Each read with its op, device, the frame that asked and its stack."""
    out = [f"{title}: {len(reads)}"]
    for i, r in enumerate(reads):
        why = on_the_cpu_only(r)
        out.append(f"  [{i}] {r.op} of a {r.device} tensor at {r.where} (origin {r.origin})"
                   + (f" -- on the CPU only: {why}" if why else ""))
        out += r.lines()
    return "\n".join(out)


def summary(reads: list[Read]) -> list[dict]:
    """The reads as a record keeps them: op, device, where, origin, on the CPU only."""
    return [{"op": r.op, "device": r.device, "where": r.where, "origin": r.origin,
             "cpu_only": on_the_cpu_only(r) is not None} for r in reads]
