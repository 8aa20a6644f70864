"""The structured backend: the paper's patterns at O(n sqrt(n)) on plain PyTorch ops.

Child et al., 2019, sec. 4.3 (the patterns) and sec. 5.5 (how a factorized pattern becomes
fast): each head's keys are cut into a few dense pieces, computed with a fused kernel and
merged exactly through their log-sum-exp. Its files, one idea each:

* ``attention.py`` -- the operator: the plan of a layer's pieces, the forward and backward,
  the custom operators torch.compile sees, the float64 decision, and "full" as causal SDPA
  or one band;
* ``strided.py``   -- the strided pattern's pieces (sec. 4.3, Figure 3b): the local band and
  the column, as a transposition of the sequence into an (n / l, l) grid;
* ``fixed.py``     -- the fixed pattern's pieces (sec. 4.3, Figure 3c): the causal block and
  the summary positions, gathered.

Everything the rest of the package uses is named here (``fast.backends.structured.X``).
"""

from fast.backends.structured.attention import (
    BACKWARD,
    DENSE_WINDOW_MIN,
    DENSE_WINDOW_WIDTH,
    EXACT_LSE,
    FORWARD,
    StructuredAttention,
    backward,
    causal,
    dense_window,
    forward,
    full_attention,
    group,
    home_chunk,
    layer_backward,
    layer_forward,
    looks_for_overflow,
    may_outgrow_float32,
    merge_chunks,
    operator_backward,
    operator_forward,
    pad_rows,
    plan,
    plans,
    run_pieces,
    structured_attention,
)

__all__ = ["BACKWARD", "DENSE_WINDOW_MIN", "DENSE_WINDOW_WIDTH", "EXACT_LSE", "FORWARD",
           "StructuredAttention", "backward", "causal", "dense_window", "forward",
           "full_attention", "group", "home_chunk", "layer_backward", "layer_forward",
           "looks_for_overflow", "may_outgrow_float32", "merge_chunks", "operator_backward",
           "operator_forward", "pad_rows", "plan", "plans", "run_pieces",
           "structured_attention"]
