"""``python -m fast train-time``: seconds per training iteration on a GPU, against the floor.

Child et al., 2019, Table 2's time column: dense / fixed / strided, and the same model
with no attention work (``none``, the floor every row is read against). What is timed
and how is ``fast.experiments.gpu_iteration_time``; this command writes
figures/data/gpu_iteration_time.json (``--out``: DIR/data/...) after every row, marked
``"complete": false`` until the last.

    python -m fast train-time [--shapes enwik8 cifar10] [--batch 8] [--out DIR]
"""

from __future__ import annotations

from pathlib import Path

from fast.commands import cli
from fast.experiments.gpu_iteration_time import ROWS, SHAPES, run
from fast.experiments.paths import DATA
from fast.experiments.provenance import write_result
from fast.transformer.network.devices import resolve_device

COMMAND = "python -m fast train-time"


def parser() -> cli.Parser:
    """The parser of ``python -m fast train-time``; builds nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--shapes", nargs="+", type=cli.choice(SHAPES), default=list(SHAPES))
    p.add_argument("--patterns", nargs="+", type=cli.choice(ROWS), default=list(ROWS),
                   help="rows per shape, measured in the order none (attention-free: the "
                        "floor), full, fixed, strided; default all")
    p.add_argument("--batch", type=cli.integer(1, 4096), default=8, help="sequences per step")
    p.add_argument("--warm", type=cli.integer(0, 10**4), default=10, help="untimed steps first")
    p.add_argument("--steps", type=cli.integer(1, 10**4), default=10, help="timed steps")
    p.add_argument("--device", type=cli.device, default="auto",
                   help="auto (CUDA if present), cuda, cuda:1 (a GPU is needed)")
    p.add_argument("--out", type=cli.writable_folder, default=None,
                   help="write DIR/data/gpu_iteration_time.json (default figures/data/)")
    return p


def main(argv=None) -> int:
    args = parser().parse_or_exit(argv)
    device = resolve_device(args.device)
    if device.type != "cuda":
        cli.fail(COMMAND, f"--device {args.device} is the CPU; allowed: a GPU (train-time "
                          f"measures GPU iterations; on the CPU the tests call "
                          f"fast.experiments.gpu_iteration_time.run with a small shape)")
    folder = Path(args.out) / "data" if args.out else DATA
    cli.writable_or_exit(COMMAND, folder)
    path = folder / "gpu_iteration_time.json"
    run({s: SHAPES[s] for s in args.shapes}, args.patterns, args.batch, device,
        warm=args.warm, steps=args.steps, save=lambda data: write_result(path, data, indent=1),
        log=lambda line: print(line, flush=True))
    print(f"wrote {path}")
    return 0
