"""Sampling from a trained Sparse Transformer: ``sample(model, ...)``.

Child et al., 2019, section 7 (unconditional samples) and section 5.6 (query-key
products in float32 when sampling: float16 can overflow). Ancestral sampling, one
position at a time, from the model's distribution reshaped by a temperature, top-k
and top-p (nucleus) truncation (``fast.transformer.decoding.draw``). A prompt
continues text, or completes the top rows of an image.

Two ways to compute each next distribution, one flag:

* ``cache=True`` (``"sparse"``, the default): a prefill pass over the prompt,
  then one position per step from a key/value cache that keeps and reads only
  what each head's pattern allows (``fast.transformer.decoding.decode``);
  ``cache="dense"`` keeps and reads every key (the usual cache; a baseline);
* ``cache=False``: re-run the whole model on the prefix for every token -- the
  reference the tests compare the caches with. With the same generator all
  three draw the same tokens in float32 and float64; under bfloat16 or float16
  autocast they round their logits differently, and near-ties may draw differently
  (docs/design.md, section 9).

A cached step runs on one of the decoder's engines (``engine``): "numba", one
compiled call per step, for float32 models on the CPU, and "torch" otherwise;
"auto" (the default) picks (``fast.transformer.decoding.decode``).

Every argument is checked before any work starts
(``fast.transformer.decoding.request.check_request``). Batches: ``num`` sequences
are drawn ``batch_size`` at a time; by default all together, or as many as keep a
GiB of keys and values (``request.BATCH_BYTES``) when that is fewer. Sample r draws
its uniform numbers from a stream of its own, seeded from the generator by its index
(``draw.row_generators``): a seed gives the same samples whatever the batch size,
cache or engine. ``python -m fast sample``
(``fast.commands.sample``) draws from a checkpoint and writes the samples.
"""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from fast.transformer.decoding.decode import Decoder
from fast.transformer.decoding.draw import draw, row_generators
from fast.transformer.decoding.request import check_request
from fast.transformer.network.devices import autocast, resolve_precision


@torch.no_grad()
def sample(model, num: int = 4, *, length: int | None = None, prompt=None,
           temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None, precision: str = "fp32",
           start_token: bool | None = None, cache=True, batch_size: int | None = None,
           threads: int | None = None, progress: bool = False,
           stats: dict | None = None, engine: str = "auto") -> torch.Tensor:
    """Draw ``num`` sequences of ``length`` tokens (default n_ctx) -> LongTensor (num, length).

    prompt: token ids (num, p) or (p,) to continue; they are the first p tokens
    of the result (image completion: the top rows of an image; text: its start).
    start_token: feed the start token (id vocab_size) first, as images are
    trained; default True for image models, False for text (a text model then
    needs a prompt; by default one newline byte). temperature, top_k, top_p:
    ``draw``. precision: autocast of everything but attention ("fp32", "bf16",
    "fp16", "auto" as in training); q.k products and the softmax stay float32.
    cache: True / "sparse", "dense", or False (re-run the model per token).
    threads: torch's intra-op threads during the call (restored after); by default
    1 when a cache decodes on the CPU -- a step is a chain of small products that a
    second thread does not speed up, and on a busy machine each parallel product
    waits for both cores -- and torch's setting otherwise.
    progress: a progress bar counting tokens (and tokens per second). stats: a
    dict to fill with seconds, tokens drawn, the cache's bytes, the decoder's engine
    and the steps each engine ran. engine: "auto", "numba" or "torch" (``Decoder``).
    """
    model = getattr(model, "module", model)                      # DistributedDataParallel
    model = getattr(model, "_orig_mod", model)                   # torch.compile's wrapper
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got "
                         f"{type(generator).__name__} (a seed: torch.Generator()."
                         f"manual_seed(seed))")
    cfg = model.cfg
    req = check_request(cfg, num, length, prompt, temperature, top_k, top_p, precision,
                        start_token, cache, batch_size, threads, engine)
    device = next(model.parameters()).device
    precision = resolve_precision(req["precision"], device)
    num, length, prompt = req["num"], req["length"], req["prompt"]
    p = prompt.shape[1]
    out = torch.empty(num, length, dtype=torch.long, device=device)
    out[:, :p] = prompt.to(device)
    threads = req["threads"] or (1 if device.type == "cpu" and req["cache"] else None)
    threads_before = torch.get_num_threads()
    was_training = model.training
    model.eval()
    model.set_qk_fp32(True)
    streams = row_generators(num, generator)                  # one per sample: batch-free
    bar = tqdm(total=num * (length - p), unit="tok", desc="sample", disable=not progress)
    start, cache_bytes, engines = time.perf_counter(), 0, set()
    steps = {"numba": 0, "torch": 0}
    try:
        if threads:
            torch.set_num_threads(threads)
        for r0 in range(0, num, req["batch_size"]):
            rows = out[r0:r0 + req["batch_size"]]                        # (b, length) view
            prefix = torch.full((rows.shape[0], int(req["start_token"])), cfg.vocab_size,
                                dtype=torch.long, device=device)          # (b, 0 or 1)
            with autocast(precision, device):
                decoder = _fill(model, rows, prefix, p, req,
                                streams[r0:r0 + req["batch_size"]], bar)
                if decoder is not None:
                    cache_bytes = max(cache_bytes, decoder.nbytes())
                    engines.add(decoder.engine)
                    steps = {k: steps[k] + n for k, n in decoder.steps.items()}
    finally:
        torch.set_num_threads(threads_before)
        bar.close()
        model.set_qk_fp32(False)
        model.train(was_training)
    if stats is not None:
        stats.update(seconds=time.perf_counter() - start, tokens=num * (length - p),
                     cache=req["cache"], cache_bytes=cache_bytes,
                     engine="+".join(sorted(engines)) or None, steps=steps)
    return out


def _fill(model, rows: torch.Tensor, prefix: torch.Tensor, p: int, req: dict, generator,
          bar) -> Decoder | None:
    """Sample rows[:, p:] in place after the prompt rows[:, :p], row b's draws from
    ``generator[b]``; returns the decoder (None: no cache, or nothing to draw)."""
    length = rows.shape[1]
    if p == length:
        return None
    pick = dict(temperature=req["temperature"], top_k=req["top_k"], top_p=req["top_p"],
                generator=generator)
    if req["cache"] is None:                                             # the reference
        for i in range(p, length):
            x = torch.cat([prefix, rows[:, :i]], dim=1)                  # (b, prefix + i)
            rows[:, i] = draw(model(x)[:, -1], **pick)
            bar.update(rows.shape[0])
        return None
    decoder = Decoder(model, prefix.shape[1] + length - 1, req["cache"], engine=req["engine"])
    logits = decoder.prefill(torch.cat([prefix, rows[:, :p]], dim=1))   # (b, vocab)
    for i in range(p, length):
        rows[:, i] = draw(logits, **pick)
        bar.update(rows.shape[0])
        if i + 1 < length:
            logits = decoder.step(rows[:, i])
    return decoder
