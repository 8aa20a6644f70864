"""The peer suite of transformers' own model tests (``fast.experiments.peer_hf``).

Child et al., 2019, section 4, in other people's models (docs/design.md §12). Without the
fetched test tree: the plugin switches a model's default attention to the adapter's and
records each test's calls (a test file of our own, run by pytest in a subprocess), and the
report finds, from pytest's logs, the tests that pass with sdpa and fail with the adapter,
with the expected ones apart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fast.experiments.peer_hf import failures, report
from tests.conftest import ROOT

pytest.importorskip("transformers")

PEER_TEST = '''
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

CONFIG = dict(vocab_size=11, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1)


def test_default_attention_is_switched():
    model = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG))
    assert model.config._attn_implementation == "peer_hf_strided"
    model(torch.tensor([[1, 2, 3, 4]]), attention_mask=torch.tensor([[1, 1, 0, 1]]))


def test_a_named_attention_is_kept():
    model = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG), attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa"
    model(torch.tensor([[1, 2, 3]]))
'''


@pytest.mark.slow
def test_the_plugin_switches_the_default_and_counts_the_calls(tmp_path):
    (tmp_path / "test_peer.py").write_text(PEER_TEST)
    record = tmp_path / "record.json"
    env = {**os.environ, "PEER_HF_ATTN": "strided", "PEER_HF_RECORD": str(record),
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "fast.experiments.peer_hf_plugin", "test_peer.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 called the adapter's attention, 1 transformers' sdpa" in run.stdout
    rows = json.loads(record.read_text())["tests"]
    switched = rows["test_peer.py::test_default_attention_is_switched"]
    kept = rows["test_peer.py::test_a_named_attention_is_kept"]
    assert switched["outcome"] == kept["outcome"] == "passed"
    assert switched["attention:peer_hf_strided"] == 1 and switched["sparse_attention"] == 1
    assert switched["switched"] >= 1 and "sdpa" not in switched
    assert kept["sdpa"] == 1 and not any(k.startswith("attention:") for k in kept)


def _log(path, failed: dict) -> None:
    """A pytest log in the shape ``-rfEs`` writes: a section per failure, then the short
    summary, then the last line."""
    sections = "".join(f"\n____ ModelTest.{test}{f' [{sub}]' if sub else ''} ____\n"
                       f"    def {test}(self):\nE   {message}\nE   more\n"
                       for (test, sub), message in failed.items())
    summary = "".join(f"{'SUBFAILED[' + sub + ']' if sub else 'FAILED'} tests/m.py::ModelTest::"
                      f"{test} - x\n" for (test, sub) in failed)
    path.write_text(f"== test session starts ==\n{sections}\n== short test summary info ==\n"
                    f"{summary}== {len(failed)} failed, 3 passed in 1.00s ==\n")


def test_the_report_lists_what_passes_with_sdpa_and_fails_with_the_adapter(tmp_path):
    logs = tmp_path / "transformers" / "logs"
    logs.mkdir(parents=True)
    both = {("test_flaky", ""): "AssertionError: fails everywhere"}
    _log(logs / "llama-sdpa.log", both)
    _log(logs / "llama-full.log", {
        **both, ("test_generate", ""): "ValueError: the adapter refused it",
        ("test_capture", "LlamaModel"): "ValueError: output_attentions",
        ("test_sdpa_can_dispatch_non_composite_models", ""): "AssertionError: False is not true",
        ("test_cross", ""): "ValueError: got is_causal=False (an encoder or cross-attention)"})
    tests = ("test_flaky", "test_generate", "test_capture",
             "test_sdpa_can_dispatch_non_composite_models", "test_cross", "test_fine")
    sdpa = {f"tests/m.py::ModelTest::{t}": {"outcome": "failed" if t == "test_flaky"
                                            else "passed", "sdpa": 2} for t in tests}
    full = {f"tests/m.py::ModelTest::{t}": {"outcome": "passed", "attention:peer_hf_full": 2,
                                            "sparse_attention": 2} for t in tests}
    (logs / "llama-sdpa.json").write_text(json.dumps({"tests": sdpa}))
    (logs / "llama-full.json").write_text(json.dumps({"tests": full}))
    assert failures(logs / "llama-full.log")[("test_capture", "LlamaModel")] == \
        "ValueError: output_attentions"
    text = report(tmp_path / "transformers", modes=("full",), models=("llama",))
    print(text)
    assert "6 tests reached the adapter (12 calls of sparse_attention)" in text
    assert "full: 4 pass with sdpa but fail here (2 to fix)" in text
    fix = text.split("[2] to fix")[1].split("[1]")[0]
    assert "test_generate: ValueError: the adapter refused it" in fix
    assert "test_capture[LlamaModel]: ValueError: output_attentions" in fix
    assert "test_flaky" not in text.split("full:")[-1]          # fails with sdpa too
    assert "asserts that the default attention is sdpa" in text
    assert "test_cross: ValueError: got is_causal=False" in text.split("non-causal")[1]


def test_the_report_names_runs_that_stopped_before_their_end(tmp_path):
    """A log with no record beside it is a run that stopped early: said so, for sdpa (the
    model's other modes are then not compared) and for a mode; a run never started is not
    mentioned."""
    logs = tmp_path / "transformers" / "logs"
    logs.mkdir(parents=True)
    _log(logs / "llama-sdpa.log", {})
    _log(logs / "gpt2-sdpa.log", {})
    _log(logs / "gpt2-full.log", {})
    (logs / "gpt2-sdpa.json").write_text(json.dumps({"tests": {}}))
    text = report(tmp_path / "transformers", modes=("full", "strided"), models=("llama", "gpt2"))
    assert text.count("did not finish") == 2
    assert "llama: sdpa did not finish" in text and "  full     did not finish" in text
    assert "strided" not in text
