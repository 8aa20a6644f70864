"""``python -m fast train`` under bad input: every value checked, every run checked before
its first step, one line and exit status 2 for a mistake, a fuzzed parser, and the
learning-rate schedule under fp16 loss scaling (Child et al., 2019, sec. 5.6, 6).
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast.commands import train as cli
from fast.data import Dataset, load
from fast.transformer.config import TrainConfig, preset
from fast.transformer.training import train as training
from fast.transformer.training.optim import make_optimizer, make_scheduler
from tests.conftest import ROOT, tiny_digits

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits():
    return load("digits")


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


# (argv, words the one line must hold): each names the value given and what is allowed.
BAD = [
    (["--lr", "nan"], "allowed: a finite number"),
    (["--lr", "inf"], "allowed: a finite number"),
    (["--lr", "-1e-3"], "lr must be a finite number > 0"),
    (["--lr", "0"], "lr must be a finite number > 0"),
    (["--weight_decay", "-0.1"], "weight_decay must be a finite number >= 0"),
    (["--weight_decay", "-inf"], "allowed: a finite number"),
    (["--grad_clip", "1e400"], "allowed: a finite number"),
    (["--grad_clip", "-1"], "grad_clip must be a finite number >= 0"),
    (["--beta1", "1"], "beta1 must be a finite number >= 0.0 and < 1.0"),
    (["--beta2", "-0.5"], "beta2 must be a finite number >= 0.0 and < 1.0"),
    (["--min_lr_frac", "1.5"], "min_lr_frac must be"),
    (["--dropout", "1"], "dropout must be"),
    (["--device", "gpu"], "device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    (["--device", "cuda:x"], "device must be"),
    (["--seed", "-1"], "seed must be an integer >= 0"),
    (["--seed", "1.5"], "allowed: an integer"),
    (["--seed", str(2**63)], "2147483647"),
    (["--stride", str(2**63)], "2147483647"),
    (["--batch_size", "0"], "batch_size must be an integer >= 1"),
    (["--n_layers", "two"], "allowed: an integer"),
    (["--cpu_threads", "100000"], "cpu_threads must be an integer >= 1"),
    (["--image_shape", "16,16"], "3 integers"),
    (["--eval_splits", "valid"], "eval_splits must be"),
    (["--eval_splits", ""], "allowed: a non-empty text"),
    (["--precision", "fp8"], "precision must be one of"),
    (["--dataset", "imagenet"], "dataset must be one of"),
    (["--attention_backend", "cuda"], "attention_backend must be one of"),
    (["--out_dir", ""], "allowed: a non-empty text"),
    (["--resume", "maybe"], "allowed: true or false"),
    (["--resume", "--overwrite"], "choose one"),
    (["--preset", "nope"], "allowed: one of"),
    (["--preset"], "needs a value"),
    (["quick"], "unexpected argument"),
    (["--n_layer", "2"], "did you mean --n_layers"),
    (["--d_model", "30"], "divisible by n_heads"),
]


@pytest.mark.parametrize("argv,words", BAD, ids=lambda a: " ".join(a) if isinstance(a, list)
                         else None)
def test_a_bad_value_ends_with_one_line_and_exit_status_2(argv, words, capsys):
    with pytest.raises(SystemExit) as end:
        cli.configs(argv)
    err = capsys.readouterr().err
    print(err)
    assert end.value.code == 2
    assert err.startswith("python -m fast train: ") and err.count("\n") == 1
    assert words in err


@pytest.mark.slow
def test_the_command_line_through_python_m_fast():
    """The same from a shell: --help exits 0; a bad value exits 2 with one line and no
    traceback, before anything is loaded or trained."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "fast", "train", *a], cwd=ROOT,
                                    capture_output=True, text=True, timeout=120)
    ok = run("--help")
    assert ok.returncode == 0 and "--eval_splits" in ok.stdout and "presets:" in ok.stdout
    bad = run("--lr", "nan")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "python -m fast train: argument --lr: got 'nan'; allowed: a finite " \
                         "number\n"


TOKENS = st.sampled_from(["--" + f.name for f in cli.fields()] + ["--preset", "--help-me",
                                                                  "--", "-", "-x"])
VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "0", "1", "2", "0.5", "1e-3",
                     "2147483648", str(2**63), "none", "None", "true", "false", "yes",
                     "val", "val,test", "16,16,1", "(16, 16, 1)", "cpu", "cuda:0", "auto",
                     "fp16", "quick", "digits", "strided", "fixed", "", " ", "\x00", "é"]),
    st.text(max_size=12),
    st.integers(-2**70, 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
FUZZED = {"inputs": 0, "accepted": 0}


PAIRS = st.lists(st.tuples(TOKENS, VALUES), max_size=5).map(lambda ps: [a for p in ps for a in p])
_NUMBER = st.one_of(st.integers(-3, 300).map(str), st.floats(-1, 2).map(repr))
BY_TYPE = {  # values of the field's own type, mostly in range, so deeper checks run too
    "int": st.integers(-3, 300).map(str), "int | None": st.sampled_from(["none", "1", "64"]),
    "float": _NUMBER, "bool": st.sampled_from(["true", "false"]),
    "str": st.sampled_from(["strided", "fixed", "full", "text", "image", "merged",
                            "multihead", "auto", "cpu", "fp32", "digits", "stdlib", "runs/x"]),
    "str | None": st.sampled_from(["none", "data"]),
    "tuple[int, int, int] | None": st.sampled_from(["none", "16,16,1", "8,8,1", "0,1,1"]),
    "tuple[str, ...]": st.sampled_from(["val", "test", "val,test", "train"]),
}
TYPED = st.lists(st.sampled_from(cli.fields()).flatmap(
    lambda f: BY_TYPE[f.type].map(lambda v: [f"--{f.name}", v])), max_size=4).map(
    lambda ps: [a for p in ps for a in p])


@pytest.mark.slow
@settings(max_examples=12 * settings.default.max_examples, deadline=None)  # ci: 300
@given(st.one_of(st.lists(st.one_of(TOKENS, VALUES), max_size=8), PAIRS, TYPED))
def test_fuzzed_command_lines_never_give_a_traceback(argv):
    """Whatever the argv, train's parser and the configs it builds either accept it or
    end with one line on stderr and exit status 2: no other exception escapes."""
    FUZZED["inputs"] += 1
    try:
        cli.configs(argv)
        FUZZED["accepted"] += 1
    except SystemExit as end:
        assert end.code in (0, 2), argv                 # 0: --help was among the tokens
    print(f"fuzzed command lines so far: {FUZZED['inputs']} tried, {FUZZED['accepted']} "
          f"accepted, none gave a traceback")


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

def test_a_step_the_loss_scaler_skips_does_not_advance_the_schedule(digits):
    m, t = tiny(".", precision="fp16", warmup_iters=10, max_iters=20)
    torch.manual_seed(0)
    model = training.SparseTransformer(m)
    optimizer, device = make_optimizer(model, t), torch.device("cpu")
    scheduler = make_scheduler(optimizer, t)
    x, y = digits.batch("train", 4, m.n_ctx, torch.Generator().manual_seed(0))
    # a scale so large that the scaled loss overflows: the scaler must skip this update
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    weights = [p.detach().clone() for p in model.parameters()]
    lr = scheduler.get_last_lr()
    loss = training.train_step(model, model, x, y, optimizer, scheduler, scaler, "fp16", device,
                               1.0)
    assert math.isfinite(loss.item()) and scaler.get_scale() < 2.0 ** 127   # skipped
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert scheduler.last_epoch == 0 and scheduler.get_last_lr() == lr
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)               # a usable scale
    training.train_step(model, model, x, y, optimizer, scheduler, scaler, "fp16", device, 1.0)
    assert scaler.get_scale() == 2.0 ** 8 and scheduler.last_epoch == 1
    assert not all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_train_config_checks_every_number_type():
    for field, bad in (("lr", True), ("lr", "1e-3"), ("beta1", float("nan")),
                       ("grad_clip", float("inf")), ("resume", 1), ("seed", 2**31),
                       ("data_max_bytes", 0), ("out_dir", " ")):
        with pytest.raises(ValueError, match=field):
            TrainConfig(**{field: bad})
