"""Install and first steps: one torch build chosen by one variable, the same versions in
every description of the environment, Triton only on Linux, ``make lab``, and notebooks
that run from the root or from notebooks/ without touching the committed figures.

Child et al., 2019: the figures of sec. 4-7 are re-derived by the notebooks, which is the
main way this project is used; these tests keep the way to them working.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from packaging.markers import default_environment
from packaging.requirements import Requirement

from fast.experiments.paths import FIGURES_ENV
from tests.conftest import ROOT

try:
    import tomllib  # Python 3.11+
except ImportError:                                  # Python 3.10
    tomllib = pytest.importorskip("tomli")

MAKE = shutil.which("make")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def environment_yml() -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) of environment.yml (a flat YAML list)."""
    conda, pip, in_pip, section = [], [], False, None
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if re.match(r"^\w+:", line):
            section = line.split(":")[0]
        item = re.match(r"^(\s*)- (.+?)\s*$", line.split(" #")[0])
        if not item or line.lstrip().startswith("#") or section != "dependencies":
            continue
        if item.group(2) == "pip:":
            in_pip = True
        elif in_pip and len(item.group(1)) > 2:
            pip.append(item.group(2))
        else:
            conda.append(item.group(2))
    return conda, pip


def makefile_default(name: str) -> str:
    text = (ROOT / "Makefile").read_text()
    return re.search(rf"^{name}\s*\?=\s*(.+)$", text, re.M).group(1).strip()


def test_environment_yml_gives_the_versions_of_pyproject_and_the_makefile():
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    wanted = {}
    for spec in (project["dependencies"] + extras["data"] + extras["hf"] + extras["dev"]
                 + extras["lab"]):
        req = Requirement(spec)
        if req.name not in ("torch", "sparse-transformer"):
            wanted[req.name] = str(req.specifier)
    conda, pip = environment_yml()
    given = {}
    for spec in conda:
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0)
        given[name] = spec[len(name):]
    python = given.pop("python")
    assert Requirement(f"python{project['requires-python']}").specifier.contains(
        python.lstrip("="))
    given.pop("pip")
    assert given == wanted                                  # same names, same bounds
    assert makefile_default("TORCH_SPEC") in pip            # torch==2.13.0 in both
    assert any(p.startswith("-e .[") and "dev" in p for p in pip)


def test_triton_is_installed_on_linux_only():
    """The dev extras install on macOS and Windows: Triton carries a platform marker."""
    extras = pyproject()["project"]["optional-dependencies"]
    (triton,) = [Requirement(r) for r in extras["triton"]]
    assert triton.name == "triton"
    for platform, wanted in (("linux", True), ("darwin", False), ("win32", False)):
        env = dict(default_environment(), sys_platform=platform)
        assert triton.marker is not None and triton.marker.evaluate(env) is wanted
    assert any("triton" in r for r in extras["dev"])       # dev pulls the extra in


def test_transformers_is_optional_and_in_the_dev_install():
    """The Hugging Face adapter's dependencies are the extra hf (transformers, and accelerate,
    which transformers.Trainer needs), which dev pulls in (so its tests run wherever the
    tests run); nothing else needs them."""
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    assert [Requirement(r).name for r in extras["hf"]] == ["transformers", "accelerate"]
    (itself,) = [Requirement(r) for r in extras["dev"]
                 if Requirement(r).name == "sparse-transformer"]
    assert "hf" in itself.extras
    assert all(Requirement(r).name not in ("transformers", "accelerate")
               for r in project["dependencies"])


def test_notebooks_needing_triton_are_skipped_without_it(monkeypatch):
    spec = importlib.util.spec_from_file_location("notebook_conftest",
                                                  ROOT / "notebooks" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)

    class Item:
        def __init__(self, name):
            self.path, self.marks = ROOT / "notebooks" / name, []

        def add_marker(self, mark):
            self.marks.append(mark)

    items = [Item("04_triton_kernel.ipynb"), Item("01_attention_patterns.ipynb")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [len(i.marks) for i in items] == [1, 0]
    monkeypatch.delenv(FIGURES_ENV, raising=False)           # pytest notebooks, bare
    conftest.pytest_configure(None)
    out = Path(os.environ[FIGURES_ENV])
    assert out.is_dir() and ROOT not in out.parents         # never figures/


def _fake_venv(tmp_path) -> Path:
    """A copy of the Makefile beside a .venv whose python only logs what it was asked; it
    finds no torch by local version (torch==X+cpu: a wheel on a find-links path) when
    NO_LOCAL_WHEEL is set, as on a machine that has none."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/../log"\n'
                      'case "$*" in *torch==*+*) [ -z "$NO_LOCAL_WHEEL" ] || exit 1;; esac\n')
    python.chmod(0o755)
    return tmp_path / "venv" / "log"


@pytest.mark.skipif(MAKE is None or sys.platform == "win32", reason="needs make and sh")
def test_the_install_stamp_follows_the_torch_build(tmp_path):
    log = _fake_venv(tmp_path)

    def install(*args, local_wheel: bool = False) -> list[str]:
        env = {**os.environ} | ({} if local_wheel else {"NO_LOCAL_WHEEL": "1"})
        subprocess.run([MAKE, "-s", "install", "VENV=venv", *args], cwd=tmp_path, check=True,
                       env=env)
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return lines

    first = install()
    assert "-m pip install --quiet torch==2.13.0+cpu" in first      # a local wheel first,
    assert "-m pip install --quiet torch==2.13.0 --index-url " \
           "https://download.pytorch.org/whl/cpu" in first        # then the CPU index
    assert "-m pip install --quiet -e .[dev]" in first
    assert install() == []                                          # nothing changed
    cuda = install("TORCH=cu128")
    assert "-m pip uninstall --quiet --yes torch" in cuda
    assert any(line.endswith("--index-url https://download.pytorch.org/whl/cu128")
               for line in cuda)
    assert install("TORCH=cu128") == []
    assert any("torch==2.12.0" in line for line in install("TORCH=cu128",
                                                           "TORCH_SPEC=torch==2.12.0"))
    assert install("TORCH=pypi")[2] == "-m pip install --quiet torch==2.13.0"   # PyPI's
    local = install("TORCH=cu126", local_wheel=True)
    assert "-m pip install --quiet torch==2.13.0+cu126" in local    # found: no index asked
    assert not any("--index-url" in line for line in local)


@pytest.mark.skipif(MAKE is None or sys.platform == "win32", reason="needs make and sh")
def test_make_lab_installs_jupyterlab_and_opens_the_notebooks(tmp_path):
    _fake_venv(tmp_path)
    # --no-print-directory: under `make test` this make is a sub-make and would add
    # "Entering/Leaving directory" lines around the plan
    plan = subprocess.run([MAKE, "--no-print-directory", "-n", "lab", "VENV=venv"],
                          cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout.splitlines()
    assert 'venv/bin/python -m pip install --quiet -e ".[dev,lab]"' in plan
    assert plan[-1] == "venv/bin/jupyter lab notebooks"
    lab = [Requirement(r).name for r in pyproject()["project"]["optional-dependencies"]["lab"]]
    assert lab == ["jupyterlab"]


def _digest(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_notebook_runs_from_the_repository_root_and_keeps_the_committed_figures(
        tmp_path, monkeypatch):
    """Notebook 02 executed with the repository root as its working directory (the
    nbval run covers notebooks/): it finds its inputs, and the figure it draws lands
    in SPARSE_TRANSFORMER_FIGURES, never in figures/."""
    before = _digest(ROOT / "figures")
    monkeypatch.setenv(FIGURES_ENV, str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))               # the kernel imports this tree
    nb = nbformat.read(ROOT / "notebooks" / "02_reference_attention.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["combine_heads.png"]
    assert _digest(ROOT / "figures") == before
    assert not list(ROOT.glob("*.png"))                     # nothing written beside the root


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="needs Numba")
def test_sample_runs_from_a_read_only_install_with_an_unwritable_home(tmp_path):
    """A copy of the code that cannot be written (read-only files; a regular file where
    Numba's in-tree cache folder would go, which even root cannot turn into a folder), a
    HOME that is a file and no NUMBA_CACHE_DIR: no folder takes Numba's cache. ``sample``
    on the compiled engine still draws (compiled in memory), where Numba alone refuses
    ("no locator available")."""
    install = tmp_path / "install"
    for package in ("fast", "reference"):
        shutil.copytree(ROOT / package, install / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    (install / "fast" / "transformer" / "decoding" / "__pycache__").write_text("not a folder")
    (tmp_path / "home").write_text("not a folder")
    model = tmp_path / "work" / "text.pt"
    model.parent.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA", "XDG"))}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(install),
               PYTHONDONTWRITEBYTECODE="1")
    save = ("import torch; from fast.transformer.config import ModelConfig; "
            "from fast.transformer.network.model import SparseTransformer; "
            "from fast.transformer.network.checkpoint import save_weights; "
            "torch.manual_seed(0); save_weights('text.pt', SparseTransformer(ModelConfig("
            "vocab_size=256, n_ctx=24, d_model=16, n_heads=2, n_layers=1, pattern='fixed', "
            "stride=8, c=2)))")
    subprocess.run([sys.executable, "-c", save], cwd=model.parent, env=env, check=True,
                   timeout=300)
    for path in sorted(install.rglob("*"), reverse=True):
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        proc = subprocess.run([sys.executable, "-m", "fast", "sample", "--checkpoint",
                               "text.pt", "--num", "2", "--length", "12", "--engine", "numba",
                               "--out", "s.txt", "--no-progress"], cwd=model.parent, env=env,
                              capture_output=True, text=True, timeout=600)
        bare = subprocess.run([sys.executable, "-c", "import numba\n@numba.njit(cache=True)\n"
                               "def f(x):\n    return x\n"], cwd=install / "fast", env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        for path in install.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
    print(proc.stderr[-2000:])
    assert proc.returncode == 0 and "engine numba" in proc.stdout
    assert (model.parent / "s.txt").is_file()
    assert "no locator available" in bare.stderr                  # the situation is real
