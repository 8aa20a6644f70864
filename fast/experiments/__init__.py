"""The scripts that regenerate the paper-style results and figures (Child et al., 2019, sec. 7).

Each script trains or measures (through ``fast.transformer`` and
``fast.measure``), caches what it found as JSON under ``figures/data/``
(``paths``) and draws its figures (``fast.plots``); each is the ``main(argv)``
of a ``python -m fast`` command: ``bench``, ``memory`` (``memory_report``),
``table2``, ``fig2`` (``learned_attention``), ``figures`` (``make_figures``
runs the four before), ``results`` (prints the README's tables from the JSON)
and ``notebooks`` (``run_notebooks``). ``bench_triton`` times the Triton kernel
on a GPU (``python -m fast.experiments.bench_triton``).
"""
