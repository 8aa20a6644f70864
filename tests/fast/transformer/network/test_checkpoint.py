"""fast/transformer/network/checkpoint.py: what reading a file that is no checkpoint says
(Child et al., 2019, sec. 6: runs resume from files that can be damaged, cut short or
something else entirely).

Each kind of bad file is named for what it is -- empty, not a ``torch.save`` archive, a
plain pickle, an archive cut short, a ``torch.save`` file that does not read to its end --
in one sentence that says what to do; and nothing in any of them is unpickled with code
execution (a crafted plain pickle runs nothing). The configs and weights inside a
readable checkpoint: tests/fast/transformer/training/test_checkpoint_checks.py.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest
import torch

from fast.transformer.config import ModelConfig
from fast.transformer.network.checkpoint import load_checkpoint, load_model, save_weights
from fast.transformer.network.model import SparseTransformer

NOT_READABLE = "is not a readable checkpoint: "
DAMAGED = "it is damaged or truncated"
TO_DO = "copy it again from where it was written, or use an earlier checkpoint"
NOT_ARCHIVE = "it is not a checkpoint archive (torch.save's zip format)"


class Payload:
    """Unpickling this calls os.mkdir(marker): any code could run instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.fixture
def good(tmp_path):
    """A weights-only checkpoint of a tiny text model, and its bytes."""
    torch.manual_seed(0)
    model = SparseTransformer(ModelConfig(vocab_size=13, n_ctx=19, d_model=16, n_heads=2,
                                          n_layers=1, pattern="strided", stride=5))
    path = save_weights(tmp_path / "good.pt", model)
    return path, open(path, "rb").read()


def refusal(path) -> str:
    """The one sentence both readers give for ``path`` (they must give the same)."""
    said = []
    for read in (load_checkpoint, load_model):
        with pytest.raises(ValueError) as err:
            read(path)
        said.append(str(err.value))
    assert said[0] == said[1], said
    print(said[0])
    assert said[0].startswith(f"{path} {NOT_READABLE}") and "\n" not in said[0]
    return said[0]


def test_a_truncated_archive_is_said_to_be_damaged_with_what_to_do(good, tmp_path):
    path, data = good
    assert load_model(path)[1].n_ctx == 19                       # the whole file reads
    for size in (20, 1000, len(data) // 2, len(data) - 10):     # cut short at each place
        cut = tmp_path / f"cut{size}.pt"
        cut.write_bytes(data[:size])
        said = refusal(cut)
        assert f"{DAMAGED}, {size:,} bytes that begin as a checkpoint archive" in said
        assert TO_DO in said and "Errno" not in said


def test_a_file_that_is_no_archive_is_said_to_be_none(tmp_path):
    text = tmp_path / "text.pt"
    text.write_text("garbage")
    said = refusal(text)
    assert f"{NOT_ARCHIVE}, its first bytes are b'garbage'; allowed: a file written by " \
           f"torch.save" in said
    assert "Python objects" not in said and "operand" not in said
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert "it is empty (0 bytes), not a checkpoint archive" in refusal(empty)
    other = tmp_path / "other.pt"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("notes.txt", "a zip archive, but not torch.save's")
    assert "it is a zip archive but not a checkpoint archive" in refusal(other)


def test_a_plain_pickle_is_refused_unread_so_nothing_runs(tmp_path):
    marker, path = tmp_path / "it_ran", tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"model": {}, "model_cfg": {}, "x": Payload(marker)}))
    pickle.loads(path.read_bytes())                 # an unsafe load runs it: the test is real
    assert marker.is_dir()
    marker.rmdir()
    assert "it is a Python pickle, not a checkpoint archive" in refusal(path)
    assert not marker.exists()


def test_torch_save_older_format_reads_and_cut_short_is_damaged(good, tmp_path):
    """torch.save's pre-zip format is a pickle stream: still read, safely; cut short it
    is damaged, not 'not a checkpoint'."""
    path, _ = good
    state = torch.load(path, weights_only=True)
    buf = io.BytesIO()
    torch.save(state, buf, _use_new_zipfile_serialization=False)
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(buf.getvalue())
    assert load_model(legacy)[1].n_ctx == 19
    cut = tmp_path / "legacy_cut.pt"
    cut.write_bytes(buf.getvalue()[:-30])
    said = refusal(cut)
    assert f"{DAMAGED}, a torch.save file that cannot be read to its end" in said and TO_DO in said


def test_bytes_changed_inside_a_record_are_caught_by_its_checksum(good, tmp_path):
    """torch.load reads zeroed or flipped weight bytes without a word (shown first); the
    archive's CRC-32 of each record catches them, and the refusal names the record."""
    path, data = good
    with zipfile.ZipFile(path) as z:
        record = max((info for info in z.infolist() if "/data/" in info.filename),
                     key=lambda info: info.file_size)                  # the largest tensor
    with open(path, "rb") as f:                     # the data begins after the local header
        f.seek(record.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
    start = record.header_offset + 30 + name_len + extra_len
    for change in ("zeroed", "flipped"):
        broken = bytearray(data)
        piece = slice(start + 8, start + 40)
        broken[piece] = bytes(32) if change == "zeroed" else bytes(b ^ 0x10 for b in
                                                                    broken[piece])
        bad = tmp_path / f"{change}.pt"
        bad.write_bytes(bytes(broken))
        loaded = torch.load(bad, weights_only=True)["model"]    # torch does not notice
        assert any(not torch.equal(loaded[k], v)
                   for k, v in torch.load(path, weights_only=True)["model"].items())
        said = refusal(bad)
        assert f"it is damaged, its record {record.filename!r} does not match the " \
               f"checksum" in said and TO_DO in said
