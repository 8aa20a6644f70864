"""Samples of the kept models, drawn with the sparse-cache sampler: the sample figures.

Child et al., 2019, section 7 and Figure 5: unconditional samples, and
completions of held-out images whose top half is given. ``python -m fast
table2`` keeps the weights of its models in figures/data/models/
(``<modality>_<pattern>.pt``, fp16); this script loads every kept model there,
draws with ``fast.transformer.decoding.sample.sample`` (the sparse key/value cache, seed
0) and writes

    figures/samples_images.png       8 samples of every image model;
    figures/samples_completions.png  every image model's completion of the same
                                     6 held-out test crops from their top half;

and prints a continuation of a line of Python by every text model. Every model
draws with the same generator seed, so the models consume the same uniform
numbers (``fast.transformer.decoding.sample.draw``): where two models' distributions
agree they draw the same token, and their samples share stretches of text or
pixels. Notebook 09 calls the same functions and writes into
``figures_out()``.

    python -m fast samples      (fast.commands.samples)
"""

from __future__ import annotations

import numpy as np
import torch

from fast.data import load
from fast.experiments.paths import DATA
from fast.plots import samples as plot_samples
from fast.plots.style import PATTERN_ORDER
from fast.transformer.decoding.sample import sample
from fast.transformer.network.checkpoint import load_model

KEPT = DATA / "models"             # written by python -m fast table2
IMAGE_DATA = "grey16"              # the image models' data (16x16 greyscale crops)
PROMPT = b"import os\n\ndef main("  # the text models' prompt (the stdlib is Python source)


def kept_models(modality: str, folder=KEPT) -> dict:
    """{pattern: model in eval mode} for every ``<modality>_<pattern>.pt`` kept in
    ``folder``, in the order dense, fixed, strided. Raises FileNotFoundError if
    there is none; ``missing`` names the ones that are not there."""
    if modality not in ("image", "text"):
        raise ValueError(f"modality must be 'image' or 'text', got {modality!r}")
    models = {p: load_model(folder / f"{modality}_{p}.pt")[0] for p in PATTERN_ORDER
              if (folder / f"{modality}_{p}.pt").is_file()}
    if not models:
        raise FileNotFoundError(f"no kept {modality} models in {folder} (looked for "
                                f"{modality}_{{{','.join(PATTERN_ORDER)}}}.pt); "
                                f"python -m fast table2 writes them")
    return models


def missing(modality: str, folder=KEPT) -> list[str]:
    """The patterns whose kept ``modality`` model is not in ``folder``."""
    return [p for p in PATTERN_ORDER if not (folder / f"{modality}_{p}.pt").is_file()]


def held_out(count: int, split: str = "test", dataset: str = IMAGE_DATA) -> np.ndarray:
    """``count`` held-out images spread evenly over ``split``: (count, H*W*C) int64."""
    data = load(dataset).splits[split]
    rows = np.linspace(0, len(data) - 1, count).round().astype(np.int64)
    return data[rows].astype(np.int64)


def draw_images(models: dict, num: int = 8, seed: int = 0) -> dict:
    """{pattern: (num, n) samples from the start token}, every model with one seed."""
    return {p: sample(m, num, generator=torch.Generator().manual_seed(seed)).cpu().numpy()
            for p, m in models.items()}


def draw_completions(models: dict, truth: np.ndarray, given: int, seed: int = 0) -> dict:
    """{pattern: (N, n)}: each model completes the same truth[:, :given]."""
    prompt = torch.as_tensor(truth[:, :given])
    return {p: sample(m, len(truth), prompt=prompt,
                      generator=torch.Generator().manual_seed(seed)).cpu().numpy()
            for p, m in models.items()}


def draw_text(models: dict, prompt: bytes = PROMPT, length: int = 320, num: int = 2,
              seed: int = 0, **kw) -> dict:
    """{pattern: [num decoded strings]}: every model continues ``prompt``."""
    ids = torch.tensor(list(prompt), dtype=torch.long)
    return {p: [bytes(row).decode("utf-8", "replace") for row in
                sample(m, num, length=length, prompt=ids,
                       generator=torch.Generator().manual_seed(seed), **kw).tolist()]
            for p, m in models.items()}


def make_figures(figdir, folder=KEPT, seed: int = 0) -> list:
    """Draw and write the two image figures into ``figdir``; returns their paths."""
    models = kept_models("image", folder)
    cfg = next(iter(models.values())).cfg
    truth = held_out(6)
    given = cfg.n_ctx // 2
    return [plot_samples.plot_samples(draw_images(models, 8, seed), cfg.image_shape,
                                      cfg.vocab_size, f"{figdir}/samples_images.png"),
            plot_samples.plot_completions(truth, draw_completions(models, truth, given, seed),
                                          given, cfg.image_shape, cfg.vocab_size,
                                          f"{figdir}/samples_completions.png")]
