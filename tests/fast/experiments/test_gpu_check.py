"""``python -m fast gpu-check``, the driver of a GPU session, checked on the CPU: its parts'
commands parse, the gpu tests split by kernel variant cover every test once, and the
driver runs parts in order, logs each, goes on after a failure and starts no part past
its time limit (Child et al., 2019, sec. 5.5 and Table 2: what only a GPU measures).
The parts themselves run on a GPU only (docs/gpu.md); here they are stand-in commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from fast.commands import bench as bench_cli
from fast.commands import gpu_check as command
from fast.commands import layout_time, train_time
from fast.experiments import gpu_check as driver
from fast.experiments.bench_sweep import points
from fast.kernels.variants import VARIANTS
from tests import conftest
from tests.conftest import ROOT


def test_every_part_is_a_command_line_its_command_accepts(tmp_path):
    every = {p.name: p for p in driver.parts(tmp_path, workers=4, test_args=("-x",))}
    assert tuple(every) == driver.PART_NAMES == (
        "tests", "variants", "bench", "train-time", "tests-0", "tests-1", "tests-2",
        "variants-all", "bench-all", "long", "layout-time")
    assert driver.SESSION == driver.PART_NAMES[:4]
    sweeps = {}
    for name in ("variants", "bench", "long", "variants-all", "bench-all"):
        argv = list(every[name].argv)
        assert argv[:3] == ["-m", "fast", "bench"]
        sweeps[name] = sweep = bench_cli.sweep_from(bench_cli.parse_args(argv[3:]))
        assert sweep.device == "cuda" and bool(sweep.variants) == name.startswith("variants")
        assert bool(sweep.long_ns) == (name == "long")
        out = Path(argv[argv.index("--out") + 1])
        assert out == (tmp_path if name in ("variants", "bench") else tmp_path / name)
    # the session's variant sweep: the target point only, every variant against dense
    assert points(sweeps["variants"]) == [("float16", 4, 16, 16384)]
    assert sweeps["variants"].contenders == ("dense", "triton block-sparse")
    assert sweeps["variants"].variants == tuple(VARIANTS)
    # the session's benchmark: the target point first, then (1, 4, n) for the small target
    assert points(sweeps["bench"]) == [("float16", 4, 16, 16384)] + [
        ("float16", 1, 4, n) for n in (4096, 8192, 16384, 32768, 65536)]
    assert sweeps["bench"].flex_ns == (16384,) and sweeps["bench"].max_minutes == 2.5
    assert "flex" in sweeps["bench"].contenders and "flex flash" in sweeps["bench"].contenders
    for sweep in sweeps.values():                       # every contender has its time cap
        assert sweep.method.cap_s == 60
    assert points(sweeps["variants-all"])[0] == ("float16", 4, 16, 16384)
    assert every["variants"].writes == ("data/bench_cuda_variants.json",)
    tt = train_time.parser().parse_args(list(every["train-time"].argv[3:]))
    assert (tt.warm, tt.steps, tt.patterns) == (3, 5, ["none", "full", "fixed", "strided"])
    layout_time.parser().parse_args(list(every["layout-time"].argv[3:]))
    files = driver.gpu_test_files()
    assert "tests/fast/kernels/test_triton_gpu.py" in files and "tests/test_install.py" not in files
    for name in ("tests", *driver.TEST_GROUPS):
        argv = every[name].argv
        assert argv[:2 + len(files) + 3] == ("-m", "pytest", *files, "-m", "gpu", "-p")
        assert argv[-3:] == ("-n", "4", "-x") and every[name].env == {"TRITON_INTERPRET": "0"}
        assert ("--kernel-variants" in argv) == (name != "tests")
    for name in driver.TEST_GROUPS:
        argv = every[name].argv
        assert argv[argv.index("--kernel-variants") + 1] == ",".join(driver.TEST_GROUPS[name])
    assert "-n" not in driver.parts(tmp_path, workers=1)[0].argv


def test_the_session_fits_nine_minutes_on_the_gpu_that_measured_it(tmp_path, monkeypatch):
    """The session's parts on an H200-class machine (16 cores, pytest-xdist: 14 workers, as
    the run that took 110 s for every gpu test) add up to at most 9 minutes; without
    pytest-xdist the plan says the tests take one process, and how to split them."""
    monkeypatch.setattr(driver, "xdist_installed", lambda: True)
    monkeypatch.setattr(driver.os, "cpu_count", lambda: 16)
    assert driver.test_workers() == 14 and driver.test_workers(3) == 3
    session = [p for p in driver.parts(tmp_path, driver.test_workers())
               if p.name in driver.SESSION]
    assert [p.name for p in session] == list(driver.SESSION)
    assert sum(p.minutes for p in session) <= driver.SESSION_MINUTES
    assert session[0].minutes == 1.9                         # measured: 110 s
    assert driver.warnings_for(session, 14) == []
    monkeypatch.setattr(driver, "xdist_installed", lambda: False)
    assert driver.test_workers() == 1
    alone = [p for p in driver.parts(tmp_path, 1) if p.name in driver.SESSION]
    said = driver.warnings_for(alone, 1)
    assert len(said) == 2 and "tests-0, tests-1, tests-2" in said[0]
    assert said[1].startswith("the session is estimated at ")


def test_the_test_groups_hold_every_variant_once():
    names = [v for group in driver.TEST_GROUPS.values() for v in group]
    assert sorted(names) == sorted([conftest.NO_VARIANT, *VARIANTS])
    assert driver.TEST_GROUPS["tests-0"] == (conftest.NO_VARIANT,) == (driver.NO_VARIANT,)


def _item(name, variant=None):
    params = {} if variant is None else {"variant": variant, "dtype": torch.float16}
    return types.SimpleNamespace(name=name, callspec=types.SimpleNamespace(params=params))


def test_kernel_variants_option_keeps_the_tests_of_the_variants_named():
    items = [_item("a"), _item("b", "fused"), _item("c", VARIANTS["all"]), _item("d", "all"),
             types.SimpleNamespace(name="e")]                  # not parametrized at all
    deselected = []
    config = types.SimpleNamespace(
        getoption=lambda opt: "none, all", hook=types.SimpleNamespace(
            pytest_deselected=lambda items: deselected.extend(items)))
    conftest.pytest_collection_modifyitems(config, items)
    assert [i.name for i in items] == ["a", "c", "d", "e"]
    assert [i.name for i in deselected] == ["b"]
    config.getoption = lambda opt: "fused,fast"
    with pytest.raises(pytest.UsageError, match="'fused,fast'; allowed: names from none, "
                                                "baseline"):
        conftest.pytest_collection_modifyitems(config, items)


@pytest.mark.slow
def test_kernel_variants_option_selects_gpu_tests_in_pytest():
    """Over the whole suite: the tests without a variant and those of one group are
    selected, no other variant's; every file they are in is one the driver gives pytest."""
    group = driver.TEST_GROUPS["tests-2"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-m", "gpu", "-q", "--collect-only",
         "-p", "no:cacheprovider", "--kernel-variants", ",".join(("none", *group))],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert proc.returncode == 0 and ids, proc.stdout + proc.stderr
    others = tuple(f"-{v}]" for v in VARIANTS if v not in group)
    assert not [line for line in ids if line.endswith(others)]
    assert {v for v in group if any(line.endswith(f"-{v}]") for line in ids)} == set(group)
    assert any(line.endswith("test_decoder_on_cuda") for line in ids)       # no variant
    assert {line.split("::")[0] for line in ids} == set(driver.gpu_test_files())


def _stand_in(name, code, minutes=0.001, env=None):
    return driver.Part(name, ("-c", code), f"{name}.log", minutes, f"stand-in {name}",
                       env=env or {})


def test_the_driver_logs_each_part_goes_on_after_a_failure_and_keeps_to_its_time(tmp_path):
    lines = []
    record = tmp_path / driver.RECORD
    chosen = [_stand_in("one", "import os; print('hello', os.environ['TRITON_INTERPRET'])",
                        env={"TRITON_INTERPRET": "0"}),
              _stand_in("two", "import sys; print('broken'); sys.exit(3)"),
              _stand_in("big", "print('never')", minutes=60.0),
              # the record while a part runs: partial, marked, the parts before it in it
              _stand_in("three", f"import json; d = json.load(open({str(record)!r})); "
                                 f"print('partial', d['complete'], len(d['parts']))")]
    got = driver.run(chosen, tmp_path, minutes=1.0, log=lines.append, again="CMD")
    assert [(e["name"], e["status"], e.get("rc")) for e in got["parts"]] == [
        ("one", "ok", 0), ("two", "failed", 3), ("big", "not started", None),
        ("three", "ok", 0)]
    assert (tmp_path / "one.log").read_text().splitlines()[1:] == ["hello 0"]
    assert "TRITON_INTERPRET=0" in (tmp_path / "one.log").read_text().splitlines()[0]
    assert (tmp_path / "two.log").read_text().endswith("broken\n")
    assert not (tmp_path / "big.log").exists() and "hello 0" in lines
    assert "partial False 3" in lines                           # progress written as it goes
    saved = json.loads(record.read_text())
    assert saved["parts"] == got["parts"] and saved["complete"] is True
    assert "estimated 60 min, " in got["parts"][2]["why"]
    starts = [line for line in lines if line.startswith("== [")]
    assert [line.split(": ")[0] for line in starts] == [
        "== [ 0.0 min] part 1 of 4", "== [ 0.0 min] part 2 of 4", "== [ 0.0 min] part 4 of 4"]
    said = lines[-1]
    assert "two          failed (exit 3)" in said
    assert said.endswith("not started: big; next: CMD --parts big")


def test_gpu_check_prints_its_plan_anywhere_and_refuses_to_run_without_cuda(tmp_path, capsys,
                                                                         monkeypatch):
    assert command.main(["--dry-run", "--out", str(tmp_path / "a" / "b"), "--parts",
                         "variants", "train-time"]) == 0
    assert not (tmp_path / "a").exists()                    # a dry run makes no folder
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("variants     ~ 1.5 min  python -m fast bench --device cuda "
                                 "--variants --contenders dense 'triton block-sparse' ")
    assert printed[1].startswith("train-time") and printed[-1] == "estimated 2.5 min in all"
    assert command.main(["--dry-run", "--test-workers", "14"]) == 0      # the session
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed[:-1]] == list(driver.SESSION)
    assert printed[-1] == "estimated 7.7 min in all"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as end:
        command.main(["--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1
    assert "no CUDA device here" in err and "allowed: a machine with CUDA, or --dry-run" in err
    assert list(tmp_path.iterdir()) == []                 # nothing run or written, no folder


@pytest.mark.parametrize("argv,says", [
    (["--parts", "bench", "test"], "argument --parts: got 'test'; allowed: one of tests, "
                                   "variants,"),
    (["--test-args", "-k 'open"], "argument --test-args: got \"-k 'open\"; allowed: arguments"),
    (["--minutes", "0"], "argument --minutes: got '0'; allowed: a finite number in (0.0,"),
    (["--all", "--parts", "long"], "--all with --parts; allowed: one of them"),
])
def test_gpu_check_refuses_bad_options_in_one_line(argv, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as end:
        command.main(argv + ["--out", str(tmp_path), "--dry-run"])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1 and says in err, err
