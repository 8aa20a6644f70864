"""Table 2 at CPU scale: dense vs fixed vs strided, same model, same budget.

Child et al., 2019, section 7.1 and Table 2: the same network trained with
dense, fixed and strided attention on Enwik8 (text) and CIFAR-10 (images);
held-out bits and time per iteration. Here, on a 2-core CPU:

* text   -- the bytes of Python's standard library (``fast.data`` "stdlib"),
            n = 512, grid width l = 32, fixed summary c = 8;
* images -- 16x16 greyscale crops of the bundled photographs ("grey16"),
            n = 256, l = 16 = one image row, c = 4;

every run a 4-layer, d = 128, 4-head model (merged heads), the same steps,
batch, learning rate, schedule and seed, trained by ``fast.transformer.train.train``;
held-out bits on the test split at the end. At these lengths sparse attention
cannot be faster (the attention is a small part of the step), so the timing
columns of Table 2 are measured separately (``timing``): a 2-layer d = 256
model, one training step of batch 1 at n = 3072 and n = 12288, through the
same ``train`` loop, the mean over the steps after the first.

    python -m fast table2 [--quick] [--force] [--only text/full,...]

Results go to figures/data/table2.json (written after each run; a run already
there is skipped unless --force, so the script resumes). The text-fixed and
image-strided weights are kept (fp16, model only) in figures/data/models/ for
notebook 08, and every model draws a few samples (``fast.transformer.sample``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from fast.core.files import write_json
from fast.data import load
from fast.experiments.paths import DATA, FIGURES, QUICK
from fast.plots import table2 as plot_table2
from fast.plots.style import PATTERN_ORDER
from fast.transformer import checkpoint
from fast.transformer.checkpoint import as_dict, save_weights
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.loss import evaluate
from fast.transformer.sample import sample
from fast.transformer.train import train

KEEP = ("text/fixed", "image/strided")     # weights kept for notebook 08

# The paper's Table 2 (bits, seconds per iteration on their GPUs).
PAPER = {
    "text": {"full": (1.00, 1.31), "fixed": (0.99, 0.55), "strided": (1.13, 0.35),
             "dataset": "Enwik8 (bits per byte)"},
    "image": {"full": (2.82, 0.54), "fixed": (2.85, 0.47), "strided": (2.80, 0.38),
              "dataset": "CIFAR-10 (bits per dim)"},
}


def run_configs(modality: str, pattern: str, quick: bool,
                iters: int | None = None) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configuration of one Table 2 cell (``iters``: steps)."""
    if modality not in ("text", "image") or pattern not in PATTERN_ORDER:
        raise ValueError(f"modality must be 'text' or 'image' and pattern one of "
                         f"{PATTERN_ORDER}, got {modality!r}, {pattern!r}")
    iters = iters or (24 if quick else 300)
    common = dict(d_model=128, n_heads=4, n_layers=2 if quick else 4, pattern=pattern,
                  combine="merged")
    # images learn faster at a higher peak rate (fast.experiments.learned_attention:
    # 3e-3 beat 1e-3 on grey16)
    schedule = dict(max_iters=iters, warmup_iters=max(2, iters // 10), precision="fp32",
                    eval_interval=max(1, iters // 8), eval_batches=4, eval_splits=("val",),
                    log_interval=max(1, iters // 40), seed=0, save_checkpoint=False,
                    out_dir=f"runs/table2/{modality}_{pattern}")
    if modality == "text":
        model = ModelConfig(vocab_size=256, n_ctx=512, stride=32, embedding="text",
                            c=8 if pattern == "fixed" else None, **common)
        tcfg = TrainConfig(dataset="stdlib", data_max_bytes=4_000_000, batch_size=8, lr=1e-3,
                           **schedule)
    else:
        model = ModelConfig(vocab_size=256, n_ctx=256, stride=16, embedding="image",
                            image_shape=(16, 16, 1), c=4 if pattern == "fixed" else None, **common)
        tcfg = TrainConfig(dataset="grey16", batch_size=16, lr=3e-3, **schedule)
    return model, tcfg


def timing_configs(n: int, pattern: str, layers: int) -> tuple[ModelConfig, TrainConfig]:
    """A d=256, 4-head model of ``layers`` blocks at length n, for time per iteration."""
    image = n == 3072
    model = ModelConfig(vocab_size=256, n_ctx=n, d_model=256, n_heads=4, n_layers=layers,
                        pattern=pattern, combine="merged", stride=96 if image else 128,
                        c=32 if pattern == "fixed" else None,
                        embedding="image" if image else "text",
                        image_shape=(32, 32, 3) if image else None)
    tcfg = TrainConfig(dataset="photos32" if image else "stdlib", data_max_bytes=200_000,
                       batch_size=1, max_iters=4, warmup_iters=1, precision="fp32",
                       eval_interval=0, eval_batches=1, log_interval=1, save_checkpoint=False,
                       out_dir="runs/table2/timing")
    return model, tcfg


def load_kept_model(path):
    """A model saved by this script (fp16 weights) as a float32 SparseTransformer, eval mode."""
    return checkpoint.load_model(path)[0]


def out_paths(quick: bool) -> tuple[Path, Path, Path]:
    """(JSON, kept-models folder, figures folder) of a full or a --quick run."""
    if quick:
        return QUICK / "table2.json", QUICK / "models", QUICK / "figures"
    return DATA / "table2.json", DATA / "models", FIGURES


def run_one(modality: str, pattern: str, quick: bool, datasets: dict,
            iters: int | None = None) -> dict:
    """Train one cell; returns its record (and keeps the weights of KEEP runs)."""
    model_cfg, train_cfg = run_configs(modality, pattern, quick, iters)
    t0 = time.perf_counter()
    rec = train(model_cfg, train_cfg, progress=True, dataset=datasets[modality])
    wall = time.perf_counter() - t0
    model = rec["model"].eval()
    test_bits = evaluate(model, datasets[modality], "test", batch_size=16,
                         max_batches=4 if quick else 24)
    gen = torch.Generator().manual_seed(0)
    if modality == "image":
        samples = sample(model, 4 if quick else 8, generator=gen)
    else:
        prompt = torch.tensor(list(b"def "), dtype=torch.long)
        samples = sample(model, 2, length=48 if quick else 200, prompt=prompt, generator=gen)
    key = f"{modality}/{pattern}"
    if key in KEEP:
        save_weights(out_paths(quick)[1] / f"{modality}_{pattern}.pt", model)
    return {
        "model_cfg": as_dict(model_cfg), "train_cfg": as_dict(train_cfg),
        "history": rec["history"], "evals": rec["evals"], "val_bits": rec["final"]["val"],
        "test_bits": test_bits, "time_per_iter": rec["time_per_iter"],
        "n_params": rec["n_params"], "steps": rec["step"], "wall_s": wall, "unit": rec["unit"],
        "samples": samples.tolist(),
    }


def run_timing(quick: bool) -> list[dict]:
    """Time per training step of every pattern at the paper's lengths (``timing_configs``)."""
    rows = []
    lengths = (1024, 3072) if quick else (3072, 12288)
    for n in lengths:
        for pattern in PATTERN_ORDER:
            model_cfg, train_cfg = timing_configs(n, pattern, 1 if quick else 2)
            rec = train(model_cfg, train_cfg, progress=False)
            rows.append({"n": n, "pattern": pattern, "layers": model_cfg.n_layers,
                         "d": model_cfg.d_model, "heads": model_cfg.n_heads,
                         "stride": model_cfg.stride, "c": model_cfg.c, "batch": 1,
                         "time_per_iter": rec["time_per_iter"], "iter_times": rec["iter_times"]})
            print(f"timing n={n} {pattern}: {rec['time_per_iter']:.3f} s/iter", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny runs, for development")
    parser.add_argument("--force", action="store_true", help="redo runs whose results exist")
    parser.add_argument("--only", default="", help="comma list of keys, e.g. text/full,timing")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON (default: figures/data/table2.json)")
    parser.add_argument("--iters", type=int, default=None,
                        help="training steps per run (default 300)")
    args = parser.parse_args(argv)
    out, _, figdir = out_paths(args.quick)
    args.out = args.out or out

    keys = [f"{m}/{p}" for m in ("text", "image") for p in PATTERN_ORDER] + ["timing"]
    only = [k for k in args.only.split(",") if k]
    bad = sorted(set(only) - set(keys))
    if bad:
        raise ValueError(f"--only takes keys from {keys}, got {bad}")
    data = json.loads(args.out.read_text()) if args.out.exists() and not args.force else {}
    if data.get("quick", args.quick) != args.quick:
        raise ValueError(f"{args.out} holds {'quick' if data['quick'] else 'full'} results; "
                         f"pass --force to replace them, or another --out")
    data.update({"quick": args.quick, "paper": PAPER, "torch": torch.__version__,
                 "python": platform.python_version(),
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, CPU only"})
    data.setdefault("runs", {})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    datasets = {}
    for key in only or keys:
        if key == "timing":
            if "timing" in data and not args.force and not only:
                continue
            data["timing"] = run_timing(args.quick)
        else:
            if key in data["runs"] and not args.force and not only:
                print(f"experiments: {key} cached, skipped", flush=True)
                continue
            modality, pattern = key.split("/")
            if not datasets:
                datasets["text"] = load("stdlib", max_bytes=4_000_000)
                datasets["image"] = load("grey16")
            data["runs"][key] = run_one(modality, pattern, args.quick, datasets, args.iters)
            r = data["runs"][key]
            print(f"experiments: {key}: test {r['test_bits']:.3f} {r['unit']}, "
                  f"{r['time_per_iter']:.3f} s/iter, {r['wall_s']:.0f} s", flush=True)
        write_json(args.out, data)
    for path in plot_table2.make_all(data, figdir):
        print(f"experiments: wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
