"""The Sparse Transformer network, its training, checkpoints and sampling.

Child et al., 2019, sections 5.2-5.6 (the network: pre-activation residual
blocks, initialisation, factorized position embeddings, recomputation, mixed
precision) and section 6 (training). One job per module:

* ``config``      the two dataclasses (ModelConfig, TrainConfig) and the presets;
* ``model``       the network;
* ``optim``       AdamW and the warm-up + cosine schedule (sec. 6);
* ``devices``     device, precision (autocast) and the DDP process group (sec. 5.6, 6);
* ``loss``        the loss in nats, evaluation in bits per byte / bits per dim;
* ``checkpoint``  the one file format: save, load, resume;
* ``train``       the loop, and ``python -m fast train``;
* ``preflight``   everything a run needs, checked before its first step;
* ``cli``         that command's options and help text;
* ``sample``      generation, and ``python -m fast sample``;
* ``draw``        a sampling request's checks; temperature, top-k, top-p, one token;
* ``decode``      incremental decoding: prefill, then one position per step;
* ``kv_reads``    which keys a step reads (row t of every head's mask);
* ``kv_cache``    the dense and the sparse key/value caches;
* ``seed``        every random draw.
"""
