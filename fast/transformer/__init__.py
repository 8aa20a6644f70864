"""The Sparse Transformer network, its training, checkpoints and sampling.

Child et al., 2019, sections 5.2-5.6 (the network: pre-activation residual
blocks, initialisation, factorized position embeddings, recomputation, mixed
precision) and section 6 (training). ``config`` holds the two dataclasses and the
presets, ``model`` the network, ``train`` the loop, ``checkpoint`` the one file
format, ``sample`` generation, ``seed`` every random draw.
"""
