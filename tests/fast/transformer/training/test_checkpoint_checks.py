"""Checkpoints read from disk are checked before anything is built from them (Child et al.,
2019, sec. 6: runs resume from files that can be damaged, old, or crafted).

A resume compares the format version, the configs field by field, the world size, the
resolved precision and device, and the data's fingerprint, naming each field that differs;
every part of a training state is checked against what this run would build (types,
shapes, ranges), and a state that does not fit is one sentence (one line, exit status 2
through ``python -m fast train``). A weights-only file is checked against its config on
PyTorch's meta device before a model is allocated.
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fast.backends import cpu_window
from fast.commands import train as train_command
from fast.data import Dataset
from fast.transformer.config import preset
from fast.transformer.network.checkpoint import FORMAT, load_checkpoint, load_model
from fast.transformer.network.model import SparseTransformer
from fast.transformer.training import train as training
from fast.transformer.training.optim import ScheduleWarning
from fast.transformer.training.preflight import check_run
from fast.transformer.training.resume import ResumeWarning, cpu_kernel_computes
from tests.conftest import tiny_digits

pytestmark = pytest.mark.usefixtures("one_thread")

ARGV = ["--preset", "digits", "--d_model", "16", "--n_heads", "2", "--n_layers", "1",
        "--batch_size", "8", "--max_iters", "4", "--warmup_iters", "1", "--eval_batches", "1",
        "--eval_interval", "0", "--precision", "fp32", "--device", "cpu", "--cpu_threads", "1"]


def tiny(out_dir, **kw):
    return tiny_digits(out_dir, **{**dict(d_model=16, n_layers=1, max_iters=4,
                                          warmup_iters=1), **kw})


@pytest.fixture(scope="module")
def saved(tmp_path_factory, digits):
    """The checkpoint of a tiny run stopped after 2 of 4 steps, read back."""
    out = tmp_path_factory.mktemp("saved")
    m, t = tiny(out, stop_iter=2)
    training.train(m, t, progress=False, dataset=digits)
    return load_checkpoint(out / "ckpt.pt")


@pytest.fixture
def no_step(monkeypatch):
    def step(*args, **kw):
        raise AssertionError("a training step was taken before the run was refused")
    monkeypatch.setattr(training, "train_step", step)


def resume_from(state, tmp_path, digits, **kw):
    """check_run of the tiny run resuming ``state`` written to tmp_path/ckpt.pt."""
    torch.save(state, tmp_path / "ckpt.pt")
    m, t = tiny(tmp_path, resume=True, **kw)
    return check_run(m, t, digits)


def copy(state):
    """A deep copy (tensors cloned) to mutate."""
    return torch.load(_to_bytes(state), weights_only=True)


def _to_bytes(state):
    import io
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_a_good_checkpoint_resumes(saved, tmp_path, digits, no_step):
    plan = resume_from(saved, tmp_path, digits)
    assert plan.resume_state["step"] == 2 and saved["format"] == FORMAT


# (where, what to do to the state, words the one sentence must hold)
def _set(path, value):
    def change(state):
        *keys, last = path
        for k in keys:
            state = state[k]
        state[last] = value
    return change


def _delete(path):
    def change(state):
        *keys, last = path
        for k in keys:
            state = state[k]
        del state[last]
    return change


def _weights(name, fn):
    def change(state):
        state["model"][name] = fn(state["model"][name])
    return change


MALFORMED = [
    ("unknown model field", _set(["model_cfg", "flash"], True),
     r"model_cfg this version cannot use: model_cfg holds \['flash'\], which is unknown"),
    ("missing model field", _delete(["model_cfg", "dropout"]), r"has no 'dropout'"),
    ("model field of a wrong type", _set(["model_cfg", "n_layers"], "1"), r"n_layers"),
    ("unknown train field", _set(["train_cfg", "turbo"], 1), r"holds \['turbo'\]"),
    ("missing key", _delete(["optimizer"]), r"missing \['optimizer'\]"),
    ("no train config", _set(["train_cfg"], None), r"its train_cfg is None"),
    ("step -5", _set(["step"], -5), r"step is -5; expected an integer in \[0, 4\]"),
    ("step 10**6", _set(["step"], 10**6), r"step is 1000000; expected an integer in \[0, 4\]"),
    ("step a text", _set(["step"], "2"), r"step is '2'; expected an integer"),
    ("data position elsewhere", _set(["data_position", "step"], 1), r"data_position"),
    ("rng of two ranks", lambda s: s["rng"].append(s["rng"][0]), r"rng is a list; expected a "
                                                                  r"list of 1 items, each"),
    ("rng of another type", _set(["rng", 0, "torch"], torch.zeros(3)), r"rng\[0\]\['torch'\]"),
    ("rng word past 32 bits", lambda s: s["rng"][0].update(
        python=(3, (2**40,) + tuple(s["rng"][0]["python"][1][1:]), None)),
     r"rng\[0\]\['python'\]\[1\]\[0\] is 1099511627776"),
    ("moment of another shape", lambda s: s["optimizer"]["state"][0].update(
        exp_avg=torch.zeros(3)), r"optimizer\['state'\]\[0\]\['exp_avg'\]"),
    ("a crafted weight decay", _set(["optimizer", "param_groups", 0, "weight_decay"], 50.0),
     r"\['weight_decay'\] is 50.0; expected 0.01"),
    ("a crafted schedule", _set(["scheduler", "base_lrs"], [9.0, 9.0]), r"base_lrs"),
    ("schedule ahead of the step", _set(["scheduler", "last_epoch"], 3),
     r"scheduler\['last_epoch'\] is 3"),
    ("a scaler fp32 never has", _set(["scaler"], {"scale": 1.0}), r"scaler is a dict"),
    ("history of another kind", _set(["history", "train", "loss"], "low"),
     r"history\['train'\]\['loss'\]"),
    ("history of unequal lists", lambda s: s["history"]["train"]["loss"].append(1.0),
     r"lists of lengths"),
    ("a weight of another shape", _weights("head.weight", lambda w: w[:-1]),
     r"does not hold the weights its model_cfg describes: model\['head.weight'\]"),
    ("a NaN weight", _weights("head.weight", lambda w: w * float("nan")), r"holds NaN or inf"),
    ("a data fingerprint holding a tensor", _set(["data", "train", "shape", 0], torch.zeros(2)),
     r"data\['train'\]\['shape'\]\[0\] is a torch.float32 tensor of shape \(2,\)"),
    ("a precision that is a tensor", _set(["precision"], torch.zeros(2)), r"precision is a "),
    ("a world size that is a tensor", _set(["data_position", "world_size"], torch.zeros(2)),
     r"data_position\['world_size'\] is a "),
    ("a newer format", _set(["format"], FORMAT + 1),
     rf"format {FORMAT + 1}; allowed: formats 1 to {FORMAT}"),
    ("no format (format 1)", _delete(["format"]), r"format-1 checkpoint.*loads for sampling"),
]


@pytest.mark.parametrize("case, change, says", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_a_malformed_training_state_is_one_sentence(case, change, says, saved, tmp_path, digits,
                                                     no_step):
    state = copy(saved)
    change(state)
    with pytest.raises(ValueError, match=says) as err:
        resume_from(state, tmp_path, digits)
    print(err.value)
    assert "\n" not in str(err.value)


def test_through_the_command_it_is_one_line_and_exit_2(saved, tmp_path, capsys, no_step):
    state = copy(saved)
    state["step"] = -5
    torch.save(state, tmp_path / "ckpt.pt")
    with pytest.raises(SystemExit) as exit_:
        train_command.main(ARGV + ["--out_dir", str(tmp_path), "--resume"])
    err = capsys.readouterr().err
    print(err)
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "step is -5" in err and "Traceback" not in err


def test_a_resume_names_each_field_that_differs_not_the_whole_config(saved, tmp_path, digits,
                                                                      no_step):
    with pytest.raises(ValueError) as err:
        resume_from(saved, tmp_path, digits, n_layers=2, lr=0.5)
    said = str(err.value)
    print(said)
    assert "n_layers: 1 -> 2" in said and "lr: 0.002 -> 0.5" in said
    assert "ModelConfig(" not in said and "d_model" not in said


def test_precision_and_device_are_compared_as_resolved(saved, tmp_path, digits, no_step):
    """A run that resolved "auto" to fp16 with a loss scaler on CUDA never continues as
    bf16 on the CPU; the same words ("auto") are not enough."""
    state = copy(saved)
    state["train_cfg"]["precision"] = "auto"
    state.update(precision="fp16", device="cuda")
    with pytest.raises(ValueError, match=r"precision: 'fp16' -> 'bf16'; device: 'cuda' -> "
                                         r"'cpu'"):
        resume_from(state, tmp_path, digits, precision="auto")


def test_a_word_that_resolves_the_same_resumes(tmp_path, digits):
    """bf16 asked for by name, resumed as "auto" (bf16 on the CPU): the same run."""
    m, t = tiny(tmp_path, precision="bf16", stop_iter=1, max_iters=2)
    training.train(m, t, progress=False, dataset=digits)
    out = training.train(m, dataclasses.replace(t, precision="auto", resume=True,
                                                stop_iter=None), progress=False, dataset=digits)
    assert out["step"] == 2 and out["precision"] == "bf16"


def test_other_data_behind_the_same_path_is_refused(saved, tmp_path, digits, no_step):
    changed = {split: arr.copy() for split, arr in digits.splits.items()}
    changed["train"][0, 0] ^= 1
    other = Dataset(digits.name, digits.kind, digits.vocab_size, changed, digits.image_shape)
    with pytest.raises(ValueError, match=r"data split 'train': sha256 \w+, shape \[1437, 64\] "
                                         r"-> sha256 \w+"):
        resume_from(saved, tmp_path, other)


def test_the_same_data_at_another_path_resumes(saved, tmp_path, digits, no_step):
    """Where the data lies is no part of the run: a dataset moved to another disk (its
    bytes compared by their fingerprint, as above) resumes; before, the path's text was
    compared and such a run could not be continued."""
    moved = copy(saved)
    moved["train_cfg"]["data_path"] = "/an/older/disk/digits"
    assert resume_from(moved, tmp_path, digits).resume_state["step"] == 2


def test_a_stop_iter_before_the_checkpoint_is_refused(saved, tmp_path, digits, no_step):
    """The run cannot stop where it has been (it took no step and said nothing of it);
    at the checkpoint's step it takes no step (the same command again), past it, steps."""
    with pytest.raises(ValueError) as err:
        resume_from(saved, tmp_path, digits, stop_iter=1)
    print(err.value)
    assert "with stop_iter=1: the checkpoint is at step 2, already past it; allowed: " \
           "stop_iter >= 2 (at 2 the run takes no step), or no stop_iter (the run goes on to " \
           "max_iters=4)" in str(err.value)
    for stop in (2, 3):
        assert resume_from(saved, tmp_path, digits, stop_iter=stop).resume_state["step"] == 2


def resume_warnings(state, tmp_path, digits, **kw) -> list[str]:
    """The ResumeWarnings of a resume of ``state`` (every one, however often seen)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        resume_from(state, tmp_path, digits, **kw)
    return [str(w.message) for w in said if issubclass(w.category, ResumeWarning)]


def test_another_thread_count_resumes_and_says_weights_match_only_to_rounding(
        saved, tmp_path, digits, no_step):
    """The count belongs to the machine: allowed, with one line; the same count (given, or
    torch's own when cpu_threads is None) says nothing."""
    assert saved["cpu_threads"] == torch.get_num_threads() == 1    # what the steps used
    said = resume_warnings(saved, tmp_path, digits, cpu_threads=2)
    print(said)
    assert said == [f"{tmp_path / 'ckpt.pt'}: resumed with 2 CPU threads where the run used "
                    f"1: the weights will match an uninterrupted run only to float rounding "
                    f"(bitwise with --cpu_threads 1)"]
    assert resume_warnings(saved, tmp_path, digits, cpu_threads=1) == []
    assert resume_warnings(saved, tmp_path, digits, cpu_threads=None) == []   # torch's: 1


def test_the_thread_count_is_recorded_and_a_format_3_file_compares_its_field(
        saved, tmp_path, digits, no_step):
    """Format 4 records the count (a format-4 state without it is refused, one with a
    count out of range too); a format-3 file has only its cpu_threads field to compare,
    when it was given."""
    old = copy(saved)
    old["format"] = 3
    del old["cpu_threads"]
    assert resume_warnings(old, tmp_path, digits, cpu_threads=2) == []       # unknown: None
    old["train_cfg"]["cpu_threads"] = 1
    assert "where the run used 1" in resume_warnings(old, tmp_path, digits, cpu_threads=2)[0]
    for change, says in ((_delete(["cpu_threads"]), r"missing \['cpu_threads'\]"),
                         (_set(["cpu_threads"], 0), r"cpu_threads is 0; expected an integer")):
        state = copy(saved)
        change(state)
        with pytest.raises(ValueError, match=says):
            resume_from(state, tmp_path, digits)


@pytest.mark.skipif(cpu_window.library() is None, reason="no CPU window kernel here")
def test_another_cpu_kernel_resumes_and_says_weights_match_only_to_rounding(
        tmp_path, digits, monkeypatch):
    """A strided model trained on the structured path through the C window kernel, resumed
    where the kernel is off (SPARSE_ATTENTION_CPU_KERNEL=0, or no compiler): PyTorch's
    kernel sums in another order, so the run ends 2e-7 away from an uninterrupted one.
    Before, nothing said so (a thread-count change did). Now the checkpoint records the
    kernel and a resume on another one says so, in one line; the same kernel says
    nothing, and neither does a model the kernel does not compute (naive at this n)."""
    out = tmp_path / "run"
    m, t = tiny(out, stop_iter=2, attention_backend="structured")
    training.train(m, t, progress=False, dataset=digits)
    state = load_checkpoint(out / "ckpt.pt")
    assert state["cpu_kernel"] == cpu_window.build() and state["cpu_kernel"].startswith(
        "cpu_window.c -O3")
    kw = dict(attention_backend="structured")
    assert resume_warnings(state, tmp_path, digits, **kw) == []
    monkeypatch.setattr(cpu_window, "_STATE", {"lib": None, "missing": "turned off by "
                                               "SPARSE_ATTENTION_CPU_KERNEL=0", "flags": ""})
    said = resume_warnings(state, tmp_path, digits, **kw)
    print(said)
    assert said == [f"{tmp_path / 'ckpt.pt'}: resumed with PyTorch's kernel (turned off by "
                    f"SPARSE_ATTENTION_CPU_KERNEL=0) where the run used {state['cpu_kernel']}: "
                    f"the weights will match an uninterrupted run only to float rounding "
                    f"(bitwise with a C compiler ($CC, cc, gcc or clang) and "
                    f"SPARSE_ATTENTION_CPU_KERNEL unset, on a compiler that takes the same "
                    f"flags)"]
    unknown = copy(state)
    unknown["cpu_kernel"] = None                 # none recorded: nothing to compare
    assert resume_warnings(unknown, tmp_path, digits, **kw) == []
    assert not cpu_kernel_computes(tiny(out)[0], "cpu")    # auto at n = 64: the naive path


def test_a_model_is_checked_against_its_file_before_it_is_built(tmp_path, monkeypatch):
    """A weights-only file whose config claims 16.7 million positions (image_shape
    (512, 512, 64)) while its tensors are those of a tiny model with such tables:
    refused before a byte of the model is allocated."""
    m, _ = preset("digits", d_model=16, n_heads=2, n_layers=1)
    big = dataclasses.replace(m, image_shape=(512, 512, 64), n_ctx=512 * 512 * 64, stride=64)
    with torch.device("meta"):
        weights = SparseTransformer(big).state_dict()
    weights = {k: torch.zeros(v.shape, dtype=torch.float16 if v.is_floating_point() else v.dtype)
               for k, v in weights.items()}
    torch.save({"format": FORMAT, "model": weights, "model_cfg": dataclasses.asdict(big)},
               tmp_path / "big.pt")
    built = []
    monkeypatch.setattr(SparseTransformer, "to", lambda self, *a, **k: built.append(1) or self)
    with pytest.raises(ValueError, match=r"describes a model of [\d,]+ bytes while the file "
                                         r"holds [\d,]+ bytes.*nothing was allocated"):
        load_model(tmp_path / "big.pt")
    assert not built


def test_a_config_field_added_later_takes_its_old_value_in_an_older_file(tmp_path):
    """output_init came with format 3: a format-2 file without it holds a model made the
    way every model was then (W_out drawn, "normal") and loads so; a format-3 file must
    name it, and one without it is refused naming the field."""
    m, _ = preset("digits", d_model=16, n_heads=2, n_layers=1)
    weights = SparseTransformer(m).state_dict()
    cfg = dataclasses.asdict(m)
    del cfg["output_init"]
    torch.save({"format": 2, "model": weights, "model_cfg": cfg}, tmp_path / "old.pt")
    model, model_cfg, _ = load_model(tmp_path / "old.pt")
    assert model_cfg.output_init == "normal" and model_cfg == m
    torch.save({"format": 3, "model": weights, "model_cfg": cfg}, tmp_path / "new.pt")
    with pytest.raises(ValueError, match="model_cfg.*output_init"):
        load_model(tmp_path / "new.pt")


def test_sampling_refuses_non_finite_weights(tmp_path):
    m, _ = preset("digits", d_model=16, n_heads=2, n_layers=1)
    model = SparseTransformer(m)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["embed.tok.weight"][3, 1] = float("inf")
    torch.save({"format": FORMAT, "model": state, "model_cfg": dataclasses.asdict(m)},
               tmp_path / "inf.pt")
    with pytest.raises(ValueError, match=r"model\['embed.tok.weight'\] holds NaN or inf"):
        load_model(tmp_path / "inf.pt")
    assert np.isinf(state["embed.tok.weight"].numpy()).sum() == 1


def _paths(value, prefix=()):
    """Every place in a state (the first 3 items of a list), deepest last."""
    out = []
    items = (value.items() if isinstance(value, dict)
             else enumerate(value[:3]) if isinstance(value, (list, tuple)) else ())
    for key, inner in items:
        out.append(prefix + (key,))
        out += _paths(inner, prefix + (key,))
    return out


ODD = [None, -5, 10**6, "x", 1.5, float("nan"), True, [], {}, (1, 2), torch.zeros(2),
       torch.zeros(2, dtype=torch.int64)]


@pytest.mark.slow
@given(data=st.data())
def test_a_randomly_damaged_state_is_refused_in_one_sentence_or_resumes(data, saved, digits):
    """Any one place of the state deleted or replaced by a value of another kind: the run
    is refused with a ValueError of one sentence, or (a change that does not matter) it
    resumes and trains; never another exception."""
    state = copy(saved)
    path = data.draw(st.sampled_from(_paths(state)), label="place")
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, tuple):                    # tuples are values: rebuild the parent
        return
    if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(st.sampled_from(ODD), label="value")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            plan = resume_from(state, Path(tmp), digits)
        except ValueError as err:
            assert "\n" not in str(err)
            return
        m, t = tiny(tmp, resume=True)
        training.train(m, t, progress=False, plan=plan)


@pytest.mark.parametrize("change,message", [
    # the batches begin with the data's start token (17), the sampler with the model's
    (dict(vocab_size=32), r"start token 17, but the model's start token is its "
                          r"vocab_size=32 .*allowed: vocab_size=17"),
    (dict(vocab_size=16), r"has 17 symbols, more than the model's vocab_size=16"),
    (dict(image_shape=(4, 16, 1)), r"images of shape \(H, W, C\) = \(8, 8, 1\), but the "
                                   r"model's image_shape is \(4, 16, 1\)"),
    (dict(image_shape=(2, 2, 16)), r"allowed: image_shape=\(8, 8, 1\)"),
])
def test_image_data_must_fit_the_models_start_token_and_layout(change, message, tmp_path,
                                                                digits, no_step):
    """An image model whose vocabulary or image shape differ from its data's is refused
    before any step: training would feed one start token and sampling another, or the
    row, column and channel embeddings would describe another layout."""
    m, t = tiny(tmp_path, **change)
    with pytest.raises(ValueError, match=message):
        check_run(m, t, digits)


def test_a_warm_up_as_long_as_the_run_is_said(tmp_path, digits, no_step):
    """warmup_iters >= max_iters runs (smoke runs take a few steps of a preset) but says
    that the peak rate is never reached and the decay never starts; a shorter warm-up
    says nothing."""
    m, t = tiny(tmp_path, max_iters=10, warmup_iters=30)
    with pytest.warns(ScheduleWarning, match=r"warmup_iters=30 is not below max_iters=10: "
                                             r"the learning rate climbs to 0.333 of its peak"):
        check_run(m, t, digits)
    m, t = tiny(tmp_path, max_iters=10, warmup_iters=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleWarning)
        check_run(m, t, digits)
