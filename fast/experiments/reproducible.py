"""What makes the figure scripts' trainings repeatable bit for bit, and how a record shows it.

Child et al., 2019, sections 6-7: Table 2 and Figure 2 are trainings whose results this
project commits, so a rerun must give the same numbers. Floating-point addition is not
associative: a kernel that sums in another order gives other last bits, and training
carries them on (Table 2's image runs amplify them into visible differences of their
held-out bits; its text runs keep them in the last digits). What fixes the order of a
CPU run:

* its seed (``fast.transformer.training.seed``);
* its number of intra-op threads (a parallel reduction splits its work by thread):
  ``threads`` here, one for Table 2's runs;
* the attention backend: Table 2's runs name theirs ("structured",
  ``fast.experiments.table2.run_configs``). "auto" would follow crossovers measured
  on one machine (``fast.backends.crossovers``, which a re-measurement changes), and the
  naive and the structured paths sum in different orders (Table 2's image/fixed seed 2 ended 0.07
  bits apart on the two);
* the versions of PyTorch and of the MKL inside it;
* the vector instructions the kernels run. PyTorch chooses at start-up, per CPU,
  between the AVX2 and the AVX-512 builds of its own kernels (ATen's "CPU
  capability"), and MKL chooses its own code path. Two cloud hosts that both call
  their CPU "AMD EPYC" differ there: the same seed, threads and library versions
  gave other weights on an AVX-512 host than on an AVX2 host, and forcing the AVX2
  kernels on the AVX-512 host gave back the AVX2 host's results bit for bit
  (docs/design.md, "Reproducibility", has the numbers).

So ``child_env`` gives every child process that trains or evaluates for a committed
figure ``ATEN_CPU_CAPABILITY=avx2`` and ``MKL_CBWR=AVX2`` (MKL's conditional numerical
reproducibility, AVX2 code path) where the CPU has AVX2 -- every x86-64 CPU from
2013-2015 on. Elsewhere (ARM, or x86 without
AVX2) nothing is pinned, and a result repeats on the same kind of CPU only. The
variables must be set before PyTorch picks its kernels, hence a child process
(``fast.measure.child.run_child``). ``kernels`` records what a process ran with, and
``weights_digest`` names its trained weights: two runs are bitwise equal when their
digests are.
"""

from __future__ import annotations

import hashlib
import os

import torch

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
AVX2_OR_BETTER = ("AVX2", "AVX512")      # what torch.backends.cpu.get_cpu_capability() says


def child_env(threads: int = 1) -> dict[str, str]:
    """Environment variables for a child that trains or evaluates: ``threads`` intra-op
    threads, and the AVX2 kernels of PyTorch and MKL where this CPU has AVX2 (``PINNED``)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if torch.backends.cpu.get_cpu_capability() in AVX2_OR_BETTER:
        env.update(PINNED)
    return env


def avx512_env(threads: int = 1) -> dict[str, str]:
    """Environment variables for a child that runs an AVX-512 host's own kernels (what a
    run without the pin does there): to measure what the pin changes, never for results."""
    return {**{k: v for k, v in child_env(threads).items() if k not in PINNED},
            "ATEN_CPU_CAPABILITY": "avx512"}


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (an empty set where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return set()


def kernels() -> dict:
    """The kernels this process runs -- PyTorch's CPU capability and MKL's reproducibility
    mode (None when unset) -- and whether the host has AVX-512 (None when unknown): two
    hosts with the same CPU name can differ there."""
    flags = cpu_flags()
    return {"aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR"),
            "host_avx512": ("avx512f" in flags) if flags else None}


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 (first 16 hex digits) of a model's state, names, shapes, dtypes and bytes in
    order: equal for bitwise-equal weights, different after any change of one bit."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]
