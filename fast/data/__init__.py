"""Data for the Sparse Transformer: images and text as byte-valued token sequences.

Child et al., 2019, section 7 trains on CIFAR-10, Enwik8 and ImageNet 64x64.
Nothing is downloaded: ``images`` reads photographs that ship inside
scikit-image and scikit-learn (and CIFAR-10 pickles from a local path), ``text``
reads Python's own standard library (and enwik8 from a local path), and
``dataset`` turns either into train / val / test splits and batches.
"""

from fast.data.dataset import DATASETS, SPLITS, Dataset, load

__all__ = ["DATASETS", "SPLITS", "Dataset", "load"]
