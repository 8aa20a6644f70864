"""How long a layout takes to build at long n: the host part of the kernel's first call.

Child et al., 2019, section 5.5 and the long sequences of the paper's title: the
first call of ``fast.kernels.triton_attention.triton_sparse_attention`` at a new n
builds the pattern's block layout on the host (``fast.layout.block_layout``) and
writes its tables on the device. This script times the host part for the long
sweep's settings (B = 1, H = 8, block 64, strided l = 256, fixed l = 256 c = 32,
merged and multi-head heads), each build from scratch, and the tables written on
the CPU (``LayoutPart.tables``: what the GPU does in the first call, here on the
CPU's memory):

    python -m fast layout-time [--n 1048576] [--repeat 3]     (fast.commands.layout_time)

It prints the minimum and every time (a shared machine is noisy) and the peak
resident memory of this process.
"""

from __future__ import annotations

import time

from fast.layout import block_layout

CASES = (("strided", dict(stride=256)), ("fixed", dict(stride=256, c=32)))


def build_times(n: int, heads: int, block: int, repeat: int, tables: bool) -> list[dict]:
    rows = []
    for pattern, params in CASES:
        for combine in ("merged", "multihead"):
            build, write = [], []
            for _ in range(repeat):
                t = time.perf_counter()
                lay = block_layout(pattern, n, heads, combine, block_size=block, **params)
                build.append(time.perf_counter() - t)
                if tables:
                    t = time.perf_counter()
                    for part in lay.parts:
                        part.tables("cpu")
                    write.append(time.perf_counter() - t)
            rows.append({"pattern": pattern, "combine": combine, "n": n, "heads": heads,
                         "block": block, "params": params, "build_s": build,
                         "tables_cpu_s": write,
                         "tiles": sum(p.n_blocks_computed for p in lay.parts)})
            extra = f", tables on the CPU min {min(write):.2f} s" if write else ""
            print(f"{pattern:8} {combine:9} n={n}: build min {min(build):.2f} s "
                  f"(all {', '.join(f'{x:.2f}' for x in build)}){extra}; "
                  f"{rows[-1]['tiles']} tiles", flush=True)
    return rows
