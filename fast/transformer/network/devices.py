"""Where and in which precision the network runs: the device and autocast.

Child et al., 2019, section 5.6 (mixed precision: weights kept in fp32,
activations and gradients in fp16, dynamic loss scaling; query-key products in
fp32 when sampling). Training (``fast.transformer.training``) and decoding
(``fast.transformer.decoding``) both run the network through these:

* ``resolve_device("auto")`` -- CUDA (this process's ``LOCAL_RANK``) if there is
  one, else the CPU;
* ``resolve_precision("auto", device)`` -- fp16 with loss scaling on CUDA, bf16
  on the CPU (no loss scaling needed there);
* ``autocast(precision, device)`` -- the autocast context; the weights stay fp32.
"""

from __future__ import annotations

import contextlib
import os

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """The torch.device of a TrainConfig.device string ("auto", "cpu", "cuda:1", ...)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available; use 'cpu'")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ValueError(f"device {name!r} asked for, but this machine has {count} CUDA "
                         f"device(s): cuda:0 .. cuda:{count - 1}")
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> "fp16" on CUDA (with loss scaling), "bf16" on CPU."""
    if precision == "auto":
        return "fp16" if device.type == "cuda" else "bf16"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision 'bf16' asked for, but {torch.cuda.get_device_name(device)} "
                         f"has no bfloat16; use 'fp16' or 'fp32'")
    return precision


def autocast(precision: str, device: torch.device):
    """The autocast context of a precision ("fp32": none). Weights stay fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)
