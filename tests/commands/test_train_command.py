"""``python -m fast train``: its parser, one line and exit status 2 for every bad value
(fuzzed too), through the dispatcher and torchrun, then ``python -m fast sample`` on
what it wrote (Child et al., 2019, sec. 5.6, 6: the training setup the options name)."""

from __future__ import annotations

import os
import subprocess
import sys

import matplotlib.image
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast.__main__ import main as fast_main
from fast.commands import train as cli
from fast.transformer.decoding import sample as sampling
from fast.transformer.network.checkpoint import load_checkpoint, load_model
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

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


@pytest.mark.slow
def test_torchrun_runs_the_dispatcher_on_two_ranks(tmp_path):
    """``torchrun --nproc_per_node=2 -m fast train``: two gloo ranks, one checkpoint
    (world size 2 recorded), one summary line (rank 0 only). --standalone picks a
    free port, so parallel runs on one machine do not collide."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "fast", "train", "--preset", "digits", "--d_model", "16", "--n_heads", "2",
           "--n_layers", "1", "--batch_size", "8", "--max_iters", "2", "--warmup_iters", "1",
           "--eval_batches", "1", "--precision", "fp32", "--device", "cpu",
           "--cpu_threads", "1", "--out_dir", str(tmp_path)]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    state = load_checkpoint(tmp_path / "ckpt.pt")
    assert state["step"] == 2 and state["data_position"]["world_size"] == 2
    assert run.stdout.count("preset digits:") == 1


def test_parse_args():
    name, over = cli.parse_args(["--preset", "quick_text", "--n_layers", "2", "--resume",
                                      "--lr", "3e-4", "--data_path", "none",
                                      "--image_shape", "(16, 16, 1)"])
    assert name == "quick_text"
    assert over == {"n_layers": 2, "resume": True, "lr": 3e-4, "data_path": None,
                    "image_shape": (16, 16, 1)}
    with pytest.raises(ValueError, match="unknown option"):
        cli.parse_args(["--layers", "2"])
    with pytest.raises(ValueError, match="needs a value"):
        cli.parse_args(["--lr"])


def test_command_lines_train_then_sample(tmp_path, monkeypatch, capsys):
    """``python -m fast train`` then ``python -m fast sample``, through the dispatcher."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))          # the dispatcher sets sys.argv
    assert fast_main(["train", "--preset", "digits", "--d_model", "16", "--n_layers", "1",
                      "--max_iters", "2", "--eval_batches", "1", "--precision", "fp32",
                      "--out_dir", str(tmp_path)]) == 0
    checkpoint = str(tmp_path / "ckpt.pt")
    assert f"checkpoint {checkpoint}" in capsys.readouterr().out
    model, model_cfg, train_cfg = load_model(checkpoint)
    assert train_cfg.dataset == "digits" and model_cfg.d_model == 16
    png = str(tmp_path / "s.png")
    assert fast_main(["sample", "--checkpoint", checkpoint, "--num", "3", "--out", png]) == 0
    grid = matplotlib.image.imread(png)
    assert grid.ndim == 3 and grid.shape[0] >= 2 * 9
    seqs = sampling.sample(model, 2, generator=torch.Generator().manual_seed(0))
    again = sampling.sample(model, 2, generator=torch.Generator().manual_seed(0))
    assert seqs.shape == (2, 64) and torch.equal(seqs, again)
    assert int(seqs.max()) < 17
    with pytest.raises(ValueError, match="is not a readable checkpoint"):
        (tmp_path / "junk.pt").write_bytes(b"junk")
        load_checkpoint(tmp_path / "junk.pt")


def test_a_resume_says_what_it_would_not_do_and_what_it_changes(tmp_path, capsys):
    """--stop_iter before the checkpoint's step: one line, exit 2, no step (it was exit 0,
    "no step taken"); another --cpu_threads: the run goes on and says in one line that its
    weights match an uninterrupted run only to float rounding; the same count says
    nothing."""
    argv = ["--preset", "digits", "--d_model", "16", "--n_layers", "1", "--batch_size", "4",
            "--max_iters", "4", "--warmup_iters", "1", "--eval_batches", "1", "--precision",
            "fp32", "--out_dir", str(tmp_path)]
    assert cli.main(argv + ["--cpu_threads", "1", "--stop_iter", "2"])["step"] == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as end:
        cli.main(argv + ["--cpu_threads", "1", "--resume", "--stop_iter", "1"])
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("python -m fast train: cannot resume ") and "with stop_iter=1: the " \
        "checkpoint is at step 2, already past it; allowed: stop_iter >= 2" in err
    assert cli.main(argv + ["--cpu_threads", "2", "--resume", "--stop_iter", "3"])["step"] == 3
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("python -m fast train:")]
    assert said == [f"python -m fast train: warning: {tmp_path / 'ckpt.pt'}: resumed with 2 CPU "
                    f"threads where the run used 1: the weights will match an uninterrupted "
                    f"run only to float rounding (bitwise with --cpu_threads 1)"], said
    assert cli.main(argv + ["--cpu_threads", "2", "--resume"])["step"] == 4
    assert "python -m fast train:" not in capsys.readouterr().err       # the same count: 2


def test_a_warm_up_as_long_as_the_run_is_said_in_one_line(tmp_path, capsys):
    argv = ["--preset", "digits", "--d_model", "16", "--n_layers", "1", "--batch_size", "4",
            "--max_iters", "2", "--warmup_iters", "4", "--eval_batches", "1", "--precision",
            "fp32", "--out_dir", str(tmp_path)]
    assert cli.main(argv)["step"] == 2
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("python -m fast train:")]
    assert said == ["python -m fast train: warning: warmup_iters=4 is not below max_iters=2: "
                    "the learning rate climbs to 0.5 of its peak lr=0.002 at the last step and "
                    "its cosine decay never starts (warmup_iters < max_iters gives the whole "
                    "schedule)"], said


def test_cli_help_and_bad_option(capsys):
    with pytest.raises(SystemExit) as ok:
        cli.main(["--help"])
    assert ok.value.code == 0 and "presets:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        cli.main(["--layers", "2"])
    assert bad.value.code == 2                              # a usage error: one line, exit 2
    line = capsys.readouterr().err
    assert "unknown option --layers" in line and "--n_layers" in line and line.count("\n") == 1
