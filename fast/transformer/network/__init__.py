"""The Sparse Transformer network (Child et al., 2019, sections 5.2-5.6 and 6).

``model`` (the network as ``torch.nn`` modules), ``block`` (one residual block's
arithmetic, which the model and the decoding step both call), ``devices`` (the
device and autocast precision it runs in) and ``checkpoint`` (the one file format
of its weights, written atomically and read safely).
"""
