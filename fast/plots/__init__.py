"""Every figure of the project is drawn here, in one style (Child et al., 2019, Fig. 2-4, Table 2).

Plot functions take plain data (arrays, the dicts the experiments save as JSON)
and write a PNG; they never train or time anything, and import only from
``fast.measure`` and lower layers. ``style`` holds what every figure shares:
the backend, the resolution, one colour and one name per pattern and
benchmark contender, and ``save``.
"""
