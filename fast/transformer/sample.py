"""Sampling from a trained Sparse Transformer: ``sample(model, ...)`` and ``python -m fast sample``.

Child et al., 2019, section 7 (unconditional samples, and image completions of
held-out images from their top half) and section 5.6 (query-key products in
float32 when sampling: float16 can overflow). Ancestral sampling, one position
at a time, from the model's distribution reshaped by a temperature, top-k and
top-p (nucleus) truncation (``fast.transformer.draw``).

Two ways to compute each next distribution, one flag:

* ``cache=True`` (``"sparse"``, the default): a prefill pass over the prompt,
  then one position per step from a key/value cache that keeps and reads only
  what each head's pattern allows (``fast.transformer.decode``);
  ``cache="dense"`` keeps and reads every key (the usual cache; a baseline);
* ``cache=False``: re-run the whole model on the prefix for every token -- the
  reference the tests compare the caches with. With the same generator all
  three draw the same tokens.

Every argument is checked before any work starts (``check_request``). Batches:
``num`` sequences are drawn ``batch_size`` at a time.

    python -m fast sample --checkpoint runs/quick/ckpt.pt --num 16
    python -m fast sample --checkpoint runs/quick/ckpt.pt --num 8 --complete test
    python -m fast sample --checkpoint runs/quick_text/ckpt.pt --prompt "def " --length 200

Image models write a PNG grid (with --complete: the held-out images in the
first row, their completions below); text models write and print the decoded
bytes. Any checkpoint ``fast.transformer.checkpoint.load_model`` reads will do.
Bad arguments end the command with exit status 2 and one line saying what was
given and what is allowed.
"""

from __future__ import annotations

import argparse
import codecs
import math
import sys
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import torch
from tqdm import tqdm

from fast.data import DATASETS, load
from fast.transformer.checkpoint import load_model
from fast.transformer.config import PRECISIONS
from fast.transformer.decode import Decoder
from fast.transformer.devices import autocast, resolve_device, resolve_precision
from fast.transformer.draw import check_request, draw

__all__ = ["sample", "check_request", "draw", "image_grid", "save_samples", "main"]

COMMAND = "python -m fast sample"


@torch.no_grad()
def sample(model, num: int = 4, *, length: int | None = None, prompt=None,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None, precision: str = "fp32",
           start_token: bool | None = None, cache=True, batch_size: int | None = None,
           threads: int | None = None, progress: bool = False,
           stats: dict | None = None) -> torch.Tensor:
    """Draw ``num`` sequences of ``length`` tokens (default n_ctx) -> LongTensor (num, length).

    prompt: token ids (num, p) or (p,) to continue; they are the first p tokens
    of the result (image completion: the top rows of an image; text: its start).
    start_token: feed the start token (id vocab_size) first, as images are
    trained; default True for image models, False for text (a text model then
    needs a prompt; by default one newline byte). temperature, top_k, top_p:
    ``draw``. precision: autocast of everything but attention ("fp32", "bf16",
    "fp16", "auto" as in training); q.k products and the softmax stay float32.
    cache: True / "sparse", "dense", or False (re-run the model per token).
    threads: torch's intra-op threads during the call (restored after); by default
    1 when a cache decodes on the CPU -- a step is a chain of small products that a
    second thread does not speed up, and on a busy machine slows many times (8
    grey16 samples: 72 s with 2 threads, 4 s with 1, on this project's 2-core
    machine under load) -- and torch's setting otherwise.
    progress: a progress bar counting tokens (and tokens per second). stats: a
    dict to fill with seconds, tokens drawn and the cache's bytes.
    """
    model = getattr(model, "module", model)
    cfg = model.cfg
    req = check_request(cfg, num, length, prompt, temperature, top_k, top_p, precision,
                        start_token, cache, batch_size, threads)
    device = next(model.parameters()).device
    precision = resolve_precision(req["precision"], device)
    num, length, prompt = req["num"], req["length"], req["prompt"]
    p = prompt.shape[1]
    out = torch.empty(num, length, dtype=torch.long, device=device)
    out[:, :p] = prompt.to(device)
    threads = req["threads"] or (1 if device.type == "cpu" and req["cache"] else None)
    threads_before = torch.get_num_threads()
    was_training = model.training
    model.eval()
    model.set_qk_fp32(True)
    bar = tqdm(total=num * (length - p), unit="tok", desc="sample", disable=not progress)
    start, cache_bytes = time.perf_counter(), 0
    try:
        if threads:
            torch.set_num_threads(threads)
        for r0 in range(0, num, req["batch_size"]):
            rows = out[r0:r0 + req["batch_size"]]                        # (b, length) view
            prefix = torch.full((rows.shape[0], int(req["start_token"])), cfg.vocab_size,
                                dtype=torch.long, device=device)          # (b, 0 or 1)
            with autocast(precision, device):
                cache_bytes = max(cache_bytes, _fill(model, rows, prefix, p, req, generator,
                                                     bar))
    finally:
        torch.set_num_threads(threads_before)
        bar.close()
        model.set_qk_fp32(False)
        model.train(was_training)
    if stats is not None:
        stats.update(seconds=time.perf_counter() - start, tokens=num * (length - p),
                     cache=req["cache"], cache_bytes=cache_bytes)
    return out


def _fill(model, rows: torch.Tensor, prefix: torch.Tensor, p: int, req: dict, generator,
          bar) -> int:
    """Sample rows[:, p:] in place after the prompt rows[:, :p]; returns cache bytes."""
    length = rows.shape[1]
    if p == length:
        return 0
    pick = dict(temperature=req["temperature"], top_k=req["top_k"], top_p=req["top_p"],
                generator=generator)
    if req["cache"] is None:                                             # the reference
        for i in range(p, length):
            x = torch.cat([prefix, rows[:, :i]], dim=1)                  # (b, prefix + i)
            rows[:, i] = draw(model(x)[:, -1], **pick)
            bar.update(rows.shape[0])
        return 0
    decoder = Decoder(model, prefix.shape[1] + length - 1, req["cache"])
    logits = decoder.prefill(torch.cat([prefix, rows[:, :p]], dim=1))   # (b, vocab)
    for i in range(p, length):
        rows[:, i] = draw(logits, **pick)
        bar.update(rows.shape[0])
        if i + 1 < length:
            logits = decoder.step(rows[:, i])
    return decoder.nbytes()


# ----------------------------------------------------------------------------
# Writing samples, and the command line.
# ----------------------------------------------------------------------------

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


def save_samples(samples: torch.Tensor, model_cfg, out, levels: int | None = None,
                 cols: int | None = None) -> str:
    """PNG grid for image models (``cols`` per row), UTF-8 text (bytes decoded with
    replacement) otherwise."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    arr = samples.cpu().numpy()
    if model_cfg.embedding == "image":
        grid = image_grid(arr, model_cfg.image_shape, levels or model_cfg.vocab_size, cols)
        scale = max(1, 256 // grid.shape[0])
        grid = np.kron(grid, np.ones((scale, scale, 1), dtype=np.uint8))   # enlarge small grids
        matplotlib.image.imsave(out, grid)
    else:
        text = "\n\n----\n\n".join(bytes(row.astype(np.uint8).tolist()).decode("utf-8", "replace")
                                    for row in arr)
        out.write_text(text, encoding="utf-8")
    return str(out)


class _Parser(argparse.ArgumentParser):
    """argparse, with one line on stderr and exit status 2 for a bad option."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a ckpt.pt of python -m fast train, or "
                   "a weights-only model (figures/data/models/*.pt)")
    p.add_argument("--num", type=int, default=16, help="samples to draw (default 16)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples decoded together (default: all of them)")
    p.add_argument("--length", type=int, default=None, help="tokens per sample, prompt "
                   "included (default n_ctx; image models need n_ctx)")
    p.add_argument("--temperature", type=float, default=1.0, help="> 0 (default 1)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None,
                   help="keep the most likely tokens up to this mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:1")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 "
                   "when a cache decodes on the CPU, else torch's)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="autocast of the network (q.k stays float32); default fp32")
    p.add_argument("--cache", default="sparse", choices=("sparse", "dense", "none"),
                   help="key/value cache: sparse (default), dense, none (re-run per token)")
    p.add_argument("--prompt", default=None, help="text models: the start of every sample "
                   "(UTF-8, backslash escapes such as \\n understood)")
    p.add_argument("--prompt-file", default=None, help="text models: a file whose bytes start "
                   "every sample")
    p.add_argument("--complete", default=None, choices=("train", "val", "test"),
                   help="image models: complete held-out images of this split from their top")
    p.add_argument("--prompt-length", type=int, default=None,
                   help="with --complete: tokens given (default: the top half)")
    p.add_argument("--dataset", default=None, choices=DATASETS,
                   help="with --complete: the data (default: the checkpoint's)")
    p.add_argument("--data-path", default=None, help="local path for enwik8/cifar10/npy_images")
    p.add_argument("--out", default=None,
                   help="output path (default figures/samples_<dataset>.png or .txt)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _prompt(args, model_cfg, train_cfg):
    """(prompt or None, held-out images or None) from the command line's options."""
    image = model_cfg.embedding == "image"
    if image and (args.prompt is not None or args.prompt_file is not None):
        raise ValueError("--prompt and --prompt-file continue text; an image model completes "
                         "held-out images with --complete SPLIT")
    if not image and (args.complete or args.prompt_length is not None):
        raise ValueError("--complete and --prompt-length complete images; a text model takes "
                         "--prompt TEXT or --prompt-file PATH")
    if args.prompt is not None and args.prompt_file is not None:
        raise ValueError("give --prompt or --prompt-file, not both")
    if args.prompt is not None:
        return torch.tensor(list(codecs.escape_decode(args.prompt.encode())[0])), None
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise ValueError(f"--prompt-file {path} is not a file")
        return torch.tensor(list(path.read_bytes())), None
    if not args.complete:
        return None, None
    name = args.dataset or (train_cfg.dataset if train_cfg is not None else None)
    if name is None:
        raise ValueError(f"--complete needs the data: {args.checkpoint} stores no training "
                         f"config; name it with --dataset (one of {DATASETS})")
    data = load(name, path=args.data_path or (train_cfg.data_path if train_cfg else None),
                image_shape=model_cfg.image_shape)
    if data.kind != "image" or data.seq_len != model_cfg.n_ctx:
        raise ValueError(f"--complete needs images of {model_cfg.n_ctx} tokens "
                         f"(image_shape={model_cfg.image_shape}); dataset {name!r} holds "
                         f"{data.kind} data of image_shape={data.image_shape}")
    held = data.splits.get(args.complete)
    if held is None or len(held) < args.num:
        raise ValueError(f"--complete {args.complete}: {name} has "
                         f"{0 if held is None else len(held)} images there, --num asks {args.num}")
    rows = np.linspace(0, len(held) - 1, args.num).round().astype(np.int64)  # spread evenly
    truth = torch.from_numpy(held[rows].astype(np.int64))                    # (num, n_ctx)
    given = model_cfg.n_ctx // 2 if args.prompt_length is None else args.prompt_length
    if not 0 <= given <= model_cfg.n_ctx:
        raise ValueError(f"--prompt-length must lie in [0, n_ctx={model_cfg.n_ctx}], "
                         f"got {given}")
    return truth[:, :given], truth


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        device = resolve_device(args.device)
        model, model_cfg, train_cfg = load_model(args.checkpoint, device)
        if model_cfg.embedding == "image" and args.length not in (None, model_cfg.n_ctx):
            raise ValueError(f"image samples need the full length n_ctx={model_cfg.n_ctx} to "
                             f"form images, got --length {args.length}")
        prompt, truth = _prompt(args, model_cfg, train_cfg)
        request = dict(length=args.length, prompt=prompt, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, precision=args.precision,
                       cache=args.cache, batch_size=args.batch_size, threads=args.threads)
        check_request(model_cfg, args.num, start_token=None, **request)
    except (ValueError, FileNotFoundError) as err:
        print(f"{COMMAND}: error: {err}", file=sys.stderr)
        return 2
    stats: dict = {}
    seqs = sample(model, args.num, generator=torch.Generator().manual_seed(args.seed),
                  progress=not args.no_progress, stats=stats, **request)
    name = train_cfg.dataset if train_cfg is not None else "model"
    suffix = ".png" if model_cfg.embedding == "image" else ".txt"
    out = args.out or f"figures/samples_{name}{suffix}"
    if truth is not None:
        seqs, cols = torch.cat([truth.to(seqs.device), seqs]), args.num   # truth row on top
    else:
        cols = None
    path = save_samples(seqs, model_cfg, out, cols=cols)
    if suffix == ".txt":
        print(Path(path).read_text(encoding="utf-8"))
    rate = stats["tokens"] / max(stats["seconds"], 1e-9)
    print(f"sampled {stats['tokens']} tokens in {stats['seconds']:.1f} s ({rate:.0f} tokens/s, "
          f"cache {args.cache}: {stats['cache_bytes'] / 2**20:.1f} MiB); wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
