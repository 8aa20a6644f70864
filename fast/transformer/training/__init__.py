"""Training the Sparse Transformer (Child et al., 2019, section 6; sec. 5.6 for precision).

``train`` (the loop), ``preflight`` (everything a run needs, checked before its first
step), ``optim`` (AdamW, warm-up and cosine decay), ``loss`` (the loss in nats,
evaluation in bits per byte / per dim), ``seed`` (every random draw from one seed),
``resume`` (a training checkpoint, and continuing it), ``distributed`` (the
data-parallel process group) and ``clock`` (step times without host-device waits).
"""
