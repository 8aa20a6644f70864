"""The committed results are the code's: the code checked out now reproduces them bit for bit.

Child et al., 2019, section 7 and Tables 2-3, Figure 2: figures/data/ holds the results of
trainings (Table 2's runs, Figure 2's dense model) and of evaluations of their kept models
(Table 3). Every training there runs with a fixed seed, thread count and pinned kernels
(``fast.experiments.reproducible``), so the same code gives the same floats. These tests
retrain the first steps of the committed runs -- in a child process with the same pins, the
same configuration, the schedule of the whole run (``TrainConfig.stop_iter``) -- and
compare the training losses logged on the way with the committed history, float for
float; Table 3's first stretch is re-scored from the kept weights the same way, and one kept
model draws its samples again (figures/data/samples.json).

They fail when the code would no longer reproduce what is committed: a kernel that sums in
another order (the window kernel's, or a change of which kernel a call takes), another
initialisation, batch or schedule. The loss logged at step s is the forward pass of the
weights after s - 1 updates, so a change in the backward pass or the optimizer shows from
the second logged step on. Then regenerate the results (``make figures``) and commit them
with the code. The configuration is compared first, so a changed setting (steps, learning
rate) is named as such rather than as a difference of bits.
"""

import dataclasses
import json

import pytest
import torch

from fast.experiments import learned_attention as LA
from fast.experiments import table2 as T2
from fast.experiments.paths import DATA, ROOT
from fast.experiments.reproducible import AVX2_OR_BETTER, child_env
from fast.measure.child import run_child
from fast.plots.style import PATTERN_ORDER

pytestmark = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in AVX2_OR_BETTER,
    reason="the committed results were made with the AVX2 kernels pinned: an x86 CPU with "
           "AVX2 reproduces them (elsewhere only the same kind of CPU would)")


def committed(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def as_json(obj) -> object:
    """``obj`` as the JSON files hold it (tuples become lists)."""
    return json.loads(json.dumps(obj))


def in_child(function: str, spec: dict, threads: int):
    result = run_child(function, spec, env=child_env(threads))
    assert "result" in result, f"{function} failed: {result.get('error')}\n{result.get('output')}"
    return result["result"]


def check_table2_cells(keys: list[str]) -> None:
    """Seed 0 of every cell of ``keys``: the committed configuration is today's, and the
    first ``T2.REPLAY_STEPS`` steps give the committed losses bit for bit."""
    data = committed("table2.json")
    for key in keys:
        run = data["runs"][key]["0"]
        model_cfg, train_cfg = T2.run_configs(*key.split("/"), False, None, 0)
        for name, now in (("model_cfg", model_cfg), ("train_cfg", train_cfg)):
            then = run[name]
            now = as_json(dataclasses.asdict(now))
            changed = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
            assert not changed, (f"{key}: the committed run's {name} differs from "
                                 f"run_configs' in {changed}: regenerate Table 2 "
                                 f"(python -m fast table2 --force) and commit it")
    losses = in_child("fast.experiments.table2:replay",
                      {"keys": keys, "steps": T2.REPLAY_STEPS}, threads=1)
    for key in keys:
        want = data["runs"][key]["0"]["history"]
        got = losses[key]
        assert len(got) >= 2 and want["step"][:len(got)] == [
            T2.LOG_EVERY * (i + 1) for i in range(len(got))]
        assert got == want["loss"][:len(got)], (
            f"{key} seed 0 no longer reproduces figures/data/table2.json: the first logged "
            f"losses are {got}, committed {want['loss'][:len(got)]}; regenerate the results "
            f"(make figures) and commit them with the code")


def test_table2_text_cells_reproduce_their_first_steps_bit_for_bit():
    """One Table 2 cell per pattern (the text ones: its data load in a second), retrained
    for its first steps in one child: the committed losses, float for float."""
    check_table2_cells([f"text/{p}" for p in PATTERN_ORDER])


@pytest.mark.slow
def test_table2_image_cells_reproduce_their_first_steps_bit_for_bit():
    """The image cells the same way (their data take a few seconds more to build)."""
    check_table2_cells([f"image/{p}" for p in PATTERN_ORDER])


@pytest.mark.slow
def test_figure2s_dense_model_reproduces_its_first_steps_bit_for_bit():
    """Figure 2's dense model (figures/data/learned_attention.json): its first logged
    training loss, retrained with its thread count and pins, bit for bit."""
    train = committed("learned_attention.json")["train"]
    model_cfg, train_cfg = LA.configs(False, None, None, train["threads"])
    assert as_json(dataclasses.asdict(model_cfg)) == train["model_cfg"]
    assert as_json(dataclasses.asdict(train_cfg)) == train["train_cfg"]
    every = train_cfg.log_interval
    got = in_child("fast.experiments.learned_attention:replay",
                   {"threads": train["threads"], "steps": every}, threads=train["threads"])
    assert got == train["history"]["loss"][:1] and train["history"]["step"][0] == every, (
        f"Figure 2's dense model no longer reproduces figures/data/learned_attention.json: "
        f"step {every} loss {got}, committed {train['history']['loss'][:1]}; rerun python -m "
        f"fast fig2 --force and commit it")


@pytest.mark.slow
def test_table3_reproduces_from_the_kept_models_bit_for_bit():
    """Table 3 (figures/data/table3.json) re-scored from the kept text models: the same
    weights (by digest) and the first stretch's bits at the smallest minimum context, bit
    for bit."""
    t3 = committed("table3.json")
    models = {p: str(ROOT / m["weights"]) for p, m in t3["models"].items()}
    smallest = min(t3["models"]["full"]["contexts"], key=int)
    got = in_child("fast.experiments.table3:replay",
                   {"models": models, "m": int(smallest), "stretches": t3["stretches"],
                    "stretch": t3["stretch"], "threads": t3["threads"]}, threads=t3["threads"])
    for pattern, m in t3["models"].items():
        assert got[pattern]["weights_sha256"] == m["weights_sha256"], (
            f"the kept model {m['weights']} is not the one Table 3 read: rerun python -m fast "
            f"table3 --force and commit it")
        want = m["contexts"][smallest]["per_stretch"][:1]
        assert got[pattern]["bits"] == want, (
            f"Table 3's {pattern} model no longer reproduces figures/data/table3.json at m = "
            f"{smallest}: {got[pattern]['bits']} against {want}; rerun python -m fast table3 "
            f"--force and commit it")


@pytest.mark.slow
def test_the_samples_reproduce_from_the_kept_models_token_for_token():
    """The image samples of figures/data/samples.json (``python -m fast samples``): one kept
    model draws its samples again with the same seed, thread count and pins -- the same
    weights (by digest) and the same tokens."""
    rec = committed("samples.json")
    pattern = "strided"
    got = in_child("fast.experiments.samples:replay",
                   {"folder": str(ROOT / rec["folder"]), "pattern": pattern,
                    "seed": rec["seed"]}, threads=rec["threads"])
    assert got["weights_sha256"] == rec["weights_sha256"][f"image_{pattern}"], (
        "the kept image model is not the one the samples were drawn from: rerun python -m "
        "fast samples and commit it")
    assert got["images"] == rec["images"][pattern], (
        f"the {pattern} model's samples no longer reproduce figures/data/samples.json: rerun "
        f"python -m fast samples and commit it")
