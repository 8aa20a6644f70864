"""The scripts that regenerate the paper-style results and figures (Child et al., 2019, sec. 7).

Each script trains or measures (through ``fast.transformer`` and
``fast.measure``), caches what it found as JSON under ``figures/data/`` and
draws its figures (``fast.plots``). ``make_figures`` runs them all; ``results``
prints the README's tables from the JSON.
"""
