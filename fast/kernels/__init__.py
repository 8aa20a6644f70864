"""Block-sparse attention kernels in Triton, forward and backward (Child et al., 2019, sec. 5.5).

Triton is optional: importing this package imports nothing from Triton; the
modules inside do. On a GPU the kernels are compiled; on the CPU they run
through the Triton interpreter (``TRITON_INTERPRET=1`` set before Triton is
imported), which is how the tests check them on a machine without a GPU.
"""
