"""Figure 2 redrawn: a dense model's attention over an image, per layer and head.

Child et al., 2019, Figure 2: for one query pixel, each panel shows where a
layer (head) looks; the not-yet-generated region is black. Data from
``python -m fast fig2`` (``fast.experiments.learned_attention``):

* ``draw_heads``   -- one query pixel: rows = layers, columns = heads;
* ``draw_layers``  -- several query pixels: rows = pixels, columns = layers
  (head-averaged);
* ``draw_mass``    -- per layer, the attention mass in a local window, the
  query's row, its column, elsewhere and on the start token, and the mass inside
  the strided / fixed patterns, each beside uniform attention.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.patches import Rectangle

from fast.measure.attention_stats import pixel_position
from fast.plots import style
from fast.plots.style import plt

# local, row, column, elsewhere, start token
REGION_COLORS = (style.BLUE, style.ORANGE, style.GREEN, style.LIGHT_GREY, style.BLACK)


def attention_image(weights_pos: np.ndarray, query: int, image_shape) -> np.ndarray:
    """RGB (H, W, 3): where position ``query`` looks, over pixels; future pixels black.

    weights_pos: (n,) weights of one query over key positions (key j = pixel
    j - 1, key 0 the start token). Values are scaled by the row's largest pixel
    weight and square-rooted so that weak but real attention stays visible.
    """
    h, w, c = image_shape
    pix = np.zeros(h * w * c)
    pix[:-1] = weights_pos[1:]
    pix = pix.reshape(h, w, c).sum(-1)                                   # (H, W)
    top = pix.max()
    val = np.sqrt(pix / top) if top > 0 else pix
    rgb = plt.get_cmap("viridis")(val)[..., :3]
    future = np.arange(h * w).reshape(h, w) >= query // c
    rgb[future] = 0.0
    return rgb


def _show_image(ax, image: np.ndarray, query: int, image_shape, title: str):
    h, w, c = image_shape
    img = np.asarray(image, dtype=np.float64).reshape(h, w, c).mean(-1) / 255.0
    rgb = np.repeat(img[..., None], 3, axis=-1)
    rgb[np.arange(h * w).reshape(h, w) >= query // c] = 0.0
    ax.imshow(rgb, interpolation="nearest")
    _mark(ax, query, image_shape)
    ax.set_title(title, fontsize=7.5)
    ax.axis("off")


def _mark(ax, query: int, image_shape):
    _, w, c = image_shape
    r, col = divmod(query // c, w)
    ax.add_patch(Rectangle((col - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.2))


def draw_heads(maps: np.ndarray, image: np.ndarray, query: int, image_shape, labels, path):
    """maps: (L, H, n, n) of one image. Rows = layers, columns = [image, heads...]."""
    L, H = maps.shape[:2]
    fig, axes = plt.subplots(L, H + 1, figsize=(1.35 * (H + 1), 1.35 * L + 0.5), squeeze=False)
    for layer in range(L):
        _show_image(axes[layer, 0], image, query, image_shape, f"layer {layer}")
        for head in range(H):
            ax = axes[layer, head + 1]
            ax.imshow(attention_image(maps[layer, head, query], query, image_shape),
                      interpolation="nearest")
            _mark(ax, query, image_shape)
            ax.set_title(f"h{head}: {labels[layer][head]}", fontsize=7)
            ax.axis("off")
    r, c = divmod(query // image_shape[2], image_shape[1])
    fig.suptitle(f"Fig. 2: dense model, query pixel (row {r}, col {c}); black = not yet generated",
                 fontsize=9)
    fig.tight_layout()
    return style.save(fig, path)


def draw_layers(maps: np.ndarray, image: np.ndarray, queries, image_shape, labels, path):
    """maps: (L, H, n, n) of one image; head-averaged. Rows = query pixels, columns = layers."""
    L = maps.shape[0]
    avg = maps.mean(1)                                                   # (L, n, n)
    fig, axes = plt.subplots(len(queries), L + 1,
                             figsize=(1.35 * (L + 1), 1.45 * len(queries) + 0.4), squeeze=False)
    for row, q in enumerate(queries):
        _show_image(axes[row, 0], image, q, image_shape, "image so far")
        for layer in range(L):
            ax = axes[row, layer + 1]
            ax.imshow(attention_image(avg[layer, q], q, image_shape), interpolation="nearest")
            _mark(ax, q, image_shape)
            ax.set_title(f"layer {layer}" + (f"\n{labels[layer]}" if row == 0 else ""), fontsize=7)
            ax.axis("off")
    fig.suptitle("head-averaged attention of every layer, three query pixels", fontsize=9)
    fig.tight_layout()
    return style.save(fig, path)


def draw_mass(summary: dict, path):
    """Stacked region masses per layer, and the mass inside the sparse patterns."""
    mass = np.asarray(summary["layer_mass"])                              # (L, 4)
    start = np.asarray(summary["start"]).mean(1)                          # (L,)
    uni = np.asarray(summary["uniform"]["mass"])
    L = len(mass)
    cols = list(mass.T) + [start]
    names = list(summary["regions"]) + ["start token"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    xs = list(range(L)) + [L + 0.6]
    bottom = np.zeros(L + 1)
    for vals, uval, name, color in zip(cols, list(uni) + [summary["uniform"]["start"]], names,
                                       REGION_COLORS):
        v = np.append(vals, uval)
        ax1.bar(xs, v, bottom=bottom, color=color, label=name, width=0.75)
        bottom += v
    ax1.set_xticks(xs, [f"{i}\n{summary['labels'][i]}" for i in range(L)] + ["uniform"], fontsize=7)
    ax1.set_ylabel("attention mass (mean over queries)")
    ax1.set_xlabel("layer")
    ax1.set_title(f"where the mass goes (local = within {summary['window']} px)", fontsize=9)
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    s = np.asarray(summary["in_strided"]).mean(1)
    f = np.asarray(summary["in_fixed"]).mean(1)
    strided, fixed = style.color("strided"), style.color("fixed")
    ax2.plot(range(L), s, "o-", color=strided, label="inside strided (l=16)")
    ax2.plot(range(L), f, "s-", color=fixed, label="inside fixed (l=16, c=4)")
    ax2.axhline(summary["uniform"]["in_strided"], color=strided, ls=":", label="uniform, strided")
    ax2.axhline(summary["uniform"]["in_fixed"], color=fixed, ls=":", label="uniform, fixed")
    ax2.set_ylim(0, 1.02)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("mass inside the pattern")
    ax2.set_title("does the sparse pattern cover what was learned?", fontsize=9)
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return style.save(fig, path)


def make_all(maps: np.ndarray, image: np.ndarray, summary: dict, image_shape,
             figdir) -> list[Path]:
    """maps: (L, H, n, n) of ``image`` (shape ``image_shape`` = (H, W, C)). Writes the
    three figures into ``figdir``; returns their paths."""
    figdir = Path(figdir)
    # position p predicts pixel p (it reads the start token and pixels 0..p-1)
    queries = [pixel_position(r, c, image_shape) for r, c in summary["query_pixels"]]
    return [
        draw_heads(maps, image, queries[0], image_shape, summary["head_labels"],
                   figdir / "fig2_learned_attention.png"),
        draw_layers(maps, image, queries, image_shape, summary["labels"],
                    figdir / "fig2_layers.png"),
        draw_mass(summary, figdir / "attention_mass.png"),
    ]
