"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Child et al., 2019, section 6 trains for days: a run must survive being killed at
any moment, and so must every cache the figure scripts write (sec. 7's results
are recomputed from them). Everything the project writes to disk goes through
``atomic_write``: checkpoints (``fast.transformer.checkpoint``), the JSON caches
of ``fast.experiments`` and the benchmark results.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def atomic_write(path, write) -> str:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over
    ``path`` (``os.replace`` is atomic on one file system). If writing fails, the
    temporary file is removed and ``path`` is left as it was. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return str(path)


def write_json(path, data, indent=None) -> str:
    """``json.dumps(data)`` to ``path`` atomically (the figure scripts' caches)."""
    text = json.dumps(data, indent=indent).encode()
    return atomic_write(path, lambda f: f.write(text))
