"""``python -m fast sample``: draw samples from a checkpoint and write them.

Child et al., 2019, section 7 (samples, and completions of held-out images from
their top rows) and section 5.6 (query-key products in float32 when sampling). The
sampling itself is ``fast.transformer.decoding.sample``; this command loads the
model, checks every option against it before any work starts, and writes the result.

    python -m fast sample --checkpoint runs/quick/ckpt.pt --num 16
    python -m fast sample --checkpoint runs/quick/ckpt.pt --num 8 --complete test
    python -m fast sample --checkpoint runs/quick_text/ckpt.pt --prompt "def " --length 200

Image models write a PNG grid (with --complete: the held-out images in the
first row, their completions below); text models write and print the decoded
bytes. Any checkpoint ``fast.transformer.network.checkpoint.load_model`` reads will
do. Bad arguments end the command with exit status 2 and one line saying what was
given and what is allowed. The output is written atomically; an existing ``--out`` is
replaced only with ``--overwrite``, and never when it is one of the command's inputs
(the checkpoint, the prompt file, the data). ``--num`` up to 65,536 is drawn in
batches that keep at most a GiB of keys and values unless ``--batch-size`` says
otherwise (``fast.transformer.decoding.request.BATCH_BYTES``).
"""

from __future__ import annotations

import argparse
import codecs
import io
import os
import re
import warnings
from pathlib import Path

import matplotlib.image
import numpy as np
import torch

from fast.commands import cli
from fast.core.files import lands_on, write_bytes
from fast.data import DATASETS, SPLITS, load
from fast.plots.samples import image_grid
from fast.transformer.config import MAX_THREADS, PRECISIONS
from fast.transformer.decoding.decode import ENGINES
from fast.transformer.decoding.request import MIN_TEMPERATURE, check_request
from fast.transformer.decoding.sample import sample
from fast.transformer.network.checkpoint import load_model
from fast.transformer.network.devices import resolve_device

COMMAND = "python -m fast sample"
MAX_NUM = 2**16                     # samples per command: a bound, so that 2**63 is refused


def save_samples(samples: torch.Tensor, model_cfg, out, levels: int | None = None,
                 cols: int | None = None) -> str:
    """PNG grid for image models (``cols`` per row), UTF-8 text (bytes decoded with
    replacement) otherwise, written atomically (``fast.core.files.write_bytes``)."""
    arr = samples.cpu().numpy()
    if model_cfg.embedding == "image":
        grid = image_grid(arr, model_cfg.image_shape, levels or model_cfg.vocab_size, cols)
        scale = max(1, 256 // grid.shape[0])
        grid = np.kron(grid, np.ones((scale, scale, 1), dtype=np.uint8))   # enlarge small grids
        png = io.BytesIO()
        matplotlib.image.imsave(png, grid, format="png")
        return write_bytes(out, png.getvalue())
    text = "\n\n----\n\n".join(bytes(row.astype(np.uint8).tolist()).decode("utf-8", "replace")
                                for row in arr)
    return write_bytes(out, text.encode("utf-8"))


def check_output(out: str, inputs: list[str], overwrite: bool) -> None:
    """UsageError unless ``out`` may be written: never one of the command's ``inputs``
    (its checkpoint, prompt file, data: a file given, or any file inside a folder
    given), and an existing file only with ``--overwrite``."""
    path = Path(out)
    if not os.path.lexists(path):
        return
    for given in inputs:
        where = lands_on(path, given)
        if where is not None:
            raise cli.UsageError(f"--out {out} is {'inside ' if where == 'inside' else ''}an "
                                 f"input of this command ({given}); allowed: an output path "
                                 f"that is none of --checkpoint, --prompt-file, --data-path")
    if not overwrite:
        raise cli.UsageError(f"--out {out} already exists; allowed: a new path, or --overwrite "
                             f"to replace it")


PROMPT_ALLOWED = ("a non-empty text (backslash escapes such as \\n, \\x41 understood; \\x "
                  "takes two hex digits, and a backslash of its own is written \\\\)")


def prompt_bytes(text: str) -> bytes:
    """``--prompt``: UTF-8 text with backslash escapes (``\\n``) -> its bytes; a malformed
    escape (``\\x4``, a trailing backslash) is named with its place."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeError:                             # a lone surrogate: no bytes to give
        raise argparse.ArgumentTypeError(f"got {text!r} (not encodable as UTF-8); allowed: "
                                         f"{PROMPT_ALLOWED}") from None
    try:
        with warnings.catch_warnings():              # "\\j" stays a backslash and a j
            warnings.simplefilter("ignore", DeprecationWarning)
            data = codecs.escape_decode(raw)[0]
    except ValueError as err:                        # the codec names a byte position
        at = re.search(r"position (\d+)", str(err))
        if at is None:                               # "Trailing \\ in string"
            said = "it ends in a backslash that escapes nothing"
        else:
            i = len(raw[:int(at[1])].decode("utf-8", "surrogateescape"))   # character index
            said = f"its escape {text[i:i + 4]!r} at character {i} is malformed"
        raise argparse.ArgumentTypeError(f"got {text!r} ({said}); allowed: "
                                         f"{PROMPT_ALLOWED}") from None
    if not data:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: {PROMPT_ALLOWED}")
    return data


def parser() -> cli.Parser:
    """The parser of ``python -m fast sample``; builds nothing, loads nothing."""
    p = cli.Parser(COMMAND, description=cli.about(__doc__))
    p.add_argument("--checkpoint", required=True, type=cli.existing_file,
                   help="a ckpt.pt of python -m fast train, or a weights-only model "
                        "(figures/data/models/*.pt)")
    p.add_argument("--num", type=cli.integer(1, MAX_NUM), default=16,
                   help=f"samples to draw, 1 .. {MAX_NUM} (default 16)")
    p.add_argument("--batch-size", type=cli.integer(1, MAX_NUM), default=None,
                   help="samples decoded together (default: all of them, or as many as keep "
                        "1 GiB of keys and values)")
    p.add_argument("--length", type=cli.integer(1), default=None, help="tokens per sample, "
                   "prompt included, <= the model's n_ctx (default n_ctx; image models need it)")
    p.add_argument("--temperature", type=cli.finite(MIN_TEMPERATURE), default=1.0,
                   help=f">= {MIN_TEMPERATURE} (default 1)")
    p.add_argument("--top-k", type=cli.integer(1), default=None,
                   help="keep the k most likely tokens, 1 .. vocab_size")
    p.add_argument("--top-p", type=cli.finite(0.0, 1.0, lo_open=True), default=None,
                   help="keep the most likely tokens up to this mass, in (0, 1]")
    p.add_argument("--seed", type=cli.integer(0), default=0, help="seed of the draws (default 0)")
    p.add_argument("--device", type=cli.device, default="auto",
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
                   help="output path (default figures/samples_<dataset>.png or .txt); an "
                        "existing file only with --overwrite, never an input")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out if it exists (never the checkpoint or another input)")
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
    if not args.complete and (args.dataset is not None or args.data_path is not None):
        raise cli.UsageError("--dataset/--data-path given without --complete, which alone "
                             "reads data; allowed: them with --complete SPLIT")
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
        said = str(err)                  # a message that says what is allowed keeps its own
        allowed = "" if "allowed:" in said else ("; allowed: a checkpoint written by python "
                                                 "-m fast train or a weights-only model")
        raise cli.UsageError(f"--checkpoint {args.checkpoint} ({said}){allowed}") from err
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
    inputs = [args.checkpoint, args.prompt_file, args.data_path or (
        train_cfg.data_path if train_cfg is not None and truth is not None else None)]
    check_output(out, [i for i in inputs if i is not None and os.path.exists(i)],
                 args.overwrite)
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
