"""``python -m fast COMMAND [options]``: every command of the project behind one name.

Child et al., 2019, "Generating Long Sequences with Sparse Transformers": train the
network (sec. 5-6), sample from it, and regenerate the paper-style results (sec. 7).
The commands and the dispatcher are ``fast.commands.registry``.

    python -m fast                       # the list of commands
    python -m fast train --preset quick  # any command's options: python -m fast train --help
"""

from fast.commands.registry import main

if __name__ == "__main__":
    raise SystemExit(main())
