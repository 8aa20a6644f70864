"""The CPU window kernel's cache (fast/backends/kernel_cache.py): it runs no one else's code,
loads a library only as it was built, and never stops a call when it cannot be used.

Child et al., 2019, section 5.5: the patterns run through a kernel of our own, on the CPU a C
library compiled on first use and kept. Attacked as a careless user and another user would:
a shared or group-writable folder with a library planted in it, a umask that makes the folder
group-writable, a truncated library, a HOME that is a file, a full disk, two machines sharing
the folder with compilers that make -march=native mean different things. Each test failed on
the code before the cache checked its folder and its files (docs/design.md, "The C kernel's
cache").
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from fast import sparse_attention
from fast.backends import cpu_window
from fast.core import files
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(cpu_window._compiler() is None or os.name != "posix",
                                reason="needs a C compiler and POSIX owners")

EVIL = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("PLANTED_MARKER");
    if (marker) { FILE *f = fopen(marker, "w"); if (f) { fputs("ran", f); fclose(f); } }
}
"""


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A cache folder of this test's own; the kernel not yet built in this process."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPARSE_ATTENTION_CACHE", str(folder))
    monkeypatch.delenv(cpu_window.ENV, raising=False)
    monkeypatch.setattr(cpu_window, "_STATE", {})
    return folder


def _libraries(folder):
    return sorted(p for p in folder.iterdir() if p.suffix == ".so")


def _build(**env) -> tuple:
    """(the library, the warnings said) of a first build in this process."""
    cpu_window._STATE.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        lib = cpu_window.library()
    return lib, [str(w.message) for w in said]


def _strided_call() -> torch.Tensor:
    q = torch.randn(1, 2, 64, 16, generator=torch.Generator().manual_seed(0))
    return sparse_attention(q, q, q, "strided", stride=8, backend="structured")


def test_the_cache_is_private_whatever_the_umask(cache):
    """Under umask 002 the folder was made 0775 and the library 0664: anyone in the
    group could replace it. Now 0700 both, whatever the umask."""
    old = os.umask(0o002)
    try:
        lib, said = _build()
    finally:
        os.umask(old)
    assert lib is not None and said == []
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    for path in _libraries(cache):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, oct(path.stat().st_mode)


def _plant(folder, tmp_path) -> None:
    """Every library in ``folder`` replaced by one whose constructor writes a marker."""
    source = tmp_path / "planted.c"
    source.write_text(EVIL)
    evil = tmp_path / "planted.so"
    subprocess.run([cpu_window._compiler(), "-shared", "-fPIC", str(source), "-o", str(evil)],
                   check=True)
    for path in _libraries(folder):                  # a new file renamed over: as an attacker
        shutil.copyfile(evil, tmp_path / "staged.so")
        os.replace(tmp_path / "staged.so", path)


@pytest.mark.parametrize("how", ["group-writable folder", "folder of another user",
                                 "file of another user"])
def test_a_library_planted_in_the_cache_never_runs(cache, tmp_path, monkeypatch, how):
    """The key hashes public facts, so whoever can write the folder can plant the next
    library loaded. Before: its constructor ran at the first strided call. Now nothing
    in a folder or file that is not the user's alone is loaded: the kernel is built for
    the process (or the file replaced), with one warning saying how to fix it."""
    assert _build()[0] is not None
    _plant(cache, tmp_path)
    marker = tmp_path / "ran"
    monkeypatch.setenv("PLANTED_MARKER", str(marker))
    if how == "group-writable folder":
        cache.chmod(0o775)
    else:
        targets = [cache] if how == "folder of another user" else _libraries(cache)
        if os.geteuid() == 0:
            for path in targets:
                os.chown(path, 65534, -1)                      # nobody
        else:                                                  # this user seen as another
            uid = os.geteuid()
            monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    lib, said = _build()
    print(said)
    assert not marker.exists(), "the planted library's constructor ran"
    assert lib is not None                         # the kernel still serves the process
    assert len(said) == 1
    assert ("chmod 700" in said[0]) if "folder" in how else ("not this user's alone" in said[0])
    torch.testing.assert_close(_strided_call(), _strided_call())


def test_a_truncated_library_is_rebuilt_never_loaded(cache):
    """A library cut short (a full disk, a copy interrupted by hand) was mapped as it was:
    SIGBUS at the first call, in every process, no message. Now its bytes do not match the
    digest in its name: it is rebuilt and replaced, never loaded."""
    assert _build()[0] is not None
    [path] = _libraries(cache)
    whole = path.read_bytes()
    with open(path, "r+b") as f:
        f.truncate(len(whole) // 2)
    run = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch
        from fast import sparse_attention
        from fast.backends import cpu_window
        q = torch.randn(1, 2, 64, 16)
        sparse_attention(q, q, q, "strided", stride=8, backend="structured")
        print(cpu_window.build())
        """)], capture_output=True, text=True, env=dict(os.environ), cwd=ROOT, timeout=300)
    print(run.stdout, run.stderr[-2000:])
    assert run.returncode == 0
    assert "cpu_window.c" in run.stdout
    assert [p.read_bytes() for p in _libraries(cache)] == [whole]


@pytest.mark.parametrize("fault", ["HOME is a file", "full disk"])
def test_an_unusable_cache_falls_back_with_one_warning(cache, tmp_path, monkeypatch, fault):
    """A cache that cannot be written: the build's write error escaped, and every strided
    and fixed CPU call died. Now the library is used for this process alone, with one
    warning."""
    if fault == "HOME is a file":
        home = tmp_path / "home"
        home.write_text("not a folder")
        monkeypatch.delenv("SPARSE_ATTENTION_CACHE")
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        monkeypatch.setenv("HOME", str(home))
    else:
        def full(fd):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(files.os, "fsync", full)
    lib, said = _build()
    print(said)
    assert lib is not None
    assert len(said) == 1 and "for each process alone" in said[0]
    torch.testing.assert_close(_strided_call(), _strided_call())


def test_sample_runs_with_a_home_that_is_a_file(tmp_path):
    """``sample`` re-running a strided model (the C kernel at every step) from a HOME that
    is a file and no other cache folder: it draws, with one warning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG", "SPARSE_ATT"))}
    (tmp_path / "home").write_text("not a folder")
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))        # this checkout
    save = ("import torch; from fast.transformer.config import ModelConfig; "
            "from fast.transformer.network.model import SparseTransformer; "
            "from fast.transformer.network.checkpoint import save_weights; "
            "torch.manual_seed(0); save_weights('m.pt', SparseTransformer(ModelConfig("
            "vocab_size=256, n_ctx=32, d_model=32, n_heads=2, n_layers=1, pattern='strided', "
            "stride=8, attention_backend='structured')))")
    subprocess.run([sys.executable, "-c", save], cwd=tmp_path, env=env, check=True, timeout=300)
    run = subprocess.run([sys.executable, "-m", "fast", "sample", "--checkpoint", "m.pt",
                          "--num", "1", "--length", "20", "--cache", "none", "--out", "s.txt",
                          "--no-progress"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    print(run.stdout, run.stderr[-3000:])
    assert run.returncode == 0 and (tmp_path / "s.txt").is_file()
    assert run.stderr.count("CacheWarning") == 1


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 targets")
def test_two_machines_sharing_the_cache_keep_a_library_each(cache, tmp_path, monkeypatch):
    """A home on NFS shared by two machines whose compilers take -march=native for
    different instruction sets, where /proc/cpuinfo does not tell them apart (macOS has
    none: every Intel Mac's key was the same; sandboxes show a generic one). The key did
    not say what -march=native meant, so the second machine loaded the first one's
    library: SIGILL where the first had instructions the second lacks. Now the key holds
    the compiler's own expansion of the flags. Simulated with a compiler wrapper that
    reads -march=native as the other machine's target."""
    real = cpu_window._compiler()
    wrapper = tmp_path / "cc"
    wrapper.write_text("#!/bin/sh\n"
                       "for a in \"$@\"; do\n"
                       "  if [ \"$a\" = -march=native ]; then a=-march=$FAKE_MARCH; fi\n"
                       "  set -- \"$@\" \"$a\"; shift\n"
                       f"done\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    built = []
    for march in ("x86-64", "x86-64-v2"):                    # two machines' "native"
        monkeypatch.setenv("FAKE_MARCH", march)
        lib, said = _build()
        assert lib is not None and said == [], said
        built.append(set(_libraries(cache)))
    assert len(built[1] - built[0]) == 1, "the second machine loaded the first one's library"


def test_damaged_libraries_are_refused_by_their_digest(cache):
    """What ``find_in`` loads: a file whose bytes match the digest in its name, and nothing
    else -- a flipped byte of the same length is passed over and rebuilt."""
    from fast.backends import kernel_cache

    assert _build()[0] is not None
    [path] = _libraries(cache)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    fd = kernel_cache.open_folder(cache)
    try:
        key = path.name.split("-")[1]
        assert kernel_cache.find_in(fd, key) == (None, [])
    finally:
        os.close(fd)
    assert _build()[0] is not None
    assert [kernel_cache.digest(p.read_bytes()) for p in _libraries(cache)] == \
        [path.name.split("-")[2][:-3]]
