"""The one checkpoint file format: written atomically, read safely, a model built from it.

Child et al., 2019, section 6 trains for days; a run must survive interruption, and
the models the figures keep must load anywhere. A checkpoint is one ``torch.save``
dict. Every checkpoint holds ``model`` (a state_dict) and ``model_cfg`` (the
``ModelConfig`` as a plain dict); a training run's checkpoint adds the optimiser,
scheduler, loss scaler, RNG states, step and history
(``fast.transformer.training.resume``); a weights-only checkpoint (``save_weights``:
the models the figure scripts keep, in fp16 to be small) holds just the two.
``load_model`` reads both kinds.

Every file is written to ``<path>.tmp`` and moved over ``path`` with
``os.replace`` (``fast.core.files.atomic_write``), so a crash mid-write never
leaves a truncated checkpoint (a process killed mid-write can leave the ``.tmp``
file itself behind; nothing reads it, and the next save replaces it).

Safety: a checkpoint holds only tensors and plain Python values (dicts, lists,
tuples, numbers, strings, None; the RNG states too), and is always read with
``torch.load(weights_only=True)``, whose unpickler builds nothing else. A file that
holds anything else -- a pickle crafted to run code when opened, or a training
checkpoint written before this format (its RNG states were NumPy objects) -- is
refused with a ValueError, and nothing in it runs.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import torch

from fast.core.files import atomic_write
from fast.transformer.config import ModelConfig, TrainConfig
from fast.transformer.network.model import SparseTransformer

REQUIRED = ("model", "model_cfg")                              # every checkpoint


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a folder made read-only); the
    file that was there before, if any, is intact and no ``.tmp`` file is left."""


def save_checkpoint(path, state: dict) -> str:
    """Write ``state`` to ``path`` atomically (tmp file + os.replace). Returns the path;
    raises CheckpointWriteError, saying so, if the file system refuses."""
    try:
        return atomic_write(path, lambda f: torch.save(state, f))
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


def load_checkpoint(path, map_location="cpu") -> dict:
    """Read a checkpoint written here, safely (``weights_only=True``, see the module
    docstring); clear errors when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
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
    except Exception as err:
        raise ValueError(f"{path} is not a readable checkpoint: {err}") from err
    missing = set(REQUIRED) - set(state if isinstance(state, dict) else ())
    if missing:
        raise ValueError(f"{path} is not a fast.transformer checkpoint: missing "
                         f"{sorted(missing)} (a checkpoint holds at least {list(REQUIRED)})")
    return state


def configs_from(state: dict) -> tuple[ModelConfig, TrainConfig | None]:
    """The ModelConfig (and TrainConfig, if saved) of a checkpoint."""
    model_cfg = ModelConfig(**state["model_cfg"])
    train_cfg = TrainConfig(**state["train_cfg"]) if state.get("train_cfg") else None
    return model_cfg, train_cfg


def load_model(path, device="cpu"):
    """(model in eval mode, ModelConfig, TrainConfig or None) from a checkpoint file.

    Reads training checkpoints and weights-only ones alike; fp16 weights are
    loaded into the float32 model (``load_state_dict`` casts them)."""
    state = load_checkpoint(path, map_location=device)
    model_cfg, train_cfg = configs_from(state)
    model = SparseTransformer(model_cfg).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, model_cfg, train_cfg
