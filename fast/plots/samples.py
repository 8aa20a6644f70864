"""Figures of samples: images drawn by several models, and their completions of held-out images.

Child et al., 2019, section 7 and Figure 5 (unconditional samples, and
completions of held-out images whose top half is given). The samples come from
``fast.transformer.decoding.sample`` (drawn by ``fast.experiments.samples``); these
functions only lay them out:

* ``image_grid``        token sequences -> one uint8 grid image (what
                        ``python -m fast sample`` writes as a PNG);
* ``plot_samples``      one panel per model, each a grid of its samples (rows of
                        ``cols`` images, every cell filled);
* ``plot_completions``  one row per model under the held-out images, all models
                        completing the same tops; a line marks where the given
                        part ends.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fast.plots import style
from fast.plots.style import display_name, plt


def image_grid(samples: np.ndarray, image_shape, levels: int = 256,
               cols: int | None = None) -> np.ndarray:
    """(N, H*W*C) sequences -> one uint8 grid image (rows*H + gaps, cols*W + gaps, 3).

    ``cols`` images per row (default: about sqrt(N), a square grid)."""
    h, w, ch = image_shape
    imgs = samples.reshape(-1, h, w, ch).astype(np.float64) * (255.0 / (levels - 1))
    imgs = np.clip(np.rint(imgs), 0, 255).astype(np.uint8)
    if ch == 1:
        imgs = np.repeat(imgs, 3, axis=-1)
    n = len(imgs)
    cols = math.ceil(math.sqrt(n)) if cols is None else cols
    if cols < 1:
        raise ValueError(f"cols must be >= 1, got {cols}")
    rows = math.ceil(n / cols)
    grid = np.full((rows * (h + 1) + 1, cols * (w + 1) + 1, 3), 255, dtype=np.uint8)
    for i, img in enumerate(imgs):
        r, c = divmod(i, cols)
        grid[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = img
    return grid


def _image(seq: np.ndarray, image_shape, levels: int) -> np.ndarray:
    """One token sequence (H*W*C,) -> an (H, W, 3) uint8 image."""
    return image_grid(np.asarray(seq)[None], image_shape, levels)[1:-1, 1:-1]


def plot_samples(samples: dict, image_shape, levels: int, path, cols: int = 4,
                 titles: dict | None = None) -> Path:
    """samples: {model name: (N, H*W*C) token array}; N a multiple of ``cols``."""
    names = list(samples)
    if not names:
        raise ValueError("plot_samples needs the samples of at least one model, got none")
    for name in names:
        if len(samples[name]) % cols:
            raise ValueError(f"{name}: {len(samples[name])} samples do not fill rows of "
                             f"cols={cols}; draw a multiple of {cols}")
    rows = len(samples[names[0]]) // cols
    h, w, _ = image_shape
    size = 0.55 * max(1.0, 16 / max(h, w)) * w / 8                     # inches per image
    fig, axes = plt.subplots(1, len(names), squeeze=False,
                             figsize=(len(names) * cols * size + 0.4, rows * size + 0.9))
    for ax, name in zip(axes[0], names):
        grid = image_grid(np.asarray(samples[name]), image_shape, levels, cols=cols)
        ax.imshow(grid, interpolation="nearest")
        ax.set_title((titles or {}).get(name, display_name(name)), fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    return style.save(fig, path)


def plot_completions(truth: np.ndarray, completions: dict, given: int, image_shape,
                     levels: int, path, titles: dict | None = None) -> Path:
    """truth: (N, H*W*C) held-out images; completions: {model name: (N, H*W*C)}
    whose first ``given`` tokens are the truth's. Rows: the held-out images, then
    one per model; a red line marks the end of the given part."""
    truth = np.asarray(truth)
    rows = [("held-out", truth)] + [(name, np.asarray(c)) for name, c in completions.items()]
    for name, c in rows[1:]:
        if c.shape != truth.shape or not (c[:, :given] == truth[:, :given]).all():
            raise ValueError(f"{name}: completions must be {truth.shape} and start with the "
                             f"{given} given tokens of the held-out images")
    h, w, ch = image_shape
    cut = given / (w * ch)                                  # image rows given (may be fractional)
    n = len(truth)
    fig, axes = plt.subplots(len(rows), n, squeeze=False,
                             figsize=(1.25 * n + 1.2, 1.25 * len(rows) + 0.5))
    for r, (name, seqs) in enumerate(rows):
        for i in range(n):
            ax = axes[r][i]
            ax.imshow(_image(seqs[i], image_shape, levels), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r:
                ax.axhline(cut - 0.5, color=style.RED, lw=1.0)
        label = name if r == 0 else (titles or {}).get(name, display_name(name))
        axes[r][0].set_ylabel(label, fontsize=9, rotation=0, ha="right", va="center")
    fig.suptitle(f"each model completes the same held-out images from their top {cut:g} "
                 f"of {h} rows (above the red line: given)", fontsize=9.5)
    fig.tight_layout()
    return style.save(fig, path)
