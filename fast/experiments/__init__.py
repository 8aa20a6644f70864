"""The work behind the paper-style results and figures (Child et al., 2019, sec. 7).

Each module trains or measures (through ``fast.transformer`` and ``fast.measure``),
caches what it found as JSON under ``figures/data/`` (``paths``; read back through
``cache``) and draws its figures (``fast.plots``): ``bench`` (attention speed: the
sweep that ``bench_sweep.Sweep`` describes, on the CPU a fresh process per point, on
a GPU every contender in one process with CUDA events), ``memory_report``
(recomputation, Fig. 4), ``table2``, ``learned_attention`` (Fig. 2), ``samples``,
``generation`` (decoding speed), ``gpu_iteration_time`` (Table 2's time per iteration
on a GPU), ``layout_time`` and ``results`` (the README's tables, from the JSON). The
commands of ``python -m fast`` (``fast.commands``) read their options and call these.
"""
