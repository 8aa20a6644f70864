"""One writer per folder: a lock a training run holds on its ``out_dir`` while it runs.

Child et al., 2019, section 6 trains for days; two runs started on one ``out_dir``
would replace each other's checkpoints. ``FolderLock(folder, what)`` is held for the
life of a run (``fast.transformer.training.train``); a second run on the same folder
is refused at once with ``FolderBusy``, a ValueError whose one sentence names the
holder (its pid, host, start time and command line).

How it is crash-safe: the lock is an advisory ``flock`` on the file
``<folder>/.fast.lock``. The kernel releases a ``flock`` when the process holding it
ends in any way -- a return, an exception, ``kill -9``, a power cut -- so a lock can
never outlive its holder and there is nothing stale to clean up or time out: the
file a dead holder leaves behind is taken over by the next run. (The holder's
details written in the file are only for the message; the lock is the ``flock``.)
On release the file is removed; a run that opened it just before that finds, once
it holds the lock, that the name now points elsewhere (or nowhere) and starts over,
so two runs can never hold two different files of one name.

Limits, said plainly: ``flock`` is advisory (a program that does not take it is not
stopped; the run also checks at every save that its checkpoint is still the file it
wrote: ``fast.transformer.training.output``), and on network file systems it is
only as good as the server's locking. On Windows (no ``fcntl``) the same is done
with ``msvcrt.locking`` on the file's first byte, also released by the OS when the
process ends.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:                       # Windows
    fcntl = None
    import msvcrt

NAME = ".fast.lock"
_OPEN = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class FolderBusy(ValueError):
    """Another process holds the folder's lock; the message names it."""


def _try_lock(fd: int) -> bool:
    """Take the lock on ``fd`` without waiting; False when another holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        return False
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def _holder(path: Path) -> str:
    """What the holder wrote in the lock file, on one line."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            text = os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)
    except OSError:
        text = ""
    return " ".join(text.split()) or "a process that has not yet said who it is"


class FolderLock:
    """``with FolderLock(folder, "out_dir"):`` -- this process alone writes ``folder``
    until the block ends (``FolderBusy`` at once if another process holds it)."""

    def __init__(self, folder, what: str = "folder"):
        self.folder, self.what = Path(folder), what
        self.path = self.folder / NAME
        self.fd: int | None = None

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, _OPEN, 0o644)
            except OSError as err:
                raise ValueError(f"{self.what} {self.folder} cannot be locked: {self.path} "
                                 f"({err.strerror or err}; a link or a folder there is never "
                                 f"followed); remove it or choose another {self.what}") from err
            if not _try_lock(fd):
                os.close(fd)
                raise FolderBusy(f"{self.what} {self.folder} is in use by another run "
                                 f"({_holder(self.path)}); allowed: one run per {self.what} -- "
                                 f"wait for it to end, stop it, or choose another {self.what}")
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)                  # released and removed meanwhile: start over
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.write(fd, (f"pid {os.getpid()} on {socket.gethostname()}, since {started}: "
                      f"{' '.join(sys.argv) or 'python'}\n").encode("utf-8", "replace"))
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)          # while still held: see the module docstring
        except OSError:
            pass
        os.close(self.fd)                 # closing the last descriptor releases the lock
        self.fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def refuse_if_held(folder, what: str = "folder") -> None:
    """``FolderBusy``, naming the holder, when another process holds ``folder``'s lock now;
    nothing otherwise (a lock file left there is taken and let go at once; where there is
    none, nothing is written). For a check that would otherwise blame what the holder is
    writing (its checkpoint) rather than the holder."""
    if os.path.lexists(Path(folder) / NAME):
        FolderLock(folder, what).acquire().release()
