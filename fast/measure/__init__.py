"""Measurement: speed, memory and attention statistics (Child et al., 2019, sec. 5.4-5.5, Fig. 2).

Functions that time attention against its peers (``bench``: the CPU's
fresh-process method; ``bench_gpu``: every contender in one process, the GPU's;
``bench_triton``: the Triton contenders and their ideal; ``timing``: the rules),
count the bytes autograd keeps for backward and read peak memory (``memory``,
``model_memory``), run a measurement in a fresh process (``child``), and
summarise where learned attention goes (``attention_stats``). They return
numbers; the scripts in ``fast.experiments`` run them, save JSON and call
``fast.plots``.
"""
