"""Datasets and batching: ``load(name, ...)`` -> ``Dataset`` with ``batch`` and ``eval_batches``.

Child et al., 2019, section 7: images are modelled as sequences of bytes (bits
per dim), text as a stream of bytes (bits per byte). Loaders live in
``fast.data.images`` and ``fast.data.text``; nothing is downloaded.

Batching (section 7 trains on random windows of text and whole images):

* text: random windows of n + 1 bytes from the split's stream; x = window[:n],
  y = window[1:]. Evaluation items are the consecutive non-overlapping windows
  that tile the stream.
* images: whole sequences of n = H*W*C bytes; x is the image shifted right by one
  with the start token (id = vocab_size) in front, y is the image, so every
  pixel value is predicted. Evaluation items are the split's images.

Evaluation (``eval_batches``) reads every item of a split, or, when capped at
``max_batches``, an evenly spread sample of them -- item floor(k * count / m) for
k = 0..m-1 -- never just the first ones, so a capped number still describes the
whole split (all its files, all its photographs).

Random draws use a ``torch.Generator`` passed in
(``fast.transformer.training.seed.data_generator``), so a batch is a pure function of
(seed, step, rank).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from fast.data import images, text

DATASETS = ("grey16", "photos32", "digits", "stdlib", "enwik8", "cifar10", "npy_images")
SPLITS = ("train", "val", "test")
LOCAL = ("enwik8", "cifar10", "npy_images")       # read from a path the user gives
TEXT = ("stdlib", "enwik8")                        # byte streams: max_bytes caps them


@dataclass
class Dataset:
    name: str                        # the name load() was given
    kind: str                        # "image" (bits per dim) or "text" (bits per byte)
    vocab_size: int                  # distinct values: 256 bytes, or 17 for digits
    splits: dict                     # split -> uint8 array: (N, H*W*C) images or (T,) text
    image_shape: tuple | None = None  # (H, W, C) for images

    def __post_init__(self):
        for split, arr in self.splits.items():
            if self.kind == "image" and arr.ndim != 2:
                raise ValueError(f"image split {split!r} must be (N, H*W*C), got {arr.shape}")
            if self.kind == "text" and arr.ndim != 1:
                raise ValueError(f"text split {split!r} must be (T,), got {arr.shape}")

    @property
    def seq_len(self) -> int | None:
        """Sequence length of an image (None for text: any window length works)."""
        return int(np.prod(self.image_shape)) if self.kind == "image" else None

    def _split(self, split: str) -> np.ndarray:
        if split not in self.splits:
            raise ValueError(f"split must be one of {sorted(self.splits)}, got {split!r}")
        return self.splits[split]

    def check_length(self, n: int, split: str = "train") -> None:
        """Raise ValueError unless sequences of length n can be drawn from ``split``."""
        data = self._split(split)
        if self.kind == "image":
            if n != data.shape[1]:
                raise ValueError(f"{self.name} images are sequences of {data.shape[1]} bytes "
                                 f"(image_shape={self.image_shape}); the model's n_ctx must "
                                 f"equal that, got n={n}")
        elif len(data) < n + 1:
            raise ValueError(f"{self.name} split {split!r} holds {len(data)} bytes, too few "
                             f"for one window of n + 1 = {n + 1}")

    def _pairs(self, data: np.ndarray, rows: np.ndarray, n: int):
        """(x, y) LongTensors (B, n) for image indices or text window starts ``rows``."""
        if self.kind == "image":
            y = torch.from_numpy(data[rows].astype(np.int64))              # (B, n)
            start = torch.full((len(rows), 1), self.vocab_size, dtype=torch.long)
            return torch.cat([start, y[:, :-1]], dim=1), y                 # (B, n)
        idx = rows[:, None] + np.arange(n + 1)[None, :]                   # (B, n+1)
        w = torch.from_numpy(data[idx].astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def batch(self, split: str, batch_size: int, n: int, generator: torch.Generator):
        """A random batch (x, y), LongTensors (batch_size, n), drawn with ``generator``."""
        data = self._split(split)
        self.check_length(n, split)
        high = len(data) if self.kind == "image" else len(data) - n
        rows = torch.randint(high, (batch_size,), generator=generator).numpy()
        return self._pairs(data, rows, n)

    def eval_count(self, split: str, n: int) -> int:
        """How many evaluation items ``split`` holds: images, or non-overlapping windows of n."""
        data = self._split(split)
        self.check_length(n, split)
        return len(data) if self.kind == "image" else (len(data) - 1) // n

    def eval_items(self, split: str, n: int, max_items: int | None = None) -> np.ndarray:
        """Indices of the evaluation items read: all of them, or ``max_items`` evenly spread."""
        count = self.eval_count(split, n)
        if max_items is not None and (not isinstance(max_items, (int, np.integer))
                                      or max_items < 1):
            raise ValueError(f"max_items must be an integer >= 1 or None, got {max_items!r}")
        if max_items is None or max_items >= count:
            return np.arange(count)
        return np.arange(max_items) * count // max_items

    def eval_batches(self, split: str, batch_size: int, n: int, max_batches: int | None = None):
        """Deterministic batches over ``split``: every item, or (max_batches set) an evenly
        spread sample of max_batches * batch_size items (``eval_items``)."""
        data = self._split(split)
        cap = None if max_batches is None else max_batches * batch_size
        items = self.eval_items(split, n, cap)
        starts = items if self.kind == "image" else items * n
        for i in range(0, len(starts), batch_size):
            yield self._pairs(data, starts[i:i + batch_size], n)

    def fingerprint(self) -> dict:
        """SHA-256 (first 16 hex digits) and size of every split: which bytes a result saw."""
        return {split: {"sha256": hashlib.sha256(np.ascontiguousarray(arr).reshape(-1))
                        .hexdigest()[:16], "shape": list(arr.shape)}   # hashed in place
                for split, arr in self.splits.items()}


def load(name: str, *, path=None, max_bytes: int | None = None, image_shape=None,
         enwik8_sizes=text.ENWIK8_SIZES) -> Dataset:
    """Load dataset ``name`` (see DATASETS) without network access.

    path: local file or folder for enwik8 (zip or raw), cifar10 (cifar-10-batches-py
    folder) and npy_images (folder with train.npy, val.npy[, test.npy]).
    max_bytes: cap on each text split. image_shape: expected (H, W, C) for npy_images.
    A path given to a bundled dataset, or max_bytes to images, is refused (ValueError),
    never ignored: the run would not read what its command line says.
    """
    if path is not None and name in DATASETS and name not in LOCAL:
        raise ValueError(f"data_path {str(path)!r} given for dataset {name!r}, which is bundled "
                         f"and reads no path; allowed: data_path only for {', '.join(LOCAL)}")
    if max_bytes is not None and name in DATASETS and name not in TEXT:
        raise ValueError(f"data_max_bytes={max_bytes!r} given for dataset {name!r}, which holds "
                         f"images; allowed: data_max_bytes only for {', '.join(TEXT)}")
    if name == "grey16":
        return Dataset(name, "image", 256, images.grey16(), (16, 16, 1))
    if name == "photos32":
        return Dataset(name, "image", 256, images.photos32(), (32, 32, 3))
    if name == "digits":
        return Dataset(name, "image", 17, images.digits(), (8, 8, 1))
    if name == "cifar10":
        return Dataset(name, "image", 256, images.cifar10(path), (32, 32, 3))
    if name == "npy_images":
        if image_shape is None:
            raise ValueError("npy_images needs image_shape=(H, W, C) to know the layout")
        return Dataset(name, "image", 256, images.npy_images(path, image_shape),
                       tuple(image_shape))
    if name == "stdlib":
        return Dataset(name, "text", 256, text.stdlib(max_bytes))
    if name == "enwik8":
        return Dataset(name, "text", 256, text.enwik8(path, enwik8_sizes, max_bytes))
    raise ValueError(f"dataset must be one of {DATASETS}, got {name!r}")
