"""Where a run executes: the device, the precision, and the data-parallel process group.

Child et al., 2019, section 5.6 (mixed precision: weights kept in fp32,
activations and gradients in fp16, dynamic loss scaling; query-key products in
fp32 when sampling) and section 6 (data parallel training over several GPUs).

* ``resolve_device("auto")`` -- CUDA (this process's ``LOCAL_RANK``) if there is
  one, else the CPU;
* ``resolve_precision("auto", device)`` -- fp16 with loss scaling on CUDA, bf16
  on the CPU (no loss scaling needed there);
* ``autocast(precision, device)`` -- the autocast context; the weights stay fp32;
* ``world_size()`` -- how many ranks the run will have (before joining them);
* ``init_distributed(device)`` -- joins the process group that torchrun describes
  (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): nccl on CUDA, gloo on the CPU;
* ``gather(obj, world)`` -- every rank's ``obj`` on every rank (the RNG states a
  checkpoint keeps);
* ``StepClock(device)`` -- the seconds of every training step without making the
  host wait for the GPU: on CUDA a pair of events per step, read only when the host
  waits anyway (``loss.item()`` at a logging step, the end of training).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist


def resolve_device(name: str = "auto") -> torch.device:
    """The torch.device of a TrainConfig.device string ("auto", "cpu", "cuda:1", ...)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available; use 'cpu'")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ValueError(f"device {name!r} asked for, but this machine has {count} CUDA "
                         f"device(s): cuda:0 .. cuda:{count - 1}")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> "fp16" on CUDA (with loss scaling), "bf16" on CPU."""
    if precision == "auto":
        return "fp16" if device.type == "cuda" else "bf16"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision 'bf16' asked for, but {torch.cuda.get_device_name(device)} "
                         f"has no bfloat16; use 'fp16' or 'fp32'")
    return precision


def world_size() -> int:
    """The number of ranks this process will train with: the process group's size if
    there is one, else torchrun's WORLD_SIZE (1 without torchrun)."""
    if dist.is_initialized():
        return dist.get_world_size()
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) < 1:
        raise ValueError(f"WORLD_SIZE must be a positive integer (torchrun sets it), "
                         f"got {world!r}")
    return int(world)


def autocast(precision: str, device: torch.device):
    """The autocast context of a precision ("fp32": none). Weights stay fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def init_distributed(device: torch.device) -> tuple[int, int, bool]:
    """(rank, world_size, whether we created the process group).

    One process (no WORLD_SIZE > 1 and no group yet) is rank 0 of 1; under
    torchrun the group is created here and the caller destroys it at the end."""
    world = world_size()
    if world <= 1 and not dist.is_initialized():
        return 0, 1, False
    created = False
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        created = True
    return dist.get_rank(), dist.get_world_size(), created


def gather(obj, world: int) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (pickled between this run's own
    processes; one rank: [obj]). Every rank must call it."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


class StepClock:
    """Seconds per training step, timed without a host-device sync of its own.

    ``start()`` and ``stop()`` bracket a step. On the CPU they read the wall clock.
    On CUDA they record a pair of CUDA events on the current stream; the host does
    not wait for them, so the GPU may run several steps behind the Python loop (a
    ``torch.cuda.synchronize`` per step, which timing by wall clock would need, is a
    wait the loss scaler's one per step does not make necessary). ``seconds()``
    waits for the last recorded event and returns every step's seconds, in order;
    ``collect()`` reads the events so far without returning them. Call both where the
    host waits anyway. A CUDA step's seconds are the GPU's time
    from its start event to its stop event (host time between steps not included).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._done: list[float] = []
        self._pending: list[tuple] = []      # CUDA: (start event, stop event) not yet read
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._pending.append((event, None))
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._pending[-1] = (self._pending[-1][0], event)
        else:
            self._done.append(time.perf_counter() - self._t0)

    def collect(self) -> None:
        """Read the CUDA events recorded so far (waits for the last one) and let them go;
        the training loop calls it at its logging steps, where ``loss.item()`` waits
        anyway, so that a long run does not hold two events per step."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self._done += [a.elapsed_time(b) / 1e3 for a, b in self._pending]
            self._pending = []

    def seconds(self) -> list[float]:
        self.collect()
        return list(self._done)
