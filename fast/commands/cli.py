"""The argparse toolkit of every ``python -m fast`` command: typed values, one-line errors.

Child et al., 2019: the commands train the network (sec. 5-6), sample from it and
regenerate the results of sec. 7. Whatever the command, a bad value ends the same way:
ONE line on stderr, ``<command>: <what was given>; allowed: <what is allowed>``, and
exit status 2 (argparse's convention for usage errors), never a traceback; ``--help``
works everywhere. Written once here:

* ``Parser(prog, description)`` -- an ``argparse.ArgumentParser`` whose errors are
  ``UsageError``s said plainly (an unknown option names the closest ones), ended as
  the one line by ``parse_or_exit``; no abbreviated options; a value that starts
  with "-" (``--lr -1e-3``, ``--beta1 -inf``) is read as a value, so that the value's
  own check can say what is wrong with it;
* value parsers for ``type=``: ``integer``, ``power_of_two``, ``finite``, ``boolean``,
  ``choice``, ``names`` (a comma list of choices), ``text``, ``words`` (arguments for
  another program), ``int_tuple``, ``optional`` (``none``
  -> None), ``device`` (a device of this machine), and for paths ``existing_file``,
  ``existing_path``, ``writable_folder`` and ``output_file`` (its folder exists or can
  be made, and is writable), each with bounds where it takes them;
  ``writable_or_exit`` checks a command's output folders before its work;
* ``UsageError`` -- a ValueError a command raises for a bad combination of its own
  options; printed as the one line, exit status 2 (``fail``). The library below
  raises plain ValueError / TypeError with the same "given; allowed" words, and a
  command turns those into the one line too, around the call that checks its input.

The bounds of a configuration's fields live with the configuration (for ``train``:
``fast.transformer.config``); these parsers check only what a value must be to be
read at all (an integer, a finite number, ...), so each rule is written once.
Integers are bounded by ``reference.params.MAX_INT`` (2**31 - 1) unless told otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import shlex
import sys
from pathlib import Path

import torch

from fast.core.files import check_writable
from fast.transformer.config import DEVICE
from fast.transformer.network.devices import resolve_device
from reference.params import MAX_INT

EXIT_USAGE = 2
MAX_SEQUENCE = 2**24    # the longest n a measuring command takes (its longest sweep: 2**20)


class UsageError(ValueError):
    """Bad input found before any work was done: printed as one line, exit status 2."""


def about(doc: str) -> str:
    """What a command does, for its ``--help``: the first line of its module's docstring,
    after "``python -m fast NAME``: "."""
    return doc.strip().splitlines()[0].split(": ", 1)[-1]


def fail(prog: str, message: str) -> None:
    """End the command: ``prog: message`` on one line of stderr, exit status 2."""
    line = " ".join(str(message).split())         # one line, whatever the message held
    sys.stderr.write(f"{prog}: {line}\n")
    raise SystemExit(EXIT_USAGE)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), no abbreviations, and values that start
    with "-" read as values."""

    def __init__(self, prog: str, description: str = "", **kw):
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=prog, description=description, allow_abbrev=False, **kw)

    def error(self, message: str):
        """Raise UsageError with argparse's message, said plainly (``parse_or_exit``
        turns it into the one line and exit status 2)."""
        if message.startswith("unrecognized arguments"):
            given = message.split(":", 1)[1].split()
            options = [a.split("=")[0] for a in given if a.startswith("-")]
            known = [next(s for s in a.option_strings if s.startswith("--"))
                     for a in self._actions if any(s.startswith("--") for s in a.option_strings)]
            near = list(dict.fromkeys(m for g in options                 # best first
                                      for m in difflib.get_close_matches(g, known, 3, 0.75)))
            message = (f"unknown option {' '.join(options)}" if options
                       else f"unexpected argument {' '.join(given)!r}")
            message += f" (did you mean {', '.join(near)}?)" if near else " (see --help)"
            message += f"; allowed: the options {self.prog} --help lists"
        message = re.sub(r"^argument (\S+): expected (one|at least one) argument$",
                         lambda m: f"argument {m[1]}: needs a value; allowed: {m[1]} VALUE"
                                   + (" [VALUE ...]" if m[2] != "one" else ""), message)
        message = re.sub(r"^argument (\S+): ignored explicit argument (.*)$",
                         r"argument \1: got \2; allowed: \1 alone (it takes no value)", message)
        message = re.sub(r"^the following arguments are required: (.*)$",
                         r"\1 not given; allowed: a command line that gives \1", message)
        if "; allowed: " not in message:                # argparse's own words, said the same way
            message += f"; allowed: what {self.prog} --help lists"
        raise UsageError(message)

    def add_argument(self, *args, **kw):
        """argparse's, and a ``choice``/``names`` value lists its options in --help."""
        options = getattr(kw.get("type"), "options", None)
        if options and "metavar" not in kw and args and args[0].startswith("-"):
            kw["metavar"] = "{" + ",".join(options) + "}" + getattr(kw["type"], "more", "")
        return super().add_argument(*args, **kw)

    def parse_args(self, args=None, namespace=None):
        return super().parse_args(self.join_values(args), namespace)

    def parse_or_exit(self, args=None, namespace=None):
        """``parse_args``, ending the command with the one-line error on bad input."""
        try:
            return self.parse_args(args, namespace)
        except UsageError as err:
            fail(self.prog, err)

    def join_values(self, args) -> list[str]:
        """``--opt -x`` -> ``--opt=-x`` when ``-x`` is not an option of this parser."""
        args = list(sys.argv[1:] if args is None else args)
        out: list[str] = []
        for a in args:
            if (out and a.startswith("-") and not a.startswith("--") and len(a) > 1
                    and a not in self._option_string_actions and out[-1].startswith("--")
                    and "=" not in out[-1]):
                out[-1] = f"{out[-1]}={a}"
            else:
                out.append(a)
        return out


# ----------------------------------------------------------------------------
# Value parsers (argparse ``type=``): each raises ArgumentTypeError saying what
# was given and what is allowed; argparse prefixes the option's name.
# ----------------------------------------------------------------------------

def _bad(text, allowed: str):
    return argparse.ArgumentTypeError(f"got {text!r}; allowed: {allowed}")


def _range(lo, hi, lo_open=False, hi_open=False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi}"
    return ""


def integer(lo: int | None = None, hi: int | None = MAX_INT):
    """An integer literal (``12``, ``-3``, ``1_000``) in [lo, hi] (hi: 2**31 - 1)."""
    allowed = f"an integer {_range(lo, hi)}".rstrip()

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise _bad(text, allowed) from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise _bad(text, allowed)
        return value

    parse.__name__ = "integer"
    return parse


def power_of_two(lo: int = 1, hi: int = MAX_INT):
    """An integer in [lo, hi] that is a power of two (1, 2, 4, ...); a value that is not
    names the nearest powers of two."""
    allowed = f"an integer {_range(lo, hi)} that is a power of two"
    one = integer(lo, hi)

    def parse(text: str) -> int:
        try:
            value = one(text)
        except argparse.ArgumentTypeError:
            raise _bad(text, allowed) from None
        if value & (value - 1):
            below = 1 << (value.bit_length() - 1)
            near = ", ".join(str(p) for p in (below, 2 * below) if lo <= p <= hi)
            raise _bad(text, allowed + (f" (the nearest: {near})" if near else ""))
        return value

    parse.__name__ = "power of two"
    return parse


def finite(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False):
    """A finite real number (no nan, no inf) within the bounds given."""
    allowed = f"a finite number {_range(lo, hi, lo_open, hi_open)}".rstrip()

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _bad(text, allowed) from None
        if (not math.isfinite(value)
                or (lo is not None and (value <= lo if lo_open else value < lo))
                or (hi is not None and (value >= hi if hi_open else value > hi))):
            raise _bad(text, allowed)
        return value

    parse.__name__ = "number"
    return parse


TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def boolean(text: str) -> bool:
    """true/false (also yes/no, 1/0, on/off), any case."""
    low = text.strip().lower()
    if low in TRUE or low in FALSE:
        return low in TRUE
    raise _bad(text, "true or false")


def choice(options):
    """One of ``options`` (strings), exactly."""
    options = tuple(options)

    def parse(text: str) -> str:
        if text not in options:
            raise _bad(text, f"one of {', '.join(options)}")
        return text

    parse.__name__, parse.options = "choice", options
    return parse


def names(options):
    """A comma list of names, each one of ``options`` (``depth,peak``) -> a list, in
    the order given, without repeats; at least one."""
    options = tuple(options)

    def parse(value: str) -> list[str]:
        given = [s.strip() for s in value.split(",") if s.strip()]
        unknown = [g for g in given if g not in options]
        if not given or unknown:
            said = f" (not one: {', '.join(map(repr, unknown))})" if unknown else ""
            raise argparse.ArgumentTypeError(
                f"got {value!r}{said}; allowed: names from {', '.join(options)}, "
                f"separated by commas")
        return list(dict.fromkeys(given))

    parse.__name__, parse.options, parse.more = "names", options, "[,...]"
    return parse


def text(value: str) -> str:
    """A non-empty string without control characters."""
    if not value or any(ord(ch) < 32 for ch in value):
        raise _bad(value, "a non-empty text without control characters")
    return value


def words(value: str) -> list[str]:
    """Arguments passed on to another program (``-x -k 'strided and fused'``), split as
    a POSIX shell splits them; at least one."""
    try:
        out = shlex.split(value)
    except ValueError:                      # an unclosed quote
        out = []
    if not out:
        raise _bad(value, "arguments split as a shell splits them, e.g. '-x -k strided'")
    return out


def int_tuple(length: int, lo: int = 1, hi: int = MAX_INT):
    """``length`` integers in [lo, hi], as ``16,16,1`` or ``(16, 16, 1)``."""
    allowed = f"{length} integers in [{lo}, {hi}] separated by commas, e.g. " \
              f"{','.join(['16'] * length)}"
    one = integer(lo, hi)

    def parse(value: str) -> tuple[int, ...]:
        inner = value.strip()
        if inner[:1] == "(" and inner[-1:] == ")":
            inner = inner[1:-1]
        items = [s for s in inner.split(",")]
        if items and not items[-1].strip():
            items = items[:-1]                  # a trailing comma, as in "(16,)"
        if len(items) != length:
            raise _bad(value, allowed)
        try:
            return tuple(one(s) for s in items)
        except argparse.ArgumentTypeError:
            raise _bad(value, allowed) from None

    parse.__name__ = "int_tuple"
    return parse


def optional(parse):
    """``none`` (any case) -> None, anything else through ``parse``."""

    def parse_optional(value: str):
        return None if value.strip().lower() == "none" else parse(value)

    parse_optional.__name__ = f"optional {parse.__name__}"
    return parse_optional


def existing_file(value: str) -> str:
    """A path to a file that exists and can be read."""
    path = Path(value)
    why = ("not found" if not value or not path.exists() else "a folder" if path.is_dir()
           else "not a regular file" if not path.is_file()
           else "not readable" if not os.access(path, os.R_OK) else "")
    if why:
        raise argparse.ArgumentTypeError(f"got {value!r} ({why}); allowed: a path to an "
                                         f"existing, readable file")
    return value


def existing_path(value: str) -> str:
    """A path to a file or folder that exists (a data set given as either)."""
    if not value or not Path(value).exists():
        raise argparse.ArgumentTypeError(f"got {value!r} (not found); allowed: a path to an "
                                         f"existing file or folder")
    return value


def output_file(value: str) -> str:
    """A path a file can be written to: its folder exists (or can be made) and is
    writable, the path is not a folder, and its name fits the folder's file system
    (255 bytes on most). Checked before any work is done."""
    path = Path(value)
    longest = _name_max(path.parent)
    if len(os.fsencode(path.name)) > longest:
        raise _bad(value, f"a file name of at most {longest} bytes (this one has "
                          f"{len(os.fsencode(path.name))})")
    if not value or path.is_dir():
        raise _bad(value, "a path to a file (not a folder) in a writable folder")
    try:
        check_writable(path.parent)
    except OSError as err:
        raise _bad(value, f"a path to a file in a writable folder ({path.parent}: "
                          f"{err.strerror or err})") from None
    return value


def _name_max(folder: Path) -> int:
    """The longest file name ``folder``'s file system takes, in bytes (255 where it does
    not say, or the folder is not there yet)."""
    for where in (folder, *folder.parents):
        try:
            return os.pathconf(where if str(where) else ".", "PC_NAME_MAX")
        except (OSError, ValueError, AttributeError):
            continue
    return 255


def writable_folder(value: str) -> str:
    """A folder that exists or can be made, and in which a file can be created."""
    try:
        check_writable(Path(value))
    except OSError as err:
        raise _bad(value, f"a writable folder ({err.strerror or err})") from None
    return value


def writable_or_exit(prog: str, *folders) -> None:
    """Before any work: every folder a command will write into exists (or is made) and
    takes a file; else the one line and exit status 2."""
    for folder in folders:
        try:
            check_writable(Path(folder))
        except OSError as err:
            fail(prog, f"output folder {folder} cannot be written ({err.strerror or err}); "
                       f"allowed: a writable folder (see --help for the option that moves it)")

def device(text: str) -> str:
    """``--device``: auto, cpu, cuda or cuda:N, and present on this machine."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = ["auto", "cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(count)] if count else [])
    try:
        if DEVICE.fullmatch(text):
            resolve_device(text)
            return text
    except (ValueError, RuntimeError):
        pass
    raise argparse.ArgumentTypeError(f"got {text!r}; allowed: the devices of this machine, "
                                     f"{', '.join(here)}")
