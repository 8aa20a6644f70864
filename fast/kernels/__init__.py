"""Block-sparse attention in Triton (Child et al., 2019, sec. 5.5).

One job per module: ``triton_kernels`` (the @triton.jit kernels), ``variants``
(the kernel variants, the speed levers selectable per call), ``launch``
(launchers and the autograd Function) and ``triton_attention`` (the public
``triton_sparse_attention``, its checks and the layout cache; import from here).

Triton is optional: importing this package imports nothing from Triton; the
modules that need it do, and say how to install it if it is missing. On a GPU
the kernels are compiled; on the CPU they run through the Triton interpreter
(``TRITON_INTERPRET=1`` set before Triton is imported), which is how the tests
check them on a machine without a GPU.
"""
