"""``python -m fast COMMAND`` under bad input, end to end: one line ``<command>: <what was
given>; allowed: <what is allowed>``, exit status 2, before any work and with nothing
written (Child et al., 2019, sec. 5-7: the commands that sample and measure; the rule
is ``fast.commands.cli``'s). The parsers alone are fuzzed in ``tests/commands/test_cli_fuzz.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fast.__main__ import main as fast_main
from fast.commands import sample as sampling
from fast.experiments import samples as samples_cli
from fast.transformer.config import ModelConfig
from fast.transformer.network.checkpoint import save_weights
from fast.transformer.network.model import SparseTransformer
from tests.conftest import ROOT


def python_m_fast(*argv, cwd) -> subprocess.CompletedProcess:
    """``python -m fast ARGV`` in ``cwd``, importing this checkout's code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fast", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line(err: str, command: str) -> str:
    """The single line of ``err``, checked to say what was given and what is allowed."""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"python -m fast {command}: ") and "; allowed: " in err, err
    return err


def run(argv, capsys) -> tuple[int, str]:
    """``python -m fast ARGV`` in this process: (exit status, stderr); stdout stays empty."""
    with pytest.raises(SystemExit) as end:
        fast_main(argv)
    out = capsys.readouterr()
    assert out.out == "", out.out
    return end.value.code, out.err


@pytest.fixture
def text_model(tmp_path):
    """A weights-only text model: n_ctx 40, vocab 256."""
    torch.manual_seed(0)
    model = SparseTransformer(ModelConfig(vocab_size=256, n_ctx=40, d_model=16, n_heads=2,
                                          n_layers=1, pattern="fixed", stride=8, c=2))
    return save_weights(tmp_path / "text.pt", model)


@pytest.fixture
def no_sampling(monkeypatch):
    """Sampling fails the test: every check must come before it."""
    def refuse(*a, **k):
        raise AssertionError("sampled before the command line was checked")
    monkeypatch.setattr(sampling, "sample", refuse)


@pytest.mark.slow
def test_sample_with_a_missing_checkpoint_writes_nothing(tmp_path):
    proc = python_m_fast("sample", "--checkpoint", "missing.pt", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_line(proc.stderr, "sample") == (
        "python -m fast sample: argument --checkpoint: got 'missing.pt' (not found); "
        "allowed: a path to an existing, readable file\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sample_refuses_a_corrupt_checkpoint_and_a_prompt_past_the_length(tmp_path, text_model):
    (tmp_path / "junk.pt").write_bytes(b"\x80\x04not a checkpoint at all")
    proc = python_m_fast("sample", "--checkpoint", "junk.pt", cwd=tmp_path)
    assert proc.returncode == 2 and "--checkpoint junk.pt (" in one_line(proc.stderr, "sample")
    proc = python_m_fast("sample", "--checkpoint", text_model, "--prompt", "0123456789",
                         "--length", "5", cwd=tmp_path)
    assert proc.returncode == 2
    assert "a prompt of 10 tokens with --length 5; allowed: a prompt no longer than the " \
           "length" in one_line(proc.stderr, "sample")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.pt", "text.pt"]  # no figures/


@pytest.mark.slow
@pytest.mark.parametrize("args,says", [
    (["--temperature", "1e-40"], "argument --temperature: got '1e-40'; allowed: a finite "
                                 "number >= 1e-06"),
    (["--temperature", "inf"], "argument --temperature: got 'inf'"),
    (["--top-p", "1.5"], "argument --top-p: got '1.5'; allowed: a finite number in (0.0, 1.0]"),
    (["--top-p", "0"], "argument --top-p: got '0'"),
    (["--num", str(2**63)], f"argument --num: got '{2**63}'; allowed: an integer in [1, 65536]"),
    (["--length", "41"], "--length 41; allowed: 1 .. the model's n_ctx=40"),
    (["--top-k", "257"], "--top-k 257; allowed: 1 .. the model's vocab_size=256"),
    (["--prompt", ""], "argument --prompt: got ''; allowed: a non-empty text"),
    (["--prompt", "\\x"], "argument --prompt: got '\\\\x' (its escape '\\\\x' at character 0 is "
                          "malformed); allowed: a non-empty text"),
    (["--prompt", "ab", "--prompt-file", "p.txt"], "both --prompt and --prompt-file given"),
    (["--prompt-file", "empty.txt"], "--prompt-file empty.txt is empty; allowed: a file"),
    (["--complete", "test"], "--complete/--prompt-length given to a text model; allowed:"),
    (["--out", "a_file/out.txt"], "argument --out: got 'a_file/out.txt'; allowed: a path to a "
                                  "file in a writable folder"),
    (["--out", "."], "argument --out: got '.'; allowed: a path to a file (not a folder)"),
    (["--threads", "0"], "argument --threads: got '0'; allowed: an integer in [1, 1024]"),
    (["--seed", "-1"], "argument --seed: got '-1'; allowed: an integer in [0, 2147483647]"),
    (["--data-path", "nowhere"], "argument --data-path: got 'nowhere' (not found)"),
    (["--lenght", "3"], "unknown option --lenght (did you mean --length?)"),
])
def test_sample_bad_values_end_in_one_line_before_sampling(args, says, text_model, tmp_path,
                                                            capsys, monkeypatch, no_sampling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("a file")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "p.txt").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    code, err = run(["sample", "--checkpoint", text_model, "--no-progress", *args], capsys)
    assert code == 2 and says in err, err
    if "unknown option" not in says:
        one_line(err, "sample")
    assert sorted(tmp_path.rglob("*")) == before


def test_sample_checks_its_default_output_folder_before_sampling(text_model, tmp_path, capsys,
                                                                 monkeypatch, no_sampling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "figures").write_text("a file where the folder would be")
    code, err = run(["sample", "--checkpoint", text_model, "--num", "1"], capsys)
    assert code == 2 and "--out (default) got 'figures/samples_model.txt'" in one_line(err,
                                                                                     "sample")


@pytest.mark.slow
def test_sample_complete_with_data_that_cannot_be_read(tmp_path, capsys, no_sampling):
    torch.manual_seed(0)
    image = save_weights(tmp_path / "image.pt", SparseTransformer(ModelConfig(
        vocab_size=17, n_ctx=64, d_model=16, n_heads=2, n_layers=1, pattern="strided",
        stride=8, embedding="image", image_shape=(8, 8, 1))))
    (tmp_path / "cifar").mkdir()
    (tmp_path / "cifar" / "data_batch_1").write_bytes(b"")        # an empty training file
    for dataset, path, says in [("cifar10", tmp_path / "cifar", "--dataset cifar10 could not "
                                 "be read"), ("npy_images", tmp_path, "--dataset npy_images "
                                 "could not be read")]:
        code, err = run(["sample", "--checkpoint", image, "--complete", "test", "--dataset",
                         dataset, "--data-path", str(path), "--num", "2"], capsys)
        assert code == 2 and says in one_line(err, "sample"), err
    code, err = run(["sample", "--checkpoint", image, "--complete", "test", "--dataset",
                     "digits", "--num", "2", "--prompt-length", "65"], capsys)
    assert code == 2 and "--prompt-length 65; allowed: 0 .. n_ctx=64" in one_line(err, "sample")


@pytest.mark.slow
def test_bench_refuses_an_empty_sweep_in_one_line(tmp_path):
    proc = python_m_fast("bench", "--n-min", "4096", "--n-max", "1024", "--out", "out",
                         cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--n-min 4096 with --n-max 1024; allowed: --n-min <= --n-max" in one_line(
        proc.stderr, "bench")


@pytest.mark.parametrize("argv,says", [
    (["bench", "--replot", "--out", "."], "--replot with no data/bench_cpu.json; allowed:"),
    (["bench", "--n-max", str(2**63)], "argument --n-max: got '9223372036854775808'; allowed: "
                                       "an integer in [1, 16777216]"),
    (["bench", "--quick", "--n-min", "8192"], "--n-min 8192 with --quick; allowed: --n-min <= "
                                              "4096"),
    (["bench", "--shapes", "0x4"], "argument --shapes: got '0x4'; allowed: BxH with B and H in"),
    (["bench", "--mask-gb", "nan"], "argument --mask-gb: got 'nan'; allowed: a finite number"),
    (["bench", "--out", "a_file"], "argument --out: got 'a_file'; allowed: a writable folder"),
    (["bench", "--compile", "--crossover"], "--crossover with --compile; allowed: one of them"),
    (["bench", "--compile", "--device", "cuda"], "--compile with --device cuda; allowed: "
                                                 "--compile alone, or with --quick and --out"),
    (["memory", "--steps", "depth,bogus"], "argument --steps: got 'depth,bogus' (not one: "
                                           "'bogus'); allowed: names from depth, length, peak"),
    (["memory", "--out", "bad.json", "--steps", "depth"], "--out bad.json cannot be resumed "
                                                          "from"),
    (["memory", "--out", "other.json"], "--out other.json holds other results"),
    (["memory", "--big", "--steps", "depth"], "--big with --steps; allowed: one of them"),
    (["notebooks", "a_file"], "argument notebooks: got 'a_file'; allowed: a notebook"),
    (["notebooks", "missing.ipynb", "--timeout", "10"], "got 'missing.ipynb' (not found)"),
    (["notebooks", "nb.ipynb", "--timeout", "0"], "argument --timeout: got '0'; allowed: an "
                                                  "integer in [1, 86400]"),
    (["layout-time", "--n", str(2**63)], "argument --n: got '9223372036854775808'; allowed:"),
    (["layout-time", "--block", "-1"], "argument --block: got '-1'; allowed: an integer in "
                                       "[1, 4096]"),
    (["generate", "--threads", "0"], "argument --threads: got '0'; allowed: an integer in"),
    (["samples", "--seed", "nan"], "argument --seed: got 'nan'; allowed: an integer"),
    (["samples"], "no kept image model in"),
    (["train-time", "--device", "cpu"], "--device cpu is the CPU; allowed: a GPU"),
    (["train-time", "--batch", "0"], "argument --batch: got '0'; allowed: an integer in"),
    (["train-time", "--device", "tpu"], "argument --device: got 'tpu'; allowed: the devices "
                                        "of this machine, auto, cpu"),
])
def test_measuring_commands_end_bad_input_in_one_line(argv, says, tmp_path, capsys,
                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(samples_cli, "KEPT", tmp_path / "no_models")
    (tmp_path / "a_file").write_text("a file")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"quick": true}')
    (tmp_path / "nb.ipynb").write_text("{}")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    code, err = run(argv, capsys)
    assert code == 2 and says in one_line(err, argv[0]), err
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before   # nothing written


@pytest.mark.parametrize("argv,lists", [
    (["sample", "--help"], ["--cache {sparse,dense,none}", "--complete {train,val,test}"]),
    (["memory", "--help"], ["--steps {depth,length,peak,blog,figures}[,...]", "--big"]),
    (["bench", "--help"], ["--device {cpu,cuda}"]),
])
def test_help_lists_what_each_option_allows(argv, lists, capsys):
    with pytest.raises(SystemExit) as end:
        fast_main(argv)
    out = " ".join(capsys.readouterr().out.split())        # argparse wraps long lines
    assert end.value.code == 0 and all(" ".join(w.split()) in out for w in lists), out


@pytest.mark.slow
def test_sample_never_writes_over_an_input_or_an_existing_file(text_model, tmp_path, capsys,
                                                               monkeypatch):
    """--out pointed at the checkpoint (or the prompt file) is refused, --overwrite or not;
    an existing --out is replaced only with --overwrite."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("def ")
    checkpoint = Path(text_model).read_bytes()
    for out, extra in ((text_model, []), (text_model, ["--overwrite"]),
                       ("p.txt", ["--prompt-file", "p.txt", "--overwrite"])):
        code, err = run(["sample", "--checkpoint", text_model, "--num", "1", "--out", out,
                         "--no-progress", *extra], capsys)
        assert code == 2 and "is an input of this command" in one_line(err, "sample"), err
    assert Path(text_model).read_bytes() == checkpoint and (tmp_path / "p.txt").read_text() == \
        "def "
    (tmp_path / "old.txt").write_text("keep me")
    code, err = run(["sample", "--checkpoint", text_model, "--num", "1", "--out", "old.txt"],
                    capsys)
    assert code == 2 and "--out old.txt already exists; allowed: a new path, or --overwrite" \
        in one_line(err, "sample")
    assert (tmp_path / "old.txt").read_text() == "keep me"
    assert sampling.main(["--checkpoint", text_model, "--num", "1", "--length", "5", "--out",
                          "old.txt", "--overwrite", "--no-progress"]) == 0
    assert (tmp_path / "old.txt").read_text() != "keep me" and "wrote old.txt" in \
        capsys.readouterr().out
    assert not list(tmp_path.glob(".old.txt.*"))                 # no temporary file left
    code, err = run(["sample", "--checkpoint", text_model, "--data-path", "p.txt"], capsys)
    assert code == 2 and "--dataset/--data-path given without --complete" in one_line(err,
                                                                                     "sample")


def test_sample_writes_an_out_of_the_longest_legal_name(text_model, tmp_path, capsys,
                                                       monkeypatch):
    """--out with a 255-byte name (the longest most file systems take) is written. Before:
    every sample was drawn, then an OSError traceback on the temporary file's name (the
    name and 20 bytes more), and nothing written. A name past the limit is one line,
    before any sampling."""
    monkeypatch.chdir(tmp_path)
    name = "s" * 251 + ".txt"
    assert sampling.main(["--checkpoint", text_model, "--num", "1", "--length", "5", "--out",
                          name, "--no-progress"]) == 0
    assert (tmp_path / name).is_file() and len(list(tmp_path.iterdir())) == 2
    assert f"wrote {name}" in capsys.readouterr().out
    monkeypatch.setattr(sampling, "sample", lambda *a, **k: pytest.fail("sampled first"))
    code, err = run(["sample", "--checkpoint", text_model, "--out", "s" + name], capsys)
    assert code == 2 and "a file name of at most 255 bytes (this one has 256)" in \
        one_line(err, "sample"), err


def test_many_samples_are_drawn_in_bounded_batches(monkeypatch):
    """--num 65536 (the most the command takes) on a photos32-sized model is decoded in
    batches that keep at most BATCH_BYTES of keys and values, not all at once; a
    batch_size given is kept."""
    from fast.transformer.config import preset
    from fast.transformer.decoding import request

    cfg, _ = preset("photos32")
    req = request.check_request(cfg, 65536, None, None, 1.0, None, None, "fp32", None, True,
                                None)
    per_sequence = cfg.n_layers * (cfg.n_ctx + 1) * (cfg.qk_dim + cfg.d_model) * 4
    print("sequences per batch:", req["batch_size"])
    assert req["batch_size"] == request.BATCH_BYTES // per_sequence < 65536
    assert req["batch_size"] * per_sequence <= request.BATCH_BYTES
    assert request.check_request(cfg, 65536, None, None, 1.0, None, None, "fp32", None, True,
                                 65536)["batch_size"] == 65536
    assert request.check_request(cfg, 8, None, None, 1.0, None, None, "fp32", None, True,
                                 None)["batch_size"] == 8                # few: all together
