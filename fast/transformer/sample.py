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

A cached step runs on one of the decoder's engines (``engine``): "numba", one
compiled call per step, for float32 models on the CPU, and "torch" otherwise;
"auto" (the default) picks (``fast.transformer.decode``).

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
import time
import warnings
from pathlib import Path

import matplotlib.image
import numpy as np
import torch
from tqdm import tqdm

from fast.core import cli
from fast.data import DATASETS, SPLITS, load
from fast.transformer.checkpoint import load_model
from fast.transformer.config import DEVICE, MAX_THREADS, PRECISIONS
from fast.transformer.decode import ENGINES, Decoder
from fast.transformer.devices import autocast, resolve_device, resolve_precision
from fast.transformer.draw import MIN_TEMPERATURE, check_request, draw

__all__ = ["sample", "check_request", "draw", "image_grid", "save_samples", "parser", "main"]

COMMAND = "python -m fast sample"
MAX_NUM = 2**16                     # samples per command: a bound, so that 2**63 is refused


@torch.no_grad()
def sample(model, num: int = 4, *, length: int | None = None, prompt=None,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None, precision: str = "fp32",
           start_token: bool | None = None, cache=True, batch_size: int | None = None,
           threads: int | None = None, progress: bool = False,
           stats: dict | None = None, engine: str = "auto") -> torch.Tensor:
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
    dict to fill with seconds, tokens drawn, the cache's bytes, the decoder's engine
    and the steps each engine ran. engine: "auto", "numba" or "torch" (``Decoder``).
    """
    model = getattr(model, "module", model)
    cfg = model.cfg
    req = check_request(cfg, num, length, prompt, temperature, top_k, top_p, precision,
                        start_token, cache, batch_size, threads, engine)
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
    start, cache_bytes, engines = time.perf_counter(), 0, set()
    steps = {"numba": 0, "torch": 0}
    try:
        if threads:
            torch.set_num_threads(threads)
        for r0 in range(0, num, req["batch_size"]):
            rows = out[r0:r0 + req["batch_size"]]                        # (b, length) view
            prefix = torch.full((rows.shape[0], int(req["start_token"])), cfg.vocab_size,
                                dtype=torch.long, device=device)          # (b, 0 or 1)
            with autocast(precision, device):
                decoder = _fill(model, rows, prefix, p, req, generator, bar)
                if decoder is not None:
                    cache_bytes = max(cache_bytes, decoder.nbytes())
                    engines.add(decoder.engine)
                    steps = {k: steps[k] + n for k, n in decoder.steps.items()}
    finally:
        torch.set_num_threads(threads_before)
        bar.close()
        model.set_qk_fp32(False)
        model.train(was_training)
    if stats is not None:
        stats.update(seconds=time.perf_counter() - start, tokens=num * (length - p),
                     cache=req["cache"], cache_bytes=cache_bytes,
                     engine="+".join(sorted(engines)) or None, steps=steps)
    return out


def _fill(model, rows: torch.Tensor, prefix: torch.Tensor, p: int, req: dict, generator,
          bar) -> Decoder | None:
    """Sample rows[:, p:] in place after the prompt rows[:, :p]; returns the decoder
    (None: no cache, or nothing to draw)."""
    length = rows.shape[1]
    if p == length:
        return None
    pick = dict(temperature=req["temperature"], top_k=req["top_k"], top_p=req["top_p"],
                generator=generator)
    if req["cache"] is None:                                             # the reference
        for i in range(p, length):
            x = torch.cat([prefix, rows[:, :i]], dim=1)                  # (b, prefix + i)
            rows[:, i] = draw(model(x)[:, -1], **pick)
            bar.update(rows.shape[0])
        return None
    decoder = Decoder(model, prefix.shape[1] + length - 1, req["cache"], engine=req["engine"])
    logits = decoder.prefill(torch.cat([prefix, rows[:, :p]], dim=1))   # (b, vocab)
    for i in range(p, length):
        rows[:, i] = draw(logits, **pick)
        bar.update(rows.shape[0])
        if i + 1 < length:
            logits = decoder.step(rows[:, i])
    return decoder


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


def device_name(text: str) -> str:
    """``--device``: auto, cpu, cuda or cuda:N, and present on this machine."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = ["auto", "cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(count)] if count else [])
    try:
        if DEVICE.fullmatch(text):
            resolve_device(text)
            return text
    except (ValueError, RuntimeError):
        pass
    raise argparse.ArgumentTypeError(f"got {text!r}; allowed: the devices of this machine, "
                                     f"{', '.join(here)}")


def prompt_bytes(text: str) -> bytes:
    """``--prompt``: UTF-8 text with backslash escapes (``\\n``) -> its bytes."""
    try:
        with warnings.catch_warnings():              # "\\j" stays a backslash and a j
            warnings.simplefilter("ignore", DeprecationWarning)
            data = codecs.escape_decode(text.encode("utf-8", "surrogateescape"))[0]
    except (ValueError, UnicodeError):
        data = b""
    if not data:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: a non-empty text (backslash "
                                         f"escapes such as \\n, \\x41 understood)")
    return data


def parser() -> cli.Parser:
    """The parser of ``python -m fast sample``; builds nothing, loads nothing."""
    p = cli.Parser(COMMAND, description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, type=cli.existing_file,
                   help="a ckpt.pt of python -m fast train, or a weights-only model "
                        "(figures/data/models/*.pt)")
    p.add_argument("--num", type=cli.integer(1, MAX_NUM), default=16,
                   help=f"samples to draw, 1 .. {MAX_NUM} (default 16)")
    p.add_argument("--batch-size", type=cli.integer(1, MAX_NUM), default=None,
                   help="samples decoded together (default: all of them)")
    p.add_argument("--length", type=cli.integer(1), default=None, help="tokens per sample, "
                   "prompt included, <= the model's n_ctx (default n_ctx; image models need it)")
    p.add_argument("--temperature", type=cli.finite(MIN_TEMPERATURE), default=1.0,
                   help=f">= {MIN_TEMPERATURE} (default 1)")
    p.add_argument("--top-k", type=cli.integer(1), default=None,
                   help="keep the k most likely tokens, 1 .. vocab_size")
    p.add_argument("--top-p", type=cli.finite(0.0, 1.0, lo_open=True), default=None,
                   help="keep the most likely tokens up to this mass, in (0, 1]")
    p.add_argument("--seed", type=cli.integer(0), default=0, help="seed of the draws (default 0)")
    p.add_argument("--device", type=device_name, default="auto",
                   help="auto (CUDA if present), cpu, cuda, cuda:1")
    p.add_argument("--threads", type=cli.integer(1, MAX_THREADS), default=None,
                   help="torch threads (default: 1 when a cache decodes on the CPU, else torch's)")
    p.add_argument("--precision", default="fp32", type=cli.choice(PRECISIONS),
                   help="autocast of the network (q.k stays float32); default fp32")
    p.add_argument("--cache", default="sparse", type=cli.choice(("sparse", "dense", "none")),
                   help="key/value cache: sparse (default), dense, none (re-run per token)")
    p.add_argument("--engine", default="auto", type=cli.choice(ENGINES),
                   help="what runs a cached step: auto (default: numba for float32 on the "
                        "CPU, else torch), numba, torch")
    p.add_argument("--prompt", default=None, type=prompt_bytes, help="text models: the start "
                   "of every sample (UTF-8, backslash escapes such as \\n understood)")
    p.add_argument("--prompt-file", default=None, type=cli.existing_file,
                   help="text models: a file whose bytes start every sample")
    p.add_argument("--complete", default=None, type=cli.choice(SPLITS),
                   help="image models: complete held-out images of this split from their top")
    p.add_argument("--prompt-length", type=cli.integer(0), default=None,
                   help="with --complete: tokens given, <= n_ctx (default: the top half)")
    p.add_argument("--dataset", default=None, type=cli.choice(DATASETS),
                   help="with --complete: the data (default: the checkpoint's)")
    p.add_argument("--data-path", default=None, type=cli.existing_path,
                   help="local path for enwik8/cifar10/npy_images")
    p.add_argument("--out", default=None, type=cli.output_file,
                   help="output path (default figures/samples_<dataset>.png or .txt)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _prompt(args, model_cfg, train_cfg):
    """(prompt or None, held-out images or None) from the command line's options;
    UsageError (given; allowed) when they do not fit the model."""
    image = model_cfg.embedding == "image"
    if image and (args.prompt is not None or args.prompt_file is not None):
        raise cli.UsageError("--prompt/--prompt-file given to an image model; allowed: "
                             "--complete SPLIT (an image model completes held-out images)")
    if not image and (args.complete or args.prompt_length is not None):
        raise cli.UsageError("--complete/--prompt-length given to a text model; allowed: "
                             "--prompt TEXT or --prompt-file PATH")
    if args.prompt is not None and args.prompt_file is not None:
        raise cli.UsageError("both --prompt and --prompt-file given; allowed: one of them")
    if args.prompt_file is not None:
        args.prompt = Path(args.prompt_file).read_bytes()
        if not args.prompt:
            raise cli.UsageError(f"--prompt-file {args.prompt_file} is empty; allowed: a file "
                                 f"holding at least one byte")
    if args.prompt is not None:
        return torch.tensor(list(args.prompt)), None
    if not args.complete:
        return None, None
    name = args.dataset or (train_cfg.dataset if train_cfg is not None else None)
    if name is None:
        raise cli.UsageError(f"--complete without --dataset, and {args.checkpoint} stores no "
                             f"training config; allowed: --dataset one of {', '.join(DATASETS)}")
    try:
        data = load(name, path=args.data_path or (train_cfg.data_path if train_cfg else None),
                    image_shape=model_cfg.image_shape)
    except (ValueError, OSError) as err:
        raise cli.UsageError(f"--dataset {name} could not be read ({err}); allowed: a data set "
                             f"{DATASETS} with its local file where it needs one") from err
    if data.kind != "image" or data.seq_len != model_cfg.n_ctx:
        raise cli.UsageError(f"--complete from dataset {name!r} ({data.kind} data of "
                             f"image_shape={data.image_shape}); allowed: images of "
                             f"{model_cfg.n_ctx} tokens (image_shape={model_cfg.image_shape})")
    held = data.splits.get(args.complete)
    if held is None or len(held) < args.num:
        raise cli.UsageError(f"--num {args.num} with --complete {args.complete}; allowed: at "
                             f"most the {0 if held is None else len(held)} images {name} "
                             f"holds there")
    given = model_cfg.n_ctx // 2 if args.prompt_length is None else args.prompt_length
    if given > model_cfg.n_ctx:
        raise cli.UsageError(f"--prompt-length {given}; allowed: 0 .. n_ctx={model_cfg.n_ctx}")
    rows = np.linspace(0, len(held) - 1, args.num).round().astype(np.int64)  # spread evenly
    truth = torch.from_numpy(held[rows].astype(np.int64))                    # (num, n_ctx)
    return truth[:, :given], truth


def prepare(args):
    """Everything ``main`` checks before it samples: (model, configs, request, prompt's
    truth, output path); UsageError (one line, given; allowed) on a bad combination."""
    try:
        with warnings.catch_warnings():        # torch's note on a foreign pickle: ours says more
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            model, model_cfg, train_cfg = load_model(args.checkpoint, resolve_device(args.device))
    except (ValueError, OSError, RuntimeError) as err:
        raise cli.UsageError(f"--checkpoint {args.checkpoint} ({err}); allowed: a checkpoint "
                             f"written by python -m fast train or a weights-only model") from err
    n_ctx, image = model_cfg.n_ctx, model_cfg.embedding == "image"
    length = n_ctx if args.length is None else args.length
    if length > n_ctx or (image and length != n_ctx):
        raise cli.UsageError(f"--length {length}; allowed: {'exactly' if image else '1 ..'} the "
                             f"model's n_ctx={n_ctx}" + (" (image samples form whole images)"
                                                         if image else ""))
    if args.top_k is not None and args.top_k > model_cfg.vocab_size:
        raise cli.UsageError(f"--top-k {args.top_k}; allowed: 1 .. the model's "
                             f"vocab_size={model_cfg.vocab_size}")
    prompt, truth = _prompt(args, model_cfg, train_cfg)
    if prompt is not None and prompt.shape[-1] > length:
        raise cli.UsageError(f"a prompt of {prompt.shape[-1]} tokens with --length {length}; "
                             f"allowed: a prompt no longer than the length")
    request = dict(length=args.length, prompt=prompt, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, precision=args.precision,
                   cache=args.cache, batch_size=args.batch_size, threads=args.threads,
                   engine=args.engine)
    try:
        check_request(model_cfg, args.num, start_token=None, **request)
    except ValueError as err:
        raise cli.UsageError(str(err)) from err
    name = train_cfg.dataset if train_cfg is not None else "model"
    out = args.out or f"figures/samples_{name}{'.png' if image else '.txt'}"
    try:
        cli.output_file(out)
    except argparse.ArgumentTypeError as err:
        raise cli.UsageError(f"--out (default) {err}") from err
    return model, model_cfg, request, truth, out


def main(argv=None) -> int:
    args = parser().parse_or_exit(argv)
    try:
        model, model_cfg, request, truth, out = prepare(args)
    except cli.UsageError as err:
        cli.fail(COMMAND, err)
    stats: dict = {}
    seqs = sample(model, args.num, generator=torch.Generator().manual_seed(args.seed),
                  progress=not args.no_progress, stats=stats, **request)
    if truth is not None:
        seqs, cols = torch.cat([truth.to(seqs.device), seqs]), args.num   # truth row on top
    else:
        cols = None
    path = save_samples(seqs, model_cfg, out, cols=cols)
    if model_cfg.embedding != "image":
        print(Path(path).read_text(encoding="utf-8"))
    rate = stats["tokens"] / max(stats["seconds"], 1e-9)
    print(f"sampled {stats['tokens']} tokens in {stats['seconds']:.1f} s ({rate:.0f} tokens/s, "
          f"cache {args.cache}: {stats['cache_bytes'] / 2**20:.1f} MiB"
          + (f", engine {stats['engine']}" if stats["engine"] else "") + f"); wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
