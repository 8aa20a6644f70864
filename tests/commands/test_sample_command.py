"""``python -m fast sample``: completes images and continues text from a checkpoint,
escapes prompts, and ends a bad value with one line and exit status 2 (Child et al., 2019,
sec. 7: samples and completions)."""

from __future__ import annotations

import argparse

import matplotlib.image
import pytest
import torch

from fast.__main__ import main as fast_main
from fast.commands import sample as sample_command
from fast.transformer.config import ModelConfig
from fast.transformer.network.checkpoint import save_weights
from fast.transformer.network.model import SparseTransformer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def checkpoints(tmp_path):
    """A weights-only digits image model (8x8, 17 levels) and a text model."""
    torch.manual_seed(0)
    image = SparseTransformer(ModelConfig(vocab_size=17, n_ctx=64, d_model=16, n_heads=2,
                                          n_layers=1, pattern="strided", stride=8,
                                          embedding="image", image_shape=(8, 8, 1)))
    text = SparseTransformer(ModelConfig(vocab_size=256, n_ctx=40, d_model=16, n_heads=2,
                                         n_layers=1, pattern="fixed", stride=8, c=2))
    return (save_weights(tmp_path / "image.pt", image), save_weights(tmp_path / "text.pt", text))


def test_cli_completes_images_and_continues_text(checkpoints, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["python -m fast sample"])
    image, text = checkpoints
    png = tmp_path / "done.png"
    code, out, _ = run_cli(["--checkpoint", image, "--num", "3", "--complete", "test",
                            "--dataset", "digits", "--out", str(png), "--no-progress",
                            "--top-k", "5"], capsys)
    assert code == 0 and "tokens/s" in out and f"wrote {png}" in out
    grid = matplotlib.image.imread(png)
    scale = grid.shape[0] // (2 * 9 + 1)                   # held-out row + completion row
    assert grid.shape[:2] == (scale * (2 * 9 + 1), scale * (3 * 9 + 1))
    txt = tmp_path / "s.txt"
    code, out, _ = run_cli(["--checkpoint", text, "--num", "2", "--length", "30", "--prompt",
                            "def f():\\n", "--out", str(txt), "--no-progress", "--cache",
                            "dense", "--top-p", "0.9"], capsys)
    assert code == 0
    samples = txt.read_text(encoding="utf-8").split("\n\n----\n\n")
    assert len(samples) == 2 and all(s.startswith("def f():\n") for s in samples)


@pytest.mark.parametrize("args,message", [
    (["--temperature", "0"], r"argument --temperature: got '0'; allowed: a finite number >= 1e-06"),
    (["--temperature", "1e-40"], r"--temperature: got '1e-40'; allowed: a finite number >= 1e-06"),
    (["--temperature", "nan"], r"--temperature: got 'nan'; allowed: a finite number"),
    (["--top-p", "2"], r"--top-p: got '2'; allowed: a finite number in \(0.0, 1.0\]"),
    (["--top-p", "0"], r"--top-p: got '0'; allowed: a finite number in \(0.0, 1.0\]"),
    (["--top-k", "0"], r"--top-k: got '0'; allowed: an integer in \[1, "),
    (["--top-k", "300"], r"--top-k 300; allowed: 1 .. the model's vocab_size=17"),
    (["--length", "10"], r"--length 10; allowed: exactly the model's n_ctx=64 \(image samples"),
    (["--length", "65"], r"--length 65; allowed: exactly the model's n_ctx=64"),
    (["--prompt", "abc"], "given to an image model; allowed: --complete SPLIT"),
    (["--complete", "test"], "stores no training config; allowed: --dataset one of"),
    (["--num", "x"], "argument --num: got 'x'; allowed: an integer in"),
    (["--num", str(2**63)], "argument --num: got '9223372036854775808'; allowed: an integer"),
    (["--cache", "paged"], "argument --cache: got 'paged'; allowed: one of sparse, dense, none"),
    (["--engine", "jax"], "argument --engine: got 'jax'; allowed: one of auto, numba, torch"),
    (["--device", "tpu"], "argument --device: got 'tpu'; allowed: the devices of this machine"),
])
def test_cli_bad_values_exit_2_with_one_line(checkpoints, args, message, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["python -m fast sample"])
    code, out, err = run_cli(["--checkpoint", checkpoints[0], "--no-progress", *args], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m fast sample: ")
    assert "; allowed: " in lines[0] and err.count("\n") == 1
    assert __import__("re").search(message, lines[0]), lines[0]


def test_cli_help_and_missing_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["python -m fast sample"])
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0 and "--top-p" in out and "--complete" in out and "--cache" in out
    code, _, err = run_cli(["--checkpoint", str(tmp_path / "none.pt")], capsys)
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["--checkpoint", str(tmp_path / "none.pt"), "--prompt-file",
                            str(tmp_path)], capsys)
    assert code == 2
    (tmp_path / "notes.pt").write_text("not a checkpoint\n")  # says what is allowed, once
    code, _, err = run_cli(["--checkpoint", str(tmp_path / "notes.pt")], capsys)
    assert code == 2 and "not a checkpoint archive" in err and err.count("allowed:") == 1


@pytest.mark.parametrize("prompt,said", [
    ("abc\\x4", "got 'abc\\\\x4' (its escape '\\\\x4' at character 3 is malformed); allowed: a "
                "non-empty text (backslash escapes such as \\n, \\x41 understood; \\x takes two "
                "hex digits"),
    ("é\\xzz!", "(its escape '\\\\xzz' at character 1 is malformed)"),     # characters, not bytes
    ("abc\\", "got 'abc\\\\' (it ends in a backslash that escapes nothing); allowed: a "
              "non-empty text"),
    ("\ud800", "got '\\ud800' (not encodable as UTF-8); allowed: a non-empty text"),
    ("", "got ''; allowed: a non-empty text"),
])
def test_a_bad_prompt_names_its_bad_escape(prompt, said, checkpoints, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["python -m fast sample"])
    with pytest.raises(argparse.ArgumentTypeError) as err:
        sample_command.prompt_bytes(prompt)
    assert said in str(err.value), err.value
    code, out, err = run_cli(["--checkpoint", checkpoints[1], "--no-progress", "--prompt",
                              prompt], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("python -m fast sample: argument --prompt: got ") and said in err, err
    assert sample_command.prompt_bytes("a\\x41\\n\\j") == b"aA\n\\j"  # good escapes decode


def test_text_prompt_escapes(checkpoints, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["python -m fast sample"])
    (tmp_path / "p.bin").write_bytes(b"\x00\xffab")
    code, _, _ = run_cli(["--checkpoint", checkpoints[1], "--num", "1", "--length", "8",
                          "--prompt-file", str(tmp_path / "p.bin"), "--out",
                          str(tmp_path / "p.txt"), "--no-progress"], capsys)
    assert code == 0
    assert sample_command.COMMAND == "python -m fast sample"


def run_cli(args, capsys) -> tuple[int, str, str]:
    try:
        code = fast_main(["sample", *args])
    except SystemExit as stop:                             # argparse's own exits
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err
