"""Measurement: speed, memory and attention statistics (Child et al., 2019, sec. 5.4-5.5, Fig. 2).

Functions that time attention against its peers, count the bytes autograd keeps
for backward, read peak memory, and summarise where learned attention goes. They
return numbers; the scripts in ``fast.experiments`` run them, save JSON and call
``fast.plots``.
"""
