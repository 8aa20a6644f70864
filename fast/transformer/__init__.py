"""The Sparse Transformer network, its training, and decoding from it.

Child et al., 2019, sections 5.2-5.6 (the network: pre-activation residual blocks,
initialisation, factorized position embeddings, recomputation, mixed precision),
section 6 (training) and section 7 (samples). Three subpackages by idea, above the
configuration they share:

* ``config``     the two dataclasses (ModelConfig, TrainConfig) and the named presets;
* ``network``    the network (``model``), one block's arithmetic (``block``), where and
                 in which precision it runs (``devices``), and the one checkpoint file
                 format (``checkpoint``);
* ``training``   the loop (``train``), its checks before the first step
                 (``preflight``), AdamW and the schedule (``optim``), the loss and
                 evaluation in bits (``loss``), seeding (``seed``), what a training
                 checkpoint adds and resuming (``resume``), data parallelism
                 (``distributed``) and the step clock (``clock``);
* ``decoding``   sampling (``sample``: a request checked by ``request``, one token
                 drawn by ``draw``), incremental decoding (``decode``), the key/value
                 caches (``kv_cache``, and ``sparse_kv_cache``: the public
                 ``fast.SparseKVCache``) over the keys a step reads
                 (``fast.backends.reads``, shared with ``fast.sparse_attention``'s
                 one-query step), and the compiled CPU step (``cpu_step`` driving the
                 Numba ``cpu_kernel``).

Imports run downward: training and decoding use the network and the config, the
network only the config; neither training nor decoding imports the other.
"""
