"""fast.core.files and fast.core.lock: every file the project writes is written atomically,
never through a planted link, and one run at a time writes an out_dir (Child et al., 2019,
sec. 6: long runs must survive being killed, and so must the caches the figures are drawn
from)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from fast.core import files
from fast.core.files import atomic_write, write_json
from fast.core.lock import FolderBusy, FolderLock
from fast.transformer.network.checkpoint import save_checkpoint
from tests.conftest import ROOT


def test_write_json_round_trips(tmp_path):
    path = tmp_path / "sub" / "data.json"
    write_json(path, {"a": [1, 2.5]})
    assert json.loads(path.read_text()) == {"a": [1, 2.5]}


def test_failed_write_keeps_the_old_file_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "data.json"
    write_json(path, {"old": True})

    def broken(f):
        f.write(b'{"new": tr')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, broken)
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]


def test_a_refused_write_propagates_as_the_os_error_the_writer_turned_into_its_own(
        tmp_path, monkeypatch):
    """The disk refuses a write (ENOSPC) and the writer reports it as an exception of its
    own (as torch.save does: a RuntimeError): the OSError is what propagates, the
    writer's exception its cause; the old file stays whole and no temporary file is
    left."""
    path = tmp_path / "data.json"
    write_json(path, {"old": True})
    opened = files.os.fdopen

    class Full:
        """The temporary file, on a full disk."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            self.f.flush()

        def fileno(self):
            return self.f.fileno()

    def writer(f):
        try:
            f.write(b'{"new": true}')
        except OSError as err:
            raise RuntimeError("unexpected pos") from err

    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: Full(opened(fd, mode)))
    with pytest.raises(OSError, match="No space left") as raised:
        atomic_write(path, writer)
    assert raised.value.errno == errno.ENOSPC
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]


# ----------------------------------------------------------------------------
# One way of writing: a new temporary file of an unpredictable name, created
# exclusively, never through a link; fsync-ed; renamed; leftovers of dead writers removed.
# ----------------------------------------------------------------------------

def test_a_planted_tmp_link_is_never_followed(tmp_path):
    """A ``ckpt.pt.tmp`` symlink planted in a shared out_dir must not have its target
    overwritten, and ``ckpt.pt`` must end up a file of its own, not a link."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the victim's data")
    out = tmp_path / "shared"
    out.mkdir()
    (out / "ckpt.pt.tmp").symlink_to(victim)
    state = {"model": {"w": torch.ones(3)}, "model_cfg": {"n_ctx": 8}}
    save_checkpoint(out / "ckpt.pt", state)
    assert victim.read_bytes() == b"the victim's data"
    assert not (out / "ckpt.pt").is_symlink()
    assert torch.equal(torch.load(out / "ckpt.pt", weights_only=True)["model"]["w"],
                       torch.ones(3))
    assert (out / "ckpt.pt.tmp").is_symlink()                 # not ours: left alone


def test_the_temporary_file_is_new_and_exclusive(tmp_path, monkeypatch):
    """Every write opens a new name with O_CREAT | O_EXCL | O_NOFOLLOW; a name already
    taken (by a link or a file) is drawn again, never opened."""
    opened, real_open = [], os.open

    def spy(path, flags, *args):
        opened.append((os.path.basename(path), flags))
        return real_open(path, flags, *args)

    names = iter(["taken", "taken", "free"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    monkeypatch.setattr(files.os, "open", spy)
    mine = f"{files._host()}.{os.getpid()}"                   # this machine, this process
    taken = tmp_path / f".out.json.{mine}.taken.tmp"
    taken.symlink_to(tmp_path / "elsewhere")
    write_json(tmp_path / "out.json", {"a": 1})
    writes = [(n, f) for n, f in opened if n.startswith(".out.json.")]
    print(writes)
    assert [n for n, _ in writes] == [taken.name] * 2 + [f".out.json.{mine}.free.tmp"]
    for _, flags in writes:
        assert flags & os.O_EXCL and flags & os.O_CREAT and flags & os.O_NOFOLLOW
    assert not (tmp_path / "elsewhere").exists()
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1}


def test_leftovers_of_dead_writers_are_removed_live_ones_kept(tmp_path):
    """Temporary names carry the machine (``files._host()``) since a writer on another
    machine sharing the folder may have any pid: only this machine's are judged by pid."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    host = files._host()
    stale = tmp_path / f".data.json.{host}.{dead}.abcd1234.tmp"
    live = tmp_path / f".data.json.{host}.{os.getppid()}.abcd1234.tmp"  # pytest's parent runs
    other = tmp_path / f".other.json.{host}.{dead}.abcd1234.tmp"          # another file's
    for p in (stale, live, other):
        p.write_bytes(b"half")
    write_json(tmp_path / "data.json", [1])
    assert not stale.exists() and live.exists() and other.exists()


def test_a_writer_on_another_machine_keeps_its_temporary_file(tmp_path, monkeypatch):
    """Two machines share a folder (a home on NFS: the CPU kernel's cache, an out_dir).
    Machine A is writing; machine B finishes a write of the same file and clears the
    temporaries of dead writers -- judging A's pid on B, where no such process runs.
    Before: B removed A's half-written file and A's rename failed (FileNotFoundError: the
    kernel's build crashed every strided call on A). Now a temporary names its machine,
    and only this machine's are judged by pid."""
    path = tmp_path / "lib.so"

    def as_machine_b():
        with monkeypatch.context() as m:
            m.setattr(files.socket, "gethostname", lambda: "machine-b")
            m.setattr(files, "_alive", lambda pid: False)        # A's pid means nothing on B
            files.write_bytes(path, b"B's build")

    def writer(f):                                       # machine A, mid-write
        f.write(b"A's build")
        as_machine_b()

    atomic_write(path, writer)
    assert path.read_bytes() == b"A's build"
    assert [p.name for p in tmp_path.iterdir()] == ["lib.so"]


def test_a_long_file_name_is_written(tmp_path):
    """A name the folder takes (255 bytes) is written: its temporary file's name is cut to
    fit, with a digest of the whole (``sample --out`` drew every sample, then failed on its
    temporary name)."""
    for length in (200, 255):
        path = tmp_path / ("x" * (length - 4) + ".txt")
        files.write_bytes(path, b"all of it")
        assert path.read_bytes() == b"all of it"
    assert len(list(tmp_path.iterdir())) == 2


def test_a_figure_is_written_atomically(tmp_path, monkeypatch):
    """The one save function of the figures: a write that fails (here: the disk refuses
    the fsync) leaves the previous PNG whole and no temporary file behind."""
    import matplotlib.pyplot as plt

    from fast.plots import style

    path = tmp_path / "fig.png"
    fig = plt.figure(figsize=(1, 1))
    style.save(fig, path)
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG")
    fig = plt.figure(figsize=(2, 2))

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        style.save(fig, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs: POSIX")
def test_regular_file_says_what_a_path_is(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    assert files.regular_file(tmp_path / "file", "data") == tmp_path / "file"
    for name, what in (("fifo", "a FIFO"), ("folder", "a folder")):
        with pytest.raises(ValueError, match=f"data {tmp_path / name} is {what}; allowed"):
            files.regular_file(tmp_path / name, "data")
    if os.path.exists("/dev/zero"):
        with pytest.raises(ValueError, match="is a device"):
            files.regular_file("/dev/zero", "data")
    with pytest.raises(FileNotFoundError, match="not found"):
        files.regular_file(tmp_path / "nothing", "data")


# ----------------------------------------------------------------------------
# The folder lock: one holder, named to the next; released on exit and on a crash.
# ----------------------------------------------------------------------------

def test_a_held_folder_is_refused_naming_the_holder(tmp_path):
    with FolderLock(tmp_path, "out_dir"):
        with pytest.raises(FolderBusy, match=rf"out_dir {tmp_path} is in use by another run "
                                             rf"\(pid {os.getpid()} on "):
            FolderLock(tmp_path, "out_dir").acquire()
    assert list(tmp_path.iterdir()) == []                         # released and removed
    with FolderLock(tmp_path, "out_dir"):                         # and free again
        pass


def test_a_planted_lock_link_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".fast.lock").symlink_to(victim)
    with pytest.raises(ValueError, match="cannot be locked"):
        FolderLock(tmp_path / "out").acquire()
    assert victim.read_bytes() == b"keep"


HOLD = """
import sys, time
from fast.core.lock import FolderLock
FolderLock(sys.argv[1], "out_dir").acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_lock_dies_with_its_holder(tmp_path):
    """kill -9 of the holder: the kernel drops its flock, so the folder is free at once
    (no stale lock to wait for or clean up), though the holder's file is still there."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(FolderBusy, match=f"pid {proc.pid} on"):
        FolderLock(tmp_path, "out_dir").acquire()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / ".fast.lock").exists()                     # left behind by the dead
    with FolderLock(tmp_path, "out_dir"):
        assert str(os.getpid()) in (tmp_path / ".fast.lock").read_text()
