"""The JSON caches of the figure scripts: read whole or refused in one sentence, never half-read.

Child et al., 2019, section 7: every result the README and the notebooks show is
recomputed by a script that writes its numbers to figures/data/*.json (atomically,
``fast.core.files.write_json``) and resumes from them: a step whose result is there is
not run again. A cache can still be damaged from outside (a truncated copy, an empty
file, another program's JSON, a file in another encoding), so every script reads its
cache through ``read_cache``, and one that resumes through ``resumable``:

* ``read_cache(path, shape)`` -- the cache's dict, ``None`` when there is none, or a
  ``CacheError`` naming the file, what is wrong with it and what to do;
* ``resumable(path, quick, force, shape)`` -- the dict a run continues: ``{}`` when
  there is none or ``force`` asks for a fresh start, else the cache, refused when it
  holds results of the other size (``quick``).

``shape`` (``fast.core.schema``) is what the reader will use from the file: a file
without it (another program's JSON, a version with other keys, a value of the wrong
kind) is refused the same way, naming the place (``['runs']['text/full']['0']
['test_bits'] is 'x'; expected a number``), before anything is read from it.

``CacheError`` is a ValueError; a command prints it as its one line, exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

from fast.core.schema import ShapeError, check


class CacheError(ValueError):
    """A cache file that cannot be read or resumed from (says which, why, and what to do)."""


def _load(path: Path):
    """(the JSON object in ``path``, None) or (None, what is wrong with the file)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except IsADirectoryError:
        return None, "a folder"
    except OSError as err:
        return None, f"unreadable: {err.strerror or err}"
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as err:
        return None, ("empty" if not path.stat().st_size
                      else f"not valid JSON: {err.msg} at line {err.lineno}")
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object"
    return data, None


def _shaped(path: Path, data: dict, shape, fix: str) -> dict:
    """``data`` if it has ``shape`` (None: any dict); else CacheError saying where not."""
    if shape is not None:
        try:
            check(data, shape)
        except ShapeError as err:
            raise CacheError(f"{path} does not hold what is read from it ({err}); allowed: "
                             f"a JSON file written by this project's scripts ({fix})") from err
    return data


def read_cache(path, shape=None, advice: str = "delete it to have it recomputed"
               ) -> dict | None:
    """The JSON object in ``path``, shaped as ``shape`` says; None when the file does not
    exist. ``advice``: how to replace a damaged file, said in the CacheError (a reader
    that recomputes nothing names the command that writes the file)."""
    path = Path(path)
    if not path.exists():
        return None
    data, wrong = _load(path)
    if wrong:
        raise CacheError(f"{path} cannot be read ({wrong}); allowed: a JSON file written by "
                         f"this project's scripts ({advice})")
    return _shaped(path, data, shape, advice)


def resumable(path, quick: bool, force: bool = False, shape=None) -> dict:
    """The results a run continues from ``path`` ({} when absent or ``force``), shaped
    as ``shape`` says."""
    path = Path(path)
    if force or not path.exists():
        return {}
    data, wrong = _load(path)
    if wrong:
        raise CacheError(f"{path} cannot be resumed from ({wrong}); allowed: a JSON file this "
                         f"command wrote, or --force to replace it")
    if not isinstance(data.get("quick", quick), bool):
        raise CacheError(f"{path} says quick={data['quick']!r}; allowed: true or false (a JSON "
                         f"file this command wrote), or --force to replace it")
    if data.get("quick", quick) != quick:
        raise CacheError(f"{path} holds other results ({'quick' if data['quick'] else 'full'} "
                         f"ones; this run makes {'quick' if quick else 'full'} ones); allowed: "
                         f"--force to replace them, or another --out")
    return _shaped(path, data, shape, "or --force to replace it")
