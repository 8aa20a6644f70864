"""What is reproducible, and to what tolerance (docs/design.md, "Reproducibility").

Child et al., 2019, section 5.4 asks that recomputation be exact; the figure
scripts (Table 2, Fig. 2) go further and promise that a run can be repeated:

* same seed, same intra-op thread count, same machine and library versions ->
  bitwise-equal weights and bits (checked here on two short trainings);
* a run stopped and resumed gives the uninterrupted run's learning curve: the
  same evaluation rows and training-loss rows, no extra row where it stopped;
* the data a result saw are named by ``Dataset.fingerprint`` (recorded in the
  figure scripts' JSON): equal data give equal fingerprints, one changed byte
  changes them.
"""

import dataclasses

import numpy as np
import pytest
import torch

from fast.data import Dataset, load
from fast.transformer.config import preset
from fast.transformer.training import train as training


@pytest.fixture(scope="module")
def digits():
    return load("digits")


def tiny(tmp_path, **kw):
    base = dict(d_model=32, n_heads=2, n_layers=2, batch_size=8, max_iters=6, warmup_iters=2,
                eval_batches=1, eval_interval=2, log_interval=2, precision="fp32",
                device="cpu", cpu_threads=1, out_dir=str(tmp_path))
    base.update(kw)
    return preset("digits", **base)


def test_same_seed_and_threads_give_bitwise_equal_weights(tmp_path, digits):
    m, t = tiny(tmp_path, save_checkpoint=False)
    a = training.train(m, t, progress=False, dataset=digits)
    b = training.train(m, t, progress=False, dataset=digits)
    sa, sb = a["model"].state_dict(), b["model"].state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a["evals"] == b["evals"] and a["history"]["loss"] == b["history"]["loss"]
    c = training.train(m, dataclasses.replace(t, seed=1), progress=False, dataset=digits)
    assert not torch.equal(c["model"].state_dict()["head.weight"], sa["head.weight"])


@pytest.mark.parametrize("stop", [3, 4])    # off and on the evaluation interval
def test_stop_and_resume_give_one_runs_learning_curve(tmp_path, digits, stop):
    m, t = tiny(tmp_path)
    full = training.train(m, dataclasses.replace(t, out_dir=str(tmp_path / "a")),
                          progress=False, dataset=digits)
    part = dataclasses.replace(t, out_dir=str(tmp_path / "b"))
    first = training.train(m, dataclasses.replace(part, stop_iter=stop), progress=False,
                           dataset=digits)
    assert first["step"] == stop and set(first["final"]) == {"val"}
    resumed = training.train(m, dataclasses.replace(part, resume=True), progress=False,
                             dataset=digits)
    assert [e["step"] for e in full["evals"]] == [2, 4, 6]
    assert resumed["evals"] == full["evals"]
    assert resumed["history"] == full["history"]
    assert full["history"]["step"] == [2, 4, 6]


def test_fingerprint_names_the_data():
    images = np.arange(48, dtype=np.uint8).reshape(3, 16)
    a = Dataset("toy", "image", 256, {"train": images, "test": images[:1]}, (4, 4, 1))
    b = Dataset("toy", "image", 256, {"train": images.copy(), "test": images[:1]}, (4, 4, 1))
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint()["train"]["shape"] == [3, 16]
    changed = images.copy()
    changed[2, 5] += 1
    c = Dataset("toy", "image", 256, {"train": changed, "test": images[:1]}, (4, 4, 1))
    assert c.fingerprint()["train"] != a.fingerprint()["train"]
    assert c.fingerprint()["test"] == a.fingerprint()["test"]
