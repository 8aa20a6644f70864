"""Every figure of the project is drawn here, in one style (Child et al., 2019, Fig. 2-4, Table 2).

Plot functions take plain data (arrays, the dicts the experiments save as JSON)
and write a PNG into ``figures/``; they never train or time anything.
"""
