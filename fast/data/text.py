"""Text data as byte streams: Python's standard library source, and enwik8.

Child et al., 2019, section 7.3 (Enwik8: "the first 90 million bytes for
training, the next 5 million for validation and the last 5 million for
testing"). Every loader returns ``{"train", "val", "test"} -> uint8 (T,)``, one
stream of bytes per split. Nothing is downloaded.

stdlib: the bytes of every ``.py`` file under ``sysconfig.get_paths()["stdlib"]``
(site-packages and dist-packages excluded), files in sorted order of their
relative POSIX path, each file assigned to a split by the SHA-256 of that path:
bucket = int(sha256) mod 100; < 90 train, < 95 val, else test. So a file never
straddles two splits, and the split does not depend on the machine -- but the
bytes do depend on the Python version (record it beside any number).
``max_bytes`` caps each split (files are read until every split is full).
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
import zipfile
from pathlib import Path

import numpy as np

ENWIK8_SIZES = (90_000_000, 5_000_000, 5_000_000)


def stdlib_bucket(relpath: str) -> str:
    """The split of a stdlib file, from the SHA-256 of its relative POSIX path."""
    bucket = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest(), 16) % 100
    return "train" if bucket < 90 else "val" if bucket < 95 else "test"


def stdlib_files(root=None) -> tuple[tuple[str, Path], ...]:
    """(relative POSIX path, path) of the stdlib's .py files, sorted by relative path."""
    return _listing(str(root if root is not None else sysconfig.get_paths()["stdlib"]))


@functools.lru_cache(maxsize=4)
def _listing(root: str) -> tuple[tuple[str, Path], ...]:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"standard-library folder {root} not found")
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if {"site-packages", "dist-packages"} & set(rel.parts) or not path.is_file():
            continue
        files.append((rel.as_posix(), path))
    return tuple(sorted(files))


def stdlib(max_bytes: int | None = None, root=None) -> dict[str, np.ndarray]:
    """The stdlib source bytes split by file: uint8 (T,) per split, each capped at max_bytes."""
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
        raise ValueError(f"max_bytes must be an integer >= 1 or None, got {max_bytes!r}")
    parts: dict[str, list[bytes]] = {"train": [], "val": [], "test": []}
    sizes = dict.fromkeys(parts, 0)
    for rel, path in stdlib_files(root):
        split = stdlib_bucket(rel)
        if max_bytes is not None and sizes[split] >= max_bytes:
            if all(s >= max_bytes for s in sizes.values()):
                break
            continue
        data = path.read_bytes()
        parts[split].append(data)
        sizes[split] += len(data)
    out = {}
    for split, chunks in parts.items():
        stream = np.frombuffer(b"".join(chunks), dtype=np.uint8)
        out[split] = stream[:max_bytes].copy() if max_bytes is not None else stream.copy()
        if len(out[split]) == 0:
            raise ValueError(f"stdlib split {split!r} is empty under {root}")
    return out


def _read_enwik8(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"enwik8 file {path} not found (nothing is downloaded); give "
                                f"the zip (holding a member 'enwik8') or the raw file")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            if "enwik8" not in z.namelist():
                raise ValueError(f"{path} is a zip without a member named 'enwik8'; "
                                 f"it holds {z.namelist()}")
            return z.read("enwik8")
    return path.read_bytes()


def enwik8(path, sizes=ENWIK8_SIZES, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """enwik8 split into consecutive train/val/test byte ranges of ``sizes``
    (default 90M / 5M / 5M); each split then capped at ``max_bytes``."""
    if path is None:
        raise ValueError("enwik8 needs data_path: the local enwik8.zip or raw enwik8 file")
    sizes = tuple(sizes)
    if len(sizes) != 3 or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ValueError(f"sizes must be three integers >= 1 (train, val, test), got {sizes!r}")
    data = _read_enwik8(Path(path))
    if len(data) < sum(sizes):
        raise ValueError(f"{path} holds {len(data)} bytes, fewer than the split sizes "
                         f"{sizes} need ({sum(sizes)}); enwik8 is 100,000,000 bytes")
    stream = np.frombuffer(data, dtype=np.uint8)
    bounds = np.cumsum((0,) + sizes)
    out = {}
    for i, split in enumerate(("train", "val", "test")):
        part = stream[bounds[i]:bounds[i + 1]]
        out[split] = (part[:max_bytes] if max_bytes is not None else part).copy()
    return out
