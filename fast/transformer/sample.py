"""Sampling from a trained Sparse Transformer: ``sample(model, ...)`` and ``python -m fast sample``.

Child et al., 2019, section 5.6: query-key products are computed in fp32 when
sampling (fp16 can overflow), so ``sample`` turns on the model's fp32 q.k path
(``SparseTransformer.set_qk_fp32``) for the whole call. Ancestral sampling, one
position at a time, re-running the model on the prefix (no key/value cache: a
reference, not a fast sampler).

    python -m fast sample --checkpoint runs/quick/ckpt.pt      # figures/samples_<dataset>.png
    python -m fast sample --checkpoint runs/quick_text/ckpt.pt --num 4 --out samples.txt

Image models write a PNG grid of images; text models write (and print) the
decoded bytes. Any checkpoint ``fast.transformer.checkpoint.load_model`` reads
will do: one written by ``python -m fast train``, or a weights-only one.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import torch
from tqdm import tqdm

from fast.transformer.checkpoint import load_model
from fast.transformer.devices import autocast


@torch.no_grad()
def sample(model, num: int = 4, *, length: int | None = None, prompt: torch.Tensor | None = None,
           temperature: float = 1.0, generator: torch.Generator | None = None,
           precision: str = "fp32", start_token: bool | None = None,
           progress: bool = False) -> torch.Tensor:
    """Draw ``num`` sequences of ``length`` tokens (default n_ctx) -> LongTensor (num, length).

    prompt: LongTensor (num, p) or (p,) of tokens to continue (they are part of the
    result). start_token: feed the start token (id vocab_size) first, as images
    are trained; default True for image models, False for text (a text model
    then needs a prompt of at least one byte; by default one newline byte).
    The q.k products run in fp32 whatever ``precision`` the rest uses.
    """
    model = getattr(model, "module", model)
    cfg = model.cfg
    device = next(model.parameters()).device
    length = cfg.n_ctx if length is None else length
    if not isinstance(num, int) or num < 1:
        raise ValueError(f"num must be an integer >= 1, got {num!r}")
    if not isinstance(length, int) or not 1 <= length <= cfg.n_ctx:
        raise ValueError(f"length must be an integer in [1, n_ctx={cfg.n_ctx}], got {length!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if start_token is None:
        start_token = cfg.embedding == "image"
    if prompt is None:
        prompt = torch.empty(num, 0, dtype=torch.long) if start_token else \
            torch.full((num, 1), ord("\n"), dtype=torch.long)
    prompt = torch.as_tensor(prompt, dtype=torch.long)
    if prompt.dim() == 1:
        prompt = prompt[None].expand(num, -1)
    if prompt.shape[0] != num or prompt.shape[1] > length:
        raise ValueError(f"prompt must be (num={num}, p <= length={length}), "
                         f"got {tuple(prompt.shape)}")
    seq = prompt.to(device)
    prefix = torch.full((num, 1), cfg.vocab_size, dtype=torch.long, device=device) \
        if start_token else seq[:, :0]
    was_training = model.training
    model.eval()
    model.set_qk_fp32(True)
    steps = range(seq.shape[1], length)
    if progress:
        steps = tqdm(steps, desc="sample")
    try:
        for _ in steps:
            x = torch.cat([prefix, seq], dim=1)                          # (num, t)
            if x.shape[1] == 0:
                raise ValueError("nothing to condition on: give a prompt or start_token=True")
            with autocast(precision, device):
                logits = model(x)[:, -1].float() / temperature           # (num, vocab)
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)
            seq = torch.cat([seq, nxt], dim=1)
    finally:
        model.set_qk_fp32(False)
        model.train(was_training)
    return seq


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


def save_samples(samples: torch.Tensor, model_cfg, out, levels: int | None = None) -> str:
    """PNG grid for image models, UTF-8 text (bytes decoded with replacement) otherwise."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    arr = samples.cpu().numpy()
    if model_cfg.embedding == "image":
        grid = image_grid(arr, model_cfg.image_shape, levels or model_cfg.vocab_size)
        scale = max(1, 256 // grid.shape[0])
        grid = np.kron(grid, np.ones((scale, scale, 1), dtype=np.uint8))   # enlarge small grids
        matplotlib.image.imsave(out, grid)
    else:
        text = "\n\n----\n\n".join(bytes(row.astype(np.uint8).tolist()).decode("utf-8", "replace")
                                    for row in arr)
        out.write_text(text, encoding="utf-8")
    return str(out)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(prog="python -m fast sample",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True,
                        help="a ckpt.pt written by python -m fast train")
    parser.add_argument("--num", type=int, default=16, help="samples to draw")
    parser.add_argument("--length", type=int, default=None,
                        help="tokens per sample (default n_ctx)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None,
                        help="output path (default figures/samples_<dataset>.png/.txt)")
    args = parser.parse_args(argv)
    model, model_cfg, train_cfg = load_model(args.checkpoint, args.device)
    gen = torch.Generator().manual_seed(args.seed)
    seqs = sample(model, args.num, length=args.length, temperature=args.temperature,
                  generator=gen, progress=True)
    name = train_cfg.dataset if train_cfg is not None else "model"
    suffix = ".png" if model_cfg.embedding == "image" else ".txt"
    out = args.out or f"figures/samples_{name}{suffix}"
    if model_cfg.embedding == "image" and args.length not in (None, model_cfg.n_ctx):
        raise ValueError("image samples need the full length n_ctx to form images")
    path = save_samples(seqs, model_cfg, out)
    if suffix == ".txt":
        print(Path(path).read_text(encoding="utf-8"))
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
