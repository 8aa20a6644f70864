"""``python -m fast figures``: regenerate every figure of the project, training included.

Child et al., 2019 -- the commands below run in this order (``STEPS``), each in its
own process with its own progress bar: the CPU attention benchmark (``python -m fast
bench``), Figure 4 and the blog's memory table (recomputation, ``python -m fast
memory``; its 128-layer step, ``memory --big``, kept), Table 2 (dense / fixed / strided,
``python -m fast table2``), Table 3 (its kept text models against the minimum context,
``python -m fast table3``), Figure 2 (learned attention, ``python -m fast fig2``: the
kept dense model measured beside Table 2's new image models; the heavier ``--long`` run
and the models of ``--depth`` redrawn from their kept weights), the samples of Table 2's kept models
(``python -m fast samples``) and the decoding speed (``python -m fast generate``);
``make figures`` then re-executes the notebooks (``python -m fast notebooks
notebooks/*.ipynb``), which read the caches these commands write under figures/data/.

    python -m fast figures            # from scratch (the last run's minutes per step:
                                      # figures/data/make_figures.json)
    python -m fast figures --resume   # after an interruption: keep what is cached
    python -m fast figures --quick    # tiny versions, written under runs/quick/
    python -m fast figures --only memory,experiments

From scratch, every command is given ``--force`` (it rewrites its cache step by
step, so ``--resume`` continues where it stopped). Wall times go to
figures/data/make_figures.json.
"""

from __future__ import annotations

import subprocess
import sys
import time

from tqdm import tqdm

from fast.commands import cli
from fast.experiments.cache import read_cache
from fast.experiments.paths import DATA, FIGURES
from fast.experiments.provenance import write_result

# step -> (command of python -m fast, the flags it takes of --quick/--force, rough minutes on
# an idle 2-core CPU (shown beside the progress bar; what the last run took is in
# figures/data/make_figures.json, and tests/fast/experiments/test_figure_scripts.py holds
# their sum to the 45-minute budget), the output whose presence skips it under --resume
# when it takes no --force). Order: Table 2 before Figure 2 (Fig. 2 draws Table 2's kept
# image models) and before the samples (drawn from every kept model); the decoding
# benchmark uses untrained weights and goes last.
STEPS = {
    "bench": ("bench", (), 5, DATA / "bench_cpu.json"),
    "memory": ("memory", ("--quick", "--force"), 5.5, None),
    # the paper's scale (128 layers at n = 16384, about 5 minutes): measured only when
    # figures/data/memory_big.json is missing (python -m fast memory --big --force redoes it)
    "memory_big": ("memory --big", ("--quick",), 0.1, DATA / "memory_big.json"),
    "experiments": ("table2", ("--quick", "--force"), 21, None),
    # Table 3 evaluates Table 2's kept text models: after Table 2
    "table3": ("table3", ("--quick", "--force"), 1, None),
    # Figure 2: the dense model's kept weights (figures/data/learned_attention.pt, 8 minutes
    # of training, which tests/fast/experiments/test_committed_results.py ties to the code)
    # measured again beside Table 2's new image models and drawn; python -m fast fig2
    # --force retrains it. The heavier Fig. 2 runs (fig2 --long, about an hour; fig2
    # --depth, a few hours) likewise: redrawn from their kept weights, never retrained
    # here (no --force), trained only if they are missing
    "learned_attention": ("fig2", ("--quick",), 0.7, None),
    "learned_attention_long": ("fig2 --long", ("--quick",), 0.5, FIGURES / "fig2_layers_long.png"),
    "learned_attention_depth": ("fig2 --depth", ("--quick",), 1, FIGURES / "fig2_depth.png"),
    "samples": ("samples", (), 0.5, None),
    "generate": ("generate", ("--quick",), 2.3, DATA / "generation.json"),
}
LOG = DATA / "make_figures.json"


def command(name: str, quick: bool, resume: bool) -> list[str] | None:
    """The command line of step ``name``, or None when it is to be skipped: under --quick
    when the command has no quick version, under --resume when it has no cache logic of its
    own (no --force) and its output is there."""
    fast_command, flags, _, output = STEPS[name]
    if (quick and "--quick" not in flags) or (resume and "--force" not in flags
                                              and output is not None and output.exists()):
        return None
    cmd = [sys.executable, "-m", "fast", *fast_command.split()]
    if quick:
        cmd.append("--quick")
    if not resume and "--force" in flags:
        cmd.append("--force")
    return cmd


def parser() -> cli.Parser:
    """The options of ``python -m fast figures`` (builds the parser, does no work)."""
    p = cli.Parser("python -m fast figures", description=cli.about(__doc__))
    p.add_argument("--resume", action="store_true", help="keep cached results, do the rest")
    p.add_argument("--quick", action="store_true", help="tiny versions under runs/quick/")
    p.add_argument("--only", default=[], type=cli.names(STEPS),
                   help="the steps to run (default: all, in the order listed)")
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
        old = read_cache(LOG) or {"steps": {}}
        old["steps"].update(log["steps"])          # --only keeps the other steps' times
        old.update({k: v for k, v in log.items() if k != "steps"})
        LOG.parent.mkdir(parents=True, exist_ok=True)
        write_result(LOG, old, indent=1)
    print(f"make_figures: all done in {log['total_seconds'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
