"""How much memory recomputation saves: measured, written to figures/data/memory.json.

Child et al., 2019, section 5.4 and Figure 4: with recomputation only each
residual block's input is kept for the backward pass, which is how "dense
attention networks with hundreds of layers on sequence lengths of 16,384" were
trained. The blog post gives a table of attention memory for a 64-layer model.

    python -m fast memory [--quick] [--force] [--steps a,b]     (fast.commands.memory)

Steps (each result is written to the JSON as soon as it exists; a step whose
result is already there is skipped unless --force, so the script resumes):

* depth    -- bytes saved for backward (``fast.measure.memory.count_saved``) of
              d=256, 4 heads, strided l=128, n=3072, for depths 1..64, with and
              without recomputation; the target: at 64 layers >= 10x less;
* length   -- the same at 8 layers for n = 1024 .. 16384, strided and dense;
* peak     -- peak resident memory of a forward + backward step (Linux
              VmHWM) vs depth, with and without recomputation, and its time:
              wall clock and CPU seconds, median of 3 runs per point;
* blog     -- the blog's table beside ours: per-layer bytes of the explicit
              masked softmax (stores n x n weights, as the blog counts) and of
              our flash-style dense path, scaled to 64 layers;
* figures  -- figures/memory_*.png and the Fig. 4 dataflow drawing (beside the JSON
              when --out names it: every output follows --out).

and, behind a flag (``python -m fast memory --big``, ``run_big``), the paper's own scale:

* big      -- one training step (forward, backward, AdamW) of a 128-layer,
              d=256 strided model at n=16384 with recomputation; its peak
              memory, and -- from the per-layer bytes measured on a 2-layer
              model -- what it would need without. Written to
              figures/data/memory_big.json with the code that measured it. It takes
              about 5 minutes of this 2-core CPU, a ninth of ``make figures``' budget,
              so ``make figures`` measures it only when that file is missing (like
              Figure 2's longer runs); ``--big --force`` measures it again.

Every measurement is ``fast.measure.model_memory.measure``, run in a fresh child
process (``fast.measure.child``), so that one run's freed-but-cached memory
never inflates or hides the next one's peak. Batch size 1, float32, CPU.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from fast.experiments.cache import resumable
from fast.experiments.paths import DATA, FIGURES, QUICK
from fast.experiments.provenance import write_result
from fast.measure import child
from fast.measure.model_memory import MALLOC_ENV, per_layer
from fast.plots import memory as plot_memory

CACHE = DATA / "memory.json"
BIG = DATA / "memory_big.json"
STEPS = ("depth", "length", "peak", "blog", "figures")

# The shape of the paper's CIFAR-10 / Enwik8-like stacks (Table 1): d = 256.
BASE = dict(d=256, heads=4, stride=128, c=32, batch=1)


def measure_in_child(specs: list[dict]) -> list[dict]:
    """Measure each spec, in order, in one fresh Python process (``fast.measure.child``);
    returns spec + result dicts.

    Give a step ("step": peak memory) a process of its own: the peak is measured
    above the resident memory at its start, which earlier runs would inflate.
    """
    out = child.run_child("fast.measure.model_memory:measure_all", specs, env=MALLOC_ENV)
    if "error" in out:
        raise RuntimeError(f"memory measurement {specs} {out['error']}\n{out['output']}")
    return [{**spec, **res} for spec, res in zip(specs, out["result"])]


# ----------------------------------------------------------------------------
# The steps.
# ----------------------------------------------------------------------------

def _spec(**kw) -> dict:
    spec = {**BASE, "pattern": "strided", "impl": "sparse", "what": "saved", "recompute": False}
    spec.update(kw)
    return spec


def step_depth(quick: bool) -> dict:
    depths = [1, 2, 4, 8] if quick else [1, 2, 4, 8, 16, 32, 64]
    n = 1024 if quick else 3072
    rows = measure_in_child([_spec(n=n, layers=L, recompute=r)
                             for L in depths for r in (False, True)])
    return {"n": n, "rows": rows}


def step_length(quick: bool) -> dict:
    lengths = [256, 512, 1024] if quick else [1024, 3072, 8192, 16384]
    layers = 2 if quick else 8
    rows = measure_in_child([_spec(n=n, layers=layers, pattern=p, recompute=r)
                             for n in lengths for p in ("strided", "full") for r in (False, True)])
    return {"layers": layers, "rows": rows}


TIMED = ("total_s", "forward_s", "cpu_user_s", "cpu_sys_s", "minor_faults")


def step_peak(quick: bool, repeats: int = 3) -> dict:
    """Peak memory and time of a whole step: one fresh process per point, the step
    run ``repeats`` times in it (the peak is the first run's). A row holds the
    first run's numbers, the median of every timed field over the runs, and the
    runs themselves (``runs``)."""
    depths = [2, 4] if quick else [4, 16, 64]
    n = 1024 if quick else 3072
    rows = []
    for L in depths:
        for r in (False, True):
            row = measure_in_child([_spec(n=n, layers=L, recompute=r, what="step",
                                          repeats=repeats)])[0]
            for k in TIMED:
                values = [run[k] for run in row["runs"] if run[k] is not None]
                row[k] = statistics.median(values) if values else None
            rows.append(row)
    return {"n": n, "repeats": repeats, "rows": rows,
            "timing": "median of the runs; CPU seconds = user + system time of the "
                      "measuring process during the step"}


# The blog's table: attention memory of a 64-layer, 4-head model (fp32 weights).
BLOG = [
    {"what": "1024 text tokens", "n": 1024, "stored": 1.0e9, "recomputed": 16e6},
    {"what": "32x32x3 image", "n": 3072, "stored": 9.6e9, "recomputed": 151e6},
    {"what": "64x64x3 image", "n": 12288, "stored": 154e9, "recomputed": 2.4e9},
    {"what": "24,000 audio samples", "n": 24000, "stored": 590e9, "recomputed": 9.2e9},
]


def step_blog(quick: bool) -> dict:
    """Per-layer bytes (difference of 1- and 2-layer dense models), times 64."""
    rows = []
    for entry in BLOG[:2] if quick else BLOG:
        n = entry["n"]
        impls = [("flash", "sparse", False), ("recompute", "sparse", True)]
        if n <= 3072:   # the explicit (n, n) softmax: the quantity the blog counts
            impls.append(("masked", "masked", False))
        specs = [_spec(n=n, layers=L, pattern="full", impl=impl, recompute=rc)
                 for _, impl, rc in impls for L in (1, 2)]
        res = measure_in_child(specs)
        row = dict(entry)
        for i, (name, _, _) in enumerate(impls):
            row[f"ours_{name}_per_layer"] = per_layer(res[2 * i], res[2 * i + 1])
            row[f"ours_{name}_64"] = 64 * row[f"ours_{name}_per_layer"]
        # the blog's arithmetic: 64 layers x 4 heads x n^2 fp32 weights
        row["formula_stored"] = 64 * 4 * n * n * 4
        rows.append(row)
    return {"layers": 64, "heads": 4, "d": BASE["d"], "rows": rows}


def step_big(quick: bool) -> dict:
    layers, n = (8, 4096) if quick else (128, 16384)
    step = measure_in_child([_spec(n=n, layers=layers, recompute=True, what="step",
                                   optimizer=True)])[0]
    small = measure_in_child([_spec(n=n, layers=L, recompute=False) for L in (1, 2)])
    # Bytes kept without recomputation: what 2 layers measured, plus one block's
    # worth for each further layer; then the same weights, gradients and Adam state.
    block = per_layer(*small)
    without_saved = small[1]["saved_bytes"] + (layers - 2) * block
    state = 4 * step["param_bytes"]      # weights, gradients, Adam's two moments
    return {
        "layers": layers, "n": n, "step": step, "no_recompute_small": small,
        "per_layer_without": block,
        "estimated_saved_without": without_saved,
        "estimated_peak_without": without_saved + state,
        "measured_peak_with": step["peak_bytes"],
        "machine_total_bytes": _total_memory(),
    }


def _total_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None


def out_paths(quick: bool, out: Path | None = None) -> tuple[Path, Path]:
    """(JSON, figures folder) of a full or a --quick run, or of a run written to ``out``
    (--out): its PNGs then go beside it, never into figures/."""
    if out is not None:
        return Path(out), Path(out).parent
    return (QUICK / "memory.json", QUICK / "figures") if quick else (CACHE, FIGURES)


def step_figures(data: dict, figdir: Path) -> dict:
    paths = plot_memory.make_all(data, figdir)
    return {"paths": [str(p) for p in paths]}



def run(*, steps=STEPS, quick: bool = False, force: bool = False, out: Path | None = None) -> dict:
    """Run ``steps`` in order, skipping those whose result is in ``out`` (unless ``force``),
    writing the JSON after each; the figures go beside ``out`` when it is given
    (``out_paths``). Returns its data; CacheError when ``out`` cannot be resumed from."""
    out, figdir = out_paths(quick, out)
    data = resumable(out, quick, force)
    data["quick"] = quick
    data["machine"] = f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}"
    funcs = {"depth": step_depth, "length": step_length, "peak": step_peak,
             "blog": step_blog}
    for name in tqdm(steps, desc="memory_report", unit="step"):
        if name in data and not force and name != "figures":
            continue
        t0 = time.perf_counter()
        data[name] = step_figures(data, figdir) if name == "figures" else funcs[name](quick)
        data[name]["seconds"] = round(time.perf_counter() - t0, 1)
        write_result(out, data, indent=1)
        tqdm.write(f"memory_report: {name} done in {data[name]['seconds']} s")
    return data


def big_path(quick: bool, out: Path | None = None) -> Path:
    """The JSON of ``run_big``: ``out``, or figures/data/memory_big.json (--quick: under
    runs/quick/)."""
    return Path(out) if out is not None else (QUICK / BIG.name if quick else BIG)


def run_big(*, quick: bool = False, force: bool = False, out: Path | None = None) -> dict:
    """The ``big`` step (module docstring) into its own JSON (``big_path``), stamped with
    the code that measured it; kept as it is when that file holds a result and not
    ``force``. Returns its data."""
    out = big_path(quick, out)
    data = resumable(out, quick, force)
    if "big" in data:
        tqdm.write(f"memory_report: big kept from {out} (--force measures it again)")
        return data
    t0 = time.perf_counter()
    data = {"quick": quick,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}",
            "big": step_big(quick)}
    data["big"]["seconds"] = round(time.perf_counter() - t0, 1)
    write_result(out, data, indent=1)
    tqdm.write(f"memory_report: big done in {data['big']['seconds']} s")
    return data
