"""What every fast path shares, written once (Child et al., 2019, section 4).

The bottom layer of ``fast``: it imports nothing of ``fast`` and only
``reference`` from the project. Input checks (``checks``), the accumulation
dtype and where the score scale goes (``precision``), the exact log-sum-exp merge
of attention pieces (``merge``), non-finite inputs kept to the rows that read
them (``nonfinite``), the once-differentiable mark of hand-written backwards
(``autograd``), atomic file writes (``files``), a device's clock (``clock``: marks on
the wall clock or a CUDA stream, read without a wait of their own), the lock of a
run's output folder (``lock``) and the shape checks of files read back (``schema``)
live here, so that the backends, the kernels, the model and the scripts all call
the same code.
"""
