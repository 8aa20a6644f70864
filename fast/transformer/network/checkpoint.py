"""The one checkpoint file format: written atomically, read safely, checked before use.

Child et al., 2019, section 6 trains for days; a run must survive interruption, and
the models the figures keep must load anywhere. A checkpoint is one ``torch.save``
dict. Every checkpoint holds ``format`` (``FORMAT``), ``model`` (a state_dict) and
``model_cfg`` (the ``ModelConfig`` as a plain dict); a training run's checkpoint adds
the optimiser, scheduler, loss scaler, RNG states, step, history and what the run
saw (its data's fingerprint, its resolved precision and device:
``fast.transformer.training.resume``); a weights-only checkpoint (``save_weights``:
the models the figure scripts keep, in fp16 to be small) holds just the three.
``load_model`` reads both kinds.

Versions. ``format`` counts changes of what a checkpoint holds. Format 2 added the
version itself, and to training checkpoints the data fingerprint, the precision and
the device; format 3 the model's ``output_init`` field; format 4, to training
checkpoints, the CPU threads their steps used (``cpu_threads``: a resume with another
count says so, ``fast.transformer.training.resume``); format 5 (this code), to training
checkpoints, the CPU kernel that computed their strided or fixed attention
(``cpu_kernel``: a resume with another kernel says so). A file without
``format`` is format 1 (written before versions were kept; the weights-only files
under figures/data/models are): its model loads as it always did, and a format-1
*training* checkpoint is refused by ``--resume`` (it does not record the data,
precision and device a resume must compare), in one sentence that says so. A config
field added in a later format (``ADDED``) takes, in an older file, the value that
reproduces how that file's model was made; in a file of its own format or later it
must be there. A file of a newer format is refused.

Writing: ``fast.core.files.atomic_write`` (a new temporary file beside the target,
created exclusively, never through a link, fsync-ed, renamed over it), so a crash
mid-write never leaves a truncated checkpoint and a planted link is never followed.

Reading, in order, each failure a ValueError of one sentence:

0. the file's bytes (``unreadable_file``; nothing is unpickled): an empty file,
   a file that is neither a zip archive (``torch.save``'s format) nor ``torch.save``'s
   older pickle format (a text file, a web page saved instead of the file), or a plain
   Python pickle is not a checkpoint, and says so; an archive whose end is missing (a
   copy cut short, a full disk) is said to be damaged or truncated, as is a
   ``torch.save`` file that the next step cannot read to its end; an archive with a
   record whose bytes do not match the CRC-32 the archive keeps for it (bytes zeroed or
   flipped inside: ``torch.load`` reads them as weights without a word) is said to be
   damaged, and which record;
1. ``torch.load(weights_only=True)``: a checkpoint holds only tensors and plain
   Python values, and that unpickler builds nothing else. A file that holds
   anything else -- a pickle crafted to run code when opened, or a training
   checkpoint written before this format (its RNG states were NumPy objects) -- is
   refused, and nothing in it runs;
2. the keys, the format and the configs: ``model_cfg`` (and ``train_cfg``) must hold
   exactly the fields of this version's dataclasses, each value passing their own
   checks (an unknown field, a missing one, a wrong type: named);
3. the weights against the config, before anything is built: the model the config
   describes is made on PyTorch's "meta" device (shapes only, no memory) and every
   tensor of the file must have its name and shape, be floating where it is, and
   hold finite values; the model built may not need much more memory than the
   file's tensors (``MAX_EXTRA_BYTES``), so a crafted config cannot make it
   allocate what the file does not hold.
"""

from __future__ import annotations

import dataclasses
import pickle
import zipfile
from pathlib import Path

import torch

from fast.core.files import atomic_write
from fast.core.schema import Exact, ShapeError, Tensor, check
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.model import SparseTransformer

FORMAT = 5                                                      # what this code writes
# config -> {field: (the format that added it, its value in every older file)}
ADDED = {"model_cfg": {"output_init": (3, "normal")}}
REQUIRED = ("model", "model_cfg")                               # every checkpoint
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# What building a model may allocate beyond twice its file's tensors (fp16 weights
# become float32): the position coordinates and other buffers, 64 MiB.
MAX_EXTRA_BYTES = 64 * 2**20


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a folder made read-only); the
    file that was there before, if any, is intact and no temporary file is left."""


def save_checkpoint(path, state: dict) -> str:
    """Write ``{"format": FORMAT, **state}`` to ``path`` atomically. Returns the path;
    raises CheckpointWriteError, saying so, if the file system refuses."""
    try:
        return atomic_write(path, lambda f: torch.save({"format": FORMAT, **state}, f))
    except OSError as err:
        before = "the previous checkpoint there is intact" if Path(path).exists() else \
            "no checkpoint was there before"
        raise CheckpointWriteError(
            err.errno, f"could not write the checkpoint {path} ({err.strerror or err}); "
                       f"{before}, and no partial file was left") from err


def save_weights(path, model: SparseTransformer, dtype=torch.float16) -> str:
    """A weights-only checkpoint: floating-point tensors cast to ``dtype``, and the config."""
    state = {k: v.to(dtype) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    return save_checkpoint(path, {"model": state, "model_cfg": dataclasses.asdict(model.cfg)})


def format_of(state: dict) -> int:
    """The format a checkpoint was written in (1: no ``format`` key, see the docstring)."""
    return state.get("format", 1)


ZIP_START = b"PK"                                               # a zip archive's first bytes
# torch.save's older format: a pickle stream that opens with torch's magic number
LEGACY_START = pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=2)
PICKLE_START = b"\x80"                                          # pickle's PROTO opcode
DAMAGED = ("copy it again from where it was written, or use an earlier checkpoint (a "
           "copy cut short or a full disk leaves such a file)")


def _failed_checksum(z: zipfile.ZipFile) -> str | None:
    """The first record of ``z`` whose bytes do not match the CRC-32 the archive keeps
    for it, or None. torch.save writes a checksum per record and torch.load does not
    check them, so bytes changed inside a record (zeroed by a failing disk, flipped in a
    copy) would load as weights. A record written with no checksum (0) is not checked."""
    for info in z.infolist():
        if info.CRC == 0:
            continue
        try:
            with z.open(info) as f:                   # ZipExtFile checks the CRC at the end
                while f.read(1 << 24):
                    pass
        except zipfile.BadZipFile:
            return info.filename
    return None


def unreadable_file(path) -> str | None:
    """Why ``path`` cannot be a checkpoint, from its bytes alone (step 0 of the module
    docstring; nothing is unpickled), or None when it may be one."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(len(LEGACY_START))
    archive = "a checkpoint archive (torch.save's zip format)"
    if size == 0:
        return f"{path} is not a readable checkpoint: it is empty (0 bytes), not {archive}"
    if head.startswith(ZIP_START):
        if not zipfile.is_zipfile(path):
            return (f"{path} is not a readable checkpoint: it is damaged or truncated, "
                    f"{size:,} bytes that begin as {archive} but end before the archive "
                    f"does; {DAMAGED}")
        with zipfile.ZipFile(path) as z:
            if not any(name.endswith("/data.pkl") for name in z.namelist()):
                return (f"{path} is not a readable checkpoint: it is a zip archive but not "
                        f"{archive}, which holds a data.pkl")
            bad = _failed_checksum(z)
        if bad is not None:
            return (f"{path} is not a readable checkpoint: it is damaged, its record {bad!r} "
                    f"does not match the checksum the archive keeps for it; {DAMAGED}")
        return None
    if head == LEGACY_START:
        return None
    if head.startswith(PICKLE_START):
        return (f"{path} is not a readable checkpoint: it is a Python pickle, not {archive}; "
                f"it was not read, so nothing in it was run")
    return (f"{path} is not a readable checkpoint: it is not {archive}, its first bytes are "
            f"{head[:16]!r}; allowed: a file written by torch.save, as python -m fast train "
            f"writes its ckpt.pt")


def load_checkpoint(path, map_location="cpu") -> dict:
    """Read a checkpoint written here, safely (steps 0 and 1 of the module docstring),
    with its keys and format checked; clear errors when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    why = unreadable_file(path)
    if why is not None:
        raise ValueError(why)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        found = next((line.strip().rstrip(".") for line in str(err).splitlines()
                      if "GLOBAL" in line or "nsupported" in line), "")
        raise ValueError(
            f"{path} is refused: it holds Python objects other than tensors and plain "
            f"values ({found or 'see torch.load(weights_only=True)'}), so it was not written "
            f"by this code's checkpoint format (or predates it); nothing in it was run. "
            f"Open it with torch.load(weights_only=False) only if you trust its "
            f"source") from err
    except Exception as err:                # a torch.save file that does not read to its end
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path} is not a readable checkpoint: it is damaged or truncated, "
                         f"a torch.save file that cannot be read to its end ({first}); "
                         f"{DAMAGED}") from err
    missing = sorted(set(REQUIRED) - set(state if isinstance(state, dict) else ()))
    if missing:
        raise ValueError(f"{path} is not a fast.transformer checkpoint: missing "
                         f"{missing} (a checkpoint holds at least {list(REQUIRED)})")
    version = format_of(state)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT:
        raise ValueError(f"{path} is a checkpoint of format {version!r}; allowed: formats "
                         f"1 to {FORMAT} (a newer one was written by a newer version of "
                         f"this code)")
    return state


def _config(cls, fields, path, key: str, version: int):
    """``cls(**fields)``: exactly ``cls``'s fields, each passing its own check; a field
    added after ``version`` (``ADDED``) takes its older files' value when missing."""
    try:
        if isinstance(fields, dict):
            older = {name: value for name, (since, value) in ADDED.get(key, {}).items()
                     if version < since and name not in fields}
            fields = {**fields, **older}
        check(fields, Exact({f.name: object for f in dataclasses.fields(cls)}), key)
        return cls(**fields)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path} holds a {key} this version cannot use: {err}") from err


def configs_from(state: dict, path="the checkpoint") -> tuple[ModelConfig, TrainConfig | None]:
    """The ModelConfig (and TrainConfig, if saved) of a checkpoint, every field checked."""
    version = format_of(state)
    model_cfg = _config(ModelConfig, state["model_cfg"], path, "model_cfg", version)
    train = state.get("train_cfg")
    train_cfg = (_config(TrainConfig, train, path, "train_cfg", version) if train is not None
                 else None)
    return model_cfg, train_cfg


def check_weights(weights, cfg: ModelConfig, path="the checkpoint") -> None:
    """ValueError unless ``weights`` are the state_dict of a model of ``cfg``: the same
    names and shapes, floating where the model is, finite, and the model no bigger
    than the file allows (step 3 of the module docstring). Nothing is allocated."""
    with torch.device("meta"):
        template = SparseTransformer(cfg)                       # shapes only
    expected = template.state_dict()
    try:
        check(weights, Exact({k: Tensor(tuple(v.shape)) for k, v in expected.items()}),
              "model")
    except ShapeError as err:
        raise ValueError(f"{path} does not hold the weights its model_cfg describes: "
                         f"{err}") from err
    for name, value in weights.items():
        if expected[name].is_floating_point() != (value.dtype in FLOATS):
            raise ValueError(f"{path}: model[{name!r}] is {value.dtype}; expected "
                             f"{'a floating' if expected[name].is_floating_point() else 'an'} "
                             f"{expected[name].dtype} tensor")
        if value.dtype in FLOATS and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{path}: model[{name!r}] holds NaN or inf; a model with "
                             f"non-finite weights computes nothing (this code never saves "
                             f"one: a run stops before)")
    held = sum(v.numel() * v.element_size() for v in weights.values())
    needed = sum(t.numel() * t.element_size() for t in (*template.parameters(),
                                                          *template.buffers()))
    if needed > 2 * held + MAX_EXTRA_BYTES:
        raise ValueError(f"{path}: its model_cfg describes a model of {needed:,} bytes while "
                         f"the file holds {held:,} bytes of weights; allowed: at most twice "
                         f"the file plus {MAX_EXTRA_BYTES:,} bytes (nothing was allocated)")


def load_model(path, device="cpu"):
    """(model in eval mode, ModelConfig, TrainConfig or None) from a checkpoint file.

    Reads training checkpoints and weights-only ones alike, of every format (the
    module docstring); everything is checked before the model is built; fp16 weights
    are loaded into the float32 model (``load_state_dict`` casts them)."""
    state = load_checkpoint(path, map_location=device)
    model_cfg, train_cfg = configs_from(state, path)
    check_weights(state["model"], model_cfg, path)
    model = SparseTransformer(model_cfg).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, model_cfg, train_cfg
