"""A run's out_dir: one writer at a time, and a checkpoint never replaced by surprise.

Child et al., 2019, section 6 trains for days; two runs started on one out_dir, or a
run and a copy someone made meanwhile, must not silently replace each other's
checkpoints. ``RunOutput`` is what the training loop writes its checkpoint through:

* the lock: ``fast.core.lock.FolderLock`` on out_dir, taken before the first step and
  held to the end (released on any exit; the kernel drops it if the process dies, so
  a crashed run never blocks the next: see ``fast.core.lock``). A second run on the
  same out_dir is refused at once, naming the one that holds it;
* the file: the preflight remembered which checkpoint out_dir held (``Plan.found``:
  none for a fresh run; the file resumed, or the one ``overwrite`` replaces). Once
  the lock is held, and again before every save, ``ckpt.pt`` must still be that file
  -- after a save, the file this run wrote (``fast.core.files.identity``). Anything
  else there was written by someone else: before the first step that refuses the
  run (``OutputRefused``, a ValueError: exit status 2, as every refusal before any
  work), later it stops it (``stop.CheckpointConflict``); it is never replaced.

Only rank 0 of a data-parallel run writes, so only rank 0 locks; a run that saves
no checkpoint writes nothing and takes no lock.
"""

from __future__ import annotations

from fast.core.files import identity
from fast.core.lock import FolderLock
from fast.transformer.network.checkpoint import save_checkpoint
from fast.transformer.training.stop import CheckpointConflict


class OutputRefused(ValueError):
    """Before the first step: out_dir is held by another run, or its checkpoint is no
    longer the one the run's checks saw."""


class RunOutput:
    """``with RunOutput(plan, writes) as out: ... out.save(state) ...`` (the docstring)."""

    def __init__(self, plan, writes: bool):
        self.path, self.expected, self.writes = plan.path, plan.found, writes
        self.lock = FolderLock(plan.path.parent, "out_dir") if writes else None
        self.saved_step: int | None = None

    def _differs(self) -> str:
        """'' when ckpt.pt is the file this run expects; else what is there instead."""
        now = identity(self.path)
        if now == self.expected:
            return ""
        if self.expected is None:
            return f"{self.path} appeared"
        return f"{self.path} was removed" if now is None else f"{self.path} was replaced"

    def __enter__(self) -> RunOutput:
        if self.lock is not None:
            try:
                self.lock.acquire()
            except ValueError as err:                    # FolderBusy, or a planted link
                raise OutputRefused(str(err)) from err
            changed = self._differs()
            if changed:
                self.lock.release()
                raise OutputRefused(f"{changed} after this run's checks (by another run?); "
                                 f"nothing was trained, and it was left as it is: pass "
                                 f"--resume or --overwrite for it, or choose another out_dir")
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.lock.release()

    def save(self, state: dict, step: int) -> str:
        """Write ``state`` (the checkpoint of step ``step``) as ckpt.pt, unless the file
        there is not this run's to replace (``CheckpointConflict``, nothing written)."""
        changed = self._differs()
        if changed:
            kept = (f"this run's last checkpoint was of step {self.saved_step}" if self.saved_step
                    is not None else "this run had written no checkpoint")
            raise CheckpointConflict(
                f"{changed} while this run held out_dir (something that takes no lock wrote "
                f"there); the checkpoint of step {step} was not written over it, {kept}, and "
                f"the run stopped: look at what is there before you resume")
        path = save_checkpoint(self.path, state)
        self.expected, self.saved_step = identity(self.path), step
        return path
