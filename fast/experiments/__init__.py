"""The scripts that regenerate the paper-style results and figures (Child et al., 2019, sec. 7).

Each script trains or measures (through ``fast.transformer`` and
``fast.measure``), caches what it found as JSON under ``figures/data/``
(``paths``) and draws its figures (``fast.plots``); each is the ``main(argv)``
of a ``python -m fast`` command: ``bench``, ``memory`` (``memory_report``),
``table2``, ``fig2`` (``learned_attention``), ``figures`` (``make_figures``
runs the four before), ``results`` (prints the README's tables from the JSON)
and ``notebooks`` (``run_notebooks``). ``bench`` is a library without a command
line: ``bench_sweep.Sweep`` says what to measure, ``fast.commands.bench`` builds
one from the options and ``bench`` runs it (on a GPU every contender in one
process, with CUDA events). ``train-time`` (``gpu_iteration_time``) times Table
2's training iterations, and ``layout_time`` times the layout build at long n
(docs/gpu.md).
"""
