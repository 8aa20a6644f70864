"""The strided and fixed patterns' pieces through a CPU kernel of our own (C, float32).

Child et al., 2019, section 4.3 (strided: A(1), the last l positions; A(2), every l-th
one; fixed: A(1), the own block; A(2), the last c positions of every block) and section 5.5
("attention with a stride of k can be computed by transposing the matrix and computing a
local window"; "Fixed attention positions can be aggregated and computed in blocks").
``fast.backends.structured.strided`` cuts the strided heads into short causal problems: the band, a
window of l keys per row, and the column, M = n / l rows per sequence. PyTorch's CPU flash
kernel takes problems that short in 32- or 64-row query blocks of general matrix products,
at about half of dense attention's rate per computed pair (docs/design.md, section 5).
``cpu_window.c`` takes them in 16-row blocks whose products are register tiles, recomputes in
a flash-style backward, and merges the band into the column's output in place (no merge
pass). ``fast.backends.structured.fixed`` hands it the fixed pattern's own block (``forward`` with
sequences of l rows, l apart) and, in prefix mode (``prefix_forward``), the summaries of all
earlier blocks: row i reads the first (i // l) c of the gathered summaries. That is the bulk
of the fixed pattern's work; through PyTorch's kernel it was one causal problem of
(n / l - 1) c rows per sub-block (a "fold") plus a masked tail, whose 512-key causal blocks
computed 12% more than it needs, and in prefix mode it computes no pair it does not need
but the few of 16-row blocks straddling two query blocks.

Measured with ``fast.measure.pieces.piece_times("strided", 16384, rounds=5)`` (B = 1,
H = 4, d = 64, float32, l = 128), once as it is and once with SPARSE_ATTENTION_CPU_KERNEL=0
(PyTorch's kernel), one after the other on the project's 2-core machine: column forward 11.7
against 17.3 ms, band forward 17.9 against 25.3 ms plus a 2.6 ms merge, column backward
27.3 against 49.2 ms, band backward 46.2 against 80.9 ms; the whole layer 32.5 against
46.8 ms forward, 119 against 181 ms forward + backward.
The fixed layer (``piece_times("fixed", 16384, rounds=3)``, l = 128, c = 32, the merged
head: one piece), the same way: the piece's forward 220 against 281 ms, its backward
530 against 753 ms; the whole layer 217 against 295 ms forward, 750 against 1,077 ms
forward + backward.
The benchmark (``python -m fast bench``) measures the whole layer.

When it runs (``usable``): CPU float32 tensors whose rows are contiguous (stride d, d a
multiple of 8), once the kernel is built. Anything else -- float64 (the float64
recompute of large scores), float16/bfloat16 (computed in float32 by the caller, so they
do reach it), CUDA, "meta" tensors, an odd head size -- takes PyTorch's kernel
(``fast.backends.flash_cpu``), which stays the fallback everywhere.

How it is built: on first use, with the C compiler of ``$CC`` or ``cc`` / ``gcc`` /
``clang`` on the PATH (``-O3 -march=native``; without ``-march=native`` if the compiler
refuses it), into a temporary folder, and kept in a cache folder that only its owner can
write (``fast.backends.kernel_cache``: where it is, whose files are loaded, how a library
is checked before it runs, what the key covers). Without a compiler, or when the build
fails, ``missing()`` says why and the PyTorch kernel serves every call; when the cache
cannot be used (not private, not writable), the library built for this process is used
all the same, with one warning. ``SPARSE_ATTENTION_CPU_KERNEL=0`` in the environment
turns the kernel off (``SPARSE_ATTENTION_CPU_KERNEL=1`` makes a missing kernel an error
instead of a fallback). ``build()`` says which kernel serves this process, as a
training checkpoint records it (a resume that would run another is told so).

Threads: each call runs on ``torch.get_num_threads()`` threads of the OpenMP runtime PyTorch
loaded (POSIX threads where the compiler has no OpenMP); the GIL is released during the call.
Every block is one thread's, in an order the geometry alone fixes, with fixed 8-lane vectors
and no reassociation: the results are the same bit for bit for any thread count (tested) and
for an AVX2 build and an AVX-512 one (checked on this project's machine with
``-march=haswell`` against ``-march=native``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from fast.backends import kernel_cache

SOURCE = Path(__file__).with_name("cpu_window.c")
ENV = "SPARSE_ATTENTION_CPU_KERNEL"
FLAGS = ["-O3", "-shared", "-fPIC", "-pthread"]
NATIVE = ["-march=native"]
OPENMP = ["-fopenmp"]

_LOCK = threading.Lock()
_STATE: dict = {}               # "lib": the loaded library, or "missing": why there is none;
                                # "flags": the flags it was built with
# Told ("window", problems, rows, window) or ("prefix", heads, rows, block, keys) of every
# forward call: fast.measure.kernel_pairs counts the pairs the kernel computes from them,
# on "meta" tensors (shapes only, no call into C).
OBSERVERS: list = []
R = 16                          # query rows per block (cpu_window.c)
# The longest window the callers hand the kernel: a window of N rows is dense causal
# attention (the "full" plan's band); beyond this PyTorch's kernel, in large blocks, is left
# the dense work (``fast.backends.structured.dense_window`` says where below it the window
# kernel takes "full").
WINDOW_MAX = 1024
PREFIX_TASKS = 16               # prefix_backward's tasks at least (prefix_segments)


def pairs(rows: int, window: int) -> int:
    """(query, key) pairs the kernel computes for one sequence of ``rows`` rows: each block
    of R rows (the last one padded to R) scores every key from the first row's window start
    to its last row."""
    return sum(R * (min(rows, b + R) - max(0, b - window + 1)) for b in range(0, rows, R))


def prefix_pairs(rows: int, block: int, keys: int) -> int:
    """The pairs ``prefix_forward`` computes for one head of ``rows`` rows: each block of R
    rows (the last one padded to R) scores every key its last row reads."""
    return sum(R * ((min(rows, b + R) - 1) // block * keys) for b in range(0, rows, R))


def _compiler() -> str | None:
    for name in (os.environ.get("CC", "").split() or [None])[:1] + ["cc", "gcc", "clang"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_flags() -> str:
    """This CPU's feature flags (Linux), or what the platform says of the processor."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() + platform.machine()


def _compile(cc: str, flags: list[str], folder: Path) -> tuple[Path | None, str]:
    """(the library built in ``folder``, "") or (None, the compiler's complaint)."""
    built = folder / "cpu_window.so"
    run = subprocess.run([cc, *flags, str(SOURCE), "-o", str(built), "-lm"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return None, f"{cc} {' '.join(flags)}: {run.stderr.strip()[-500:]}"
    return built, ""


def _build() -> tuple[ctypes.CDLL | None, str, str]:
    """(library, "", its flags) or (None, why not, ""): from the cache when a library of
    this key is there and checks out (``kernel_cache``), else compiled in a temporary
    folder, kept in the cache if it takes it, and loaded."""
    cc = _compiler()
    if cc is None:
        return None, ("no C compiler found ($CC, cc, gcc or clang); the strided band and column "
                      "use PyTorch's CPU kernel"), ""
    errors, cache = [], kernel_cache.Cache()
    try:
        source = SOURCE.read_bytes()
        version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
        for flags in (FLAGS + NATIVE + OPENMP, FLAGS + OPENMP, FLAGS + NATIVE, FLAGS):
            k = kernel_cache.key(source, cc, version, " ".join(flags),
                                 kernel_cache.target(cc, flags), _cpu_flags(), sys.platform)
            found = cache.find(k)
            try:
                if found is not None:
                    return _declare(kernel_cache.load(*found)), "", " ".join(flags)
                with tempfile.TemporaryDirectory() as tmp:
                    built, why = _compile(cc, flags, Path(tmp))
                    if built is None:
                        errors.append(why)
                        continue
                    cache.store(k, built.read_bytes())
                    return _declare(ctypes.CDLL(str(built))), "", " ".join(flags)
            except (OSError, AttributeError) as err:    # unloadable, or no temporary folder
                errors.append(f"{' '.join(flags)}: {err}")
    except OSError as err:
        errors.append(str(err))
    finally:
        cache.close()
    return None, "building cpu_window.c failed: " + " | ".join(errors), ""


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    P, L, I, F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
    lib.window_forward.argtypes = [P] * 6 + [L] * 5 + [I] * 4 + [F, I]
    lib.window_backward.argtypes = [P] * 10 + [L] * 5 + [I] * 4 + [F, I]
    lib.prefix_forward.argtypes = [P] * 6 + [L] * 3 + [I, L, L, I, F, I]
    lib.prefix_backward.argtypes = [P] * 10 + [L] * 3 + [I, L, L, L, I, F, I]
    lib.window_forward.restype = lib.window_backward.restype = I
    lib.prefix_forward.restype = lib.prefix_backward.restype = I
    return lib


def library() -> ctypes.CDLL | None:
    """The built kernel, or None (``missing()`` says why); builds it on first use."""
    if "lib" not in _STATE:
        with _LOCK:
            if "lib" not in _STATE:
                setting = os.environ.get(ENV, "")
                if setting == "0":
                    lib, why, flags = None, f"turned off by {ENV}=0", ""
                else:
                    lib, why, flags = _build()
                    if lib is None and setting == "1":
                        raise RuntimeError(f"{ENV}=1 asks for the CPU window kernel, but {why}")
                _STATE.update(lib=lib, missing=why, flags=flags)
    return _STATE["lib"]


def missing() -> str:
    """Why the kernel is not used ("" when it is)."""
    library()
    return _STATE["missing"]


def build() -> str:
    """Which kernel serves this process's float32 CPU calls, in words a checkpoint keeps:
    "cpu_window.c <its compiler flags>", or "PyTorch's kernel" when the C kernel is off or
    missing. Two runs with the same words compute alike, bit for bit (the C kernel's
    results do not depend on the thread count, nor on the instruction set its flags pick
    up on each machine: see the module docstring)."""
    library()
    return f"cpu_window.c {_STATE.get('flags', '')}" if _STATE["lib"] is not None else \
        "PyTorch's kernel"


def usable(*rows: torch.Tensor) -> bool:
    """Whether these (G, N, d) tensors can go through the kernel: CPU, float32, rows of
    stride d with d a multiple of 8, and a built kernel. "meta" tensors (shapes only) take
    the path CPU ones would, and the kernel's calls do nothing on them but tell
    ``OBSERVERS``."""
    d = rows[0].shape[-1]
    return (d % 8 == 0 and all(t.device.type in ("cpu", "meta") and t.dtype == torch.float32
                               and t.dim() == 3
                               and t.stride(2) == 1 and t.stride(1) == d for t in rows)
            and library() is not None)


def _strides(*ts: torch.Tensor):
    return (ctypes.c_long * len(ts))(*(t.stride(0) for t in ts))


def _check(rc: int, what: str) -> None:
    if rc == 1:
        raise MemoryError(f"the CPU window kernel's {what} could not allocate its scratch memory")
    if rc != 0:
        raise RuntimeError(f"the CPU window kernel's {what} refused its arguments (code {rc})")


def _geometry(q: torch.Tensor, sequences: int, rows: int | None, step: int, seqoff: int,
              window: int) -> tuple[int, int]:
    """(G, rows per sequence); ValueError when the sequences leave q's N rows."""
    G, N, _ = q.shape
    rows = N if rows is None else rows
    if min(rows, sequences, step, window) < 1 or (sequences - 1) * seqoff + (rows - 1) * step >= N:
        raise ValueError(f"{sequences} sequences of {rows} rows, {step} apart, starting "
                         f"{seqoff} apart, with a window of {window}, do not fit {N} rows")
    return G, rows


def forward(q, k, v, out, lse, *, window: int, scale: float, strict: bool = False,
            merge: bool = False, sequences: int = 1, rows: int | None = None, step: int = 1,
            seqoff: int = 0) -> None:
    """Write (or, with ``merge``, merge into) ``out`` (G, N, d) and ``lse`` (G, N) the
    attention of every row of ``sequences`` sequences of ``rows`` rows (all N by default),
    row r of sequence s at natural row s seqoff + r step, over its window: keys
    i - window < j <= i of its sequence (j < i if strict). See ``cpu_window.c``."""
    G, Nseq = _geometry(q, sequences, rows, step, seqoff, window)
    if lse.stride(1) != 1:
        raise ValueError("lse rows must be contiguous")
    for observe in OBSERVERS:
        observe("window", G * sequences, Nseq, window)
    if q.device.type == "meta":
        return
    with torch.profiler.record_function("cpu_window_forward"):   # named in profiles
        _check(library().window_forward(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
            _strides(q, k, v, out, lse), G, sequences, Nseq, step, seqoff, q.shape[2], window,
            int(strict), int(merge), scale, torch.get_num_threads()), "forward")


def backward(q, k, v, go, out, lse, dq, dk, dv, *, window: int, scale: float,
             strict: bool = False, init: bool = False, sequences: int = 1,
             rows: int | None = None, step: int = 1, seqoff: int = 0) -> None:
    """Add (``init``: write; packed sequences only, step >= 2) this piece's share of the
    gradients into dq, dk, dv (G, N, d), given the merged out and lse (rows whose lse is
    +inf contribute nothing)."""
    G, Nseq = _geometry(q, sequences, rows, step, seqoff, window)
    if lse.stride(1) != 1:
        raise ValueError("lse rows must be contiguous")
    if q.device.type == "meta":
        return
    with torch.profiler.record_function("cpu_window_backward"):
        _check(library().window_backward(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), go.data_ptr(), out.data_ptr(),
            lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            _strides(q, k, v, out, lse, go, dq, dk, dv), G, sequences, Nseq, step, seqoff,
            q.shape[2], window, int(strict), int(init), scale, torch.get_num_threads()),
            "backward")


def _prefix_geometry(q, ks, block: int, keys: int) -> tuple[int, int, int]:
    """(G, N, Nk); ValueError when the last block's rows would read past the Nk keys."""
    G, N, _ = q.shape
    Nk = ks.shape[1]
    if min(block, keys) < 1 or (N - 1) // block * keys > Nk:
        raise ValueError(f"{N} rows in blocks of {block}, each reading {keys} more keys, "
                         f"do not fit {Nk} keys")
    return G, N, Nk


def prefix_forward(q, ks, vs, out, lse, *, block: int, keys: int, scale: float,
                   merge: bool = False) -> None:
    """Prefix mode: write (``merge``: merge into) ``out`` (G, N, d) and ``lse`` (G, N) the
    attention of every row i of q (G, N, d) over keys t < (i // block) * keys of ks, vs
    (G, Nk, d) -- the fixed pattern's summaries of all earlier blocks, gathered in block
    order (``fast.backends.structured.fixed``). Rows of the first block read nothing (lse -inf)."""
    G, N, Nk = _prefix_geometry(q, ks, block, keys)
    if lse.stride(1) != 1:
        raise ValueError("lse rows must be contiguous")
    for observe in OBSERVERS:
        observe("prefix", G, N, block, keys)
    if q.device.type == "meta":
        return
    with torch.profiler.record_function("cpu_window_prefix_forward"):
        _check(library().prefix_forward(
            q.data_ptr(), ks.data_ptr(), vs.data_ptr(), out.data_ptr(), lse.data_ptr(),
            _strides(q, ks, vs, out, lse), G, N, Nk, q.shape[2], block, keys, int(merge),
            scale, torch.get_num_threads()), "prefix forward")


def prefix_segments(G: int) -> int:
    """Segments each head's query blocks are cut into in ``prefix_backward``: at least
    PREFIX_TASKS tasks of about equal work in all (segment s takes the 16-row blocks s,
    s + segments, ...), so that threads share them evenly. It depends on G alone, not on
    the thread count, so that the sum over segments -- and so the result, bit for bit --
    is the same for any number of threads."""
    return -(-PREFIX_TASKS // G)


def prefix_backward(q, ks, vs, go, out, lse, dq, dks, dvs, *, block: int, keys: int,
                    scale: float, init: bool = False) -> None:
    """The gradient of ``prefix_forward`` given the merged out and lse (rows whose lse is
    +inf contribute nothing): added into dq (G, N, d) (``init``: written), and written whole
    into dks, dvs (G, segments, Nk, d), contiguous, one slice per segment of a head's query
    blocks (``prefix_segments``); the caller sums them over the segments."""
    G, N, Nk = _prefix_geometry(q, ks, block, keys)
    if lse.stride(1) != 1:
        raise ValueError("lse rows must be contiguous")
    if (dks.dim() != 4 or dks.shape[0] != G or dks.shape[2:] != ks.shape[1:]
            or dks.shape != dvs.shape or not (dks.is_contiguous() and dvs.is_contiguous())):
        raise ValueError(f"dks, dvs must be contiguous (G, segments, Nk, d) = ({G}, s, "
                         f"{Nk}, {ks.shape[2]}), got {tuple(dks.shape)}, {tuple(dvs.shape)}")
    if q.device.type == "meta":
        return
    flat = [t.flatten(0, 1) for t in (dks, dvs)]                   # (G segments, Nk, d)
    with torch.profiler.record_function("cpu_window_prefix_backward"):
        _check(library().prefix_backward(
            q.data_ptr(), ks.data_ptr(), vs.data_ptr(), go.data_ptr(), out.data_ptr(),
            lse.data_ptr(), dq.data_ptr(), dks.data_ptr(), dvs.data_ptr(),
            _strides(q, ks, vs, out, lse, go, dq, *flat), G, N, Nk, q.shape[2], block, keys,
            dks.shape[1], int(init), scale, torch.get_num_threads()), "prefix backward")
