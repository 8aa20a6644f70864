"""Regenerate every figure of the project, training included: ``python -m fast figures``.

Child et al., 2019 -- the commands below redraw Figure 2 (learned attention,
``python -m fast fig2``), Figure 4 and the blog's memory table (recomputation,
``python -m fast memory``), Table 2 (dense / fixed / strided, ``python -m fast
table2``) and the CPU attention benchmark (``python -m fast bench``). Each runs
in its own process, in this order, with its own progress bar; ``make figures``
then re-executes the notebooks (``python -m fast notebooks notebooks/*.ipynb``),
which read the caches these commands write under figures/data/.

    python -m fast figures            # from scratch (about 40 min on 2 CPU cores)
    python -m fast figures --resume   # after an interruption: keep what is cached
    python -m fast figures --quick    # tiny versions, written under runs/quick/
    python -m fast figures --only memory,experiments

From scratch, every command is given ``--force`` (it rewrites its cache step by
step, so ``--resume`` continues where it stopped). Wall times go to
figures/data/make_figures.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tqdm import tqdm

from fast.core import cli
from fast.core.files import write_json
from fast.experiments.paths import DATA

# step -> (command of python -m fast, takes --force/--quick, rough minutes on an idle 2-core CPU)
STEPS = {
    "bench": ("bench", False, 8),
    "memory": ("memory", True, 5),
    "experiments": ("table2", True, 18),
    "learned_attention": ("fig2", True, 6),
}
BENCH_OUTPUT = DATA / "bench_cpu.json"
LOG = DATA / "make_figures.json"


def command(name: str, quick: bool, resume: bool) -> list[str] | None:
    """The command line of step ``name``, or None when it is to be skipped."""
    fast_command, flags, _ = STEPS[name]
    cmd = [sys.executable, "-m", "fast", fast_command]
    if not flags:
        # the benchmark has no cache logic of its own: skip it when resuming over its output
        if quick or (resume and BENCH_OUTPUT.exists()):
            return None
        return cmd
    if quick:
        cmd.append("--quick")
    if not resume:
        cmd.append("--force")
    return cmd


def parser() -> cli.Parser:
    """The options of ``python -m fast figures`` (builds the parser, does no work)."""
    one_step = cli.choice(STEPS)
    p = cli.Parser("python -m fast figures", description=__doc__.splitlines()[0])
    p.add_argument("--resume", action="store_true", help="keep cached results, do the rest")
    p.add_argument("--quick", action="store_true", help="tiny versions under runs/quick/")
    p.add_argument("--only", default=[], metavar="STEP,STEP",
                   type=lambda text: [one_step(s) for s in text.split(",") if s],
                   help=f"comma list of {', '.join(STEPS)} (default: all, in that order)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_or_exit(argv)
    names = args.only or list(STEPS)

    log = {"steps": {}, "quick": args.quick, "resume": args.resume}
    start = time.perf_counter()
    bar = tqdm(names, desc="make_figures", unit="script")
    for name in bar:
        cmd = command(name, args.quick, args.resume)
        bar.set_postfix(step=name, budget=f"~{STEPS[name][2]} min")
        if cmd is None:
            tqdm.write(f"make_figures: {name} skipped")
            continue
        tqdm.write(f"make_figures: {' '.join(cmd[1:])}")
        t0 = time.perf_counter()
        result = subprocess.run(cmd)
        seconds = round(time.perf_counter() - t0, 1)
        log["steps"][name] = {"command": " ".join(cmd[2:]), "seconds": seconds,
                              "returncode": result.returncode}
        if result.returncode != 0:
            tqdm.write(f"make_figures: {name} failed (exit {result.returncode}) after {seconds} s; "
                       f"fix it and rerun with --resume")
            return result.returncode
        tqdm.write(f"make_figures: {name} done in {seconds} s")
    log["total_seconds"] = round(time.perf_counter() - start, 1)
    if not args.quick:
        old = json.loads(LOG.read_text()) if LOG.exists() else {"steps": {}}
        old["steps"].update(log["steps"])          # --only keeps the other steps' times
        old.update({k: v for k, v in log.items() if k != "steps"})
        LOG.parent.mkdir(parents=True, exist_ok=True)
        write_json(LOG, old, indent=1)
    print(f"make_figures: all done in {log['total_seconds'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
