"""The command line of ``python -m fast train``: options, help text, the closing summary.

Child et al., 2019, sections 5-7: the options are the fields of the network
(``ModelConfig``, sec. 5.1-5.6) and of its training (``TrainConfig``, sec. 6),
starting from a named preset (the paper's models of sec. 7 / Table 1 among them).

    python -m fast train --preset quick
    python -m fast train --preset quick_text --n_layers 2 --max_iters 100
    python -m fast train --preset quick --resume          # continue runs/quick/ckpt.pt
    torchrun --nproc_per_node=2 -m fast train --preset quick   # DDP (gloo CPU / nccl CUDA)

Any ModelConfig or TrainConfig field can be given as ``--field value`` (Python
literals: 2, 0.1, true, none, "(16, 16, 1)"); a bool field alone (``--resume``)
means true. The loop itself is ``fast.transformer.train``.
"""

from __future__ import annotations

import ast
import dataclasses

from fast.transformer.config import PRESETS, ModelConfig, TrainConfig, preset

COMMAND = "python -m fast train"


def _literal(text: str):
    """An option's value: true/false/none in any case, else a Python literal, else the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_args(argv: list[str]) -> tuple[str, dict]:
    """``--preset NAME --field value ...`` -> (preset name, overrides)."""
    fields = {f.name: f for f in dataclasses.fields(ModelConfig) + dataclasses.fields(TrainConfig)}
    name, overrides, i = "quick", {}, 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            raise ValueError(f"expected --field value, got {token!r}")
        key = token[2:].replace("-", "_")
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if key == "preset":
            if not has_value:
                raise ValueError(f"--preset needs a name, one of {sorted(PRESETS)}")
            name, i = argv[i + 1], i + 2
            continue
        if key not in fields:
            raise ValueError(f"unknown option --{key}; fields: --preset, "
                             f"{', '.join('--' + k for k in sorted(fields))}")
        if has_value:
            overrides[key], i = _literal(argv[i + 1]), i + 2
        elif isinstance(fields[key].default, bool):
            overrides[key], i = True, i + 1
        else:
            raise ValueError(f"--{key} needs a value")
    return name, overrides


def usage() -> str:
    """The --help text: presets, then every field with its default in the quick preset."""
    model_cfg, train_cfg = preset("quick")
    lines = [f"usage: {COMMAND} [--preset NAME] [--field value ...]",
             "       torchrun --nproc_per_node=N -m fast train ...   (data parallel)", "",
             "Train a Sparse Transformer (Child et al., 2019). Every ModelConfig and",
             "TrainConfig field (fast/transformer/config.py documents each) is an option.", "",
             f"presets: {', '.join(sorted(PRESETS))} (default: quick)", "",
             "fields (quick preset's value):"]
    for cfg in (model_cfg, train_cfg):
        for f in dataclasses.fields(cfg):
            lines.append(f"  --{f.name:<20} {getattr(cfg, f.name)!r}")
    return "\n".join(lines)


def command_line(argv: list[str]) -> tuple[str, dict]:
    """(preset name, overrides) of ``argv``; prints the help and exits on -h/--help,
    exits with the error (status 1) on a bad option."""
    if any(a in ("-h", "--help") for a in argv):
        print(usage())
        raise SystemExit(0)
    try:
        return parse_args(argv)
    except ValueError as err:
        raise SystemExit(f"{COMMAND}: {err}\n(see --help)") from None


def summary(name: str, result: dict) -> str:
    """The one line printed when a run ends (``result`` is what ``train`` returned)."""
    finals = ", ".join(f"{s} {v:.4f} {result['unit']}" for s, v in result["final"].items())
    ckpt = f"; checkpoint {result['checkpoint']}" if result["checkpoint"] else ""
    return (f"preset {name}: {result['n_params']:,} parameters, {result['step']} steps on "
            f"{result['device']} ({result['precision']}), "
            f"{result['time_per_iter'] * 1000:.1f} ms/iter; {finals}{ckpt}")
