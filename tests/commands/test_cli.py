"""fast.commands.cli: the command-line rules every ``python -m fast`` command shares -- typed
values that say what was given and what is allowed, one line and exit status 2.
(Child et al., 2019: the commands that train, sample and measure, sec. 5-7.)"""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fast.commands import cli


def rejects(parse, text, words):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse(text)
    assert repr(text) in str(err.value) and words in str(err.value), str(err.value)


def test_integer_and_its_bounds():
    p = cli.integer(1, 10)
    assert p("3") == 3 and p(" 10 ") == 10 and p("1_0") == 10
    for bad in ("0", "11", "2.5", "1e3", "", "nan", "9" * 5000):
        rejects(p, bad, "allowed: an integer in [1, 10]")
    assert cli.integer(None, None)(str(2**70)) == 2**70
    rejects(cli.integer(), str(2**31), "<= 2147483647")


def test_power_of_two_names_the_nearest():
    p = cli.power_of_two(1, 4096)
    assert [p(t) for t in ("1", "2", "1024", " 4096 ")] == [1, 2, 1024, 4096]
    rejects(p, "1500", "allowed: an integer in [1, 4096] that is a power of two (the "
                       "nearest: 1024, 2048)")
    rejects(p, "3", "(the nearest: 2, 4)")
    rejects(p, "4095", "(the nearest: 2048, 4096)")
    for bad in ("0", "8192", "-4", "2.0", "x", ""):
        rejects(p, bad, "allowed: an integer in [1, 4096] that is a power of two")
    rejects(cli.power_of_two(1, 12), "10", "power of two (the nearest: 8)")


def test_finite_numbers_only():
    p = cli.finite(0.0, 1.0, hi_open=True)
    assert p("0") == 0.0 and p("0.5") == 0.5 and p("1e-9") == 1e-9
    for bad in ("1", "-0.1", "nan", "inf", "-inf", "1e400", "x", ""):
        rejects(p, bad, "allowed: a finite number in [0.0, 1.0)")
    rejects(cli.finite(0.0, None, lo_open=True), "0", "a finite number > 0.0")
    rejects(cli.finite(), "NaN", "allowed: a finite number")


def test_boolean_choice_text_tuple_optional():
    assert [cli.boolean(t) for t in ("true", "YES", "1", "on", "False", "no", "0", "off")] \
        == [True] * 4 + [False] * 4
    rejects(cli.boolean, "maybe", "true or false")
    assert cli.choice(["a", "b"])("b") == "b"
    rejects(cli.choice(["a", "b"]), "c", "one of a, b")
    rejects(cli.text, "", "non-empty")
    rejects(cli.text, "a\nb", "control characters")
    three = cli.int_tuple(3)
    assert three("16,16,1") == three("(16, 16, 1)") == (16, 16, 1)
    for bad in ("16,16", "16,16,0", "a,b,c", "(16,16,1,)x"):
        rejects(three, bad, "3 integers")
    assert cli.int_tuple(1)("(16,)") == (16,)
    opt = cli.optional(cli.integer(1))
    assert opt("none") is None and opt("None") is None and opt("4") == 4
    rejects(opt, "0", "an integer")


def test_paths(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x")
    assert cli.existing_file(str(f)) == str(f)
    rejects(cli.existing_file, str(tmp_path / "missing"), "existing, readable file")
    rejects(cli.existing_file, str(tmp_path), "existing, readable file")
    assert cli.output_file(str(tmp_path / "new" / "out.png")) == str(tmp_path / "new" / "out.png")
    assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())
    rejects(cli.output_file, str(tmp_path), "not a folder")
    rejects(cli.output_file, str(f / "out.png"), "writable folder")
    assert cli.writable_folder(str(tmp_path / "deep" / "er")) == str(tmp_path / "deep" / "er")


def parser():
    p = cli.Parser("python -m fast demo", description="demo")
    p.add_argument("--rate", type=cli.finite(0.0, None, lo_open=True), default=1.0)
    p.add_argument("--count", type=cli.integer(1), default=1)
    p.add_argument("--flag", type=cli.boolean, nargs="?", const=True, default=False)
    return p


@pytest.mark.parametrize("argv,line", [
    (["--rate", "-1e-3"], "argument --rate: got '-1e-3'; allowed: a finite number > 0.0"),
    (["--rate", "-inf"], "argument --rate: got '-inf'; allowed: a finite number > 0.0"),
    (["--rate"], "argument --rate: needs a value"),
    (["--cout", "2"], "unknown option --cout (did you mean --count?)"),
    (["--zzz"], "unknown option --zzz (see --help)"),
    (["stray"], "unexpected argument 'stray' (see --help)"),
    (["--co", "2"], "unknown option --co"),                      # no abbreviations
])
def test_parser_errors_are_one_line_and_exit_2(argv, line, capsys):
    with pytest.raises(SystemExit) as end:
        parser().parse_or_exit(argv)
    assert end.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m fast demo: {line}") and err.count("\n") == 1


def test_parser_reads_negative_values_and_help(capsys):
    p = parser()
    assert p.parse_or_exit(["--rate", "2", "--flag"]).flag is True
    assert p.parse_or_exit(["--flag", "false", "--count", "3"]).count == 3
    with pytest.raises(SystemExit) as end:
        p.parse_or_exit(["--help"])
    assert end.value.code == 0 and "--rate" in capsys.readouterr().out
    with pytest.raises(cli.UsageError, match="got '-2'"):       # the library form raises
        p.parse_args(["--count", "-2"])


def test_fail_prints_one_line_whatever_the_message(capsys):
    with pytest.raises(SystemExit) as end:
        cli.fail("python -m fast x", "two\nlines  and   spaces")
    assert end.value.code == 2
    assert capsys.readouterr().err == "python -m fast x: two lines and spaces\n"


@given(st.lists(st.text(max_size=10), max_size=6))
def test_any_argv_parses_or_ends_with_exit_2(argv):
    try:
        parser().parse_args(argv)
    except cli.UsageError as err:
        assert "\n" not in str(err) or "\n" in "".join(argv)
    except SystemExit as end:                                # --help among them
        assert end.code == 0


def test_names_existing_path_and_writable_or_exit(tmp_path, capsys):
    steps = cli.names(["depth", "peak", "big"])
    assert steps("peak,depth,peak") == ["peak", "depth"] and steps(" big ,") == ["big"]
    for bad in ("", ",", "depth,bogus", "DEPTH"):
        rejects(steps, bad, "allowed: names from depth, peak, big, separated by commas")
    assert cli.existing_path(str(tmp_path)) == str(tmp_path)
    rejects(cli.existing_path, str(tmp_path / "gone"), "(not found); allowed: a path to an "
                                                       "existing file or folder")
    (tmp_path / "f").write_text("x")
    rejects(cli.existing_file, str(tmp_path), "(a folder); allowed: a path to an existing")
    cli.writable_or_exit("python -m fast demo", tmp_path / "made" / "here")
    assert (tmp_path / "made" / "here").is_dir()
    with pytest.raises(SystemExit) as end:
        cli.writable_or_exit("python -m fast demo", tmp_path, tmp_path / "f" / "sub")
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"python -m fast demo: output folder {tmp_path / 'f' / 'sub'} cannot "
                          f"be written (") and "; allowed: a writable folder" in err


@pytest.mark.parametrize("argv,line", [
    (["--count"], "argument --count: needs a value; allowed: --count VALUE"),
    (["--flag=yes", "--rate=1", "--count=2", "--rate"], "argument --rate: needs a value"),
    (["--zzz"], "unknown option --zzz (see --help); allowed: the options python -m fast demo "
                "--help lists"),
])
def test_argparse_own_errors_also_say_what_is_allowed(argv, line, capsys):
    with pytest.raises(SystemExit) as end:
        parser().parse_or_exit(argv)
    err = capsys.readouterr().err
    assert end.value.code == 2 and err.startswith(f"python -m fast demo: {line}")
    assert "; allowed: " in err and err.count("\n") == 1
