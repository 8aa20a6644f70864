"""The commands of ``python -m fast`` by name, and the dispatcher that runs one.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers": train
the network (sec. 5-6), sample from it, and regenerate the paper-style results
(sec. 7, Table 2, Fig. 2, the memory of sec. 5.4, the speed of sec. 5.5).

    python -m fast                       # this list
    python -m fast train --preset quick  # any command's options: python -m fast train --help

Each command is the ``main(argv)`` of one module of ``fast.commands``; the dispatcher
only finds it, so that ``python -m fast train`` does not import the plotting or
benchmark code.
"""

from __future__ import annotations

import importlib
import sys

from fast.commands.cli import fail

# command -> (module whose main(argv) runs it, what it does)
COMMANDS = {
    "train": ("fast.commands.train", "train a Sparse Transformer (presets, every config field)"),
    "sample": ("fast.commands.sample", "draw images or text from a checkpoint"),
    "bench": ("fast.commands.bench", "attention speed and memory against dense SDPA and "
                                     "FlexAttention; figures/bench_<device>.png"),
    "memory": ("fast.commands.memory", "bytes kept for backward with and without recomputation; "
                                       "figures/memory_*.png"),
    "table2": ("fast.commands.table2", "dense, fixed and strided models on text and images "
                                       "(Table 2); figures/table2_*.png"),
    "table3": ("fast.commands.table3", "test bits per byte of the kept text models against the "
                                       "minimum context (Table 3); figures/table3_context.png"),
    "fig2": ("fast.commands.fig2", "what a dense model learns to attend to (Figure 2); "
                                   "figures/fig2_*.png"),
    "figures": ("fast.commands.figures", "run every figure script in turn (make figures)"),
    "results": ("fast.commands.results", "print the README's result tables from figures/data"),
    "notebooks": ("fast.commands.notebooks", "re-execute notebooks in place"),
    "samples": ("fast.commands.samples", "images, completions and text drawn from the kept "
                                         "models; figures/samples_*.png"),
    "generate": ("fast.commands.generate", "tokens per second of incremental decoding: sparse and "
                                           "dense caches against re-running"),
    "layout-time": ("fast.commands.layout_time", "seconds to build the kernels' layouts at n = "
                                                 "2^20 (the host's part of a first call)"),
    "train-time": ("fast.commands.train_time", "seconds per training iteration of dense, fixed "
                                               "and strided models at Table 2's shapes, against "
                                               "the attention-free floor (GPU)"),
    "gpu-check": ("fast.commands.gpu_check", "a GPU session in 9 minutes: the gpu tests, the "
                                             "variants and the benchmark at the targets, Table "
                                             "2's time (--all: the longer sweeps too)"),
    "peer-hf": ("fast.commands.peer_hf", "transformers' own model tests with sdpa and with the "
                                         "Hugging Face adapter, compared test by test"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(["usage: python -m fast COMMAND [options]   (COMMAND --help for its options)",
                      "", "commands:", *rows])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        fail("python -m fast", f"unknown command {name!r}; allowed: {', '.join(COMMANDS)} "
                               f"(python -m fast --help lists what each does)")
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"python -m fast {name}", *rest]
    result = module.main(rest)
    return result if isinstance(result, int) else 0

