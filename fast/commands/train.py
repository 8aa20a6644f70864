"""``python -m fast train``: options, help text, the run, the closing summary.

Child et al., 2019, sections 5-7: the options are the fields of the network
(``ModelConfig``, sec. 5.1-5.6) and of its training (``TrainConfig``, sec. 6),
starting from a named preset (the paper's models of sec. 7 / Table 1 among them).

    python -m fast train --preset quick
    python -m fast train --preset quick_text --n_layers 2 --max_iters 100
    python -m fast train --preset quick --resume          # continue runs/quick/ckpt.pt
    python -m fast train --preset quick --overwrite       # start again over runs/quick/ckpt.pt
    torchrun --nproc_per_node=2 -m fast train --preset quick   # DDP (gloo CPU / nccl CUDA)

Every ModelConfig and TrainConfig field is an option ``--field value`` (or
``--field-name value``). How a value is read follows the field's type
(``fast.commands.cli``): integers, finite numbers (no nan, no inf), true/false (a bool
option alone, ``--resume``, means true), ``none`` for an optional field,
``16,16,1`` for image_shape and ``val,test`` for eval_splits. The allowed ranges are
the configuration's own checks (``fast.transformer.config``). Any bad value ends the
command with one line saying what was given and what is allowed, exit status 2.
Before the first step everything that can be known is checked
(``fast.transformer.training.preflight.check_run``): a bad run is one line, exit
status 2, and so is an out_dir another run holds; a resume with another CPU thread
count runs, and says in one line that its weights will match an uninterrupted run
only to float rounding. A run that stops early says why
in one line: a NaN or inf in the loss or weights, or a checkpoint that cannot be
written (a full disk), exit status 1, the last good checkpoint intact; SIGTERM or
Ctrl-C, after saving the step it was on, exit status 143 or 130 (``main``). The loop
itself is ``fast.transformer.training.train``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import warnings

from fast.commands import cli
from fast.data.dataset import LOCAL, TEXT
from fast.transformer.config import PRESETS, ModelConfig, TrainConfig, preset
from fast.transformer.network.checkpoint import CheckpointWriteError
from fast.transformer.training.optim import ScheduleWarning
from fast.transformer.training.output import OutputRefused
from fast.transformer.training.preflight import check_run
from fast.transformer.training.resume import ResumeWarning
from fast.transformer.training.stop import RunStopped
from fast.transformer.training.train import train

COMMAND = "python -m fast train"

# How each field type is read (the dataclasses' annotations, as written).
READERS = {
    "int": cli.integer(None, None),             # the range: the config's checks
    "int | None": cli.optional(cli.integer(None, None)),
    "float": cli.finite(),
    "str": cli.text,
    "str | None": cli.optional(cli.text),
    "bool": cli.boolean,
    "tuple[int, int, int] | None": cli.optional(cli.int_tuple(3)),
    "tuple[str, ...]": cli.text,                # "val,test": TrainConfig splits it
}
METAVARS = {"int": "INT", "int | None": "INT|none", "float": "NUMBER", "str": "TEXT",
            "str | None": "TEXT|none", "bool": "BOOL", "tuple[int, int, int] | None": "H,W,C|none",
            "tuple[str, ...]": "A,B"}


def fields() -> list[dataclasses.Field]:
    """The options: every ModelConfig field, then every TrainConfig field."""
    return list(dataclasses.fields(ModelConfig)) + list(dataclasses.fields(TrainConfig))


def parser() -> cli.Parser:
    """The argparse parser of ``python -m fast train``; --help lists every field with
    its value in the "quick" preset."""
    model_cfg, train_cfg = preset("quick")
    p = cli.Parser(COMMAND, description="\n".join([
        "Train a Sparse Transformer (Child et al., 2019). Every ModelConfig and",
        "TrainConfig field is an option (fast/transformer/config.py documents each);",
        "a preset gives the others.",
        "",
        f"presets: {', '.join(sorted(PRESETS))} (default: quick)",
        "",
        "  torchrun --nproc_per_node=N -m fast train ...   (data parallel)"]),
        argument_default=argparse.SUPPRESS)
    p.add_argument("--preset", default="quick", type=cli.choice(sorted(PRESETS)),
                   help="the named configuration the options change (default: quick)")
    for f in fields():
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        value = getattr(model_cfg if f.name in ModelConfig.__dataclass_fields__ else train_cfg,
                        f.name)
        extra = dict(nargs="?", const=True) if f.type == "bool" else {}
        p.add_argument(*names, dest=f.name, type=READERS[f.type],
                       metavar=METAVARS[f.type],
                       help=f"quick preset: {value!r}", **extra)
    return p


def parse_args(argv: list[str]) -> tuple[str, dict]:
    """``--preset NAME --field value ...`` -> (preset name, overrides); a bad option or
    value raises ``fast.commands.cli.UsageError`` (a ValueError) saying what and why."""
    ns = vars(parser().parse_args(argv))
    return ns.pop("preset", "quick"), ns


def configs(argv: list[str]) -> tuple[str, ModelConfig, TrainConfig]:
    """(preset name, ModelConfig, TrainConfig) of a command line, every field checked;
    on bad input, one line on stderr and exit status 2."""
    try:
        name, overrides = parse_args(argv)
        model_cfg, train_cfg = preset(name, **overrides)
        _check_preset_data_fields(name, overrides, train_cfg)
        return name, model_cfg, train_cfg
    except ValueError as err:                  # UsageError, or a config's own check
        cli.fail(COMMAND, err)


def _check_preset_data_fields(name: str, overrides: dict, train_cfg: TrainConfig) -> None:
    """A data option that the preset set and that another --dataset does not read is
    refused here, naming the preset, rather than later as if it had been given (the
    loader refuses it too: ``fast.data.load``)."""
    dataset = train_cfg.dataset
    unread = {"data_max_bytes": dataset not in TEXT, "data_path": dataset not in LOCAL}
    for field, refused in unread.items():
        if refused and getattr(train_cfg, field) is not None and field not in overrides:
            raise cli.UsageError(
                f"preset {name!r} sets {field}={getattr(train_cfg, field)!r}, which dataset "
                f"{dataset!r} does not read; allowed: --{field} none with --dataset "
                f"{dataset}, or a preset for it")


def summary(name: str, result: dict) -> str:
    """The one line printed when a run ends (``result`` is what ``train`` returned)."""
    finals = ", ".join(f"{s} {v:.4f} {result['unit']}" for s, v in result["final"].items())
    ckpt = f"; checkpoint {result['checkpoint']}" if result["checkpoint"] else ""
    speed = (f"{result['time_per_iter'] * 1000:.1f} ms/iter"
             if result["time_per_iter"] is not None else "no step taken in this run")
    return (f"preset {name}: {result['n_params']:,} parameters, {result['step']} steps on "
            f"{result['device']} ({result['precision']}), {speed}; {finals}{ckpt}")


def main(argv: list[str] | None = None) -> dict:
    """``python -m fast train [--preset NAME] [--field value ...]``: train, print one line.
    How it ends, each time with one line on stderr and no traceback: bad input or a
    run refused before its first step (out_dir held by another run, a checkpoint in
    the way), exit status 2; a run stopped on a NaN or inf, or on a checkpoint that
    cannot be written, exit status 1 (the last checkpoint kept intact); on SIGTERM or
    SIGINT, after saving the step it was on, 128 + the signal's number (143, 130).
    (A Ctrl-C in the first seconds, while Python still imports PyTorch and before this
    function runs, ends with Python's own KeyboardInterrupt traceback: nothing was
    written then.)"""
    name, model_cfg, train_cfg = configs(sys.argv[1:] if argv is None else argv)
    try:
        try:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always", ResumeWarning)
                warnings.simplefilter("always", ScheduleWarning)
                plan = check_run(model_cfg, train_cfg)       # every check before a step
        except ValueError as err:
            cli.fail(COMMAND, err)
        for w in said:            # a resume's or schedule's warning: one line; others as usual
            if issubclass(w.category, (ResumeWarning, ScheduleWarning)):
                sys.stderr.write(f"{COMMAND}: warning: {' '.join(str(w.message).split())}\n")
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        try:
            result = train(model_cfg, train_cfg, progress=True, plan=plan)
        except OutputRefused as err:
            cli.fail(COMMAND, err)
        except (RunStopped, CheckpointWriteError) as err:
            sys.stderr.write(f"{COMMAND}: {' '.join(str(err).split())}\n")
            raise SystemExit(getattr(err, "status", 1)) from None
    except KeyboardInterrupt:      # Ctrl-C before the loop takes signals, or a second one
        sys.stderr.write(f"{COMMAND}: stopped by SIGINT; out_dir holds the checkpoints saved "
                         f"before (each whole), nothing more\n")
        raise SystemExit(128 + signal.SIGINT) from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(summary(name, result))
    return result
