"""The data-parallel process group of a training run.

Child et al., 2019, section 6 (data parallel training over several GPUs). Under
torchrun every rank runs the same loop on its own batches:

* ``world_size()`` -- how many ranks the run will have (before joining them);
* ``init_distributed(device)`` -- joins the process group that torchrun describes
  (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): nccl on CUDA, gloo on the CPU;
* ``gather(obj, world)`` -- every rank's ``obj`` on every rank (the RNG states a
  checkpoint keeps).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world_size() -> int:
    """The number of ranks this process will train with: the process group's size if
    there is one, else torchrun's WORLD_SIZE (1 without torchrun)."""
    if dist.is_initialized():
        return dist.get_world_size()
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) < 1:
        raise ValueError(f"WORLD_SIZE must be a positive integer (torchrun sets it), "
                         f"got {world!r}")
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT")
               if name not in os.environ]
    if int(world) > 1 and missing:
        raise ValueError(f"WORLD_SIZE={world} asks for {world} ranks, but {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not set; allowed: launch "
                         f"with torchrun --nproc_per_node={world} (it sets them all), or "
                         f"unset WORLD_SIZE for one process")
    return int(world)


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
