"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Child et al., 2019, section 6 trains for days: a run must survive being killed at
any moment, and so must every cache the figure scripts write (sec. 7's results
are recomputed from them). Everything the project writes to disk goes through
``atomic_write``: checkpoints (``fast.transformer.network.checkpoint``), the JSON caches
of ``fast.experiments``, the benchmark results and the notebooks a command re-executes.
``check_writable`` tells, before any work, whether a folder takes a file.

What happens on a fault:

* the writer raises (a full disk, a read-only folder, a bug): the temporary file is
  removed, ``path`` is left as it was, and the error propagates. When the file system
  refused a write, that ``OSError`` is what propagates, even if the writer turned it
  into its own exception (``torch.save`` reports a full disk as a RuntimeError
  about stream positions);
* the process is killed (``kill -9``) mid-write: ``path`` is left as it was; the
  ``<name>.tmp`` file may remain (nothing can remove it then), nothing reads it, and
  the next write to ``path`` replaces it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path


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


def atomic_write(path, write) -> str:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over
    ``path`` (``os.replace`` is atomic on one file system). If writing fails, the
    temporary file is removed and ``path`` is left as it was. Returns the path.
    ``file`` offers ``write`` and ``flush`` (enough for ``torch.save`` and JSON)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    recording = None
    try:
        with open(tmp, "wb") as f:
            recording = _Recording(f)
            write(recording)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass                     # e.g. the folder itself is gone: nothing to clean up
        if recording is not None and recording.error is not None and recording.error is not err:
            raise recording.error from err
        raise
    return str(path)


def write_json(path, data, indent=None) -> str:
    """``json.dumps(data)`` to ``path`` atomically (the figure scripts' caches)."""
    text = json.dumps(data, indent=indent).encode()
    return atomic_write(path, lambda f: f.write(text))


def check_writable(folder: Path) -> None:
    """Make ``folder`` if needed and create (then remove) a file in it; OSError if not."""
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a file, not a folder", str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
    os.close(fd)
    os.unlink(probe)
