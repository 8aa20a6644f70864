"""A sampling request: every argument of ``sample`` checked before any work starts.

Child et al., 2019, section 7 (samples, and completions of held-out images from
their top half) and section 5.6 (sampling keeps q.k products in float32).
``check_request`` compares each argument with the model's config and returns them
normalised; a ValueError says what was given and what is allowed.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fast.transformer.config import PRECISIONS
from fast.transformer.decoding.decode import ENGINES

# The smallest temperature: logits are divided by it in float32, and below about 1e-30 a
# logit of 10 overflows to inf and the softmax to NaN (a silently wrong draw). At 1e-6
# the draw is already the most likely token (greedy) for any logit gap above 1e-4.
MIN_TEMPERATURE = 1e-6

CACHE_FLAGS = {True: "sparse", "sparse": "sparse", "dense": "dense", False: None, "none": None}

# How many sequences are decoded together when batch_size is not given: as many as keep
# at most this many bytes of float32 keys and values (every layer, every position: the
# dense cache, the most any cache holds), at least one. ``num`` = 65,536 samples are
# then drawn in batches, never allocated at once (the (num, length) tokens are).
BATCH_BYTES = 2**30


def default_batch(cfg, num: int, length: int) -> int:
    """The batch size of a request that names none: ``num``, or fewer (``BATCH_BYTES``)."""
    per_sequence = cfg.n_layers * (length + 1) * (cfg.qk_dim + cfg.d_model) * 4
    return max(1, min(num, BATCH_BYTES // per_sequence))


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def check_request(cfg, num, length, prompt, temperature, top_k, top_p, precision, start_token,
                  cache, batch_size, threads=None, engine="auto") -> dict:
    """Every argument of ``sample`` checked against the model's config ``cfg``;
    returns them normalised (prompt a LongTensor (num, p) on the CPU). Raises
    ValueError saying what was given and what is allowed."""
    if not _is_int(num) or num < 1:
        raise ValueError(f"num must be an integer >= 1, got {num!r}")
    length = cfg.n_ctx if length is None else length
    if not _is_int(length) or not 1 <= length <= cfg.n_ctx:
        raise ValueError(f"length must be an integer in [1, n_ctx={cfg.n_ctx}] (the model's "
                         f"context), got {length!r}")
    batch_size = default_batch(cfg, num, length) if batch_size is None else batch_size
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature must be >= {MIN_TEMPERATURE} (smaller ones overflow "
                         f"float32 logits; 1e-6 is already greedy), got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or not 1 <= top_k <= cfg.vocab_size):
        raise ValueError(f"top_k must be None or an integer in [1, vocab_size={cfg.vocab_size}], "
                         f"got {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if threads is not None and (not _is_int(threads) or threads < 1):
        raise ValueError(f"threads must be None or an integer >= 1, got {threads!r}")
    if not any(cache is key for key in CACHE_FLAGS) and cache not in ("sparse", "dense", "none"):
        raise ValueError(f"cache must be True, False, 'sparse', 'dense' or 'none', got {cache!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if start_token is None:
        start_token = cfg.embedding == "image"
    if not isinstance(start_token, bool):
        raise ValueError(f"start_token must be None, True or False, got {start_token!r}")
    if prompt is None:                       # text without a start token: one newline byte
        text = cfg.embedding == "text" and not start_token and cfg.vocab_size > ord("\n")
        prompt = torch.full((num, int(text)), ord("\n"), dtype=torch.long)
    if isinstance(prompt, (list, tuple)) and len(prompt) == 0:
        prompt = torch.zeros(0, dtype=torch.long)        # no prompt: the start token alone
    prompt = torch.as_tensor(np.asarray(prompt) if isinstance(prompt, (list, tuple)) else prompt)
    if prompt.dtype in (torch.bool,) or prompt.is_floating_point() or prompt.is_complex():
        raise ValueError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    if prompt.dim() == 1:
        prompt = prompt[None].expand(num, -1)
    if prompt.dim() != 2 or prompt.shape[0] != num:
        raise ValueError(f"prompt must be (p,) or (num={num}, p), got shape {tuple(prompt.shape)}")
    prompt = prompt.to("cpu", torch.long)
    p = prompt.shape[1]
    if p and (int(prompt.min()) < 0 or int(prompt.max()) >= cfg.vocab_size):
        raise ValueError(f"prompt token ids must lie in [0, vocab_size={cfg.vocab_size}) (the "
                         f"start token {cfg.vocab_size} is added by start_token), got values in "
                         f"[{int(prompt.min())}, {int(prompt.max())}]")
    if p > cfg.n_ctx:
        raise ValueError(f"the prompt holds {p} tokens, longer than the context "
                         f"n_ctx={cfg.n_ctx}")
    if p > length:
        raise ValueError(f"the prompt holds {p} tokens, more than length={length}")
    if p == 0 and not start_token:
        raise ValueError("nothing to condition on: give a prompt of at least one token or "
                         "start_token=True")
    return dict(num=int(num), batch_size=int(batch_size), length=int(length),
                temperature=float(temperature), top_k=top_k, top_p=top_p, precision=precision,
                start_token=start_token, cache=CACHE_FLAGS[cache], prompt=prompt,
                threads=threads, engine=engine)
