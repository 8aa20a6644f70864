"""Figure 2: what a dense Sparse Transformer learns to attend to on images.

Child et al., 2019, section 3 ("Motivation") and Figure 2: a dense network
trained on images shows local attention in early layers, row/column attention
in some, global data-dependent attention in others and very sparse attention in
late layers; that is the evidence for the strided pattern (sec. 4.3).

Here: a 6-layer, d=128, 4-head dense model ("full" pattern) trained by
``fast.transformer.train.train`` (500 steps of batch 16, peak learning rate 3e-3:
at 1e-3 and 200 steps every layer stayed close to uniform attention) on the
16x16 greyscale photo crops ("grey16", n = 256), its weights cached in
figures/data/ (fp16, model only). Then, for test images:

* ``attention_maps``  -- every layer's and head's weights (L, B, H, n, n), from
  the model's explicit-softmax path (``return_attention=True``);
* ``layer_summary``   -- per layer and head: mass in a local window / the
  query's row / column / elsewhere, normalised entropy, top-k mass, and the mass
  inside the strided (l = 16 = one row) and fixed (l = 16, c = 4) patterns,
  each beside what uniform attention would give (``fast.measure.attention_stats``);

    python -m fast fig2 [--quick] [--force]

writes figures/data/learned_attention.json and the figures (fast.plots.attention).
The model is trained only when its cached weights are missing (or --force).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from fast.core.files import write_json
from fast.data import load
from fast.experiments.paths import DATA, FIGURES, QUICK
from fast.measure import attention_stats as stats
from fast.plots import attention as plot_attention
from fast.transformer import checkpoint
from fast.transformer.checkpoint import as_dict, save_weights
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.loss import evaluate
from fast.transformer.train import train
from reference import patterns

SHAPE = (16, 16, 1)
STRIDE, SUMMARY = 16, 4          # the strided / fixed patterns we ask about: one image row
QUERY_PIXELS = ((10, 8), (13, 3), (8, 13))   # (row, column) of the pixels drawn in Fig. 2
MIN_ROW = 4                      # summaries use every query pixel from this row on


def configs(quick: bool = False, iters: int | None = None) -> tuple[ModelConfig, TrainConfig]:
    """The dense model of Fig. 2 and its training run (``iters`` overrides the steps)."""
    model_cfg = ModelConfig(vocab_size=256, n_ctx=256, d_model=128, n_heads=4,
                            n_layers=3 if quick else 6, pattern="full", combine="merged",
                            stride=STRIDE, embedding="image", image_shape=SHAPE)
    iters = iters or (30 if quick else 500)
    train_cfg = TrainConfig(dataset="grey16", batch_size=16, max_iters=iters,
                            warmup_iters=max(2, iters // 10), lr=3e-3, precision="fp32",
                            eval_interval=0, eval_batches=8, log_interval=max(1, iters // 50),
                            seed=0, save_checkpoint=False, out_dir="runs/learned_attention")
    return model_cfg, train_cfg


def paths(quick: bool) -> tuple[Path, Path, Path]:
    """(weights, summary JSON, figures folder); --quick writes under runs/quick/."""
    if quick:
        return QUICK / "learned_attention.pt", QUICK / "learned_attention.json", QUICK / "figures"
    return DATA / "learned_attention.pt", DATA / "learned_attention.json", FIGURES


def train_model(quick: bool = False, iters: int | None = None) -> tuple[torch.nn.Module, dict]:
    """Train the dense model; returns (model, record without the model)."""
    model_cfg, train_cfg = configs(quick, iters)
    dataset = load(train_cfg.dataset)
    t0 = time.perf_counter()
    rec = train(model_cfg, train_cfg, progress=True, dataset=dataset)
    model = rec.pop("model").eval()
    rec["test_bits"] = evaluate(model, dataset, "test", batch_size=16,
                                max_batches=4 if quick else None)
    rec["wall_s"] = time.perf_counter() - t0
    return model, {"history": rec["history"], "val_bits": rec["final"]["val"],
                   "test_bits": rec["test_bits"], "time_per_iter": rec["time_per_iter"],
                   "steps": rec["step"], "wall_s": rec["wall_s"], "n_params": rec["n_params"],
                   "model_cfg": as_dict(model_cfg), "train_cfg": as_dict(train_cfg)}


def load_model(path) -> torch.nn.Module:
    """The cached dense model (fp16 weights on disk), float32, eval mode."""
    return checkpoint.load_model(path)[0]


def test_images(count: int = 8) -> np.ndarray:
    """The first ``count`` test images of grey16, uint8 (count, 256)."""
    return load("grey16").splits["test"][:count]


@torch.no_grad()
def attention_maps(model, images: np.ndarray) -> np.ndarray:
    """Every layer's and head's attention weights: float32 (L, B, H, n, n).

    images: uint8 (B, n). The model reads them shifted right by the start token
    (as in training), so row i holds the weights with which pixel i is
    predicted from the start token and pixels 0..i-1 -- query position i reads
    positions j <= i of the shifted input, i.e. pixels j - 1.
    """
    x = torch.as_tensor(np.asarray(images, dtype=np.int64))
    start = torch.full((x.shape[0], 1), model.cfg.vocab_size, dtype=torch.long)
    idx = torch.cat([start, x[:, :-1]], dim=1)                           # (B, n)
    _, weights = model(idx, return_attention=True)
    return torch.stack(weights).numpy()                                  # (L, B, H, n, n)


def to_pixels(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position-space weights (..., n) -> (pixel-space weights (..., n), start-token mass (...)).

    Key position j of the shifted input holds pixel j - 1 (key 0: the start
    token), so pixel p's weight is column p + 1; the last pixel is never read.
    """
    pix = np.zeros_like(weights)
    pix[..., :-1] = weights[..., 1:]
    return pix, weights[..., 0]


def query_positions(image_shape=SHAPE, min_row: int = MIN_ROW) -> np.ndarray:
    """Positions whose rows are summarised: every pixel from row ``min_row`` on."""
    h, w, c = image_shape
    return np.arange(min_row * w * c, h * w * c)


def layer_summary(maps: np.ndarray, image_shape=SHAPE, window: int = 1, k: int = 8) -> dict:
    """Per-layer and per-head summaries of ``maps`` (L, B, H, n, n); lists for JSON.

    Masses are averaged over images and over the query positions of
    ``query_positions``; "uniform" holds the same numbers for uniform causal
    attention, the baseline every learned number should be read against.
    Region masses are taken over *pixels* (``to_pixels``: they sum to 1 minus
    the start token's mass, "start"); pattern masses over *positions*, where a
    sparse model applies its pattern.
    """
    n = maps.shape[-1]
    q = query_positions(image_shape)
    a = maps[..., q, :]                                                  # (L, B, H, Q, n)
    pix, start = to_pixels(a)
    mass = stats.region_mass(pix, image_shape, q, window).mean(1)        # (L, H, 4)
    ent, top = stats.concentration(a, q, k)                              # (L, B, H) each
    ent, top = ent.mean(1), top.mean(1)
    strided_mask = patterns.union(*patterns.strided(n, STRIDE))
    fixed_mask = patterns.union(*patterns.fixed(n, STRIDE, SUMMARY))
    in_strided = stats.pattern_mass(a, strided_mask, q).mean(1)          # (L, H)
    in_fixed = stats.pattern_mass(a, fixed_mask, q).mean(1)
    uni = stats.uniform_weights(n, q)
    uni_pix, uni_start = to_pixels(uni)
    uni_mass = stats.region_mass(uni_pix, image_shape, q, window)
    uni_ent, uni_top = stats.concentration(uni, q, k)
    layer_mass = mass.mean(1)                                            # (L, 4)
    labels = [stats.classify_layer(layer_mass[i], top[i].mean(), uni_mass)
              for i in range(len(layer_mass))]
    head_labels = [[stats.classify_layer(mass[i, h], top[i, h], uni_mass)
                    for h in range(mass.shape[1])] for i in range(len(mass))]
    return {
        "regions": list(stats.REGIONS), "window": window, "k": k,
        "queries": f"every pixel from row {MIN_ROW} on ({len(q)} positions), "
                   f"{maps.shape[1]} test images",
        "mass": mass.tolist(), "layer_mass": layer_mass.tolist(),
        "start": start.mean((1, 3)).tolist(),                            # (L, H)
        "entropy": ent.tolist(), "topk": top.tolist(),
        "in_strided": in_strided.tolist(), "in_fixed": in_fixed.tolist(),
        "labels": labels, "head_labels": head_labels,
        "uniform": {"mass": uni_mass.tolist(), "start": float(uni_start.mean()),
                    "entropy": float(uni_ent), "topk": float(uni_top),
                    "in_strided": float(stats.pattern_mass(uni, strided_mask, q)),
                    "in_fixed": float(stats.pattern_mass(uni, fixed_mask, q))},
    }


def pixel_position(row: int, col: int, image_shape=SHAPE) -> int:
    """Raster position of pixel (row, col), channel 0 (``attention_stats.pixel_position``)."""
    return stats.pixel_position(row, col, image_shape)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, for development")
    parser.add_argument("--force", action="store_true", help="retrain even if cached")
    parser.add_argument("--iters", type=int, default=None, help="training steps (default 500)")
    args = parser.parse_args(argv)
    weights, summary_path, figdir = paths(args.quick)
    weights.parent.mkdir(parents=True, exist_ok=True)
    if weights.exists() and summary_path.exists() and not args.force:
        print(f"learned_attention: using cached {weights}", flush=True)
        model = load_model(weights)
        summary = json.loads(summary_path.read_text())
    else:
        model, record = train_model(args.quick, args.iters)
        save_weights(weights, model)
        model = load_model(weights)          # what the notebook will see (fp16-rounded)
        summary = {"train": record}
    maps = attention_maps(model, test_images())
    summary.update(layer_summary(maps))
    summary["query_pixels"] = [list(p) for p in QUERY_PIXELS]
    write_json(summary_path, summary)
    image = test_images(1)[0]
    for path in plot_attention.make_all(maps[:, 0], image, summary, SHAPE, figdir):
        print(f"learned_attention: wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
