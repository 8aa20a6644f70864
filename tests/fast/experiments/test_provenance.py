"""fast.experiments.provenance: every results file names the code that wrote it (Child et al.,
2019, section 7: the numbers this project reports are recomputed by its scripts)."""

import json
import shutil
import subprocess

import pytest

from fast.commands import results as results_command
from fast.experiments import provenance
from tests.conftest import ROOT

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def tree(root, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def git(root, *args) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def repo(tmp_path):
    tree(tmp_path, {"fast/a.py": "A = 1\n", "fast/k.c": "int k;\n", "reference/b.py": "B = 2\n",
                    "docs/notes.md": "words\n", "figures/data/r.json": "{}\n"})
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "code")
    return tmp_path


def test_the_sources_hash_covers_the_code_that_runs_and_nothing_else(tmp_path):
    tree(tmp_path, {"fast/a.py": "A = 1\n", "fast/k.c": "int k;\n", "reference/b.py": "B = 2\n"})
    base = provenance.sources_sha256(tmp_path)
    assert [p.name for p in provenance.source_files(tmp_path)] == ["a.py", "k.c", "b.py"]
    tree(tmp_path, {"docs/notes.md": "x\n", "figures/data/r.json": "{}\n", "README.md": "y\n",
                    "fast/__pycache__/a.cpython-311.pyc": "z", "notebooks/n.ipynb": "{}"})
    assert provenance.sources_sha256(tmp_path) == base          # results, docs, caches: out
    for name, text in (("fast/a.py", "A = 2\n"), ("fast/k.c", "int k; \n"),
                       ("reference/b.py", "B = 2\n\n")):
        before = (tmp_path / name).read_text()
        (tmp_path / name).write_text(text)
        assert provenance.sources_sha256(tmp_path) != base, name   # one byte of code: in
        (tmp_path / name).write_text(before)
    (tmp_path / "fast/a.py").rename(tmp_path / "fast/c.py")          # a name is code too
    assert provenance.sources_sha256(tmp_path) != base


@needs_git
def test_commit_and_dirty_say_what_was_checked_out(tmp_path):
    root = repo(tmp_path)
    head = git(root, "rev-parse", "HEAD")
    assert provenance.code_version(root) == {
        "sources_sha256": provenance.sources_sha256(root), "commit": head, "dirty": False}
    (root / "figures/data/r.json").write_text('{"new": 1}\n')       # results: not dirty
    (root / "docs/notes.md").write_text("more words\n")
    assert provenance.code_version(root)["dirty"] is False
    (root / "fast/new.py").write_text("N = 0\n")                     # untracked code: dirty
    assert provenance.code_version(root)["dirty"] is True
    (root / "fast/new.py").unlink()
    (root / "reference/b.py").write_text("B = 3\n")                   # changed code: dirty
    assert provenance.code_version(root)["dirty"] is True


def test_outside_git_there_is_the_hash_and_no_commit(tmp_path):
    tree(tmp_path, {"fast/a.py": "A = 1\n"})
    code = provenance.code_version(tmp_path)
    assert code["commit"] is None and code["dirty"] is None and len(code["sources_sha256"]) == 64


@needs_git
def test_results_committed_with_their_code_are_named_by_that_commits_sources(tmp_path):
    """The design's point: a commit cannot hold its own id, but it can hold the hash of its
    own sources. A results file written from uncommitted code and committed together with
    it records the commit before (dirty) and a sources hash equal to the hash of the commit
    that holds both, recomputed from that commit alone."""
    root = repo(tmp_path)
    before = git(root, "rev-parse", "HEAD")
    (root / "fast/a.py").write_text("A = 42\n")                      # new code, not committed
    code = provenance.code_version(root)
    (root / "figures/data/r.json").write_text(json.dumps(provenance.stamp({"bits": 1.5}, code)))
    git(root, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "code + results")
    written = json.loads((root / "figures/data/r.json").read_text())["code"]
    assert written["commit"] == before and written["dirty"] is True
    fresh = tmp_path.parent / (tmp_path.name + "-clone")
    subprocess.run(["git", "clone", "-q", str(root), str(fresh)], check=True)
    assert provenance.sources_sha256(fresh) == written["sources_sha256"]
    assert provenance.provenance(json.loads((fresh / "figures/data/r.json").read_text()),
                                 provenance.sources_sha256(fresh)).startswith("these sources")


def test_write_result_stamps_without_touching_the_data(tmp_path):
    data = {"runs": {"a": 1}}
    provenance.write_result(tmp_path / "r.json", data, indent=1)
    assert data == {"runs": {"a": 1}}
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["runs"] == {"a": 1} and written["code"] == provenance.process_code()
    here = written["code"]["sources_sha256"]
    assert provenance.provenance(written, here).startswith("these sources (")
    assert provenance.provenance(written, "0" * 64).startswith(f"other sources: {here[:12]}")
    assert provenance.provenance({"runs": {}}, here).startswith("no code recorded")


def test_every_results_writer_goes_through_write_result():
    """Only fast.core.files defines the atomic JSON write and only write_result calls it:
    every script that writes a results file stamps it with its code."""
    callers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fast").rglob("*.py")
                     if "write_json(" in p.read_text()
                     and p.name not in ("files.py", "provenance.py"))
    examples = [str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.py")
                if "write_json(" in p.read_text()]
    assert callers == [] and examples == []


def test_results_provenance_names_each_file_and_mixed_runs(tmp_path, capsys):
    here = provenance.sources_sha256()
    now = {"sources_sha256": here, "commit": "a" * 40, "dirty": False}
    then = {"sources_sha256": "b" * 64, "commit": "c" * 40, "dirty": True}
    (tmp_path / "table2.json").write_text(json.dumps(
        {"code": now, "runs": {"text/full": {"0": {"code": now}, "1": {"code": then}}}}))
    (tmp_path / "old.json").write_text(json.dumps({"x": 1}))
    assert results_command.main(["--data", str(tmp_path), "--provenance"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "old.json: no code recorded (written before results recorded their code)"
    assert out[1] == f"table2.json: these sources (commit {'a' * 12})"
    assert f"  runs from other sources: {'b' * 12} (commit {'c' * 12} with uncommitted " \
           f"sources): text/full seed 1" in out
