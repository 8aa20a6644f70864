"""Faults injected into training and its checkpoints: nothing lost, nothing unsafe.

Child et al., 2019, section 6 trains for days, data parallel: a run must survive
``kill -9`` at any moment (mid-step or mid-write) and resume to the same weights, a
full disk or a read-only folder must lose nothing and say so, a checkpoint someone
sent must never run code when opened, and every rank of a torchrun job must draw its
own dropout masks and get its own RNG back on resume.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from fast.commands import train as train_command
from fast.core import files
from fast.core.lock import FolderLock

try:
    import resource  # Linux and macOS: the file-size limit
except ImportError:                               # Windows
    resource = None
from fast.transformer.config import preset
from fast.transformer.network.checkpoint import CheckpointWriteError, load_checkpoint, load_model
from fast.transformer.training import train as training
from fast.transformer.training.output import OutputRefused
from fast.transformer.training.stop import CheckpointConflict, NonFinite
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")
LINUX = sys.platform.startswith("linux") and resource is not None


def config(out_dir, **kw):
    base = dict(d_model=16, n_heads=2, n_layers=1, batch_size=8, max_iters=12, warmup_iters=2,
                eval_batches=1, eval_interval=0, precision="fp32", device="cpu", cpu_threads=1,
                dropout=0.2, checkpoint_interval=1, out_dir=str(out_dir))
    base.update(kw)
    return preset("digits", **base)


def same_weights(a, b) -> bool:
    a, b = a.state_dict(), b.state_dict()
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


# A training run in a child process, so that it can be killed: its config as JSON in
# argv[1]; SLOW_STEP sleeps after every step; STALL_AT_STEP writes part of that step's
# checkpoint, touches argv[2] and hangs there (a kill mid-write).
CHILD = """
import json, os, sys, time, torch
from fast.data import load
from fast.transformer.training import train as training
from fast.transformer.config import preset
step, save = training.train_step, torch.save
def slow_step(*a, **k):
    out = step(*a, **k)
    time.sleep(float(os.environ.get("SLOW_STEP", "0")))
    return out
def stalling_save(obj, f):
    if obj.get("step") == int(os.environ.get("STALL_AT_STEP", "-1")):
        f.write(b"PK\\x03\\x04 half a checkpoint"); f.flush()
        open(sys.argv[2], "w").close()
        time.sleep(600)
    return save(obj, f)
training.train_step, torch.save = slow_step, stalling_save
training.train(*preset("digits", **json.loads(sys.argv[1])), progress=False,
               dataset=load("digits"))
"""


def child(t, sentinel, **env):
    fields = {k: v for k, v in dataclasses.asdict(t).items() if k != "eval_splits"}
    model_fields = {"d_model": 16, "n_heads": 2, "n_layers": 1, "dropout": 0.2}
    return subprocess.Popen([sys.executable, "-c", CHILD, json.dumps({**fields, **model_fields}),
                             str(sentinel)], cwd=ROOT, env=dict(os.environ, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(condition, proc, timeout=120):
    end = time.time() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.time() < end, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_kill_9_mid_training_then_resume_is_bitwise(tmp_path, digits):
    m, t = config(tmp_path / "killed")
    path = tmp_path / "killed" / "ckpt.pt"
    proc = child(t, tmp_path / "unused", SLOW_STEP="0.2")
    wait_for(lambda: path.exists() and load_checkpoint(path)["step"] >= 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = load_checkpoint(path)["step"]
    print("killed after the checkpoint of step", killed_at)
    assert proc.returncode == -signal.SIGKILL and 3 <= killed_at < t.max_iters
    resumed = training.train(m, dataclasses.replace(t, resume=True), progress=False,
                             dataset=digits)
    full = training.train(m, dataclasses.replace(t, out_dir=str(tmp_path / "full")),
                          progress=False, dataset=digits)
    assert resumed["step"] == full["step"] == t.max_iters
    assert same_weights(resumed["model"], full["model"])


@pytest.mark.slow
def test_kill_9_mid_checkpoint_write_loses_nothing(tmp_path, digits):
    m, t = config(tmp_path / "run")
    path, sentinel = tmp_path / "run" / "ckpt.pt", tmp_path / "stalled"
    proc = child(t, sentinel, STALL_AT_STEP="3")
    wait_for(sentinel.exists, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert load_checkpoint(path)["step"] == 2                  # the previous one, whole
    [half] = path.parent.glob(".ckpt.pt.*.tmp")                 # the half-written one,
    assert half.stat().st_size > 0                             # under its own unique name
    resumed = training.train(m, dataclasses.replace(t, resume=True), progress=False,
                             dataset=digits)
    full = training.train(m, dataclasses.replace(t, out_dir=str(tmp_path / "full")),
                          progress=False, dataset=digits)
    assert same_weights(resumed["model"], full["model"])
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.pt"]   # tmp replaced


@pytest.mark.slow
@pytest.mark.skipif(not LINUX, reason="RLIMIT_FSIZE and SIGXFSZ: Linux")
def test_a_full_disk_loses_nothing_and_says_so(tmp_path, digits):
    """The file-size limit stands in for a full disk: writes past it fail (EFBIG)."""
    m, t = config(tmp_path, max_iters=4, checkpoint_interval=0, stop_iter=2)
    first = training.train(m, t, progress=False, dataset=digits)
    before = Path(first["checkpoint"]).read_bytes()

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    argv = ["--preset", "digits", "--d_model", "16", "--n_heads", "2", "--n_layers", "1",
            "--dropout", "0.2", "--batch_size", "8", "--max_iters", "4", "--warmup_iters", "2",
            "--eval_batches", "1", "--eval_interval", "0", "--precision", "fp32", "--device",
            "cpu", "--cpu_threads", "1", "--out_dir", str(tmp_path), "--resume"]
    run = subprocess.run([sys.executable, "-m", "fast", "train", *argv], cwd=ROOT,
                         preexec_fn=small_disk, capture_output=True, text=True, timeout=300)
    last = run.stderr.strip().splitlines()[-1]
    print(last)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert last.startswith("python -m fast train: [Errno 27] could not write the checkpoint")
    assert "the previous checkpoint there is intact" in last
    assert Path(first["checkpoint"]).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_a_folder_turned_read_only_mid_run_loses_nothing(tmp_path, digits, monkeypatch):
    """The file system refuses the checkpoint (EROFS, raised where the data reach the
    disk): the run stops with CheckpointWriteError, the previous checkpoint intact."""
    m, t = config(tmp_path, max_iters=4, checkpoint_interval=2)
    calls, real_fsync = [], os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) > 1:                        # the first checkpoint gets written
            raise OSError(errno.EROFS, "Read-only file system")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(CheckpointWriteError, match="Read-only file system.*previous "
                                                   "checkpoint there is intact"):
        training.train(m, t, progress=False, dataset=digits)
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


# ----------------------------------------------------------------------------
# Opening a checkpoint never runs code.
# ----------------------------------------------------------------------------

class Payload:
    """Unpickling this calls os.mkdir(marker): any code could run instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_a_crafted_pickle_is_refused_without_running_anything(tmp_path):
    marker, path = tmp_path / "it_ran", tmp_path / "ckpt.pt"
    torch.save({"model": {}, "model_cfg": {"n_ctx": 8}, "step": Payload(marker)}, path)
    torch.load(path, weights_only=False)          # an unsafe load runs it: the test is real
    assert marker.is_dir()
    marker.rmdir()
    for load_it in (load_checkpoint, load_model):
        with pytest.raises(ValueError, match=r"refused.*GLOBAL \w+\.mkdir.*nothing in it "
                                             r"was run"):
            load_it(path)
        assert not marker.exists()


def test_old_unsafe_and_broken_checkpoints_give_clear_errors(tmp_path, digits):
    m, t = config(tmp_path, max_iters=1)
    path = Path(training.train(m, t, progress=False, dataset=digits)["checkpoint"])
    state = torch.load(path, weights_only=True)
    assert torch.equal(load_checkpoint(path)["rng"][0]["torch"], state["rng"][0]["torch"])
    state["rng"] = {"numpy": np.random.get_state()}            # the old format's RNG
    torch.save(state, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="refused.*numpy"):
        load_checkpoint(tmp_path / "old.pt")
    (tmp_path / "cut.pt").write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="is not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt")


# ----------------------------------------------------------------------------
# torchrun: every rank its own dropout masks, its own RNG state in the checkpoint.
# ----------------------------------------------------------------------------

def _rank(rank, world, port, tmp, dataset):
    """Three runs on one process group: uninterrupted (u), stopped at step 2 (r), resumed."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=world)
    masks, forward = [], torch.nn.Dropout.forward

    def recording(self, x):
        y = forward(self, x)
        if self.training and self.p > 0:
            masks.append((y != 0).flatten().clone())
        return y

    torch.nn.Dropout.forward = recording
    for name, out_dir, stop, resume in (("full", "u", None, False), ("first", "r", 2, False),
                                        ("resumed", "r", None, True)):
        masks.clear()
        m, t = config(os.path.join(tmp, out_dir), dropout=0.3, max_iters=4, stop_iter=stop,
                      resume=resume, checkpoint_interval=0)
        out = training.train(m, t, progress=False, dataset=dataset)
        torch.save({"state": out["model"].state_dict(), "masks": list(masks),
                    "rng": torch.get_rng_state()}, os.path.join(tmp, f"{name}{rank}.pt"))
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_ranks_draw_their_own_dropout_and_resume_their_own_rng(tmp_path, digits):
    for attempt in range(2):                   # the free port may be taken meanwhile
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            mp.spawn(_rank, args=(2, port, str(tmp_path), digits), nprocs=2)
            break
        except mp.ProcessRaisedException as err:
            if attempt:
                raise
            print("retrying on a new port:", err)
    full, first, resumed = ([torch.load(tmp_path / f"{name}{r}.pt") for r in (0, 1)]
                            for name in ("full", "first", "resumed"))
    a, b = full[0]["masks"], full[1]["masks"]
    assert len(a) == len(b) > 0
    same = sum(torch.equal(x, y) for x, y in zip(a, b))
    print(f"dropout masks equal on both ranks: {same} of {len(a)}")
    assert same == 0
    state = load_checkpoint(tmp_path / "r" / "ckpt.pt")
    assert state["step"] == 4 and len(state["rng"]) == 2
    for r in (0, 1):                        # each rank's state, as it was when saved
        assert torch.equal(state["rng"][r]["torch"], resumed[r]["rng"])
        assert all(torch.equal(full[r]["state"][k], resumed[r]["state"][k])
                   for k in full[r]["state"])
        n = len(resumed[r]["masks"])        # the steps after the resume: the same masks
        assert n > 0 and all(torch.equal(x, y) for x, y in zip(full[r]["masks"][-n:],
                                                               resumed[r]["masks"]))
        assert len(first[r]["masks"]) + n == len(full[r]["masks"])
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])


# ----------------------------------------------------------------------------
# A run never saves NaN or inf: it stops, naming the step, the last good checkpoint kept.
# ----------------------------------------------------------------------------

def test_a_run_whose_numbers_turn_nan_stops_and_keeps_its_last_good_checkpoint(tmp_path, digits,
                                                                                capsys):
    m, t = config(tmp_path / "lib", lr=1e4, max_iters=30)           # a checkpoint every step
    with pytest.raises(NonFinite, match=r"non-finite \(NaN or inf\) at step (\d+); the run "
                                        r"stopped there") as err:
        training.train(m, t, progress=False, dataset=digits)
    bad = int(re.search(r"at step (\d+)", str(err.value))[1])
    kept = load_checkpoint(tmp_path / "lib" / "ckpt.pt")
    print(err.value, "| kept step", kept["step"])
    assert kept["step"] == bad - 1 and f"keeps step {bad - 1}" in str(err.value)
    assert all(torch.isfinite(v).all() for v in kept["model"].values())
    load_model(tmp_path / "lib" / "ckpt.pt")                      # samples from it load
    argv = ["--preset", "digits", "--d_model", "16", "--n_heads", "2", "--n_layers", "1",
            "--dropout", "0.2", "--batch_size", "8", "--max_iters", "30", "--warmup_iters",
            "2", "--eval_batches", "1", "--eval_interval", "0", "--precision", "fp32",
            "--device", "cpu", "--cpu_threads", "1", "--checkpoint_interval", "1",
            "--lr", "1e4", "--out_dir", str(tmp_path / "cmd")]
    with pytest.raises(SystemExit) as exit_:
        train_command.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    print(lines[-1])
    assert exit_.value.code == 1 and "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith(f"python -m fast train: the loss or the weights turned "
                                f"non-finite (NaN or inf) at step {bad}")


def test_activations_that_overflow_stop_the_run_as_a_non_finite_loss_does(tmp_path, digits):
    """Weights finite but so large that the next forward overflows: sparse_attention
    refuses the non-finite q (a NonFiniteInput); the run stops on it as on a NaN loss,
    one NonFinite naming the step, the last good checkpoint kept (it was a traceback)."""
    m, t = config(tmp_path, lr=1e30, max_iters=30)                  # a checkpoint every step
    with pytest.raises(NonFinite, match=r"the activations turned non-finite \(NaN or inf\) "
                                        r"at step (\d+) \(q holds non-finite") as err:
        training.train(m, t, progress=False, dataset=digits)
    bad = int(re.search(r"at step (\d+)", str(err.value))[1])
    print(err.value)
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == bad - 1


def test_a_rank_that_writes_no_checkpoint_says_which_rank_does():
    """Under torchrun only rank 0 writes: a stop line of rank 1 said no checkpoint was
    written, while rank 0's named the one it kept."""
    from types import SimpleNamespace as NS
    run = NS(cfg=NS(save_checkpoint=True), rank=1, plan=NS(path="runs/x/ckpt.pt"),
             output=NS(saved_step=None), first_step=None)
    assert training._Run.kept(run) == ("rank 0 writes the run's checkpoint (runs/x/ckpt.pt), "
                                       "this rank none")
    run.rank, run.output.saved_step = 0, 7
    assert training._Run.kept(run) == "runs/x/ckpt.pt keeps step 7"


# ----------------------------------------------------------------------------
# SIGTERM (preemption) and SIGINT (Ctrl-C): the step under way is saved, one line, and the
# run resumes to the weights of an uninterrupted one.
# ----------------------------------------------------------------------------

COMMAND_CHILD = """
import os, sys, time
from fast.commands import train as command
from fast.transformer.training import train as training
step, done = training.train_step, [0]
def slow_step(*a, **k):
    out = step(*a, **k)
    done[0] += 1
    with open(sys.argv[1], "w") as f:
        f.write(str(done[0]))
    time.sleep(float(os.environ.get("SLOW_STEP", "0")))
    return out
training.train_step = slow_step
command.main(sys.argv[2:])
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_step_and_resumes_bitwise(signum, tmp_path, digits):
    out, steps = tmp_path / "run", tmp_path / "steps"
    argv = ["--preset", "digits", "--d_model", "16", "--n_heads", "2", "--n_layers", "1",
            "--dropout", "0.2", "--batch_size", "8", "--max_iters", "12", "--warmup_iters",
            "2", "--eval_batches", "1", "--eval_interval", "0", "--precision", "fp32",
            "--device", "cpu", "--cpu_threads", "1", "--out_dir", str(out)]
    m, t = config(out, checkpoint_interval=0)             # the default: a checkpoint at the end
    assert train_command.configs(argv)[1:] == (m, t)
    proc = subprocess.Popen([sys.executable, "-c", COMMAND_CHILD, str(steps), *argv], cwd=ROOT,
                            env=dict(os.environ, SLOW_STEP="0.3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: steps.exists() and steps.read_text() not in ("", "1", "2"), proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    last = err.strip().splitlines()[-1]
    print(last)
    stopped = load_checkpoint(out / "ckpt.pt")["step"]
    assert proc.returncode == 128 + signum and "Traceback" not in err
    assert last == (f"python -m fast train: stopped by {signal.Signals(signum).name} after step "
                    f"{stopped} of 12; {out / 'ckpt.pt'} keeps step {stopped}: continue it "
                    f"with --resume")
    assert 3 <= stopped < 12
    resumed = training.train(m, dataclasses.replace(t, resume=True), progress=False,
                             dataset=digits)
    full = training.train(m, dataclasses.replace(t, out_dir=str(tmp_path / "full")),
                          progress=False, dataset=digits)
    assert resumed["step"] == full["step"] == 12
    assert same_weights(resumed["model"], full["model"])
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt"]        # no lock, no tmp left


# ----------------------------------------------------------------------------
# One writer per out_dir, and a checkpoint written only over the file the run expects.
# ----------------------------------------------------------------------------

def test_a_second_writer_of_an_out_dir_is_refused_naming_the_first(tmp_path, digits, capsys):
    m, t = config(tmp_path, max_iters=2)
    with FolderLock(tmp_path, "out_dir"):                     # a run holds it
        with pytest.raises(OutputRefused, match=rf"out_dir {tmp_path} is in use by another "
                                                rf"run \(pid {os.getpid()} on "):
            training.train(m, t, progress=False, dataset=digits)
        argv = ["--preset", "digits", "--d_model", "16", "--n_heads", "2", "--n_layers", "1",
                "--max_iters", "2", "--warmup_iters", "1", "--eval_batches", "1",
                "--device", "cpu", "--out_dir", str(tmp_path)]
        with pytest.raises(SystemExit) as exit_:
            train_command.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
        assert "is in use by another run (pid" in err
    assert not (tmp_path / "ckpt.pt").exists()
    training.train(m, t, progress=False, dataset=digits)        # free again once released
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_a_fresh_run_on_an_out_dir_being_written_names_the_writer_not_its_checkpoint(
        tmp_path, digits):
    """The holder has already saved its first checkpoint: the refusal names the run that
    holds out_dir (wait for it, or another out_dir), not the file it is writing (whose
    advice, --resume or --overwrite, would be wrong while it runs)."""
    m, t = config(tmp_path, max_iters=2)
    with FolderLock(tmp_path, "out_dir"):
        (tmp_path / "ckpt.pt").write_bytes(b"the holder's checkpoint")
        with pytest.raises(ValueError, match=r"is in use by another run \(pid "):
            training.train(m, t, progress=False, dataset=digits)
    assert (tmp_path / "ckpt.pt").read_bytes() == b"the holder's checkpoint"
    with pytest.raises(ValueError, match="already holds a checkpoint"):   # released: the file
        training.train(m, t, progress=False, dataset=digits)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]   # no lock file left


def test_a_checkpoint_another_writer_put_there_is_never_replaced(tmp_path, digits, monkeypatch):
    """Something that takes no lock writes ckpt.pt: after the checks and before the first
    step the run is refused; mid-run the next save stops the run. Theirs stays."""
    m, t = config(tmp_path / "a", max_iters=4, checkpoint_interval=2)
    plan = training.check_run(m, t, digits)
    (tmp_path / "a" / "ckpt.pt").write_bytes(b"theirs")
    with pytest.raises(OutputRefused, match="ckpt.pt appeared after this run's checks"):
        training.train(m, t, progress=False, plan=plan)
    assert (tmp_path / "a" / "ckpt.pt").read_bytes() == b"theirs"

    m, t = config(tmp_path / "b", max_iters=6, checkpoint_interval=2)
    step = training.train_step
    done = []

    def meddling_step(*args, **kw):
        done.append(1)
        if len(done) == 3:                      # after our checkpoint of step 2
            (tmp_path / "b" / "ckpt.pt").write_bytes(b"theirs")
        return step(*args, **kw)

    monkeypatch.setattr(training, "train_step", meddling_step)
    with pytest.raises(CheckpointConflict, match=r"ckpt.pt was replaced while this run held "
                                                 r"out_dir .* the checkpoint of step 4 was not "
                                                 r"written over it, this run's last checkpoint "
                                                 r"was of step 2"):
        training.train(m, t, progress=False, dataset=digits)
    assert (tmp_path / "b" / "ckpt.pt").read_bytes() == b"theirs"


def test_a_resume_that_takes_no_step_records_nothing_twice(tmp_path, digits):
    m, t = config(tmp_path, max_iters=4, eval_interval=2, checkpoint_interval=0, stop_iter=2)
    assert [e["step"] for e in training.train(m, t, progress=False, dataset=digits)["evals"]] \
        == [2]
    again = training.train(m, dataclasses.replace(t, resume=True), progress=False,
                           dataset=digits)                       # stop_iter 2 again: no step
    assert [e["step"] for e in again["evals"]] == [2] and again["time_per_iter"] is None
    line = train_command.summary("digits", again)
    print(line)
    assert "nan" not in line and "no step taken in this run" in line
    assert [e["step"] for e in load_checkpoint(tmp_path / "ckpt.pt")["history"]["evals"]] == [2]
    done = training.train(m, dataclasses.replace(t, resume=True, stop_iter=None),
                          progress=False, dataset=digits)
    assert [e["step"] for e in done["evals"]] == [2, 4]
    finished = training.train(m, dataclasses.replace(t, resume=True, stop_iter=None),
                              progress=False, dataset=digits)     # a finished run: no step
    assert [e["step"] for e in finished["evals"]] == [2, 4]


@pytest.mark.slow
def test_two_fresh_runs_started_half_a_second_apart(tmp_path):
    """The first keeps out_dir and finishes; the second is refused in one line (exit 2)
    naming the first; the checkpoint left is the first run's, whole."""
    argv = ["--preset", "digits", "--d_model", "16", "--n_heads", "2", "--n_layers", "1",
            "--batch_size", "8", "--max_iters", "12", "--warmup_iters", "2", "--eval_batches",
            "1", "--eval_interval", "0", "--precision", "fp32", "--device", "cpu",
            "--cpu_threads", "1", "--checkpoint_interval", "1", "--out_dir", str(tmp_path / "run")]
    procs = []
    for i in range(2):
        procs.append(subprocess.Popen(
            [sys.executable, "-c", COMMAND_CHILD, str(tmp_path / f"steps{i}"), *argv], cwd=ROOT,
            env=dict(os.environ, SLOW_STEP="1.0"), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
        time.sleep(0.5)
    (out0, err0), (out1, err1) = (p.communicate(timeout=300) for p in procs)
    print(err1.strip().splitlines()[-1])
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], (codes, err0[-500:], err1[-500:])
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    said = (err0, err1)[loser].strip().splitlines()
    assert len(said) == 1 and "Traceback" not in said[0]
    assert f"is in use by another run (pid {procs[winner].pid} on " in said[0]
    assert load_checkpoint(tmp_path / "run" / "ckpt.pt")["step"] == 12
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["ckpt.pt"]
