"""``python -m fast layout-time``: seconds to build the kernels' layouts at long n.

Child et al., 2019, section 5.5: the host's part of the Triton kernel's first call at
a new n (``fast.experiments.layout_time``). Prints the minimum and every time of each
case, and the peak resident memory of this process.

    python -m fast layout-time [--n 1048576] [--repeat 3] [--tables]
"""

from __future__ import annotations

import resource

from fast.commands import cli
from fast.experiments.layout_time import CASES, build_times
from reference.params import check_params

COMMAND = "python -m fast layout-time"


def parser() -> cli.Parser:
    """The parser of ``python -m fast layout-time``; builds nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--n", type=cli.integer(1, cli.MAX_SEQUENCE), default=2**20,
                   help="sequence length (default 2**20)")
    p.add_argument("--heads", type=cli.integer(1, 1024), default=8, help="heads (default 8)")
    p.add_argument("--block", type=cli.integer(1, 4096), default=64,
                   help="slots per block (default 64)")
    p.add_argument("--repeat", type=cli.integer(1, 1000), default=3,
                   help="builds timed per case (default 3)")
    p.add_argument("--tables", action="store_true",
                   help="also write the look-up tables on the CPU (GiBs at n = 2**20 for fixed)")
    return p


def main(argv=None) -> int:
    args = parser().parse_or_exit(argv)
    for pattern, params in CASES:                       # every case checked before any build
        for combine in ("merged", "multihead"):
            try:
                check_params(pattern, args.n, args.heads, combine, 0, params)
            except ValueError as err:
                cli.fail(COMMAND, f"--n {args.n} --heads {args.heads} for {pattern} "
                                  f"{params} ({err}); allowed: sizes every case accepts")
    build_times(args.n, args.heads, args.block, args.repeat, args.tables)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak resident memory of this process: {peak:.2f} GiB")
    return 0
