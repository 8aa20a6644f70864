"""Measurement: speed, memory and attention statistics (Child et al., 2019, sec. 5.4-5.5, Fig. 2).

Functions that time attention against its peers (``contenders``: who runs and
where; ``timing``: how a call is timed, by one of two methods; ``bench_point``:
one contender at one shape; ``bench``: what a sweep of points amounts to), count
the bytes autograd keeps for backward and read peak memory (``memory``,
``model_memory``), run a measurement in a fresh process (``child``), time
decoding (``generation``) and summarise where learned attention goes
(``attention_stats``). They return numbers; the scripts in ``fast.experiments``
run them, save JSON and call ``fast.plots``.
"""
