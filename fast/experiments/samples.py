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

The command draws in a child process with the kernels pinned and one thread
(``draw_record``, ``fast.experiments.reproducible.child_env``), as the trainings are,
and keeps what it drew -- every token of every sample, the text continuations, the
digests of the weights it drew from -- in figures/data/samples.json, so that
tests/fast/experiments/test_committed_results.py can draw one model's samples again and
compare them token for token (``replay``).

    python -m fast samples      (fast.commands.samples)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fast.data import load
from fast.experiments.paths import DATA, named
from fast.experiments.provenance import write_result
from fast.experiments.reproducible import child_env, kernels, weights_digest
from fast.measure.child import run_child
from fast.plots import samples as plot_samples
from fast.plots.style import PATTERN_ORDER
from fast.transformer.decoding.sample import sample
from fast.transformer.network.checkpoint import load_model

KEPT = DATA / "models"             # written by python -m fast table2
RECORD = DATA / "samples.json"     # what python -m fast samples drew, token for token
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


TEXT_LENGTH = 320                  # bytes of each text sample (prompt included) at most


def draw_text(models: dict, prompt: bytes = PROMPT, length: int | None = None, num: int = 2,
              seed: int = 0, **kw) -> dict:
    """{pattern: [num decoded strings]}: every model continues ``prompt`` to ``length``
    bytes; by default ``TEXT_LENGTH``, or the model's whole context where that is shorter
    (a length given that a model's context cannot hold is refused by ``sample``)."""
    ids = torch.tensor(list(prompt), dtype=torch.long)
    return {p: [bytes(row).decode("utf-8", "replace") for row in
                sample(m, num, length=length or min(TEXT_LENGTH, m.cfg.n_ctx), prompt=ids,
                       generator=torch.Generator().manual_seed(seed), **kw).tolist()]
            for p, m in models.items()}


THREADS = 1                        # intra-op threads of the drawing child


def draw_record(spec: dict) -> dict:
    """The child's side of ``make_figures``: every kept model of spec["folder"] draws with
    spec["seed"] on ``THREADS`` thread(s) -- 8 image samples, the completions of 6 held-out
    crops from their top half, 2 text continuations -- returned as plain lists with the
    digests of the weights and the kernels ({"images", "completions", "truth", "given",
    "text", "weights_sha256", "image_shape", "vocab_size", "kernels", "seed"})."""
    torch.set_num_threads(THREADS)
    folder, seed = Path(spec["folder"]), spec["seed"]
    images = kept_models("image", folder)
    cfg = next(iter(images.values())).cfg
    truth = held_out(6)
    given = cfg.n_ctx // 2
    texts = kept_models("text", folder) if len(missing("text", folder)) < len(PATTERN_ORDER) \
        else {}
    digests = {f"{m}_{p}": weights_digest(model) for m, models in (("image", images),
                                                                     ("text", texts))
               for p, model in models.items()}
    return {"images": {p: a.tolist() for p, a in draw_images(images, 8, seed).items()},
            "completions": {p: a.tolist() for p, a in
                            draw_completions(images, truth, given, seed).items()},
            "truth": truth.tolist(), "given": given, "text": draw_text(texts, seed=seed),
            "weights_sha256": digests, "image_shape": list(cfg.image_shape),
            "vocab_size": cfg.vocab_size, "kernels": kernels(), "seed": seed,
            "threads": THREADS}


def replay(spec: dict) -> dict:
    """The child's side of the reproduction check: the kept image model spec["pattern"] of
    spec["folder"] draws its 8 samples with spec["seed"] again, as ``draw_record`` draws
    them. {"weights_sha256", "images": the samples as lists}."""
    torch.set_num_threads(THREADS)
    model = kept_models("image", Path(spec["folder"]))[spec["pattern"]]
    drawn = draw_images({spec["pattern"]: model}, 8, spec["seed"])[spec["pattern"]]
    return {"weights_sha256": weights_digest(model), "images": drawn.tolist()}


def make_figures(figdir, folder=KEPT, seed: int = 0, record=None) -> list:
    """Draw (in a child with the kernels pinned: ``draw_record``) and write the two image
    figures into ``figdir``; returns their paths. ``record``: the JSON that keeps what was
    drawn (``fast.experiments.provenance.write_result``), or None to keep nothing."""
    return draw(figdir, folder, seed, record)[0]


def draw(figdir, folder=KEPT, seed: int = 0, record=None) -> tuple[list, dict]:
    """(the two figures' paths, what was drawn: ``draw_record``'s dict) -- drawn in a child
    with the kernels pinned; written to ``record`` too when given."""
    result = run_child("fast.experiments.samples:draw_record",
                       {"folder": str(folder), "seed": seed}, env=child_env(THREADS))
    if "error" in result:
        raise RuntimeError(f"samples: drawing {result['error']}\n{result['output']}")
    drawn = result["result"]
    shape, vocab, given = tuple(drawn["image_shape"]), drawn["vocab_size"], drawn["given"]
    truth = np.asarray(drawn["truth"])
    paths = [plot_samples.plot_samples({p: np.asarray(a) for p, a in drawn["images"].items()},
                                       shape, vocab, f"{figdir}/samples_images.png"),
             plot_samples.plot_completions(truth, {p: np.asarray(a) for p, a in
                                                   drawn["completions"].items()},
                                           given, shape, vocab,
                                           f"{figdir}/samples_completions.png")]
    if record is not None:
        write_result(record, {**drawn, "folder": named(folder)})
    return paths, drawn

