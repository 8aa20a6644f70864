"""Training under bad input: every config field checked, every run checked before its
first step (data, devices, the output folder, a checkpoint it would overwrite or resume)
(Child et al., 2019, sec. 5.6, 6). The command line's own checks:
tests/commands/test_train_command.py."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from fast.commands import train as cli
from fast.data import Dataset
from fast.transformer.config import TrainConfig, preset
from fast.transformer.training import train as training
from tests.conftest import tiny_digits

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(out_dir, **kw):
    """The shared tiny digits run, smaller still: the checks come before any step."""
    return tiny_digits(out_dir, **{**dict(d_model=16, n_layers=1, max_iters=3,
                                          warmup_iters=1), **kw})


@pytest.fixture
def no_step(monkeypatch):
    """Fail the test if a training step is taken: the checks must come before."""
    def step(*args, **kw):
        raise AssertionError("a training step was taken before the run was refused")
    monkeypatch.setattr(training, "train_step", step)


# ----------------------------------------------------------------------------
# Fields: eval_splits are names, not characters; every field has a checked range.
# ----------------------------------------------------------------------------

def test_eval_splits_are_names_not_characters():
    _, t = preset("quick", eval_splits="val")
    assert t.eval_splits == ("val",)
    _, t = preset("quick", eval_splits="val, test")
    assert t.eval_splits == ("val", "test")
    assert cli.parse_args(["--eval_splits", "val,test"])[1] == {"eval_splits": "val,test"}
    assert cli.configs(["--eval_splits", "test"])[2].eval_splits == ("test",)
    for bad in (("v", "a", "l"), "valid", (), ("val", "val"), "val,,test", 3):
        with pytest.raises(ValueError, match="eval_splits must be"):
            preset("quick", eval_splits=bad)


# ----------------------------------------------------------------------------
# The run: everything checked before the first step.
# ----------------------------------------------------------------------------

def test_an_empty_eval_split_is_found_before_training(tmp_path, digits, no_step):
    splits = dict(digits.splits, test=digits.splits["test"][:0])
    empty = Dataset("digits", "image", 17, splits, (8, 8, 1))
    m, t = tiny(tmp_path, eval_splits=("val", "test"))
    with pytest.raises(ValueError, match="split 'test' holds no sequence"):
        training.train(m, t, progress=False, dataset=empty)
    text = Dataset("bytes", "text", 256, {"train": digits.splits["train"].ravel(),
                                          "val": digits.splits["val"].ravel()[:64]})
    m, t = preset("quick_text", d_model=16, n_heads=2, n_layers=1, n_ctx=64, stride=8, c=2,
                  out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="split 'val' holds 64 bytes"):
        training.train(m, t, progress=False, dataset=text)
    with pytest.raises(ValueError, match="has no split 'test'"):
        training.train(m, dataclasses.replace(t, eval_splits=("test",)), progress=False,
                       dataset=text)


def test_an_unwritable_out_dir_is_found_before_training(tmp_path, digits, no_step):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    m, t = tiny(blocker / "run")
    with pytest.raises(ValueError, match="cannot be written to"):
        training.train(m, t, progress=False, dataset=digits)
    assert not (blocker / "run").exists() and blocker.read_text() == "not a folder"


def test_missing_data_and_devices_are_found_before_training(tmp_path, no_step):
    m, t = preset("cifar10", n_layers=1, d_model=16, data_path=str(tmp_path / "none"),
                  out_dir=str(tmp_path))
    with pytest.raises(ValueError):
        training.train(m, t, progress=False)
    if not torch.cuda.is_available():
        m, t = tiny(tmp_path, device="cuda")
        with pytest.raises(ValueError, match="CUDA is not available"):
            training.train(m, t, progress=False)


def test_a_fresh_run_never_overwrites_a_checkpoint(tmp_path, digits, capsys, monkeypatch):
    m, t = tiny(tmp_path)
    first = training.train(m, t, progress=False, dataset=digits)
    path = Path(first["checkpoint"])
    before = path.read_bytes()
    with pytest.raises(ValueError, match="--resume to continue it, --overwrite to replace it"):
        training.train(m, t, progress=False, dataset=digits)
    assert path.read_bytes() == before
    monkeypatch.setattr(sys, "argv", list(sys.argv))            # main may set sys.argv
    argv = ["--preset", "digits", "--d_model", "16", "--n_layers", "1", "--max_iters", "3",
            "--precision", "fp32", "--device", "cpu", "--out_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as end:
        cli.main(argv)
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1 and "--overwrite" in err
    assert path.read_bytes() == before                           # nothing lost
    again = training.train(m, dataclasses.replace(t, overwrite=True, seed=1), progress=False,
                           dataset=digits)
    assert again["step"] == 3 and path.read_bytes() != before   # asked for: replaced
    off = training.train(m, dataclasses.replace(t, save_checkpoint=False), progress=False,
                         dataset=digits)
    assert off["checkpoint"] is None                             # writes nothing: allowed


def test_resume_without_a_checkpoint_is_refused(tmp_path, digits, no_step):
    m, t = tiny(tmp_path / "empty", resume=True)
    with pytest.raises(ValueError, match="there is no checkpoint"):
        training.train(m, t, progress=False, dataset=digits)
    (tmp_path / "odd" / "ckpt.pt").mkdir(parents=True)
    m, t = tiny(tmp_path / "odd", overwrite=True)
    with pytest.raises(ValueError, match="is a folder"):
        training.train(m, t, progress=False, dataset=digits)


# ----------------------------------------------------------------------------
# fp16 loss scaling: a skipped update does not advance the schedule.
# ----------------------------------------------------------------------------


def test_train_config_checks_every_number_type():
    for field, bad in (("lr", True), ("lr", "1e-3"), ("beta1", float("nan")),
                       ("grad_clip", float("inf")), ("resume", 1), ("seed", 2**31),
                       ("data_max_bytes", 0), ("out_dir", " ")):
        with pytest.raises(ValueError, match=field):
            TrainConfig(**{field: bad})


@pytest.mark.parametrize("where", ["the data file", "inside the data folder"])
def test_the_checkpoint_is_never_written_over_or_inside_the_data(tmp_path, digits, no_step,
                                                                 where):
    """--data_path is the run's input: a checkpoint path that is that file, or lies inside
    that folder, is refused before anything is written, --overwrite or not (a fresh
    run with --overwrite replaced a data file named out_dir/ckpt.pt with a checkpoint)."""
    run = tmp_path / "run"
    run.mkdir()
    data = run / "ckpt.pt" if where == "the data file" else run
    if where == "the data file":
        data.write_bytes(b"data that must survive")
    m, t = tiny(run, overwrite=True)
    t = dataclasses.replace(t, dataset="npy_images", data_path=str(data))
    with pytest.raises(ValueError, match=f"would be written (over|inside) --data_path {data}"):
        training.train(m, t, progress=False, dataset=digits)
    if where == "the data file":
        assert data.read_bytes() == b"data that must survive"
    else:
        assert not (run / "ckpt.pt").exists()


def test_world_size_without_torchrun_is_one_line(tmp_path, monkeypatch, capsys):
    """WORLD_SIZE=2 set by hand, without the rest torchrun sets: one line naming what is
    missing and how to launch (it was torch's rendezvous traceback)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as end:
        cli.main(["--preset", "digits", "--d_model", "16", "--n_layers", "1", "--max_iters",
                  "1", "--device", "cpu", "--out_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1
    assert "WORLD_SIZE=2 asks for 2 ranks, but RANK, MASTER_ADDR, MASTER_PORT are not set; " \
           "allowed: launch with torchrun --nproc_per_node=2" in err
