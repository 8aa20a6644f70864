"""The command lines behind ``python -m fast COMMAND`` (Child et al., 2019, sec. 5-7).

The top layer of ``fast``: each module holds one command's parser and ``main``;
the library below takes plain values, raises ValueError or TypeError on bad ones
and returns results, and a command turns a bad value into one line on stderr and
exit status 2 (``fast.core.cli``).
"""
