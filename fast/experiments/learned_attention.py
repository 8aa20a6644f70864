"""Figure 2: what a dense Sparse Transformer learns to attend to on images, and how
trained strided and fixed models spend their attention inside their patterns.

Child et al., 2019, sec. 4.1 and Figure 2 (both in sec. 4): a dense network
trained on images shows local attention in early layers, row/column attention
in some, global data-dependent attention in others and very sparse attention in
late layers; that is the evidence for the strided pattern (sec. 4.3).

Here, on the 16x16 greyscale photo crops ("grey16", n = 256):

* the dense model (``configs``) is trained by ``fast.transformer.training.train.train``,
  its weights cached in figures/data/learned_attention.pt (fp16, model only);
* the strided and fixed models are Table 2's image models of seed 0
  (``python -m fast table2`` keeps them in figures/data/models/), when present;
* ``attention_maps`` gives every layer's and head's weights (L, B, H, n, n) on
  test images, from the models' explicit-softmax path (``return_attention=True``);
* ``summarise`` turns them into per-head numbers, each beside uniform attention
  (``fast.measure.attention_stats``: start-token mass; pixel mass in a local
  window of ``WINDOW`` rows and columns, the query's row, its column, elsewhere;
  entropies; the label of every head by the rule stated there), and, for the
  dense model, the mass inside the strided (l = 16, one image row) and fixed
  (l = 16, c = 4) patterns ("in_": all of it, start token included where key 0
  lies in the pattern; "share_in_": the share of the pixel mass, start token left
  out, as the region shares); for a sparse model, the mass on each of its two parts
  over the pixels (``part_masks``: the start token, key 0, is counted once, as "start",
  never inside a part, so start and parts sum to 1 for every head).

    python -m fast fig2 [--quick] [--force] [--iters N] [--layers L] [--threads T]
    python -m fast fig2 --long [--force]
    python -m fast fig2 --depth [--force] [--jobs 2]

writes figures/data/learned_attention.json and the figures (fast.plots.attention).
The dense model is trained only when its cached weights are missing (or --force).
Every training runs in a child process with the kernels pinned
(``fast.experiments.reproducible.child_env``), so its weights are the same on
every x86 host with AVX2.

``--long`` is the heavier run behind a flag: the same dense model trained for
``LONG_ITERS`` steps on one thread (about an hour of a 2-core CPU, too long for
``make figures``' budget). Its weights are kept in figures/data/models/ and its
numbers, with the machine that trained it, in figures/data/learned_attention_long.json;
``make figures`` redraws its figures (fig2_*_long.png) from the kept weights and
retrains it only when they are missing.

``--depth`` asks the question of Figure 2 against depth: the paper found row and
column attention in layers 19-20 of a 128-layer network. Dense models of ``DEPTHS``
layers (narrower: d = ``DEPTH_WIDTH``), each trained for ``DEPTH_ITERS`` steps on one
thread, ``--jobs`` at a time, are kept in figures/data/models/ (fig2_dense_depth{L}.pt,
fp16) with their numbers in figures/data/learned_attention_depth.json; every head is
labelled by the rule of ``fast.measure.attention_stats``, and every layer gets its
row and column lifts (``beats_uniform``: the share of the head's pixel mass on the
query's row, or its column, outside the local window, as a multiple of uniform
attention's share over the same positions). ``make figures`` redraws them from the
kept weights and trains only what is missing; ``--force`` retrains.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from fast.data import load
from fast.experiments.cache import read_cache, resumable
from fast.experiments.paths import DATA, FIGURES, QUICK, named
from fast.experiments.provenance import code_version, write_result
from fast.experiments.reproducible import child_env, kernels, weights_digest
from fast.measure import attention_stats as stats
from fast.measure.bench import machine_info
from fast.measure.child import run_child
from fast.plots import attention as plot_attention
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.checkpoint import load_model, save_weights
from fast.transformer.training.loss import evaluate
from fast.transformer.training.train import train
from reference import patterns

SHAPE = (16, 16, 1)
STRIDE, SUMMARY = 16, 4          # the strided / fixed patterns we ask about: one image row
QUERY_PIXELS = ((10, 8), (13, 3), (8, 13))   # (row, column) of the pixels drawn in Fig. 2
MIN_ROW = 4                      # summaries use every query pixel from this row on
WINDOW = 2                       # "local": within 2 rows and 2 columns of the query pixel
N_IMAGES = 16                    # test images the statistics average over (evenly spread)
THREADS = 2                      # intra-op threads of the dense run: fixed, so its weights do
                                 # not depend on the machine's core count (on a busy machine,
                                 # --threads 1 is faster; the weights then differ in the last bits)
ITERS = 600                      # training steps of the dense run: about 6 minutes of 2 cores
LONG_ITERS, LONG_THREADS = 3000, 1   # --long: five times the steps, one thread (about an hour)
DEPTHS = (6, 12, 24)             # --depth: dense models this deep, all else equal
QUICK_DEPTHS = (1, 2)
DEPTH_WIDTH = 64                 # narrower than the 6-layer models: 24 layers must fit a session
DEPTH_ITERS = 1500               # steps of every depth model, one thread each
ROWCOL_LABELS = ("row", "column", "row+column")   # the rule's labels of row/column heads
PER_LAYER = ("start", "mass", "shares", "entropy", "image_entropy", "topk", "labels",
             "data_dependence", "in_strided", "in_fixed",
             "share_in_strided", "share_in_fixed")           # a dense summary's (L, ...) lists
SPARSE = ("strided", "fixed")    # the trained sparse models drawn beside the dense one
PARTS = {"strided": ("band (last l positions)", "column (every l-th)"),
         "fixed": ("own block", "summaries (last c of each block)")}


def configs(quick: bool = False, iters: int | None = None, layers: int | None = None,
            threads: int = THREADS, width: int = 128) -> tuple[ModelConfig, TrainConfig]:
    """The dense model of Fig. 2 and its training run (``iters``, ``layers`` and the width
    ``width`` override)."""
    model_cfg = ModelConfig(vocab_size=256, n_ctx=256, d_model=width, n_heads=4,
                            n_layers=layers or (3 if quick else 6), pattern="full",
                            combine="merged",
                            stride=STRIDE, embedding="image", image_shape=SHAPE)
    iters = iters or (30 if quick else ITERS)
    train_cfg = TrainConfig(dataset="grey16", batch_size=16, max_iters=iters,
                            warmup_iters=max(2, iters // 10), lr=3e-3, precision="fp32",
                            eval_interval=0, eval_batches=8, log_interval=max(1, iters // 50),
                            seed=0, save_checkpoint=False, cpu_threads=threads,
                            out_dir="runs/learned_attention")
    return model_cfg, train_cfg


def paths(quick: bool, long: bool = False) -> tuple[Path, Path, Path, Path]:
    """(dense weights, summary JSON, kept sparse models folder, figures folder)."""
    root, figures = _roots(quick)
    if long:
        return (root / "models" / "fig2_dense_long.pt", root / "learned_attention_long.json",
                root / "models", figures)
    return root / "learned_attention.pt", root / "learned_attention.json", root / "models", figures


def _roots(quick: bool) -> tuple[Path, Path]:
    return (QUICK, QUICK / "figures") if quick else (DATA, FIGURES)


def depth_paths(quick: bool, layers: int) -> tuple[Path, Path]:
    """(kept weights of the ``layers``-deep model of ``--depth``, the depth JSON)."""
    root, _ = _roots(quick)
    return (root / "models" / f"fig2_dense_depth{layers}.pt",
            root / "learned_attention_depth.json")


def train_one(spec: dict) -> dict:
    """Train one dense model (in a child process: ``train_model``), keep its weights at
    spec["weights"] (fp16) and return its record. spec: {"quick", "iters", "layers",
    "threads", "width", "weights"} (None: the defaults of ``configs``)."""
    model_cfg, train_cfg = configs(spec["quick"], spec.get("iters"), spec.get("layers"),
                                   spec["threads"], spec.get("width") or 128)
    dataset = load(train_cfg.dataset)
    t0, c0 = time.perf_counter(), time.process_time()
    rec = train(model_cfg, train_cfg, progress=False, dataset=dataset)
    model = rec.pop("model").eval()
    save_weights(spec["weights"], model)
    return {"history": rec["history"],
            "val_bits": evaluate(model, dataset, "val", max_batches=None),
            "test_bits": evaluate(model, dataset, "test", max_batches=None),
            "time_per_iter": rec["time_per_iter"], "steps": rec["step"],
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "threads": spec["threads"], "machine": machine_info("cpu"), "kernels": kernels(),
            "n_params": rec["n_params"], "weights_sha256": weights_digest(model),
            "model_cfg": asdict(model_cfg), "train_cfg": asdict(train_cfg),
            "data": dataset.fingerprint(),
            "code": code_version()}    # the code that trained it: a kept record outlives it


def replay(spec: dict) -> list[float]:
    """The child's side of the reproduction check: the first ``spec["steps"]`` steps of the
    dense model as ``train_one`` trains it (``configs`` with spec's "quick", "iters",
    "layers", "threads" and "width", stopped early by ``TrainConfig.stop_iter``, which keeps
    the whole run's schedule). Returns the training losses logged on the way: the committed
    run's first ones, bit for bit, or the code no longer reproduces it
    (tests/fast/experiments/test_committed_results.py)."""
    model_cfg, train_cfg = configs(spec.get("quick", False), spec.get("iters"),
                                   spec.get("layers"), spec["threads"], spec.get("width") or 128)
    train_cfg = replace(train_cfg, stop_iter=spec["steps"])
    return train(model_cfg, train_cfg, progress=False,
                 dataset=load(train_cfg.dataset))["history"]["loss"]


def train_model(weights: Path, quick: bool = False, iters: int | None = None,
                layers: int | None = None, threads: int = THREADS,
                width: int | None = None) -> dict:
    """Train a dense model in a child process (``train_one``, the kernels pinned by
    ``child_env``), keep its weights at ``weights``; returns its record. RuntimeError,
    with the child's output, when the training fails."""
    spec = {"quick": quick, "iters": iters, "layers": layers, "threads": threads,
            "width": width, "weights": str(weights)}
    print(f"learned_attention: training the {f'{layers}-layer ' if layers else ''}dense model "
          f"({threads} thread{'s' if threads > 1 else ''}) -> {weights}", flush=True)
    result = run_child("fast.experiments.learned_attention:train_one", spec,
                       env=child_env(threads))
    if "error" in result:
        raise RuntimeError(f"learned_attention: training {weights.name} {result['error']}\n"
                           f"{result['output']}")
    return result["result"]



def test_images(count: int = N_IMAGES) -> np.ndarray:
    """``count`` test images of grey16, evenly spread over the split: uint8 (count, 256)."""
    test = load("grey16").splits["test"]
    return test[np.arange(count) * len(test) // count]


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


def query_positions(image_shape=SHAPE, min_row: int = MIN_ROW) -> np.ndarray:
    """Positions whose rows are summarised: every pixel from row ``min_row`` on."""
    h, w, c = image_shape
    return np.arange(min_row * w * c, h * w * c)


def pattern_masks(pattern: str, n: int, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of a sparse pattern as read by head ``head`` of a merged layer, as
    disjoint position masks (n, n): A(1), and A(2) without what A(1) already holds (the
    strided pattern's j = i). For "fixed", head h reads the summary sub-block of rank h
    (``reference.heads``: the last c positions of every block for head 0, the c before
    them for head 1, ...); the strided heads all read the same positions."""
    params = {"stride": STRIDE} if pattern == "strided" else {"stride": STRIDE, "c": SUMMARY}
    a1, a2 = patterns.factorized(pattern, n, head if pattern == "fixed" else 0, **params)
    return a1, a2 & ~a1


def part_masks(pattern: str, n: int, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``pattern_masks`` without key 0: the two parts over the pixels only. The start
    token (key 0) lies inside the strided band of the first row and column 0, and inside
    the fixed head whose summary sub-block starts a block; it is measured once, as the
    start token's mass, so the start token and the two parts are disjoint and hold all
    of a head's readable keys (their masses sum to 1)."""
    a1, a2 = pattern_masks(pattern, n, head)
    a1, a2 = a1.copy(), a2.copy()
    a1[:, 0] = a2[:, 0] = False
    return a1, a2


def readable_masks(pattern: str, n: int, n_heads: int) -> np.ndarray:
    """bool (H, n, n): the positions each head of a merged layer may read (the fixed
    heads read different summary sub-blocks, so each head has its own mask)."""
    return np.stack([patterns.union(*pattern_masks(pattern, n, h)) for h in range(n_heads)])


def _tolist(d: dict) -> dict:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in d.items()}


def summarise(maps: np.ndarray, pattern: str = "full", image_shape=SHAPE,
              window: int = WINDOW) -> dict:
    """Per-head numbers of ``maps`` (L, B, H, n, n) of a model with ``pattern``; lists for JSON.

    Every number is averaged over images and over the query positions of
    ``query_positions``, and "uniform" holds the same numbers for uniform
    attention over what the model may read (every earlier position; for a sparse
    model, the positions inside its pattern) -- the baseline to read them against.
    """
    L, B, H, n, _ = maps.shape
    q = query_positions(image_shape)
    a = maps[..., q, :].transpose(0, 2, 1, 3, 4).reshape(L, H, B * len(q), n)   # (L, H, BQ, n)
    qq = np.tile(q, B)
    per_image = maps[..., q, :].transpose(0, 2, 1, 3, 4)                           # (L, H, B, Q, n)
    uni_out = []
    if pattern == "full":
        out = _tolist(stats.head_statistics(a, image_shape, qq, window))
        uni = stats.uniform_weights(n, q)
        uni_out.append(stats.head_statistics(uni, image_shape, q, window))
    else:
        # every head against its own readable positions (the fixed heads' summaries differ)
        heads = []
        readable = readable_masks(pattern, n, H)                                   # (H, n, n)
        for h in range(H):
            mask = readable[h]
            heads.append(stats.head_statistics(a[:, h:h + 1], image_shape, qq, window,
                                               mask=mask))
            uni = stats.uniform_weights(n, q, mask)
            uni_out.append(stats.head_statistics(uni, image_shape, q, window, mask=mask))
        out = {k: (np.concatenate([d[k] for d in heads], axis=1) if k != "labels" else
                   [sum((d[k][layer] for d in heads), []) for layer in range(L)])
               for k in heads[0]}
        out = _tolist(out)
    out["data_dependence"] = stats.data_dependence(per_image).tolist()             # (L, H)
    # uniform attention: the mean over heads of each head's baseline (equal for strided)
    out["uniform"] = _tolist({k: np.mean([u[k] for u in uni_out], axis=0)
                              for k in uni_out[0] if k != "labels"})
    out["uniform"]["labels"] = uni_out[0]["labels"]
    out["uniform"]["data_dependence"] = 0.0
    out.update({"pattern": pattern, "regions": list(stats.REGIONS), "window": window,
                "queries": f"every pixel from row {MIN_ROW} on ({len(q)} positions) of {B} "
                           f"test images"})
    if pattern == "full":
        # "in_": all of the weight inside the pattern, the start token's where key 0 lies in
        # it; "share_in_": the share of the weight on pixels inside it (key 0 left out), the
        # way "shares" measures the regions
        pixels = np.ones((n, n), dtype=bool)
        pixels[:, 0] = False
        for name, mask2 in (("strided", patterns.union(*patterns.strided(n, STRIDE))),
                            ("fixed", patterns.union(*patterns.fixed(n, STRIDE, SUMMARY)))):
            out[f"in_{name}"] = stats.pattern_mass(a, mask2, qq).tolist()            # (L, H)
            out["uniform"][f"in_{name}"] = float(stats.pattern_mass(uni, mask2, q))
            for record, w_, qs in ((out, a, qq), (out["uniform"], uni, q)):
                inside = stats.pattern_mass(w_, mask2 & pixels, qs)
                total = stats.pattern_mass(w_, pixels, qs)
                share = np.divide(inside, total, out=np.zeros_like(inside), where=total > 0)
                record[f"share_in_{name}"] = share.tolist() if share.ndim else float(share)
    else:
        out["parts"] = list(PARTS[pattern])
        # the parts over the pixels; the start token's mass is "start" (key 0 in no part)
        out["part_mass"] = np.stack([np.stack([stats.pattern_mass(a[:, h], m, qq) for m in
                                               part_masks(pattern, n, h)], -1)
                                     for h in range(H)], 1).tolist()                 # (L, H, 2)
        out["uniform"]["part_mass"] = np.mean(
            [[float(stats.pattern_mass(stats.uniform_weights(n, q, readable[h]), m, q))
              for m in part_masks(pattern, n, h)] for h in range(H)], axis=0).tolist()
    return out


def summarise_layers(maps: np.ndarray, chunk: int = 4) -> dict:
    """``summarise`` of a dense model's maps (L, B, H, n, n), ``chunk`` layers at a time (a
    deep model's statistics at once would hold several GB): the same numbers."""
    parts = [summarise(maps[i:i + chunk]) for i in range(0, len(maps), chunk)]
    out = dict(parts[0])
    for key in PER_LAYER:
        out[key] = sum((p[key] for p in parts), [])
    return out


def beats_uniform(summary: dict) -> list[dict]:
    """Per layer, the head that departs most from uniform attention on each statistic:
    local, row, column and row+column pixel shares as multiples of uniform's (the row and
    column outside the local window, as the regions of ``fast.measure.attention_stats``;
    uniform: the same shares of uniform attention over the same readable pixels), the
    lowest image entropy (1 = uniform) and the largest data dependence. The numbers behind
    "which layers beat uniform, by how much"; ``rowcol_heads`` lists the heads the rule labels
    row, column or row+column.

    A head labelled "start sink" parks most of its mass on the start token, so its pixel
    shares and entropy describe a small remainder of its attention: the statistics of a
    layer are taken over its other heads (``heads``), and ``sink_heads`` lists the sinks
    (a layer whose heads are all sinks is measured over all of them, and says so). The
    largest start-token mass is over every head."""
    shares, uni = np.asarray(summary["shares"]), np.asarray(summary["uniform"]["shares"])
    ent = np.asarray(summary["image_entropy"])
    start = np.asarray(summary["start"])
    dep = np.asarray(summary["data_dependence"])
    rows = []
    for layer in range(len(shares)):
        labels = summary["labels"][layer]
        sinks = [h for h, label in enumerate(labels) if label == "start sink"]
        heads = np.array(stats.measured_heads(labels))
        local = shares[layer, heads, 0] / uni[0]
        # a region uniform attention cannot read (outside a sparse pattern) has no lift
        row, column = (np.divide(shares[layer, heads, k], uni[k], out=np.zeros(len(heads)),
                                 where=uni[k] > 0) for k in (1, 2))
        rowcol = (shares[layer, heads, 1] + shares[layer, heads, 2]) / (uni[1] + uni[2])
        rows.append({"layer": layer, "heads": heads.tolist(), "sink_heads": sinks,
                     "local_x": float(local.max()), "local_head": int(heads[local.argmax()]),
                     "rowcol_x": float(rowcol.max()), "rowcol_head": int(heads[rowcol.argmax()]),
                     "row_x": float(row.max()), "row_head": int(heads[row.argmax()]),
                     "column_x": float(column.max()), "column_head": int(heads[column.argmax()]),
                     "rowcol_heads": [h for h, label in enumerate(labels)
                                      if label in ROWCOL_LABELS],
                     "min_entropy": float(ent[layer, heads].min()),
                     "entropy_head": int(heads[ent[layer, heads].argmin()]),
                     "max_start": float(start[layer].max()),
                     "max_data_dependence": float(dep[layer, heads].max()),
                     "labels": labels})
    return rows


def run(*, quick: bool = False, force: bool = False, iters: int | None = None,
        threads: int | None = None, layers: int | None = None, long: bool = False) -> dict:
    """Train the dense model unless its weights are kept (or ``force``, ``iters`` or
    ``layers`` ask for another), measure it and the kept sparse models, write the JSON
    and draw the figures. Returns the JSON's data."""
    weights, summary_path, models, figdir = paths(quick, long)
    weights.parent.mkdir(parents=True, exist_ok=True)
    old = read_cache(summary_path) or {}
    if weights.exists() and "train" in old and not (force or iters or layers):
        print(f"learned_attention: using cached {weights}", flush=True)
        record = old["train"]
    else:
        iters = iters or (LONG_ITERS if long and not quick else None)
        threads = threads or (LONG_THREADS if long else THREADS)
        record = train_model(weights, quick, iters, layers, threads)
    images = test_images()
    result = {"train": record, "query_pixels": [list(p) for p in QUERY_PIXELS],
              "images": f"{len(images)} test images of grey16, evenly spread", "models": {}}
    drawn, readable = {}, {}
    sparse = [] if long else [(p, models / f"image_{p}.pt") for p in SPARSE]
    for name, path in [("full", weights)] + sparse:
        if not path.exists():
            print(f"learned_attention: {path} missing (run python -m fast table2); "
                  f"{name} skipped", flush=True)
            continue
        model = load_model(path)[0]       # what the notebook sees (fp16-rounded weights)
        maps = attention_maps(model, images)
        summary = summarise(maps, model.cfg.pattern)
        summary["layers"] = beats_uniform(summary)
        summary["weights"] = named(path)
        result["models"][name] = summary
        drawn[name] = maps
        if name != "full":
            readable[name] = readable_masks(name, maps.shape[-1], maps.shape[2])  # (H, n, n)
    # the panels show the test image with the most contrast, so that data-dependent
    # attention has something to follow
    shown = int(np.argmax(images.std(1)))
    result["shown_image"] = shown
    write_result(summary_path, result)
    drawn = {name: maps[:, shown] for name, maps in drawn.items()}
    for path in plot_attention.make_all(drawn, images[shown], result, SHAPE, figdir, readable,
                                        suffix="_long" if long else ""):
        print(f"learned_attention: wrote {path}", flush=True)
    return result


def depths(quick: bool) -> tuple[int, ...]:
    """The depths of ``--depth`` (tiny ones under --quick)."""
    return QUICK_DEPTHS if quick else DEPTHS


def run_depth(*, quick: bool = False, force: bool = False, jobs: int = 2) -> dict:
    """Figure 2 against depth: train the dense models of ``depths`` whose weights are not
    kept (all of them with ``force``), ``jobs`` at a time, deepest first; then label every
    head, measure every layer against uniform attention (``beats_uniform``) and draw each
    model's Figure 2 and the row and column lifts against depth. The JSON
    (learned_attention_depth.json) is written after every training. Returns its data."""
    layer_counts = depths(quick)
    summary_path = depth_paths(quick, layer_counts[0])[1]
    _, figdir = _roots(quick)
    data = resumable(summary_path, quick, force)
    data.update({"quick": quick, "depths": list(layer_counts), "width": DEPTH_WIDTH,
                 "images": f"{N_IMAGES} test images of grey16, evenly spread",
                 "query_pixels": [list(p) for p in QUERY_PIXELS]})
    data.setdefault("train", {})
    todo = [layers for layers in sorted(layer_counts, reverse=True)
            if force or str(layers) not in data["train"]
            or not depth_paths(quick, layers)[0].exists()]
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    depth_paths(quick, layer_counts[0])[0].parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(train_model, depth_paths(quick, layers)[0], quick,
                               None if quick else DEPTH_ITERS, layers, 1, DEPTH_WIDTH): layers
                   for layers in todo}
        for future in as_completed(futures):
            layers = futures[future]
            data["train"][str(layers)] = record = future.result()
            write_result(summary_path, data)
            print(f"learned_attention: {layers} layers trained, {record['test_bits']:.3f} "
                  f"test bits/dim, {record['wall_s'] / 60:.0f} min", flush=True)
    images = test_images()
    shown = int(np.argmax(images.std(1)))
    query = stats.pixel_position(*QUERY_PIXELS[0], SHAPE)
    data["shown_image"], data["models"] = shown, {}
    for layers in layer_counts:
        weights = depth_paths(quick, layers)[0]
        maps = attention_maps(load_model(weights)[0], images)             # (L, B, H, n, n)
        summary = summarise_layers(maps)
        summary["layers"] = beats_uniform(summary)
        summary["weights"] = named(weights)
        data["models"][str(layers)] = summary
        path = plot_attention.draw_heads(maps[:, shown], images[shown], query, SHAPE,
                                         summary["labels"],
                                         figdir / f"fig2_learned_attention_depth{layers}.png")
        print(f"learned_attention: wrote {path}", flush=True)
        del maps
    write_result(summary_path, data)
    print(f"learned_attention: wrote {plot_attention.draw_depth(data, figdir / 'fig2_depth.png')}",
          flush=True)
    return data
