"""The seconds of every training step, timed without making the host wait for the GPU.

Child et al., 2019, section 6 (training) and Table 2 (time per iteration). On CUDA a
``torch.cuda.synchronize`` per step, which timing by wall clock would need, is a wait
that the loss scaler's one per step does not make necessary, so the loop times its
steps with a pair of marks of the device's own clock each (``fast.core.clock``: CUDA
events on a GPU), read only where the host waits anyway.
"""

from __future__ import annotations

import torch

from fast.core.clock import Clock


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
        self.clock = Clock(device)
        self._done: list[float] = []
        self._pending: list[tuple] = []      # (start mark, stop mark) not yet read

    def start(self) -> None:
        self._pending.append((self.clock.mark(), None))

    def stop(self) -> None:
        self._pending[-1] = (self._pending[-1][0], self.clock.mark())

    def collect(self) -> None:
        """Read the marks recorded so far (on CUDA: waits for the last one) and let them
        go; the training loop calls it at its logging steps, where ``loss.item()`` waits
        anyway, so that a long run does not hold two events per step."""
        self._done += self.clock.elapsed(self._pending)
        self._pending = []

    def seconds(self) -> list[float]:
        self.collect()
        return list(self._done)
