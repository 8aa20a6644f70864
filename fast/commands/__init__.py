"""The command lines of ``python -m fast``: the top layer, one module per command.

Child et al., 2019: the commands train the network (sec. 5-6), sample from it and
regenerate the results of sec. 7. Each module holds one command's parser and its
``main(argv)``, and nothing else: the work is done by the library below, which
raises ValueError / TypeError (with the same "given; allowed" words) and returns
values; a command turns a refused input into one line on stderr and exit status 2
(``cli``: the argparse toolkit every command shares). ``registry`` maps command
names to these modules.
"""
