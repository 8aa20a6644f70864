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
from fast.kernels.variants import VARIANTS
from tests import conftest
from tests.conftest import ROOT


def test_every_part_is_a_command_line_its_command_accepts(tmp_path):
    every = {p.name: p for p in driver.parts(tmp_path, workers=4, test_args=("-x",))}
    assert tuple(every) == driver.PART_NAMES == ("tests-0", "tests-1", "tests-2", "variants",
                                                 "bench", "long", "train-time", "layout-time")
    for name in ("variants", "bench", "long"):
        argv = list(every[name].argv)
        assert argv[:3] == ["-m", "fast", "bench"]
        sweep = bench_cli.sweep_from(bench_cli.parse_args(argv[3:]))
        assert sweep.device == "cuda" and bool(sweep.variants) == (name == "variants")
        assert bool(sweep.long_ns) == (name == "long")
        out = Path(argv[argv.index("--out") + 1])
        assert out == (tmp_path / "long" if name == "long" else tmp_path)
    assert every["variants"].writes == ("data/bench_cuda_variants.json",)
    train_time.parser().parse_args(list(every["train-time"].argv[3:]))
    layout_time.parser().parse_args(list(every["layout-time"].argv[3:]))
    files = driver.gpu_test_files()
    assert "tests/fast/kernels/test_triton_gpu.py" in files and "tests/test_install.py" not in files
    for name in driver.TEST_GROUPS:
        argv = every[name].argv
        assert argv[:2 + len(files) + 3] == ("-m", "pytest", *files, "-m", "gpu", "-p")
        assert argv[argv.index("--kernel-variants") + 1] == ",".join(driver.TEST_GROUPS[name])
        assert argv[-3:] == ("-n", "4", "-x") and every[name].env == {"TRITON_INTERPRET": "0"}
    assert "-n" not in driver.parts(tmp_path, workers=1)[0].argv


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
    chosen = [_stand_in("one", "import os; print('hello', os.environ['TRITON_INTERPRET'])",
                        env={"TRITON_INTERPRET": "0"}),
              _stand_in("two", "import sys; print('broken'); sys.exit(3)"),
              _stand_in("big", "print('never')", minutes=60.0),
              _stand_in("three", "print('still run')")]
    record = driver.run(chosen, tmp_path, minutes=1.0, log=lines.append, again="CMD")
    assert [(e["name"], e["status"], e.get("rc")) for e in record["parts"]] == [
        ("one", "ok", 0), ("two", "failed", 3), ("big", "not started", None),
        ("three", "ok", 0)]
    assert (tmp_path / "one.log").read_text().splitlines()[1:] == ["hello 0"]
    assert "TRITON_INTERPRET=0" in (tmp_path / "one.log").read_text().splitlines()[0]
    assert (tmp_path / "two.log").read_text().endswith("broken\n")
    assert not (tmp_path / "big.log").exists() and "hello 0" in lines
    assert json.loads((tmp_path / driver.RECORD).read_text())["parts"] == record["parts"]
    assert "estimated 60 min, " in record["parts"][2]["why"]
    said = lines[-1]
    assert "two          failed (exit 3)" in said
    assert said.endswith("not started: big; next: CMD --parts big")


def test_gpu_check_prints_its_plan_anywhere_and_refuses_to_run_without_cuda(tmp_path, capsys,
                                                                         monkeypatch):
    assert command.main(["--dry-run", "--out", str(tmp_path / "a" / "b"), "--parts",
                         "variants", "train-time"]) == 0
    assert not (tmp_path / "a").exists()                    # a dry run makes no folder
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("variants     ~ 8.0 min  python -m fast bench --device cuda "
                                 "--variants --out ")
    assert printed[1].startswith("train-time") and printed[-1] == "estimated 12 min in all"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as end:
        command.main(["--out", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1
    assert "no CUDA device here" in err and "allowed: a machine with CUDA, or --dry-run" in err
    assert list(tmp_path.iterdir()) == []                 # nothing run or written, no folder


@pytest.mark.parametrize("argv,says", [
    (["--parts", "bench", "tests"], "argument --parts: got 'tests'; allowed: one of tests-0,"),
    (["--test-args", "-k 'open"], "argument --test-args: got \"-k 'open\"; allowed: arguments"),
    (["--minutes", "0"], "argument --minutes: got '0'; allowed: a finite number in (0.0,"),
])
def test_gpu_check_refuses_bad_options_in_one_line(argv, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as end:
        command.main(argv + ["--out", str(tmp_path), "--dry-run"])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1 and says in err, err
