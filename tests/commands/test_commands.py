"""``python -m fast COMMAND``: every command is found, documents itself, and refuses what it
does not know in one line (Child et al., 2019, sec. 5-7: the commands train, sample and
regenerate the paper-style results)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from fast.commands.registry import COMMANDS, main, usage


def test_usage_lists_every_command():
    text = usage()
    for name in COMMANDS:
        assert f"  {name} " in text


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_main(name):
    module = importlib.import_module(COMMANDS[name][0])
    assert callable(module.main)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_answers_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code in (0, None)
    assert "usage" in capsys.readouterr().out.lower()


@pytest.mark.slow
def test_unknown_command_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "fast", "trian"], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'trian'" in lines[0] and "train" in lines[0]


def test_no_command_prints_usage(capsys):
    assert main([]) == 0
    assert "commands:" in capsys.readouterr().out
