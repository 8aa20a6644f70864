"""Where the CPU window kernel's built library is kept, and when one found there is loaded.

Child et al., 2019, section 5.5 computes the sparse patterns with kernels of their own;
ours on the CPU is C (``fast.backends.cpu_window``), compiled on first use and kept so that
the next process does not compile it again. A library is code: loading one runs its
constructors in the process. So the cache trusts only its owner, as ssh trusts
``~/.ssh`` and Python its own ``__pycache__``, and a library reaches the loader only
whole and as it was built:

* **Where**: ``$SPARSE_ATTENTION_CACHE``, else ``$XDG_CACHE_HOME/sparse-transformer``,
  else ``~/.cache/sparse-transformer`` (``cache_dir``).
* **Private**: the folder this code creates is 0700 and the library in it 0700, whatever
  the umask (missing parents are made as ``mkdir -p`` makes them). A folder found there
  is used only if it is owned by the current user and writable by nobody else (group
  and others: no write bit); a file only if, besides, it is a regular file (a link is
  not followed). The folder is judged through the descriptor it is opened by, and every file
  is opened and read relative to that descriptor, so the folder judged is the folder
  read, whatever happens to the path meanwhile.
* **Whole**: a library's name carries the SHA-256 of its bytes
  (``cpu_window-<key>-<digest>.so``): the checksum is written with the file, in the one
  rename that gives it its name (``fast.core.files``). The loader reads the bytes once,
  compares their digest with the name's, and loads exactly those bytes (from an
  anonymous in-memory file, ``memfd``, on Linux: what runs is what was checked, and
  nothing another process or machine later does to the cached file -- truncate it,
  replace it over NFS -- can pull pages from under the running code). A library that
  does not match its name (truncated, damaged) is never loaded; it is rebuilt and
  replaced.
* **The key** (``key``) hashes what the library's bytes depend on: the source, the
  compiler (its path and ``--version``), the flags, and what the flags mean on this
  machine -- the compiler's own expansion of ``-march=native`` (the instruction sets and
  CPU it picks, read from ``cc -###``) beside the CPU's feature flags. Two machines that
  share the folder (a home on NFS) therefore share a library only where it runs on both.
  Temporary files carry the machine's name and the writer's pid (``fast.core.files``),
  so a writer never removes another machine's temporary file for a pid that merely
  does not run here.

When the folder cannot be used -- not private, not creatable, not writable (a
read-only HOME, or one that is a file; a full disk) -- the library is built in a
private temporary folder and loaded from there for this process alone, with one
``CacheWarning`` that says why and how to fix it; nothing in an untrusted folder is
ever read. What it
assumes: that the current user's own files and root's actions are trusted (a process
running as this user can replace the library, as it can replace the package itself),
and that the compiler on the PATH is the one the user means (``$CC`` picks another).
On systems without POSIX ownership (Windows), the ownership checks are skipped.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import stat
import subprocess
import warnings
from pathlib import Path

from fast.core.files import write_bytes

PREFIX = "cpu_window"
FOLDER_MODE = 0o700
LIBRARY_MODE = 0o700
DIGEST = 32                     # hex digits of the SHA-256 in a library's name
ALONE = "the kernel is compiled for each process alone (about a second each)"


class CacheWarning(UserWarning):
    """The cache could not be used; the kernel was built for this process alone (the
    message says why and how to fix it)."""


class Unusable(OSError):
    """The cache folder cannot be used; ``str()`` is the sentence a warning gives."""


def cache_dir() -> Path:
    """Where built libraries are kept (the module docstring)."""
    if os.environ.get("SPARSE_ATTENTION_CACHE"):
        return Path(os.environ["SPARSE_ATTENTION_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sparse-transformer"


def target(cc: str, flags: list[str]) -> str:
    """What ``flags`` mean to ``cc`` on this machine: the instruction-set and CPU options
    of its ``-###`` expansion (gcc: ``-march=...`` and every ``-m`` option; clang:
    ``-target-cpu`` and ``-target-feature``), one per line; "" when it says nothing."""
    run = subprocess.run([cc, *flags, "-###", "-E", "-x", "c", os.devnull],
                         capture_output=True, text=True)
    kept = []
    for line in (run.stderr + run.stdout).splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        for i, word in enumerate(words):
            if word in ("-target-cpu", "-target-feature", "-tune-cpu") and i + 1 < len(words):
                kept.append(f"{word} {words[i + 1]}")
            elif word.startswith("-m") and not word.startswith("-mllvm"):
                kept.append(word)
    return "\n".join(dict.fromkeys(kept))


def key(*parts: str | bytes) -> str:
    """16 hex digits of the SHA-256 of ``parts`` (the module docstring says which)."""
    blob = b"\0".join(p if isinstance(p, bytes) else p.encode("utf-8", "replace")
                      for p in parts)
    return hashlib.sha256(blob).hexdigest()[:16]


def _owner_problem(st: os.stat_result) -> str | None:
    """Why a file or folder of this ``stat`` is not the current user's alone, or None."""
    if not hasattr(os, "geteuid"):
        return None                                  # no POSIX owners (Windows)
    why = []
    if st.st_uid != os.geteuid():
        why.append(f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002))
                           if st.st_mode & bit)
        why.append(f"writable by {who} (mode {stat.S_IMODE(st.st_mode):03o})")
    return " and ".join(why) or None


def open_folder(folder: Path) -> int:
    """A descriptor of ``folder``, made 0700 if it is not there (its missing parents as
    ``mkdir -p`` makes them); ``Unusable`` if it cannot be made or opened, or is not
    private."""
    if os.open not in os.supports_dir_fd or os.listdir not in os.supports_fd:
        raise Unusable("the CPU window kernel's cache is not used on this system (it "
                       "cannot open files relative to a folder it has checked)")
    try:
        if not folder.is_dir():
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(folder, FOLDER_MODE)
                os.chmod(folder, FOLDER_MODE)        # the umask may have taken bits away
            except FileExistsError:
                pass                                 # made meanwhile: judged below
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise Unusable(f"the CPU window kernel's cache {folder} cannot be used "
                       f"({err.strerror or err}): {ALONE}; to keep it, make that folder "
                       f"writable or set SPARSE_ATTENTION_CACHE to a writable folder of your "
                       f"own") from err
    problem = _owner_problem(os.fstat(fd))
    if problem:
        os.close(fd)
        raise Unusable(f"the CPU window kernel's cache {folder} is {problem}, so nothing in "
                       f"it is loaded (another user could have put code there): {ALONE}; fix "
                       f"it with `chown -R $(id -u) {folder} && chmod 700 {folder}`, or set "
                       f"SPARSE_ATTENTION_CACHE to a folder of your own")
    return fd


def _read(dir_fd: int, name: str) -> tuple[bytes | None, str | None]:
    """(the bytes of the regular file ``name`` of the folder ``dir_fd``, None) if it is
    this user's alone; (None, why not) if it is not (a link, a folder, a foreign or
    shared file); (None, None) if it cannot be read (gone meanwhile)."""
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except OSError:
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False                             # gone meanwhile
        return None, "a symbolic link" if link else None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        problem = _owner_problem(st)
        if problem:
            return None, problem
        try:
            return f.read(), None
        except OSError:
            return None, None


def digest(data: bytes) -> str:
    """The checksum a library's name carries."""
    return hashlib.sha256(data).hexdigest()[:DIGEST]


def find_in(dir_fd: int, k: str) -> tuple[tuple[bytes, str] | None, list[str]]:
    """((bytes, name) of a library of key ``k`` in the folder ``dir_fd`` whose bytes
    match the digest in its name and which is this user's alone, or None; [the files
    of key ``k`` refused for their owner or kind, each "name (why)"]). A file whose
    bytes do not match its name (truncated, damaged) is passed over in silence: it is
    rebuilt."""
    stem, refused = f"{PREFIX}-{k}-", []
    for name in sorted(os.listdir(dir_fd)):
        if not (name.startswith(stem) and name.endswith(".so")):
            continue
        data, why = _read(dir_fd, name)
        if why is not None:
            refused.append(f"{name} ({why})")
        elif data is not None and digest(data) == name[len(stem):-3]:
            return (data, name), refused
    return None, refused


def remove_others(dir_fd: int, k: str, keep: str) -> None:
    """Remove the files of key ``k`` but ``keep`` (damaged, or left by an older build):
    none of them is ever loaded. Errors are ignored (another process may be at it)."""
    stem = f"{PREFIX}-{k}-"
    for name in os.listdir(dir_fd):
        if name.startswith(stem) and name.endswith(".so") and name != keep:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass


def store_in(folder: Path, dir_fd: int, k: str, data: bytes) -> str:
    """Keep ``data`` as the library of key ``k`` (atomically, 0700, its digest in its
    name); the other files of ``k`` are removed. Returns the name; OSError if the
    folder does not take it."""
    name = f"{PREFIX}-{k}-{digest(data)}.so"
    write_bytes(folder / name, data, mode=LIBRARY_MODE)
    remove_others(dir_fd, k, name)
    return name


def load(data: bytes, path: Path) -> ctypes.CDLL:
    """Load the library ``data`` (the bytes just checked): from an anonymous in-memory
    file where the system has one (Linux), else from ``path``, which holds them (OSError
    if neither loads)."""
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        fd = os.memfd_create(PREFIX, getattr(os, "MFD_CLOEXEC", 0))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return ctypes.CDLL(f"/proc/self/fd/{fd}")
        except OSError:
            pass                          # e.g. /proc without exec rights: from the file
        finally:
            os.close(fd)
    return ctypes.CDLL(str(path))


class Cache:
    """The cache folder as one build finds it: ``find`` a checked library, ``store`` a new
    one, each doing what the folder allows and saying at most one ``CacheWarning`` of
    what it cannot do (the module docstring); ``close`` when done."""

    def __init__(self):
        self.folder, self.fd, self.warned = cache_dir(), None, False
        try:
            self.fd = open_folder(self.folder)
        except Unusable as err:
            self.warn(str(err))

    def warn(self, message: str) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(message, CacheWarning, stacklevel=6)

    def find(self, k: str):
        """(bytes, path) of the checked library of key ``k``, or None."""
        if self.fd is None:
            return None
        try:
            found, refused = find_in(self.fd, k)
        except OSError:
            return None
        if refused:
            self.warn(f"the CPU window kernel's cache {self.folder} holds files this code did "
                      f"not load, since they are not this user's alone: {'; '.join(refused)}; "
                      f"they are replaced by a build of its own (if you did not put them "
                      f"there, someone else can write to that folder)")
        return None if found is None else (found[0], self.folder / found[1])

    def store(self, k: str, data: bytes) -> None:
        if self.fd is None:
            return
        try:
            store_in(self.folder, self.fd, k, data)
        except OSError as err:
            self.warn(f"the CPU window kernel could not be kept in its cache {self.folder} "
                      f"({err.strerror or err}): {ALONE}; to keep it, free the "
                      f"disk or set SPARSE_ATTENTION_CACHE to a writable folder of your own")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
