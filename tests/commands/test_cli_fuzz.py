"""Every ``python -m fast`` command line, fuzzed: it parses, or it ends with one line and
exit status 2 -- never a traceback (Child et al., 2019, sec. 5-7: the commands that
train, sample and regenerate the results; the rule is ``fast.commands.cli``'s).

Each command of ``fast.__main__.COMMANDS`` is reached through its module's
``parser()`` (a command without one fails here). Command lines are built from the
parser's own option strings, with values drawn from numbers, nan, inf, -1, 2**63,
empty and unicode texts and paths that do not exist or cannot be written. Every
outcome is counted; the count per command is printed (``pytest -s``), and
``HYPOTHESIS_PROFILE=thorough`` tries 12x more (the ci profile: 300 per command).
The parsers run in a scratch folder: a path they accept as an output is made there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fast.commands import cli
from fast.commands.registry import COMMANDS

SCRATCH_FILE = "a_file"          # made in the scratch folder: "a_file/out.png" is unwritable
NOTEBOOK = "nb.ipynb"            # made there too
GOOD = {"checkpoint": SCRATCH_FILE, "notebooks": NOTEBOOK,  # a value the required ones accept
        "action": "report", "tree": "peer"}
VALUES = st.one_of(
    st.sampled_from([
        "nan", "inf", "-inf", "NaN", "1e400", "-1e400", "-1", "0", "1", "2", "3", "0.5", "1e-40",
        "1e-3", "64", "1024", "4096", "2147483648", str(2**63), str(-2**63), str(2**64),
        "", " ", "none", "true", "false", "x", "é", "☃", "\u202e", "1,2", "depth,peak",
        "depth,bogus", "4x16", "0x4", "cpu", "cuda", "cuda:7", "auto", "fp16", "fp8",
        "sparse", "dense", "test", "digits", "strided", "fixed", "full", "enwik8", "float32",
        "missing.pt", "missing.ipynb", "no/such/folder/file.json", f"{SCRATCH_FILE}/out.png",
        SCRATCH_FILE, ".", "out/x.png", "out", "notebooks/01_patterns.ipynb", "\\x", "\\n",
        "--", "-", "-x", "=", "--=1"]),
    st.integers(-2**70, 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(blacklist_characters="/\x00"), max_size=12),
)
COUNTS: dict[str, Counter] = {}


def options(p: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``p`` but help (asked for in ``test_commands``)."""
    return [s for a in p._actions for s in a.option_strings if s not in ("-h", "--help")]


def outcome(p: cli.Parser, argv: list[str]) -> str:
    """"parsed"; "refused" when the parser ended with exactly one line on stderr and
    exit status 2; "help" for --help (exit 0, usage on stdout); any other exception, or
    another ending, fails the test."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            p.parse_or_exit(argv)
    except SystemExit as end:
        text = err.getvalue()
        if end.code == 0:                                   # -h among random texts: help
            assert out.getvalue().startswith("usage:") and text == "", (argv, text)
            assert any(a.startswith("-h") or a == "--help" for a in argv), argv
            return "help"
        assert end.code == 2, (argv, end.code, text)
        assert text.startswith(f"{p.prog}: ") and text.count("\n") == 1, (argv, text)
        assert "; allowed: " in text, (argv, text)           # what was given; what is allowed
        assert text.strip() and out.getvalue() == "", (argv, text)
        return "refused"
    assert err.getvalue() == "" and out.getvalue() == "", argv
    return "parsed"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder to parse in (paths accepted as outputs are made here), with a file in it."""
    folder = tmp_path_factory.mktemp("argv")
    (folder / SCRATCH_FILE).write_text("a file, not a folder")
    (folder / NOTEBOOK).write_text("{}")
    before = os.getcwd()
    os.chdir(folder)
    yield folder
    os.chdir(before)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMMANDS))
def test_fuzzed_command_lines_parse_or_end_in_one_line(name, scratch):
    module = COMMANDS[name][0]
    assert callable(getattr(importlib.import_module(module), "parser", None)), \
        f"{module} has no parser(): every command parses with fast.commands.cli.Parser"
    p = importlib.import_module(module).parser()
    assert isinstance(p, cli.Parser), f"{module}.parser() is not a fast.commands.cli.Parser"
    flags = options(p)
    token = st.one_of(st.sampled_from(flags), VALUES) if flags else VALUES
    pair = st.tuples(st.sampled_from(flags), VALUES).map(list) if flags else VALUES.map(
        lambda v: [v])
    required = [a for a in p._actions if a.required]          # filled in half the time
    assert all(a.dest in GOOD for a in required), f"{name}: add a value to GOOD"
    prefix = [v for a in required for v in [*a.option_strings[:1], GOOD[a.dest]]]
    counts = COUNTS.setdefault(name, Counter())

    @settings(max_examples=12 * settings.default.max_examples,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(st.one_of(st.lists(token, max_size=8),
                     st.lists(pair, max_size=5).map(lambda ps: [a for q in ps for a in q]),
                     st.lists(pair, max_size=4).map(lambda ps: [f"{q[0]}={q[-1]}" for q in ps
                                                                if len(q) == 2])),
           st.booleans())
    def fuzz(argv, fill):
        counts[outcome(p, prefix + argv if fill else argv)] += 1

    fuzz()
    tried = sum(counts.values())
    print(f"\n{name:12} {tried:6} command lines: {counts['parsed']:6} parsed, "
          f"{counts['refused']:6} refused in one line (exit 2), {counts['help']} help, "
          f"0 tracebacks")
    assert tried >= settings.default.max_examples and counts["refused"] > 0


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_value_is_read_by_a_value_parser_that_says_given_and_allowed(name, scratch):
    """No option takes a raw string, int or float (``nan`` read as a number, a path
    never checked): each value goes through a value parser, and a refused value's
    message holds the value given and what is allowed."""
    for action in importlib.import_module(COMMANDS[name][0]).parser()._actions:
        if action.nargs == 0 or action.option_strings == ["-h", "--help"]:
            continue                                           # flags take no value
        where = f"{name} {'/'.join(action.option_strings) or action.dest}"
        assert action.type not in (None, int, float, str, Path), \
            f"{where}: a value parser of fast.commands.cli, not {action.type}"
        for bad in ("nan", "-inf", str(2**63), "-1", "", "☃", "no/such/file.pt"):
            try:
                action.type(bad)
            except argparse.ArgumentTypeError as err:
                assert repr(bad) in str(err) and "allowed: " in str(err), (where, str(err))
