"""transformers' own model tests against the Hugging Face adapter: a peer suite.

Child et al., 2019, section 4 (attention over a pattern's positions) in other people's
models through ``fast.integrations.hf`` (docs/design.md §12), which promises to be a
drop-in for ``attn_implementation="sdpa"``. The strictest check of that promise is a
suite nobody here wrote: transformers' fast (non-slow) model tests for Llama, GPT-2,
Mistral and Qwen2, run once with sdpa and once with the adapter's "full" and "strided"
(stride 3) as every model's default attention (``fast.experiments.peer_hf_plugin``), then
compared test by test: what passes with sdpa must pass with the adapter.

The test tree (``build_tree``): the model tests, the generation mixin and the helpers come
from transformers' repository at ``UPSTREAM`` (2b296305, 5.16.0.dev0: the newest commit
of the repository this was first run from; any clone of huggingface/transformers that
holds it will do), and the top-level test files (``tests/*.py``, the model-test mixins)
and the pytest settings from the 5.23.0 source distribution, exactly as released -- the
release the adapter pins. Three small edits make it run outside transformers'
repository: a stand-in for ``tests/distributed_testing_utils.py`` (in neither source;
only names are imported, by the FSDP / tensor- / expert-parallel tests, which are
switched off), the root conftest's network-debug plugin registered only under xdist
(whose hook it defines), and ``src/transformers`` pointing at the installed package.

A run (``run``) writes, per model and mode, pytest's log ``<model>-<mode>.log`` and the
plugin's record ``<model>-<mode>.json`` (each test's outcome and its calls into the
adapter and into sdpa) under ``<tree>/logs``; ``report`` reads them.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from fast.core.files import write_bytes

MODELS = ("llama", "gpt2", "mistral", "qwen2")
MODES = ("sdpa", "full", "strided")
UPSTREAM = "2b296305d7bcf040831661b7b689e13a2e2e8d67"
RELEASE = "5.23.0"
# the environment every run gives pytest: nothing from the network, no multi-process tests
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "RUN_FSDP_TESTS": "0", "RUN_TENSOR_PARALLEL_TESTS": "0",
       "RUN_EXPERT_PARALLEL_TESTS": "0", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONUNBUFFERED": "1"}
# the failures that are not the adapter's to fix: (pattern over "test: first error line",
# why)
EXPECTED = (
    (r"^test_sdpa_can_dispatch_non_composite_models:", "asserts that the default attention is "
     "sdpa, which the switch changes by construction"),
    (r"is_causal=False|read a later key", "non-causal attention (an encoder, cross-attention "
     "or a bidirectional mask): every pattern is causal"),
)

DISTRIBUTED_STAND_IN = '''\
# Stand-in for transformers' tests/distributed_testing_utils.py, which is neither in the
# source distribution nor in the repository commit the tree is built from. Only these
# names are imported, by the FSDP / tensor- / expert-parallel tests, which the peer suite
# switches off (RUN_*_TESTS=0).


def _unavailable(*args, **kwargs):
    raise NotImplementedError("distributed test helpers are not part of the peer suite")


_get_distributed_backend = _get_distributed_device_type = _get_rank_device = _unavailable
_set_rank_device = _start_rank_processes = run_distributed = _unavailable
'''


def build_tree(folder, source, sdist=None) -> Path:
    """Build the test tree under ``folder``/transformers and return it: ``source`` is a git
    directory of transformers' repository holding ``UPSTREAM``; ``sdist`` the
    transformers-5.23.0.tar.gz source distribution (None: downloaded with pip into
    ``folder``/dl)."""
    folder, source = Path(folder).resolve(), Path(source).resolve()
    tree = folder / "transformers"
    if sdist is None:
        (folder / "dl").mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"transformers=={RELEASE}",
                        "--no-binary", ":all:", "--no-deps", "-d", str(folder / "dl")],
                       check=True)
        sdist = folder / "dl" / f"transformers-{RELEASE}.tar.gz"
    archive = subprocess.run(["git", "-C", str(source), "archive", UPSTREAM, "conftest.py",
                              "tests", "utils/test_module"], check=True,
                             capture_output=True).stdout
    _extract(tarfile.open(fileobj=io.BytesIO(archive)), tree, lambda name: name)
    top = f"transformers-{RELEASE}/"
    with tarfile.open(sdist) as released:
        _extract(released, tree, lambda name: name[len(top):] if (
            name == top + "pyproject.toml"
            or re.fullmatch(re.escape(top) + r"tests/[^/]+\.py", name)) else None)
    write_bytes(tree / "tests" / "distributed_testing_utils.py", DISTRIBUTED_STAND_IN.encode())
    conftest = tree / "conftest.py"
    text = conftest.read_text()
    old = "    register_network_debug_plugin(config)\n"
    if text.count(old) != 1:
        raise ValueError(f"{conftest}: expected one call of register_network_debug_plugin "
                         f"to guard; the tree is not commit {UPSTREAM[:8]}'s")
    write_bytes(conftest, text.replace(old, (
        "    if config.pluginmanager.hasplugin(\"xdist\"):  # peer suite: its hook is xdist's\n"
        "        register_network_debug_plugin(config)\n")).encode())
    installed = Path(importlib.util.find_spec("transformers").origin).parent
    link = tree / "src" / "transformers"
    link.parent.mkdir(exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(installed)
    return tree


def _extract(archive: tarfile.TarFile, tree: Path, rename) -> None:
    """The regular files of ``archive`` whose ``rename(name)`` is not None, at that path
    under ``tree`` (written atomically; links and paths outside ``tree`` refused)."""
    for member in archive.getmembers():
        name = rename(member.name)
        if name is None or not member.isfile():
            continue
        path = (tree / name).resolve()
        if not path.is_relative_to(tree.resolve()):
            raise ValueError(f"archive member {member.name!r} lies outside {tree}")
        write_bytes(path, archive.extractfile(member).read())


def run(tree, models=MODELS, modes=MODES, tag: str = "", no_sliding_window: bool = False,
        log=print) -> list[str]:
    """Run each model's test file under each mode from ``tree``; the logs and records in
    ``tree``/logs. Returns (and logs) one line per run: its name, exit status, seconds
    and pytest's last line."""
    tree = Path(tree).resolve()
    logs = tree / "logs"
    logs.mkdir(exist_ok=True)
    timeout = (["--timeout=300"] if importlib.util.find_spec("pytest_timeout") else [])
    lines = []
    for model in models:
        for mode in modes:
            name = f"{model}-{mode}{'-' + tag if tag else ''}"
            env = {**os.environ, **ENV, "PEER_HF_ATTN": mode,
                   "PEER_HF_RECORD": str(logs / f"{name}.json"),
                   "PEER_HF_NO_SLIDING_WINDOW": "1" if no_sliding_window else "0"}
            argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                    "fast.experiments.peer_hf_plugin", *timeout, "-rfEs",
                    f"tests/models/{model}/test_modeling_{model}.py"]
            start = time.time()
            with open(logs / f"{name}.log", "w") as f:
                rc = subprocess.run(argv, cwd=tree, env=env, stdout=f,
                                    stderr=subprocess.STDOUT).returncode
            last = _summary_line(logs / f"{name}.log")
            lines.append(f"{name}: exit {rc}, {time.time() - start:.0f} s, {last}")
            log(lines[-1])
    return lines


def _summary_line(path: Path) -> str:
    found = [line.strip("= ") for line in path.read_text(errors="replace").splitlines()
             if line.startswith("=") and " in " in line]
    return found[-1] if found else "(no summary)"


def failures(path: Path) -> dict:
    """{(test, subtest or ""): its first error line} of the tests pytest's short summary
    calls failed (FAILED, ERROR, SUBFAILED) in the log at ``path``."""
    text = path.read_text(errors="replace")
    first = {}
    parts = re.split(r"\n_+ (\S.*?) _+\n", text)
    for title, body in zip(parts[1::2], parts[2::2]):
        m = re.match(r"\w+\.(\w+)(?: \[(.*)\])?", title)
        if m:
            errors = [line[1:].strip() for line in body.splitlines() if line.startswith("E ")]
            first[(m.group(1), m.group(2) or "")] = errors[0] if errors else "(no E line)"
    failed = set()
    for line in text.splitlines():
        m = re.match(r"(?:FAILED|ERROR|SUBFAILED(?:\[(.*?)\])?) \S+::\w+::(\w+)", line)
        if m:
            failed.add((m.group(2), m.group(1) or ""))
    return {key: first.get(key, "(see the log)") for key in failed}


UNFINISHED = ("did not finish (its log has no record beside it: the run stopped before its "
              "end); run it again")


def _expected(test: str, message: str) -> str | None:
    for pattern, why in EXPECTED:
        if re.search(pattern, f"{test}: {message}"):
            return why
    return None


def report(tree, modes=("full", "strided"), models=MODELS, tag: str = "") -> str:
    """Per model: pytest's summary for sdpa and each mode, proof that the switch took (the
    tests that reached the adapter), and every test or subtest that passes with sdpa but
    fails with the adapter, with its first error line -- those expected (``EXPECTED``)
    apart."""
    logs = Path(tree).resolve() / "logs"
    suffix = f"-{tag}" if tag else ""

    def run_of(model: str, mode: str) -> tuple[Path, dict | str | None]:
        """(the log of ``mode``'s run, its per-test record: None when it never ran,
        UNFINISHED when its log has no record beside it)."""
        log = logs / f"{model}-{mode}{suffix}.log"
        record = log.with_suffix(".json")
        if not log.exists():
            return log, None
        if not record.exists():
            return log, UNFINISHED
        return log, json.loads(record.read_text())["tests"]

    out = []
    for model in models:
        base, base_record = run_of(model, "sdpa")
        if base_record is None:
            continue
        if base_record is UNFINISHED:
            out.append(f"{model}: sdpa {UNFINISHED}")
            continue
        base_failed = failures(base)
        base_passed = {node.split("::")[-1] for node, row in base_record.items()
                       if row["outcome"] == "passed"}
        out += [f"{model} (tests/models/{model}/test_modeling_{model}.py)",
                f"  sdpa     {_summary_line(base)}"]
        for mode in modes:
            path, record = run_of(model, mode)
            if record is None:
                continue
            if record is UNFINISHED:
                out.append(f"  {mode:8} {UNFINISHED}")
                continue
            reached = sum(1 for row in record.values()
                          if any(key.startswith("attention:") for key in row))
            calls = sum(row.get("sparse_attention", 0) for row in record.values())
            out += [f"  {mode:8} {_summary_line(path)}",
                    f"           {reached} tests reached the adapter ({calls} calls of "
                    f"sparse_attention)"]
            failed = failures(path)
            worse = sorted(k for k in failed if k not in base_failed and k[0] in base_passed)
            groups = defaultdict(list)
            for test, sub in worse:
                message = failed[(test, sub)]
                groups[_expected(test, message) or "to fix"].append(
                    f"{test}{f'[{sub}]' if sub else ''}: {message[:150]}")
            counts = Counter({why: len(items) for why, items in groups.items()})
            out.append(f"  {mode}: {len(worse)} pass with sdpa but fail here"
                       + (f" ({counts['to fix']} to fix)" if worse else ""))
            for why, items in sorted(groups.items(), key=lambda kv: kv[0] != "to fix"):
                out.append(f"    [{len(items)}] {why}")
                out += [f"        {item}" for item in items]
    return "\n".join(out) if out else f"no logs under {logs} (run the suite first)"
