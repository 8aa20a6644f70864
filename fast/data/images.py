"""Image data as byte sequences: bundled photographs, digits, CIFAR-10, local .npy.

Child et al., 2019, section 7.1 (CIFAR-10 "represented as sequences of 3072
bytes") and section 7.3 (ImageNet 64x64). Every loader returns a dict
``{"train", "val", "test"} -> uint8 array (N, H*W*C)``: each image flattened in
raster order with channels interleaved, position p = (row * W + col) * C + ch
(R, G, B for colour) -- the order that fast.transformer.network.model's (row, column, channel)
embeddings assume. Nothing is downloaded: the photographs are the files that
ship inside scikit-image (``skimage/data/``) and scikit-learn
(``sklearn/datasets/images/``); CIFAR-10 and .npy images are read from a local path.
CIFAR-10's python batches are pickles: they are read by an unpickler that builds
only what a batch holds (``CIFAR_GLOBALS``), so a crafted file runs nothing; .npy
files are read with ``allow_pickle=False``.

Photographs -> crops (deterministic; training and held-out photographs are
disjoint, so no validation or test pixel was seen in training):

    train:    astronaut, rocket, hubble_deep_field, ihc, motorcycle_left (skimage), china (sklearn)
    held out: coffee, chelsea (skimage), flower (sklearn) -> val and test

Each photo is cut into non-overlapping 32x32 tiles on a grid from its top-left
corner, tiles listed row by row, photos in the order above. Every tile of a
training photo goes to train. The tiles of each held-out photo are split like
the squares of a chessboard: tile (grid row r, grid column c) goes to val when
r + c is even and to test when it is odd (``checkerboard``). So validation and
test are drawn by one rule from the same photographs -- their bits estimate the
same quantity -- and no two splits share a pixel. ``grey16`` turns each 32x32
colour tile into a 16x16 greyscale one (luma 0.299 R + 0.587 G + 0.114 B, then a
2x2 mean, rounded).

Decoding a JPEG (rocket, hubble_deep_field, china, flower) goes through Pillow's
libjpeg, whose output may change between Pillow versions; the PNGs decode
bit-exactly everywhere. ``fast.data.dataset.fingerprint`` hashes the splits, so
a result can be traced to the data it was measured on.
"""

from __future__ import annotations

import codecs
import functools
import pickle
from pathlib import Path

import numpy as np

from fast.core.files import kind, regular_file

try:
    from numpy._core.multiarray import _reconstruct  # NumPy 2
    from numpy._core.numeric import _frombuffer
except ImportError:                                          # NumPy 1
    from numpy.core.multiarray import _reconstruct
    from numpy.core.numeric import _frombuffer

PHOTO_SPLITS = {
    "train": ["skimage:astronaut.png", "skimage:rocket.jpg", "skimage:hubble_deep_field.jpg",
              "skimage:ihc.png", "skimage:motorcycle_left.png", "sklearn:china.jpg"],
    # every tile of these goes to val or test, by ``checkerboard``
    "held_out": ["skimage:coffee.png", "skimage:chelsea.png", "sklearn:flower.jpg"],
}


def _photo_path(source: str) -> Path:
    package, name = source.split(":")
    if package == "skimage":
        import skimage
        folder = Path(skimage.__file__).parent / "data"
    else:
        import sklearn
        folder = Path(sklearn.__file__).parent / "datasets" / "images"
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"photograph {name!r} is not inside the installed {package} "
                                f"package (looked for {path}); install scikit-image>=0.21 "
                                f"and scikit-learn>=1.3 (pip install -e .[data])")
    return path


def load_photo(source: str) -> np.ndarray:
    """One bundled photograph as uint8 (H, W, 3)."""
    from PIL import Image
    with Image.open(_photo_path(source)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def tiles(image: np.ndarray, size: int) -> np.ndarray:
    """Non-overlapping size x size tiles of an (H, W, C) image, row by row: (N, size, size, C)."""
    h, w, ch = image.shape
    rows, cols = h // size, w // size
    t = image[:rows * size, :cols * size].reshape(rows, size, cols, size, ch)
    return t.transpose(0, 2, 1, 3, 4).reshape(rows * cols, size, size, ch)   # (N, s, s, C)


def checkerboard(image: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The tiles of a held-out photo split like a chessboard: (val tiles, test tiles).

    Tile (grid row r, grid column c) of ``tiles(image, size)`` goes to val when
    r + c is even, to test when it is odd; each part keeps the row-by-row order.
    """
    cols = image.shape[1] // size
    t = tiles(image, size)                                                # (N, s, s, C)
    r, c = np.divmod(np.arange(len(t)), cols)
    even = (r + c) % 2 == 0
    return t[even], t[~even]


def to_grey16(crops: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) colour crops -> (N, 16, 16, 1) greyscale (luma, 2x2 mean)."""
    luma = crops.astype(np.float64) @ np.array([0.299, 0.587, 0.114])        # (N, 32, 32)
    n = luma.shape[0]
    small = luma.reshape(n, 16, 2, 16, 2).mean(axis=(2, 4))                    # (N, 16, 16)
    return np.clip(np.rint(small), 0, 255).astype(np.uint8)[..., None]


def photos32() -> dict[str, np.ndarray]:
    """32x32x3 crops of the bundled photographs, flattened: uint8 (N, 3072) per split."""
    return {split: x.copy() for split, x in _photos32_cached().items()}


@functools.lru_cache(maxsize=1)
def _photos32_cached() -> dict[str, np.ndarray]:
    train = np.concatenate([tiles(load_photo(s), 32) for s in PHOTO_SPLITS["train"]])
    parts = [checkerboard(load_photo(s), 32) for s in PHOTO_SPLITS["held_out"]]
    val = np.concatenate([v for v, _ in parts])
    test = np.concatenate([t for _, t in parts])
    return {split: x.reshape(len(x), -1)                                # (N, 3072)
            for split, x in (("train", train), ("val", val), ("test", test))}


def grey16() -> dict[str, np.ndarray]:
    """16x16 greyscale versions of the photos32 crops: uint8 (N, 256) per split."""
    return {split: to_grey16(x.reshape(-1, 32, 32, 3)).reshape(len(x), -1)
            for split, x in photos32().items()}


def digits() -> dict[str, np.ndarray]:
    """scikit-learn's 8x8 digits, values 0..16 (17 grey levels): uint8 (N, 64).
    Split by a fixed permutation (NumPy default_rng(0)): 1437 / 180 / 180."""
    from sklearn.datasets import load_digits
    images = load_digits().images.astype(np.uint8).reshape(-1, 64)           # (1797, 64)
    order = np.random.default_rng(0).permutation(len(images))
    return {"train": images[order[:1437]], "val": images[order[1437:1617]],
            "test": images[order[1617:]]}


# ----------------------------------------------------------------------------
# Local files.
# ----------------------------------------------------------------------------

NPY_MAGIC = b"\x93NUMPY"                 # the first bytes of every .npy file

CIFAR_TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
CIFAR_TEST = "test_batch"

# Everything a CIFAR-10 python batch is built from. The batches are Python 2 pickles
# (protocol 2) of a dict {"batch_label": str, "labels": [int], "data": ndarray,
# "filenames": [str]}; strings and ints are pickle opcodes, and the array takes
# three globals: numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), "b") makes an
# empty array, numpy.dtype("u1", ...) its dtype, and the array's __setstate__ fills it
# from a byte string. (NumPy 2 moved numpy.core to numpy._core; a batch re-pickled by
# it names the new module, the same function.) A batch re-pickled by Python 3 is read
# too: protocol 2 writes its byte strings as _codecs.encode(text, "latin1"), and
# protocol 5 its arrays as numpy's _frombuffer(bytes, dtype, shape, order); both only
# build values (a codec is looked up among Python's own encodings). Nothing else is
# ever looked up.
CIFAR_GLOBALS = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
                 ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
                 ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                 ("_codecs", "encode"): codecs.encode,
                 ("numpy.core.numeric", "_frombuffer"): _frombuffer,
                 ("numpy._core.numeric", "_frombuffer"): _frombuffer}


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that builds only what a CIFAR-10 batch holds (``CIFAR_GLOBALS``):
    a pickle asking for any other global (``os.system``, ``builtins.eval``, ...) is
    refused before anything in it runs."""

    def find_class(self, module, name):
        if (module, name) not in CIFAR_GLOBALS:
            raise pickle.UnpicklingError(f"it asks for {module}.{name}")
        return CIFAR_GLOBALS[module, name]


def _cifar_batch(path: Path) -> np.ndarray:
    regular_file(path, "CIFAR-10 batch", f"the python version's folder (cifar-10-batches-py) "
                                         f"holding the files {CIFAR_TRAIN + [CIFAR_TEST]}")
    try:
        with open(path, "rb") as f:
            batch = _CifarUnpickler(f, encoding="bytes").load()
    except pickle.UnpicklingError as err:
        if str(err).startswith("it asks for"):
            raise ValueError(f"{path} is refused: {err}, which a CIFAR-10 batch never holds "
                             f"(only {', '.join(sorted('.'.join(g) for g in CIFAR_GLOBALS))}); "
                             f"nothing in it was run") from err
        raise ValueError(f"{path} is not a CIFAR-10 python pickle batch: {err}") from err
    except Exception as err:  # unpickling errors come in many types
        raise ValueError(f"{path} is not a CIFAR-10 python pickle batch: "
                         f"{type(err).__name__}: {err}") from err
    if not isinstance(batch, dict) or b"data" not in batch:
        keys = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"{path}: a CIFAR-10 batch is a dict with key b'data', got {keys}")
    data = batch[b"data"]
    if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2
            or data.shape[1] != 3072):
        raise ValueError(f"{path}: b'data' must be a uint8 array (N, 3072), got "
                         f"{getattr(data, 'dtype', type(data).__name__)} "
                         f"{getattr(data, 'shape', '')}")
    # CIFAR stores each image channel-major (1024 R, 1024 G, 1024 B); we use raster
    # order with channels interleaved.
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).reshape(-1, 3072)


def _folder(path, what: str, allowed: str) -> Path:
    """``path`` as a Path if it is a folder; else one sentence saying what it is."""
    found = kind(path)
    if found == "missing":
        raise FileNotFoundError(f"{what} {path} not found; allowed: {allowed}")
    if found != "a folder":
        raise ValueError(f"{what} {path} is {found}; allowed: {allowed}")
    return Path(path)


def cifar10(path) -> dict[str, np.ndarray]:
    """CIFAR-10 from the python pickle batches in folder ``path``: uint8 (N, 3072).
    train: data_batch_1..4 and the first half of data_batch_5; val: the second half
    of data_batch_5; test: test_batch."""
    if path is None:
        raise ValueError("cifar10 needs data_path: the local cifar-10-batches-py folder")
    folder = _folder(path, "CIFAR-10 folder", "the python version's folder "
                     "(cifar-10-batches-py; nothing is downloaded)")
    train = [_cifar_batch(folder / name) for name in CIFAR_TRAIN]
    half = len(train[-1]) // 2
    return {"train": np.concatenate(train[:-1] + [train[-1][:half]]),
            "val": train[-1][half:], "test": _cifar_batch(folder / CIFAR_TEST)}


def npy_images(path, image_shape=None) -> dict[str, np.ndarray]:
    """uint8 images (N, H, W, C) from ``path``/{train,val,test}.npy (test optional),
    e.g. downsampled ImageNet 64x64 prepared by the user. A split present holds at least
    one image (an empty one is refused, naming its file)."""
    if path is None:
        raise ValueError("npy_images needs data_path: a folder with train.npy and val.npy")
    allowed = "a folder holding uint8 arrays (N, H, W, C) as train.npy, val.npy [, test.npy]"
    folder = _folder(path, "npy_images folder", allowed)
    out = {}
    for split in ("train", "val", "test"):
        file = folder / f"{split}.npy"
        if split == "test" and kind(file) == "missing":
            continue
        regular_file(file, "npy_images file", allowed)
        with open(file, "rb") as f:
            head = f.read(6)
        if head != NPY_MAGIC:                     # NumPy would call it a pickle
            raise ValueError(f"{file} is not a .npy file: its first bytes are {head!r}, not "
                             f"{NPY_MAGIC!r}; allowed: {allowed}")
        try:                                      # the header only: the array is mapped
            x = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError, pickle.UnpicklingError) as err:
            why = ("it holds Python objects (dtype object), which are never unpickled here"
                   if "allow_pickle" in str(err) else str(err))
            raise ValueError(f"{file} is not a readable .npy array ({why}); allowed: "
                             f"{allowed}") from err
        if x.dtype != np.uint8 or x.ndim != 4:
            raise ValueError(f"{file} must hold uint8 (N, H, W, C), got {x.dtype} {x.shape}")
        if x.size == 0:                           # no image, or images of no pixel
            raise ValueError(f"{file}: split {split!r} holds no image (an array of shape "
                             f"{x.shape}); allowed: at least one image of at least one "
                             f"pixel in each split"
                             + (" (leave test.npy out for no test split)"
                                if split == "test" else ""))
        if image_shape is not None and tuple(x.shape[1:]) != tuple(image_shape):
            raise ValueError(f"{file} holds images of shape {x.shape[1:]}, the model "
                             f"expects {tuple(image_shape)}")
        out[split] = np.ascontiguousarray(x).reshape(len(x), -1)    # (N, H*W*C)
    return out


__all__ = ["photos32", "grey16", "digits", "cifar10", "npy_images", "load_photo", "tiles",
           "checkerboard", "to_grey16", "PHOTO_SPLITS"]
