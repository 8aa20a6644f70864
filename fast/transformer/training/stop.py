"""How a run stops early: saved on a signal, never saved once its numbers are not finite.

Child et al., 2019, section 6 trains for days on machines that get preempted, and
section 5.6's mixed precision can overflow; neither may cost the run or leave a
checkpoint that cannot be used. Every early stop is a ``RunStopped`` carrying the
exit status ``python -m fast train`` ends with (one line on stderr, no traceback):

* ``Interrupted`` -- SIGTERM (preemption, ``kill``, a scheduler) or SIGINT (Ctrl-C):
  ``Signals`` notes the signal; the step under way finishes, a checkpoint of that
  step is written (when the run saves checkpoints) and the run stops with status
  128 + the signal's number (143, 130), the shell's convention for "ended by a
  signal", so a script that chains commands does not go on as if it had finished.
  The checkpoint resumes like any other, to the same weights as an uninterrupted
  run. A second signal is handled as Python would (the handlers are restored after
  the first), so a run can always be stopped at once;
* ``NonFinite`` -- the loss or a weight turned NaN or inf (a learning rate far too
  high, an overflow): ``FiniteWatch`` notes, each step, whether the loss and the
  weights after the update are finite (on the device, no wait of its own; read
  every step on the CPU, where the next forward pass would refuse NaN, and
  elsewhere before every log line, evaluation and save). The run stops at once
  with status 1, naming the first bad step; nothing after it is saved, so the last
  checkpoint (if any) holds finite weights and resumes;
* ``CheckpointConflict`` -- status 1: the checkpoint in out_dir is no longer the
  one this run expects (``fast.transformer.training.output``).

Status 2 stays what it means for every command: refused before any work.
A checkpoint that cannot be written is ``CheckpointWriteError`` (status 1).
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}


class RunStopped(RuntimeError):
    """A run that stopped before its end; ``status`` is the command's exit status."""
    status = 1


class NonFinite(RunStopped):
    status = 1


class CheckpointConflict(RunStopped):
    status = 1


class Interrupted(RunStopped):
    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum, self.status = signum, 128 + signum


class Signals:
    """``with Signals() as s:`` -- SIGTERM and SIGINT set ``s.received`` (the signal's
    number) instead of ending the process; restored on exit, or at the first signal.
    Outside the main thread (where Python cannot take signals) it does nothing."""

    def __init__(self):
        self.received: int | None = None
        self.before: dict = {}

    def _note(self, signum, frame) -> None:
        self.received = signum
        self._restore()                  # a second signal acts as it always did

    def _restore(self) -> None:
        for signum, handler in self.before.items():
            signal.signal(signum, handler)
        self.before = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for signum in NAMES:
                self.before[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()


class FiniteWatch:
    """Per step, whether the loss and every weight are finite, kept on the device until
    ``first_bad`` reads them (one wait for all the steps since the last read)."""

    def __init__(self, model: torch.nn.Module):
        self.params = [p for p in model.parameters()]
        self.pending: list[tuple[int, torch.Tensor]] = []

    def add(self, step: int, loss: torch.Tensor) -> None:
        """Note step ``step``: its loss, and the weights after its update."""
        largest = torch.stack(torch._foreach_norm(self.params, float("inf")))   # max |w| each
        self.pending.append((step, torch.isfinite(loss.detach()).all()
                             & torch.isfinite(largest).all()))

    def first_bad(self, world: int = 1) -> int | None:
        """The first noted step that was not finite (on any rank), or None; forgets them."""
        bad = None
        if self.pending:
            oks = torch.stack([ok for _, ok in self.pending]).cpu().tolist()   # one wait
            bad = next((s for (s, _), ok in zip(self.pending, oks) if not ok), None)
        self.pending.clear()
        if world > 1:                    # every rank stops at the same, first bad step
            code = torch.tensor([float("inf") if bad is None else bad], dtype=torch.float64,
                                device=self.params[0].device)
            dist.all_reduce(code, op=dist.ReduceOp.MIN)
            bad = None if code.item() == float("inf") else int(code.item())
        return bad


def agreed_signal(signals: Signals, world: int, device) -> int | None:
    """The signal any rank received (every rank stops at the same step), or None."""
    got = signals.received
    if world > 1:
        flag = torch.tensor([got or 0], dtype=torch.int64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        got = int(flag.item()) or None
    return got
