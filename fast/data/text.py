"""Text data as byte streams: Python's standard library source, and enwik8.

Child et al., 2019, section 7.2 (Enwik8: "We trained on the first 90 million
tokens and reserved the last 10 million for validation and test"; the last 10
million are cut here into 5 million for validation and 5 million for testing, the
usual split of enwik8, since the paper does not say how). Every loader returns
``{"train", "val", "test"} -> uint8 (T,)``, one stream of bytes per split. Nothing is downloaded.

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
import zlib
from pathlib import Path

import numpy as np

from fast.core.files import regular_file

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


ENWIK8_ALLOWED = ("the enwik8 zip (holding a member named 'enwik8') or the raw enwik8 file "
                  "(nothing is downloaded)")
CHUNK = 1 << 20                     # bytes read at a time where the rest is only checked


def _ranges(sizes: tuple, max_bytes: int | None) -> list[tuple[int, int]]:
    """The byte range [start, stop) of each split that is used: the split's first
    ``max_bytes`` bytes, or all of it."""
    bounds = np.cumsum((0,) + sizes).tolist()
    return [(a, b if max_bytes is None else min(b, a + max_bytes))
            for a, b in zip(bounds, bounds[1:])]


def _fewer(path, held: int, sizes: tuple) -> ValueError:
    smaller = (f"; for a smaller file give the splits' sizes from Python, fast.data.load("
               f"'enwik8', path=..., enwik8_sizes=(train, val, test)) (the command lines read "
               f"the paper's {ENWIK8_SIZES})" if sizes == ENWIK8_SIZES else "")
    return ValueError(f"{path} holds {held} bytes, fewer than the split sizes {sizes} need "
                      f"({sum(sizes)}); enwik8 is 100,000,000 bytes{smaller}")


# Archives other than zip, by their first bytes (tar: "ustar" at byte 257): a raw file
# is read as it is, so one of these would be read as text, its header included.
ARCHIVES = ((0, b"\x1f\x8b", "gzip"), (0, b"BZh", "bzip2"), (0, b"\xfd7zXZ\x00", "xz"),
            (0, b"7z\xbc\xaf\x27\x1c", "7z"), (0, b"\x28\xb5\x2f\xfd", "zstd"),
            (257, b"ustar", "tar"))


def _archive(head: bytes) -> str | None:
    """The kind of archive a file's first 262 bytes begin, or None."""
    return next((kind for at, magic, kind in ARCHIVES
                 if head[at:at + len(magic)] == magic), None)


def _read_raw(path: Path, ranges, sizes) -> list[bytes]:
    """The ranges of a raw file, each read with one seek (the rest is never read)."""
    held = path.stat().st_size
    if held < sum(sizes):
        raise _fewer(path, held, sizes)
    parts = []
    with open(path, "rb") as f:
        for a, b in ranges:
            f.seek(a)
            parts.append(f.read(b - a))
            if len(parts[-1]) != b - a:
                raise ValueError(f"{path} ended at byte {a + len(parts[-1])} while read "
                                 f"(it said it holds {held}); was it changed meanwhile?")
    return parts


def _read_zip(path: Path, ranges, sizes) -> list[bytes]:
    """The ranges of the zip's member 'enwik8', decompressed in order; the bytes between
    them are decompressed and dropped, and the member is read to its end so that its
    CRC-32 is checked (a damaged archive is refused, never half-used)."""
    with zipfile.ZipFile(path) as z:
        try:
            info = z.getinfo("enwik8")
        except KeyError:
            names = z.namelist()
            raise ValueError(f"{path} is a zip without a member named 'enwik8'; it holds "
                             f"{names[:10]}{' ...' if len(names) > 10 else ''}") from None
        if info.flag_bits & 0x1:
            raise ValueError(f"{path}: its member 'enwik8' is encrypted (a password is "
                             f"needed); allowed: an unencrypted zip or the raw file")
        if info.file_size < sum(sizes):
            raise _fewer(path, info.file_size, sizes)
        parts, pos = [], 0
        with z.open(info) as member:
            for a, b in ranges:
                while pos < a:                                  # skipped, not kept
                    got = len(member.read(min(CHUNK, a - pos)))
                    if not got:
                        break
                    pos += got
                parts.append(member.read(b - a))
                pos += len(parts[-1])
                if len(parts[-1]) != b - a:
                    raise _fewer(path, pos, sizes)
            while member.read(CHUNK):                           # to the end: the CRC
                pass
    return parts


def _read_enwik8(path, sizes: tuple, max_bytes: int | None) -> list[bytes]:
    """The bytes of each split that is used, read from the zip or the raw file; the
    sizes are checked before anything is read."""
    path = regular_file(path, "enwik8 file", ENWIK8_ALLOWED)
    with open(path, "rb") as f:
        head = f.read(262)
    magic = head[:4]
    kind = _archive(head)
    if kind is not None:
        raise ValueError(f"{path} is a {kind} archive, which would be read as raw text; "
                         f"allowed: {ENWIK8_ALLOWED} (unpack it first)")
    try:
        if zipfile.is_zipfile(path) or magic == b"PK\x03\x04":
            return _read_zip(path, _ranges(sizes, max_bytes), sizes)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as err:
        raise ValueError(f"{path} is a damaged or unreadable zip ({err}); allowed: "
                         f"{ENWIK8_ALLOWED}") from err
    return _read_raw(path, _ranges(sizes, max_bytes), sizes)


def enwik8(path, sizes=ENWIK8_SIZES, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """enwik8 split into consecutive train/val/test byte ranges of ``sizes``
    (default 90M / 5M / 5M); each split then capped at ``max_bytes``. Only the bytes
    used are kept (a raw file: only they are read), so the memory is that of the
    splits, whatever the size of the file."""
    if path is None:
        raise ValueError("enwik8 needs data_path: the local enwik8.zip or raw enwik8 file")
    sizes = tuple(sizes)
    if len(sizes) != 3 or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ValueError(f"sizes must be three integers >= 1 (train, val, test), got {sizes!r}")
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
        raise ValueError(f"max_bytes must be an integer >= 1 or None, got {max_bytes!r}")
    parts = _read_enwik8(path, sizes, max_bytes)
    return {split: np.frombuffer(part, dtype=np.uint8).copy()
            for split, part in zip(("train", "val", "test"), parts)}
