"""Figure 2 redrawn: a model's attention over an image, per layer and head.

Child et al., 2019, Figure 2: for one query pixel, each panel shows where a
layer (head) looks; the not-yet-generated region is black. Data from
``python -m fast fig2`` (``fast.experiments.learned_attention``). Every panel of
a figure shares one colour scale, logarithmic from ``VMIN`` to 1 and drawn as a
colour bar, so a near-uniform head (every weight about 1/i) looks dim next to a
sharp one; the start token's weight is the square outside the image's top-left
corner; pixels a sparse model may not read are grey.

* ``draw_heads``   -- one query pixel: rows = layers, columns = heads;
* ``draw_layers``  -- several query pixels: rows = pixels, columns = layers
  (head-averaged);
* ``draw_mass``    -- per layer: where the mass goes (start token, local window,
  row, column, elsewhere), how far each layer's most local / most row-column
  head is above uniform attention, every head's image entropy and data dependence
  (start sinks marked apart and left out of the mean, as the layer statistics leave
  them out), and the share of its pixel mass (start token left out, as the region
  shares) a dense model puts inside the strided and fixed patterns -- each beside uniform;
* ``draw_parts``   -- trained sparse models: the mass on each part of the pattern;
* ``draw_depth``   -- dense models of several depths: per layer, the row and the column
  lift of the most row-like and most column-like head (its share of the pixel mass on
  the query's row or column, outside the local window, over uniform attention's), and
  how many heads get each label.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LogNorm
from matplotlib.patches import Rectangle

from fast.measure.attention_stats import (
    CONCENTRATED,
    LABELS,
    MOST,
    SPREAD,
    measured_heads,
    pixel_position,
    split_start,
)
from fast.plots import style
from fast.plots.style import plt

VMIN = 1e-3                                         # weights below are drawn as VMIN
NORM = LogNorm(vmin=VMIN, vmax=1.0)
CMAP = plt.get_cmap("viridis")
OUTSIDE = (0.62, 0.62, 0.62)                        # pixels outside a sparse pattern
# start token, local, row, column, elsewhere
REGION_COLORS = (style.BLACK, style.BLUE, style.ORANGE, style.GREEN, style.LIGHT_GREY)
NAMES = {"full": "dense"}


def attention_image(weights_pos: np.ndarray, query: int, image_shape,
                    readable: np.ndarray | None = None) -> np.ndarray:
    """RGB (H, W, 3): where position ``query`` looks, over pixels, on the shared scale.

    weights_pos: (n,) weights of one query over key positions (key j = pixel
    j - 1, key 0 the start token); readable: bool (n,) positions the model may
    read (None: all). Pixels not generated yet are black, pixels outside the
    pattern grey.
    """
    h, w, c = image_shape
    pix, _ = split_start(np.asarray(weights_pos, dtype=np.float64))
    pix = pix.reshape(h, w, c).sum(-1)                                   # (H, W)
    rgb = CMAP(NORM(np.clip(pix, VMIN, 1.0)))[..., :3]
    if readable is not None:
        inside = np.zeros(h * w * c, dtype=bool)
        inside[:-1] = np.asarray(readable, dtype=bool)[1:]
        rgb[~inside.reshape(h, w, c).any(-1)] = OUTSIDE
    rgb[np.arange(h * w).reshape(h, w) >= query // c] = 0.0
    return rgb


def _panel(ax, weights_pos, query, image_shape, readable, title):
    ax.imshow(attention_image(weights_pos, query, image_shape, readable),
              interpolation="nearest")
    start = float(weights_pos[0])
    ax.add_patch(Rectangle((-2.6, -2.6), 1.8, 1.8, clip_on=False, lw=0.6, edgecolor="white",
                           facecolor=CMAP(NORM(max(start, VMIN)))))
    _mark(ax, query, image_shape)
    ax.set_xlim(-2.8, image_shape[1] - 0.5)
    ax.set_ylim(image_shape[0] - 0.5, -2.8)
    ax.set_title(title, fontsize=7)
    ax.axis("off")


def _show_image(ax, image: np.ndarray, query: int, image_shape, title: str):
    h, w, c = image_shape
    img = np.asarray(image, dtype=np.float64).reshape(h, w, c).mean(-1) / 255.0
    rgb = np.repeat(img[..., None], 3, axis=-1)
    rgb[np.arange(h * w).reshape(h, w) >= query // c] = 0.0
    ax.imshow(rgb, interpolation="nearest")
    _mark(ax, query, image_shape)
    ax.set_xlim(-2.8, w - 0.5)
    ax.set_ylim(h - 0.5, -2.8)
    ax.set_title(title, fontsize=7.5)
    ax.axis("off")


def _mark(ax, query: int, image_shape):
    _, w, c = image_shape
    r, col = divmod(query // c, w)
    ax.add_patch(Rectangle((col - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.2))


def _colorbar(fig, axes):
    bar = fig.colorbar(ScalarMappable(norm=NORM, cmap=CMAP), ax=axes, shrink=0.7, aspect=30)
    bar.set_label("attention weight (log scale, shared by every panel)", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def draw_heads(maps: np.ndarray, image: np.ndarray, query: int, image_shape, labels, path,
               pattern: str = "full", readable: np.ndarray | None = None):
    """maps: (L, H, n, n) of one image. Rows = layers, columns = [image, heads...];
    labels: (L, H) head labels; readable: bool (H, n, n), the positions each head of a
    sparse model may read (``fast.experiments.learned_attention.readable_masks``): per
    head, since the heads of one layer may read different positions (the fixed
    pattern's summary sub-blocks), and grey marks what is outside that head's own."""
    L, H = maps.shape[:2]
    n = maps.shape[-1]
    if readable is not None and np.shape(readable) != (H, n, n):
        raise ValueError(f"readable must be one mask per head, (H, n, n) = {(H, n, n)}, "
                         f"got shape {np.shape(readable)}")
    fig, axes = plt.subplots(L, H + 1, figsize=(1.3 * (H + 1) + 0.9, 1.5 * L + 0.7),
                             squeeze=False, layout="constrained")
    for layer in range(L):
        _show_image(axes[layer, 0], image, query, image_shape, f"layer {layer}")
        for head in range(H):
            row_mask = None if readable is None else readable[head, query]
            start = float(maps[layer, head, query, 0])
            _panel(axes[layer, head + 1], maps[layer, head, query], query, image_shape, row_mask,
                   f"h{head}: {labels[layer][head]}\nhere: start {start:.2f}")
    r, c = divmod(query // image_shape[2], image_shape[1])
    extra = "; grey = outside the pattern" if readable is not None else ""
    fig.suptitle(f"Fig. 2, {NAMES.get(pattern, pattern)} model: where pixel (row {r}, col {c}) "
                 f"looks (red); black = not yet generated{extra};\nsquare outside the corner = "
                 f"start token. Labels: averages over many test images and query\npixels (one "
                 f"image, one query drawn); 'here: start' = this panel's weight on the start token",
                 fontsize=8.5)
    _colorbar(fig, axes)
    return style.save(fig, path)


def draw_layers(maps: np.ndarray, image: np.ndarray, queries, image_shape, labels, path):
    """maps: (L, H, n, n) of one image; head-averaged. Rows = query pixels, columns = layers."""
    L = maps.shape[0]
    avg = maps.mean(1)                                                   # (L, n, n)
    fig, axes = plt.subplots(len(queries), L + 1,
                             figsize=(1.3 * (L + 1) + 0.9, 1.5 * len(queries) + 0.6),
                             squeeze=False, layout="constrained")
    for row, q in enumerate(queries):
        _show_image(axes[row, 0], image, q, image_shape, "image so far")
        for layer in range(L):
            counts = {lab: labels[layer].count(lab) for lab in dict.fromkeys(labels[layer])}
            text = "\n".join(f"{k} x{v}" if v > 1 else k for k, v in counts.items())
            _panel(axes[row, layer + 1], avg[layer, q], q, image_shape, None,   # a label a line
                   f"layer {layer}" + (f"\n{text}" if row == 0 else ""))
    fig.suptitle("dense model, head-averaged attention of every layer for three query pixels "
                 "(one shared log scale; square = start token);\nlabels: every head's, averaged "
                 "over many test images and query pixels, not over the three drawn", fontsize=8.5)
    _colorbar(fig, axes)
    return style.save(fig, path)


def draw_mass(summary: dict, path):
    """Six panels per layer of the dense model, each beside uniform attention."""
    mass = np.asarray(summary["mass"]).mean(1)                           # (L, 4)
    start = np.asarray(summary["start"]).mean(1)                         # (L,)
    uni = summary["uniform"]
    L = len(mass)
    fig, axes = plt.subplots(2, 3, figsize=(13.0, 7.0))
    ax = axes[0, 0]
    xs = list(range(L)) + [L + 0.6]
    bottom = np.zeros(L + 1)
    columns = [start] + list(mass.T)
    uni_cols = [uni["start"]] + list(uni["mass"])
    for vals, uval, name, color in zip(columns, uni_cols, ["start token"] + summary["regions"],
                                       REGION_COLORS):
        v = np.append(vals, uval)
        ax.bar(xs, v, bottom=bottom, color=color, width=0.75,
               label=name if name != "local" else f"local (within {summary['window']} px)")
        bottom += v
    ax.set_xticks(xs, [str(i) for i in range(L)] + ["uniform"], fontsize=7.5)
    ax.set_xlabel("layer (mean over heads)")
    ax.set_ylabel("attention mass")
    ax.set_title("where the mass goes", fontsize=9)
    ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0))

    ax = axes[0, 1]
    layers = summary["layers"]
    ax.plot(range(L), [r["local_x"] for r in layers], "o-", color=style.BLUE,
            label="local share, most local head")
    ax.plot(range(L), [r["rowcol_x"] for r in layers], "s-", color=style.ORANGE,
            label="row+column share, most row/column head")
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="uniform attention")
    ax.set_ylim(0, None)
    ax.set_xlabel("layer")
    ax.set_ylabel("share of pixel mass / uniform's")
    ax.set_title("how far the best head beats uniform", fontsize=9)
    ax.legend(fontsize=6.5)
    ax.grid(alpha=0.3)

    ax = axes[0, 2]
    _per_head(ax, np.asarray(summary["image_entropy"]), 1.0, "uniform = 1", summary["labels"])
    ax.axhline(SPREAD, color=style.GREEN, lw=0.8, ls="--", label=f"global at {SPREAD} or above")
    ax.axhline(CONCENTRATED, color=style.RED, lw=0.8, ls="--",
               label=f"concentrated at {CONCENTRATED} or below")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("image entropy / uniform's")
    ax.set_title("how spread the pixel mass is", fontsize=9)
    ax.legend(fontsize=6.5, loc="lower left")

    ax = axes[1, 0]
    _per_head(ax, np.asarray(summary["data_dependence"]), 0.0, "uniform (or any fixed pattern) = 0",
              summary["labels"])
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("mean total-variation distance")
    ax.set_title("how much the weights change from image to image", fontsize=9)
    ax.legend(fontsize=6.5, loc="upper left")

    ax = axes[1, 1]
    for name, marker in (("strided", "o-"), ("fixed", "s-")):
        if f"share_in_{name}" not in summary:
            continue
        ax.plot(range(L), np.asarray(summary[f"share_in_{name}"]).mean(1), marker,
                color=style.color(name), label=f"inside {name}")
        ax.axhline(uni[f"share_in_{name}"], color=style.color(name), ls=":",
                   label=f"uniform, {name}")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("layer (mean over heads)")
    ax.set_ylabel("share of pixel mass inside the pattern (l = 16)")
    ax.set_title("would the sparse pattern hold it?", fontsize=9)
    ax.legend(fontsize=6.5)
    ax.grid(alpha=0.3)

    ax = axes[1, 2]
    ax.axis("off")
    lines = [f"layer {i}: " + ", ".join(labels) for i, labels in enumerate(summary["labels"])]
    ax.text(0.0, 1.0, "head labels (h0, h1, ...)\n\n" + "\n".join(lines), va="top",
            fontsize=7.5, family="monospace", transform=ax.transAxes)
    fig.suptitle("dense model, per layer, against uniform attention over the same positions",
                 fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


def _per_head(ax, values: np.ndarray, uniform: float, uniform_label: str, labels=None):
    """values (L, H): every head a dot, the mean over heads a line, uniform dotted.

    labels (L lists of H, ``label_head``'s): a head labelled "start sink" describes with
    its pixel numbers only the small rest of its mass, so it is drawn with its own marker
    and left out of the mean -- the heads a layer's statistics are taken over
    (``measured_heads``), as ``learned_attention.beats_uniform`` takes them."""
    L, H = values.shape
    kept = np.ones((L, H), bool)                                         # (L, H)
    if labels is not None:
        kept[:] = False
        for layer, names in enumerate(labels):
            kept[layer, measured_heads(names)] = True
    for layer in range(L):
        ax.plot(np.full(kept[layer].sum(), layer), values[layer, kept[layer]], "o", ms=4,
                color=style.GREY, alpha=0.7)
    mean = [values[layer, kept[layer]].mean() for layer in range(L)]
    ax.plot(range(L), mean, "-", color=style.GREY, label="heads (dots), mean (line)")
    if not kept.all():
        layer, head = np.nonzero(~kept)
        ax.plot(layer, values[layer, head], "x", ms=7, mew=1.8, color=style.PURPLE,
                label="start sink (left out of the mean)")
    ax.axhline(uniform, color="black", lw=0.8, ls=":", label=uniform_label)
    ax.set_xlabel("layer")
    ax.grid(alpha=0.3)


def draw_parts(summaries: dict, path):
    """summaries: {pattern: summary} of trained sparse models. Per layer, stacked: start
    token and each part's mass; beside it uniform attention inside the pattern. Under each
    layer, "most common:" and the most common of its heads' labels (``_majority``: a tie goes
    to the tied label that comes first in head order). The
    start token and the parts are disjoint (``learned_attention.part_masks``), so every
    head's bars sum to 1; a summary whose do not raises ValueError."""
    for pattern, s in summaries.items():
        total = np.asarray(s["start"]) + np.asarray(s["part_mass"]).sum(-1)      # (L, H)
        uniform = s["uniform"]["start"] + sum(s["uniform"]["part_mass"])
        if not (np.allclose(total, 1.0, atol=1e-3) and np.isclose(uniform, 1.0, atol=1e-3)):
            raise ValueError(f"{pattern}: start token and parts must sum to 1 per head (each "
                             f"key counted once), got {np.round(total, 3).tolist()} and "
                             f"uniform {uniform:.3f}")
    fig, axes = plt.subplots(1, len(summaries), figsize=(5.0 * len(summaries), 3.6),
                             squeeze=False)
    for ax, (pattern, s) in zip(axes[0], summaries.items()):
        part = np.asarray(s["part_mass"]).mean(1)                        # (L, 2)
        start = np.asarray(s["start"]).mean(1)
        L = len(part)
        xs = list(range(L)) + [L + 0.6]
        bottom = np.zeros(L + 1)
        cols = [(np.append(start, s["uniform"]["start"]), "start token", style.BLACK)]
        cols += [(np.append(part[:, k], s["uniform"]["part_mass"][k]), s["parts"][k], color)
                 for k, color in ((0, style.color(pattern)), (1, style.LIGHT_GREY))]
        for vals, name, color in cols:
            ax.bar(xs, vals, bottom=bottom, color=color, width=0.75, label=name)
            bottom += vals
        # one label per layer: the most common of its heads' labels
        ax.set_xticks(xs, [f"{i}\nmost\ncommon:\n{_majority(s['labels'][i])}" for i in range(L)]
                      + ["uniform\nin pattern"], fontsize=7)
        ax.set_ylabel("attention mass")
        ax.set_ylim(0, 1.02)
        ax.set_yticks(np.linspace(0, 1, 6))                              # 0 included
        ax.set_title(f"trained {pattern} model: mass per part of the pattern", fontsize=9)
        # under the axes and the four-line ticks: inside, it covered the bottoms of the first bars
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
    fig.tight_layout()
    return style.save(fig, path, tight=True)                            # the legends hang below


def draw_depth(data: dict, path):
    """data: the depth JSON (``python -m fast fig2 --depth``), {"models": {depth: summary
    with "layers" rows}}. Left and middle: per layer, the largest row and column lift over
    the heads, one line per depth, uniform attention at 1 and the lift above which a head
    is labelled row (or column), most of its pixel mass there; right: the share of heads
    with each label, per depth."""
    models = {int(k): v for k, v in data["models"].items()}
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 3.9))
    colors = [style.BLUE, style.ORANGE, style.GREEN, style.RED, style.GREY]
    for ax, key, region, name in ((axes[0], "row_x", 1, "row"),
                                  (axes[1], "column_x", 2, "column")):
        uniform = None
        for color, (depth, s) in zip(colors, sorted(models.items())):
            lifts = [r[key] for r in s["layers"]]
            ax.plot(range(depth), lifts, "o-", ms=3, color=color, label=f"{depth} layers")
            uniform = s["uniform"]["shares"][region]
        ax.axhline(1.0, color="black", lw=0.8, ls=":", label="uniform attention")
        if uniform:
            ax.axhline(MOST / uniform, color=style.RED, lw=0.8, ls="--",
                       label=f"labelled {name}: share {MOST} or more")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel(f"{name} share of pixel mass / uniform's")
        ax.set_title(f"most {name}-like head of each layer", fontsize=9)
        ax.legend(fontsize=6.5)
        ax.grid(alpha=0.3, which="both")
    ax = axes[2]
    depths = sorted(models)
    bottom = np.zeros(len(depths))
    label_colors = dict(zip(LABELS, (style.BLACK, style.BLUE, style.ORANGE, style.GREEN,
                                     style.RED, style.LIGHT_GREY, style.PURPLE, style.GREY)))
    for label in LABELS:
        share = np.array([np.mean([lab == label for layer in models[d]["labels"]
                                   for lab in layer]) for d in depths])
        if share.any():
            ax.bar(range(len(depths)), share, bottom=bottom, color=label_colors[label],
                   label=label, width=0.6)
        bottom += share
    ax.set_xticks(range(len(depths)), [f"{d} layers" for d in depths])
    ax.set_ylabel("share of the heads")
    ax.set_title("the package's head labels (its rule: notebook 06 §9)", fontsize=9)
    ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Fig. 2 against depth: dense models on 16x16 grey photo crops, every layer "
                 "against uniform attention over the same pixels", fontsize=10)
    fig.tight_layout()
    return style.save(fig, path)


def _majority(labels) -> str:
    """The most common of ``labels``; of labels tied for it, the one that comes first."""
    return max(dict.fromkeys(labels), key=list(labels).count)


def make_all(maps: dict, image: np.ndarray, result: dict, image_shape, figdir,
             readable: dict | None = None, suffix: str = "") -> list[Path]:
    """maps: {pattern: (L, H, n, n) of ``image``}; result: the learned_attention JSON;
    readable: {pattern: bool (H, n, n)} positions each head of a sparse model may read.
    Writes the figures the data allow into ``figdir``, ``suffix`` before each file's extension
    (``python -m fast fig2 --long``: "_long"); returns their paths."""
    figdir = Path(figdir)
    readable = readable or {}
    queries = [pixel_position(r, c, image_shape) for r, c in result["query_pixels"]]
    models = result["models"]
    paths = []
    if "full" in maps:
        s = models["full"]
        paths += [draw_heads(maps["full"], image, queries[0], image_shape, s["labels"],
                             figdir / f"fig2_learned_attention{suffix}.png"),
                  draw_layers(maps["full"], image, queries, image_shape, s["labels"],
                              figdir / f"fig2_layers{suffix}.png"),
                  draw_mass(s, figdir / f"attention_mass{suffix}.png")]
    for pattern in ("strided", "fixed"):
        if pattern in maps:
            paths.append(draw_heads(maps[pattern], image, queries[0], image_shape,
                                    models[pattern]["labels"],
                                    figdir / f"fig2_{pattern}{suffix}.png",
                                    pattern=pattern, readable=readable.get(pattern)))
    sparse = {p: models[p] for p in ("strided", "fixed") if p in models}
    if sparse:
        paths.append(draw_parts(sparse, figdir / f"attention_parts{suffix}.png"))
    return paths
