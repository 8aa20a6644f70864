"""Which code produced a results file: a hash of its sources, the commit, and whether it differed.

Child et al., 2019, section 7: every number this project reports is recomputed by a script and
kept in figures/data/. A number is only as good as the code it came from, so every results
file written through ``write_result`` carries a ``"code"`` record (``code_version``):

* ``sources_sha256`` -- SHA-256 of the code that runs: every ``.py`` and ``.c`` file under
  ``fast/`` and ``reference/``, each as its path relative to the repository root and its
  bytes, in sorted order of the paths (``SOURCES``, ``source_files``). It names the code
  itself, from the files, committed or not.
* ``commit`` -- the git commit checked out when the file was written (None outside a git
  checkout or without git), and ``dirty`` -- whether those sources then differed from that
  commit (changed, staged or untracked source files; None when git cannot say).

Why a hash of the sources and not only the commit: a commit cannot contain its own id, so a
results file committed together with the code that produced it can only name the commit
before, marked dirty -- true, but it does not say which code that was. The hash can: the
results never enter it (figures/data is not a source), so a file committed in the same
commit as its code carries that commit's own sources hash, and ``python -m fast results
--provenance`` (``provenance_lines``) says, for every results file, whether it came from the
sources checked out now. Notebooks, documents and tests are left out on purpose: they do not
change a number, and editing them should not make every result look stale. A docstring
edit in ``fast/`` does change the hash; the hash says "other sources", and whether the
numbers still hold is what the reproduction tests check (tests/fast/experiments/
test_committed_results.py retrains the first steps of the committed runs bit for bit).

``PACKAGES`` is the folder that holds ``fast/`` and ``reference/``: the repository root in a
source checkout, site-packages in an installed copy (whose files are hashed the same way, and
which has no commit).
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

from fast.core.files import write_json
from fast.experiments.cache import CacheError, read_cache

PACKAGES = Path(__file__).resolve().parents[2]   # the folder that holds fast/ and reference/

SOURCES = ("fast", "reference")       # the folders whose code produces the results
SUFFIXES = (".py", ".c")              # the files there that run
FIELD = "code"                        # the key of the record in every results file


def source_files(root: Path = PACKAGES) -> list[Path]:
    """The source files under ``root`` that the hash covers (``SOURCES``, ``SUFFIXES``), in
    sorted order of their POSIX paths relative to ``root``; caches (__pycache__) left out."""
    root = Path(root)
    files = [p for folder in SOURCES if (root / folder).is_dir()
             for p in (root / folder).rglob("*")
             if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def sources_sha256(root: Path = PACKAGES) -> str:
    """SHA-256 (hex) of the sources under ``root``: each file's relative path, a NUL, its
    size, a NUL and its bytes, in ``source_files`` order (lengths keep two files from
    reading as one)."""
    h = hashlib.sha256()
    for path in source_files(root):
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _git(root: Path, *args: str) -> str | None:
    """The output of ``git -C root args`` (stripped), or None when git is missing, ``root``
    is no git checkout, or the command fails."""
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def code_version(root: Path = PACKAGES) -> dict:
    """{"sources_sha256", "commit", "dirty"} of the code under ``root`` now (module
    docstring). Not cached: a long run's children may start from edited sources, and each
    record says what its own process ran."""
    root = Path(root)
    commit = _git(root, "rev-parse", "HEAD")
    status = None if commit is None else _git(root, "status", "--porcelain",
                                              "--untracked-files=all", "--", *SOURCES)
    changed = None if status is None else [line for line in status.splitlines()
                                           if line[3:].endswith(SUFFIXES)]
    return {"sources_sha256": sources_sha256(root), "commit": commit,
            "dirty": None if changed is None else bool(changed)}


@functools.lru_cache(maxsize=1)
def process_code() -> dict:
    """``code_version`` once per process: the code this process imported at its start (a
    source edited later does not change what it runs)."""
    return code_version()


def stamp(data: dict, code: dict | None = None) -> dict:
    """``data`` with its ``"code"`` record (``code``, default this process's
    ``process_code``), a new dict; ``data`` itself is left as it was."""
    return {**data, FIELD: dict(code or process_code())}


def write_result(path, data: dict, **kwargs) -> Path:
    """Write a results file: ``data`` stamped with this process's code (``stamp``) through
    the one atomic write (``fast.core.files.write_json``, ``kwargs`` passed on)."""
    return write_json(path, stamp(data), **kwargs)


def provenance(data: dict, here: str) -> str:
    """In words, which code a results file's ``data`` came from, against the sources hash
    ``here`` of the code checked out now."""
    code = data.get(FIELD) if isinstance(data, dict) else None
    if not isinstance(code, dict) or not isinstance(code.get("sources_sha256"), str):
        return "no code recorded (written before results recorded their code)"
    commit = code.get("commit")
    at = "outside git" if commit is None else (
        f"commit {commit[:12]}" + (" with uncommitted sources" if code.get("dirty") else ""))
    if code["sources_sha256"] == here:
        return f"these sources ({at})"
    return f"other sources: {code['sources_sha256'][:12]} ({at})"


def provenance_lines(folder) -> list[str]:
    """One line per results file (``*.json``) in ``folder``: its name and which code it came
    from (``provenance``) against the sources checked out now; a results file whose runs
    came from several codes (a resumed Table 2) says so per run."""
    here = sources_sha256()
    lines = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = read_cache(path)
        except CacheError as err:
            lines.append(f"{path.name}: unreadable ({err})")
            continue
        lines.append(f"{path.name}: {provenance(data, here)}")
        runs = data.get("runs") if isinstance(data, dict) else None
        kinds = {}
        for key, by_seed in (runs.items() if isinstance(runs, dict) else ()):
            for seed, run in (by_seed.items() if isinstance(by_seed, dict) else ()):
                if isinstance(run, dict) and FIELD in run:
                    kinds.setdefault(provenance(run, here), []).append(f"{key} seed {seed}")
        if len(kinds) > 1:
            lines += [f"  runs from {what}: {', '.join(names)}" for what, names in kinds.items()]
    return lines
