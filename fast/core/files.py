"""Every file the project writes, written one way: whole or not at all, never through a link.

Child et al., 2019, section 6 trains for days: a run must survive being killed at
any moment, and so must every cache the figure scripts write (sec. 7's results
are recomputed from them). Everything the project writes to disk goes through
``atomic_write``: checkpoints (``fast.transformer.network.checkpoint``), samples
(``python -m fast sample``), figures (``fast.plots.style.save``), the JSON caches of
``fast.experiments`` and the notebooks a command re-executes. How:

1. a temporary file ``.<name>.<host>.<pid>.<random>.tmp`` is created in the folder
   of ``path`` with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (and the file's ``mode``, when
   one is given, whatever the umask): a new file of a name nobody can predict, never
   an existing file and never the target of a symbolic link someone planted (a name
   taken is drawn again). ``<host>`` is 8 hex digits of this machine's name, so that
   writers on several machines sharing a folder (a home on NFS) tell their
   temporaries apart; a ``<name>`` too long to leave room for the rest within the
   file system's 255 bytes is cut, with a digest of the whole name in place of its
   end, so any name a folder takes can be written;
2. the writer fills it; it is flushed and ``fsync``-ed;
3. ``os.replace`` renames it over ``path`` (atomic on one file system; a link at
   ``path`` itself is replaced, its target left alone);
4. the folder is ``fsync``-ed, so that the rename survives a power cut too
   (file systems that cannot sync a folder are left at step 3).

What happens on a fault:

* the writer raises (a full disk, a read-only folder, a bug): the temporary file is
  removed, ``path`` is left as it was, and the error propagates. When the file system
  refused a write, that ``OSError`` is what propagates, even if the writer turned it
  into its own exception (``torch.save`` reports a full disk as a RuntimeError
  about stream positions);
* the process is killed (``kill -9``) mid-write: ``path`` is left as it was; its
  temporary file remains (nothing can remove it then) and nothing reads it; the next
  successful write of ``path`` on the same machine removes the temporary files of
  ``path`` whose process (the pid in the name) no longer runs there. A temporary
  file another machine's writer made is never removed: its pid means nothing here.

``check_writable`` tells, before any work, whether a folder takes a file;
``regular_file`` says in one sentence why a path given as an input file is not one
(missing, a folder, a FIFO, a device); ``identity`` tells whether a file is still
the one seen before (``fast.transformer.training`` checks its checkpoint with it).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import socket
import stat
import tempfile
from pathlib import Path

# a new file, never an existing one, never through a link; not inherited by children
_CREATE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
           | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


class _Recording:
    """A binary file whose ``write`` remembers the OSError it raised, if any."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.f.flush()


# The longest part of a temporary file's name taken from the target's name, in bytes:
# what is left of 255 (NAME_MAX on Linux, macOS and Windows) holds the rest with room.
STEM_BYTES = 200


def _host() -> str:
    """8 hex digits that name this machine in temporary files' names (step 1 above)."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def _stem(name: str) -> str:
    """``name`` as the temporary files of it start: itself, or, beyond STEM_BYTES
    bytes, its first bytes and a digest of the whole (step 1 above)."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= STEM_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return raw[:STEM_BYTES - 17].decode("utf-8", "ignore") + "~" + digest


def _temporary(path: Path, mode: int | None = None) -> tuple[Path, int]:
    """(name, descriptor) of a new, empty file beside ``path`` (step 1 above), with
    permissions ``mode`` whatever the umask (None: 0o666 less the umask)."""
    for _ in range(100):
        tmp = path.with_name(f".{_stem(path.name)}.{_host()}.{os.getpid()}."
                             f"{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, _CREATE, 0o666 if mode is None else mode & 0o600)
        except FileExistsError:
            continue                 # taken (or planted): draw another name
        if mode is not None and hasattr(os, "fchmod"):     # POSIX: exactly ``mode``
            os.fchmod(fd, mode)
        return tmp, fd
    raise FileExistsError(errno.EEXIST, "no free temporary name after 100 draws", str(path))


def _sync_folder(folder: Path) -> None:
    """fsync a folder (its entries: the rename); skipped where the OS cannot do it."""
    if os.name != "posix":
        return                       # Windows cannot open a folder to sync it
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise                    # those say "this file system does not sync folders"
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (another user's counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale(path: Path) -> None:
    """Remove the temporary files of ``path`` left by writers on this machine killed
    mid-write (another machine's are left alone: their pids mean nothing here)."""
    prefix, host = f".{_stem(path.name)}.", _host()
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        parts = name[len(prefix):].split(".") if name.startswith(prefix) else []
        if len(parts) != 4 or parts[3] != "tmp" or parts[0] != host or not parts[1].isdigit():
            continue
        if _alive(int(parts[1])):
            continue                 # a writer at work: its file is not ours to take
        try:
            if not stat.S_ISDIR(os.lstat(path.parent / name).st_mode):
                os.unlink(path.parent / name)      # a link is removed, never followed
        except OSError:
            pass                     # gone meanwhile, or not ours to remove: harmless


def atomic_write(path, write, mode: int | None = None) -> str:
    """Call ``write(file)`` on a new temporary file beside ``path``, then rename it over
    ``path`` (the module docstring: exclusive, no links followed, fsync-ed, folder
    synced). If writing fails, the temporary file is removed and ``path`` is left as it
    was. Returns the path. ``file`` offers ``write`` and ``flush`` (enough for
    ``torch.save``, JSON and bytes). ``mode``: the file's permissions whatever the
    umask (e.g. 0o600: its owner's alone), set before it takes the name ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = _temporary(path, mode)
    recording = None
    try:
        with os.fdopen(fd, "wb") as f:
            recording = _Recording(f)
            write(recording)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _sync_folder(path.parent)
    except BaseException as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass                     # e.g. the folder itself is gone: nothing to clean up
        if recording is not None and recording.error is not None and recording.error is not err:
            raise recording.error from err
        raise
    _remove_stale(path)
    return str(path)


def write_bytes(path, data: bytes, mode: int | None = None) -> str:
    """``data`` to ``path`` atomically (samples, figures, notebooks, built libraries);
    ``mode`` as ``atomic_write`` takes it."""
    return atomic_write(path, lambda f: f.write(data), mode)


def write_json(path, data, indent=None) -> str:
    """``json.dumps(data)`` to ``path`` atomically (the figure scripts' caches)."""
    return write_bytes(path, json.dumps(data, indent=indent).encode())


def check_writable(folder: Path) -> None:
    """Make ``folder`` if needed and create (then remove) a file in it; OSError if not."""
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a file, not a folder", str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
    os.close(fd)
    os.unlink(probe)


def kind(path) -> str:
    """What ``path`` is, in words: "a file", "a folder", "a FIFO", "a device", "a
    socket", "missing" (a link is followed)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    return ("a file" if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def regular_file(path, what: str, allowed: str = "a regular file") -> Path:
    """``path`` as a Path if it is a regular file; else FileNotFoundError (missing) or
    ValueError (a folder, a FIFO, a device...), one sentence naming ``what``, the path
    and what is ``allowed``."""
    path = Path(path)
    found = kind(path)
    if found == "missing":
        raise FileNotFoundError(f"{what} {path} not found; allowed: {allowed}")
    if found != "a file":
        raise ValueError(f"{what} {path} is {found}; allowed: {allowed}")
    return path


def identity(path) -> tuple | None:
    """What tells a file from its replacement: (device, inode, size, mtime in ns) of
    ``path`` itself (a link is not followed), or None when nothing is there."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def lands_on(out, given) -> str | None:
    """Where writing ``out`` would land on the input ``given``: "over" (the same file),
    "inside" (``given`` is a folder that holds ``out``), or None. A command checks its
    outputs against its inputs with it, so that it never writes over what it reads."""
    if not os.path.exists(given):
        return None
    if Path(given).is_dir() and Path(os.path.realpath(out)).is_relative_to(
            os.path.realpath(given)):
        return "inside"
    if os.path.exists(out) and os.path.samefile(out, given):
        return "over"
    return None
