"""The seconds of every training step, timed without making the host wait for the GPU.

Child et al., 2019, section 6 (training) and Table 2 (time per iteration). On CUDA a
``torch.cuda.synchronize`` per step, which timing by wall clock would need, is a wait
that the loss scaler's one per step does not make necessary, so the loop times its
steps with a pair of CUDA events each, read only where the host waits anyway.
"""

from __future__ import annotations

import time

import torch


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
