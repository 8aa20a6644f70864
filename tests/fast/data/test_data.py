"""fast/data/ (images, text, dataset): loaders on tiny files in the exact CIFAR-10 /
enwik8 formats, the bundled photographs and stdlib text (deterministic splits), and
batching (sec. 7)."""

import os
import pickle
import struct
import zipfile

import numpy as np
import pytest
import torch

from fast.data import Dataset, load
from fast.data import images as data_images
from fast.data import text as data_text

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------
# CIFAR-10: python pickle batches, dict b"data" uint8 (N, 3072), channel-major.
# ----------------------------------------------------------------------------

def _write_cifar(folder, per_batch=4):
    rng = np.random.default_rng(0)
    batches = {}
    for name in data_images.CIFAR_TRAIN + [data_images.CIFAR_TEST]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": [0] * per_batch}, f)
        batches[name] = data
    return batches


def test_cifar10_tiny_files(tmp_path):
    batches = _write_cifar(tmp_path)
    ds = load("cifar10", path=tmp_path)
    assert ds.kind == "image" and ds.image_shape == (32, 32, 3)
    assert [len(ds.splits[s]) for s in ("train", "val", "test")] == [18, 2, 4]
    # channel-major (1024 R, 1024 G, 1024 B) -> raster order, channels interleaved
    raw = batches["test_batch"][1]
    img = ds.splits["test"][1].reshape(32, 32, 3)
    assert img[0, 0, 0] == raw[0] and img[0, 0, 1] == raw[1024] and img[0, 0, 2] == raw[2048]
    assert img[2, 5, 1] == raw[1024 + 2 * 32 + 5]
    assert np.array_equal(ds.splits["val"], batches["data_batch_5"][2:].reshape(
        -1, 3, 32, 32).transpose(0, 2, 3, 1).reshape(-1, 3072))


def test_cifar10_missing_and_malformed(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load("cifar10", path=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="data_path"):
        load("cifar10")
    _write_cifar(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load("cifar10", path=tmp_path)
    with open(tmp_path / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3000), np.uint8)}, f)
    with pytest.raises(ValueError, match=r"\(N, 3072\)"):
        load("cifar10", path=tmp_path)
    with open(tmp_path / "data_batch_3", "wb") as f:
        pickle.dump({b"labels": [1]}, f)
    with pytest.raises(ValueError, match="b'data'"):
        load("cifar10", path=tmp_path)
    (tmp_path / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a CIFAR-10"):
        load("cifar10", path=tmp_path)


def _s(b: bytes) -> bytes:
    """A Python 2 str in a protocol-2 pickle: SHORT_BINSTRING (U) or BINSTRING (T)."""
    return (b"U" + bytes([len(b)]) if len(b) < 256 else b"T" + struct.pack("<i", len(b))) + b


def _i(n: int) -> bytes:
    """A Python 2 int: BININT1 (K), BININT2 (M) or BININT (J)."""
    return (b"K" + bytes([n]) if 0 <= n < 256 else b"M" + struct.pack("<H", n) if n < 65536
            else b"J" + struct.pack("<i", n))


def py2_cifar_batch(data: np.ndarray, labels, name=b"training batch 1 of 5") -> bytes:
    """A batch as the CIFAR-10 python version ships it: Python 2's cPickle, protocol 2,
    of {"batch_label": str, "labels": [int], "data": uint8 ndarray, "filenames": [str]},
    the array pickled by NumPy (numpy.core.multiarray._reconstruct(ndarray, (0,), "b"),
    then __setstate__((1, shape, dtype("u1"), False, the bytes)))."""
    n, width = data.shape
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _i(0) + b"\x85"
             + _s(b"b") + b"\x87R"
             + b"(" + _i(1) + _i(n) + _i(width) + b"\x86"
             + b"cnumpy\ndtype\n" + _s(b"u1") + _i(0) + _i(1) + b"\x87R"
             + b"(" + _i(3) + _s(b"|") + b"NNN" + b"J\xff\xff\xff\xffJ\xff\xff\xff\xff" + _i(0)
             + b"tb" + b"\x89" + _s(data.tobytes()) + b"tb")
    items = (_s(b"batch_label") + _s(name) + _s(b"labels") + b"](" + b"".join(map(_i, labels))
             + b"e" + _s(b"data") + array + _s(b"filenames") + b"](" +
             b"".join(_s(b"img_%d.png" % i) for i in range(n)) + b"e")
    return b"\x80\x02}(" + items + b"u."


def test_cifar10_in_the_real_format(tmp_path):
    """Batches byte for byte as the python version's: they load through the restricted
    unpickler, which knows exactly the globals they use."""
    rng = np.random.default_rng(1)
    raw = {}
    for name in data_images.CIFAR_TRAIN + [data_images.CIFAR_TEST]:
        raw[name] = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
        (tmp_path / name).write_bytes(py2_cifar_batch(raw[name], [3, 1, 4, 1]))
    ds = load("cifar10", path=tmp_path)
    to_raster = lambda x: x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).reshape(-1, 3072)
    assert np.array_equal(ds.splits["test"], to_raster(raw["test_batch"]))
    assert np.array_equal(ds.splits["train"][:4], to_raster(raw["data_batch_1"]))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_cifar_batch_re_pickled_by_python_3_loads(tmp_path, protocol):
    """The same batch re-saved by Python 3 under any protocol: protocol 2 writes its byte
    strings through _codecs.encode, protocol 5 its arrays through numpy's _frombuffer
    (both were refused as globals a batch never holds); each loads, equal."""
    rng = np.random.default_rng(2)
    raw = {}
    for name in data_images.CIFAR_TRAIN + [data_images.CIFAR_TEST]:
        raw[name] = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
        batch = {b"batch_label": b"batch", b"labels": [3, 1, 4, 1], b"data": raw[name]}
        (tmp_path / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    ds = load("cifar10", path=tmp_path)
    to_raster = lambda x: x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).reshape(-1, 3072)
    assert np.array_equal(ds.splits["test"], to_raster(raw["test_batch"]))


class RunsAShell:
    """Unpickling this runs ``touch marker`` through os.system."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def test_a_crafted_cifar_batch_runs_nothing(tmp_path, capsys, monkeypatch):
    """A data folder of malicious pickles: refused in one line, and the command it
    carries is never run (pickle.load would run it: checked first)."""
    _write_cifar(tmp_path)
    marker = tmp_path / "it_ran"
    evil = pickle.dumps({b"data": RunsAShell(marker)})
    pickle.loads(evil)                                   # the plain unpickler runs it
    assert marker.exists()
    marker.unlink()
    (tmp_path / "data_batch_2").write_bytes(evil)
    with pytest.raises(ValueError, match=r"data_batch_2 is refused: it asks for "
                                         r"(posix|os)\.system.*nothing in it was run"):
        load("cifar10", path=tmp_path)
    assert not marker.exists()
    from fast.commands import train as train_command
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        train_command.main(["--preset", "cifar10", "--n_layers", "1", "--d_model", "16",
                            "--data_path", str(tmp_path), "--device", "cpu",
                            "--out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    print(err)
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "refused: it asks for" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------
# enwik8: zip holding "enwik8", or the raw file; consecutive 90M/5M/5M split.
# ----------------------------------------------------------------------------

def test_enwik8_zip_and_raw(tmp_path):
    payload = bytes(range(256)) * 2                       # 512 bytes
    raw = tmp_path / "enwik8"
    raw.write_bytes(payload)
    zipped = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("enwik8", payload)
    for path in (raw, zipped):
        ds = load("enwik8", path=path, enwik8_sizes=(400, 50, 60))
        assert ds.kind == "text"
        assert bytes(ds.splits["train"]) == payload[:400]
        assert bytes(ds.splits["val"]) == payload[400:450]
        assert bytes(ds.splits["test"]) == payload[450:510]
    capped = load("enwik8", path=raw, enwik8_sizes=(400, 50, 60), max_bytes=30)
    assert bytes(capped.splits["val"]) == payload[400:430]


def test_enwik8_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load("enwik8", path=tmp_path / "enwik8")
    short = tmp_path / "short"
    short.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="fewer than the split sizes") as err:
        load("enwik8", path=short)                          # default 90M/5M/5M
    assert "enwik8_sizes=(train, val, test)" in str(err.value)   # the way to a small copy
    bad_zip = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad_zip, "w") as z:
        z.writestr("other", b"x" * 100)
    with pytest.raises(ValueError, match="member named 'enwik8'"):
        load("enwik8", path=bad_zip, enwik8_sizes=(10, 10, 10))


def test_enwik8_in_another_archive_is_refused_not_read_as_text(tmp_path):
    """A raw file is read as it is: a tar, gzip, bzip2 or xz of enwik8 would have been
    read as text, its header included, every split shifted. Refused, by kind."""
    import bz2
    import gzip
    import io
    import lzma
    import tarfile
    payload = b"<mediawiki " + bytes(range(256)) * 4
    packed = {"gzip": gzip.compress(payload), "bzip2": bz2.compress(payload),
              "xz": lzma.compress(payload)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("enwik8")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    packed["tar"] = buf.getvalue()
    for kind, data in packed.items():
        path = tmp_path / f"enwik8.{kind}"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=f"is a {kind} archive, which would be read as "
                                             f"raw text; allowed: the enwik8 zip"):
            load("enwik8", path=path, enwik8_sizes=(10, 10, 10))
    raw = tmp_path / "enwik8"
    raw.write_bytes(payload)                                  # the raw file still reads
    assert bytes(load("enwik8", path=raw, enwik8_sizes=(10, 10, 10)).splits["train"]) == \
        payload[:10]


def test_enwik8_reads_only_the_bytes_it_uses(tmp_path):
    """A 100 GB (sparse) file: the sizes are checked against the file's, and only the
    capped splits are read -- no MemoryError, no 100 GB read."""
    huge = tmp_path / "enwik8"
    with open(huge, "wb") as f:
        f.truncate(100 * 10**9)                 # a hole: takes no disk
        f.seek(90_000_000)
        f.write(b"validation starts here")
    ds = load("enwik8", path=huge, max_bytes=1000)
    assert [len(ds.splits[s]) for s in ("train", "val", "test")] == [1000] * 3
    assert bytes(ds.splits["val"][:22]) == b"validation starts here"
    assert not ds.splits["train"].any()


def _zip_with(path, payload: bytes, flag_bits: int = 0, corrupt: bool = False):
    """A zip of member 'enwik8'; flag bit 0 set says "encrypted" (a password is needed);
    ``corrupt`` changes one byte of the stored data (its CRC-32 no longer matches)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("enwik8", payload)
    raw = bytearray(path.read_bytes())
    if corrupt:
        at = raw.index(payload[:16])
        raw[at + 5] ^= 0xFF
    if flag_bits:
        for sig, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local, central
            at = raw.index(sig)
            raw[at + offset] |= flag_bits
    path.write_bytes(bytes(raw))


def test_enwik8_damaged_or_encrypted_zips_are_one_sentence(tmp_path):
    payload = bytes(range(256)) * 2
    sizes = (400, 50, 60)
    for name, kw, says in (("crc.zip", dict(corrupt=True), "damaged or unreadable zip .*CRC"),
                           ("password.zip", dict(flag_bits=1), "encrypted .a password")):
        _zip_with(tmp_path / name, payload, **kw)
        with pytest.raises(ValueError, match=says):
            load("enwik8", path=tmp_path / name, enwik8_sizes=sizes)
    (tmp_path / "cut.zip").write_bytes((tmp_path / "crc.zip").read_bytes()[:100])
    with pytest.raises(ValueError, match="damaged or unreadable zip"):
        load("enwik8", path=tmp_path / "cut.zip", enwik8_sizes=sizes)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs: POSIX")
def test_a_folder_fifo_or_device_given_as_a_file_is_named(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path, what in ((tmp_path, "a folder"), (tmp_path / "fifo", "a FIFO"),
                       ("/dev/zero", "a device")):
        if os.path.exists(path):
            with pytest.raises(ValueError, match=f"enwik8 file {path} is {what}; allowed"):
                load("enwik8", path=path, enwik8_sizes=(10, 10, 10))
    with pytest.raises(ValueError, match=f"CIFAR-10 folder {tmp_path / 'fifo'} is a FIFO"):
        load("cifar10", path=tmp_path / "fifo")


def test_npy_errors_name_the_file(tmp_path):
    np.save(tmp_path / "train.npy", np.zeros((2, 4, 4, 3), np.uint8))
    (tmp_path / "val.npy").write_bytes(b"not an array at all")
    with pytest.raises(ValueError, match=f"{tmp_path / 'val.npy'} is not a .npy file: its "
                                         f"first bytes are b'not an'") as err:
        load("npy_images", path=tmp_path, image_shape=(4, 4, 3))
    assert "pickle" not in str(err.value)       # NumPy's advice to unpickle is not passed on
    np.save(tmp_path / "val.npy", np.array([[None]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="val.npy is not a readable .npy array .*Python "
                                         "objects") as err:
        load("npy_images", path=tmp_path, image_shape=(4, 4, 3))
    assert "allow_pickle" not in str(err.value)
    (tmp_path / "val.npy").write_bytes((tmp_path / "train.npy").read_bytes()[:-10])  # cut
    with pytest.raises(ValueError, match=f"{tmp_path / 'val.npy'} is not a readable .npy"):
        load("npy_images", path=tmp_path, image_shape=(4, 4, 3))


def test_options_a_dataset_does_not_read_are_refused(tmp_path, capsys):
    """--data_path for a bundled dataset, or a byte cap for images, would be silently
    ignored: refused instead, in one line through the command."""
    with pytest.raises(ValueError, match="data_path .* given for dataset 'digits', which is "
                                         "bundled"):
        load("digits", path=tmp_path)
    with pytest.raises(ValueError, match="data_max_bytes=100 given for dataset 'grey16'"):
        load("grey16", max_bytes=100)
    from fast.commands import train as train_command
    with pytest.raises(SystemExit) as exit_:
        train_command.main(["--preset", "digits", "--data_path", str(tmp_path),
                            "--out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "data_path" in err and "bundled" in err


def test_a_data_option_the_preset_set_is_blamed_on_the_preset(tmp_path, capsys):
    """--preset quick_text --dataset cifar10: the byte cap is the preset's, not the
    command line's; the one line says so and how to clear it (it read as if given)."""
    from fast.commands import train as train_command
    with pytest.raises(SystemExit) as exit_:
        train_command.main(["--preset", "quick_text", "--dataset", "cifar10", "--data_path",
                            str(tmp_path), "--out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "preset 'quick_text' sets data_max_bytes=4000000, which dataset 'cifar10' does " \
           "not read; allowed: --data_max_bytes none with --dataset cifar10" in err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------
# Python's standard library, split by file.
# ----------------------------------------------------------------------------

def test_stdlib_split_by_file_hash(tmp_path):
    names = [f"pkg/mod{i}.py" for i in range(40)]
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(f"# {name}\n".encode())
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "x.py").write_bytes(b"# excluded\n")
    splits = data_text.stdlib(root=tmp_path)
    for split, stream in splits.items():
        expect = b"".join(f"# {n}\n".encode() for n in sorted(names)
                          if data_text.stdlib_bucket(n) == split)
        assert bytes(stream) == expect
    assert b"excluded" not in b"".join(bytes(s) for s in splits.values())


@pytest.mark.slow
def test_real_stdlib_is_deterministic_and_capped():
    a = load("stdlib", max_bytes=20_000)
    b = load("stdlib", max_bytes=20_000)
    for split in ("train", "val", "test"):
        assert len(a.splits[split]) == 20_000
        assert np.array_equal(a.splits[split], b.splits[split])
    first = next(p for rel, p in data_text.stdlib_files() if data_text.stdlib_bucket(rel) == "val")
    head = first.read_bytes()[:100]
    assert bytes(a.splits["val"][:len(head)]) == head


# ----------------------------------------------------------------------------
# Photographs bundled with scikit-image / scikit-learn, digits.
# ----------------------------------------------------------------------------

def test_tiles_and_grey():
    img = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    t = data_images.tiles(img, 2)                          # 2 x 3 tiles, row by row
    assert t.shape == (6, 2, 2, 3)
    assert np.array_equal(t[4], img[2:4, 2:4])
    crop = np.full((1, 32, 32, 3), (10, 200, 30), dtype=np.uint8)
    grey = data_images.to_grey16(crop)
    assert grey.shape == (1, 16, 16, 1)
    assert np.all(grey == round(0.299 * 10 + 0.587 * 200 + 0.114 * 30))


def test_photos_split_by_source_and_deterministic():
    a = load("grey16")
    b = load("grey16")
    for split in ("train", "val", "test"):
        assert np.array_equal(a.splits[split], b.splits[split])
    assert a.fingerprint() == b.fingerprint()
    assert a.splits["train"].shape[1] == 256 and a.image_shape == (16, 16, 1)
    coffee = data_images.load_photo("skimage:coffee.png")
    expect = data_images.tiles(coffee, 32)
    val_tiles, test_tiles = data_images.checkerboard(coffee, 32)
    assert len(val_tiles) + len(test_tiles) == len(expect)
    # the held-out photographs' tiles, split like a chessboard: tile (0, 0) to val,
    # tile (0, 1) to test, tile (1, 0) to test, tile (1, 1) to val
    cols = coffee.shape[1] // 32
    assert np.array_equal(val_tiles[0], expect[0]) and np.array_equal(test_tiles[0], expect[1])
    assert np.array_equal(test_tiles[cols // 2], expect[cols])
    assert np.array_equal(a.splits["val"][0], data_images.to_grey16(expect[:1]).reshape(-1))
    colour = load("photos32")
    assert np.array_equal(colour.splits["val"][3], val_tiles[3].reshape(-1))
    assert np.array_equal(colour.splits["test"][3], test_tiles[3].reshape(-1))
    # val and test drawn by one rule from the same photographs: sizes within one tile
    # per held-out photograph, and every held-out tile in exactly one of them
    held = [data_images.tiles(data_images.load_photo(s), 32)
            for s in data_images.PHOTO_SPLITS["held_out"]]
    n_held = sum(len(t) for t in held)
    assert len(colour.splits["val"]) + len(colour.splits["test"]) == n_held
    assert abs(len(colour.splits["val"]) - len(colour.splits["test"])) <= len(held)
    # no split shares a crop with another (training photographs are not held out)
    assert not set(data_images.PHOTO_SPLITS["train"]) & set(data_images.PHOTO_SPLITS["held_out"])
    seen = {split: {bytes(x) for x in colour.splits[split]} for split in ("train", "val", "test")}
    assert not seen["train"] & seen["val"] and not seen["train"] & seen["test"]
    assert not seen["val"] & seen["test"]


def test_digits():
    ds = load("digits")
    assert ds.vocab_size == 17 and ds.image_shape == (8, 8, 1)
    assert [len(ds.splits[s]) for s in ("train", "val", "test")] == [1437, 180, 180]
    assert ds.splits["train"].max() == 16


def test_npy_an_empty_split_is_named_with_what_is_allowed(tmp_path):
    np.save(tmp_path / "train.npy", np.zeros((2, 4, 4, 3), np.uint8))
    for split, empty in (("val", (0, 4, 4, 3)), ("val", (2, 0, 4, 3)), ("test", (0, 4, 4, 3))):
        np.save(tmp_path / "val.npy", np.zeros((2, 4, 4, 3), np.uint8))
        np.save(tmp_path / f"{split}.npy", np.zeros(empty, np.uint8))
        with pytest.raises(ValueError) as err:
            load("npy_images", path=tmp_path, image_shape=(4, 4, 3))
        print(err.value)
        assert str(err.value).startswith(f"{tmp_path / f'{split}.npy'}: split {split!r} holds "
                                         f"no image (an array of shape {empty}); allowed: "
                                         f"at least one image"), err.value
        assert ("leave test.npy out" in str(err.value)) == (split == "test")
        (tmp_path / "test.npy").unlink(missing_ok=True)


def test_npy_images(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "train.npy", rng.integers(0, 256, (5, 4, 4, 3), dtype=np.uint8))
    np.save(tmp_path / "val.npy", rng.integers(0, 256, (2, 4, 4, 3), dtype=np.uint8))
    ds = load("npy_images", path=tmp_path, image_shape=(4, 4, 3))
    assert ds.splits["train"].shape == (5, 48) and "test" not in ds.splits
    with pytest.raises(ValueError, match="expects"):
        load("npy_images", path=tmp_path, image_shape=(8, 8, 3))
    np.save(tmp_path / "val.npy", np.zeros((2, 4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="uint8"):
        load("npy_images", path=tmp_path, image_shape=(4, 4, 3))


def test_unknown_dataset():
    with pytest.raises(ValueError, match="dataset must be one of"):
        load("mnist")


# ----------------------------------------------------------------------------
# Batching.
# ----------------------------------------------------------------------------

def test_text_batches_are_shifted_windows():
    stream = np.arange(100, dtype=np.uint8)
    ds = Dataset("toy", "text", 256, {"train": stream, "val": stream[:25]})
    x, y = ds.batch("train", 4, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y[:, 0] - x[:, 0], torch.ones(4, dtype=torch.long))
    x2, _ = ds.batch("train", 4, 10, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    evals = list(ds.eval_batches("val", 1, 10))
    assert len(evals) == 2 and evals[1][0][0, 0] == 10    # consecutive, non-overlapping
    assert ds.eval_count("train", 10) == 9
    with pytest.raises(ValueError, match="too few"):
        ds.batch("val", 1, 30, torch.Generator())
    with pytest.raises(ValueError, match="split must be one of"):
        ds.batch("test", 1, 5, torch.Generator())


def test_text_windows_start_anywhere_a_whole_window_fits():
    """A window of n + 1 bytes starts at 0 .. len - n - 1, every one of them drawn: a split
    of exactly n + 1 bytes is one window (x its first n bytes, y its last n), and a split
    of n + 3 bytes gives windows starting at 0, 1 and 2, never beyond."""
    n = 10
    ds = Dataset("toy", "text", 256, {"train": np.arange(n + 1, dtype=np.uint8)})
    x, y = ds.batch("train", 4, n, torch.Generator().manual_seed(0))
    assert torch.equal(x, torch.arange(n).expand(4, n))
    assert torch.equal(y, torch.arange(1, n + 1).expand(4, n))
    ds = Dataset("toy", "text", 256, {"train": np.arange(n + 3, dtype=np.uint8)})
    starts = set()
    for seed in range(50):
        x, _ = ds.batch("train", 8, n, torch.Generator().manual_seed(seed))
        starts |= set(x[:, 0].tolist())
    assert starts == {0, 1, 2}


def test_image_batches_start_token():
    images = np.arange(12, dtype=np.uint8).reshape(3, 4)
    ds = Dataset("toy", "image", 17, {"train": images}, (2, 2, 1))
    x, y = ds.batch("train", 5, 4, torch.Generator().manual_seed(0))
    assert torch.all(x[:, 0] == 17) and torch.equal(x[:, 1:], y[:, :-1])
    assert all(any(torch.equal(row, torch.from_numpy(im).long()) for im in images) for row in y)
    assert sum(len(b[0]) for b in ds.eval_batches("train", 2, 4)) == 3
    with pytest.raises(ValueError, match="n_ctx must"):
        ds.batch("train", 1, 5, torch.Generator())


def test_capped_evaluation_is_an_evenly_spread_sample():
    """A capped evaluation reads items spread over the whole split, not its first ones."""
    stream = np.arange(1000, dtype=np.uint16).astype(np.uint8)
    ds = Dataset("toy", "text", 256, {"val": stream})
    assert ds.eval_count("val", 10) == 99
    items = ds.eval_items("val", 10, 4)
    assert items.tolist() == [0, 24, 49, 74]                  # floor(k * 99 / 4)
    firsts = [int(x[0, 0]) for x, _ in ds.eval_batches("val", 1, 10, max_batches=4)]
    assert firsts == [int(stream[i * 10]) for i in items]
    assert len(list(ds.eval_batches("val", 3, 10, max_batches=2))) == 2     # 6 windows
    assert ds.eval_items("val", 10, 500).tolist() == list(range(99))        # cap above count
    images = np.arange(40, dtype=np.uint8).reshape(10, 4)
    img = Dataset("toy", "image", 256, {"test": images}, (2, 2, 1))
    ys = [y for _, y in img.eval_batches("test", 2, 4, max_batches=2)]
    assert torch.equal(torch.cat(ys)[:, 0], torch.tensor([0, 8, 20, 28]))  # images 0, 2, 5, 7
    with pytest.raises(ValueError, match="max_items"):
        ds.eval_items("val", 10, 0)
