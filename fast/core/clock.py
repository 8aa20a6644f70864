"""A device's own clock: marks on the CPU's wall clock or on a CUDA stream, read later.

Child et al., 2019, section 5.5 and Table 2 compare attention and training
steps by their time. Timing work on a GPU by the host's wall clock needs a
``torch.cuda.synchronize`` before each reading, a wait the work itself does not
need (and, in a training loop, one per step). So time is read here from marks:

* on the CPU a mark is ``time.perf_counter()``;
* on CUDA a mark is a ``torch.cuda.Event(enable_timing=True)`` recorded on the
  current stream: the GPU stamps it when it gets there, and the host goes on.

``Clock(device).mark()`` makes a mark and waits for nothing; ``seconds(start,
stop)`` reads the time between two marks and ``elapsed(pairs)`` between each
pair of a list, waiting (on CUDA) only for the last stop mark to be reached: the
one wait, at the moment the caller chooses to read. A CUDA interval is the GPU's
time from the start mark to the stop mark on that stream (work queued before the
start mark is not in it; host time spent between launches is, when the GPU sat
idle waiting for it).

Everything that times work builds on this: the benchmarks' timing rules
(``fast.measure.timing``) and the training loop's step clock.
"""

from __future__ import annotations

import time

import torch


class Clock:
    """Marks on ``device``'s own clock (module docstring); no host-device wait of its own."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def mark(self):
        """Now, on this device's clock: a float on the CPU, a recorded CUDA event on CUDA."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, stop) -> float:
        """Seconds from mark ``start`` to mark ``stop`` (on CUDA: waits for ``stop``)."""
        return self.elapsed([(start, stop)])[0]

    def elapsed(self, pairs) -> list[float]:
        """Seconds of each (start, stop) pair of marks, in order; on CUDA waits once, for
        the last stop mark (a stream runs its marks in order)."""
        pairs = list(pairs)
        if not self.cuda:
            return [stop - start for start, stop in pairs]
        if pairs:
            pairs[-1][1].synchronize()
        return [start.elapsed_time(stop) / 1e3 for start, stop in pairs]
