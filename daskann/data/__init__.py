"""Data sets, local-file loaders and the deterministic batch order.

Every set comes as numpy arrays; :func:`as_dask` turns them into row-chunked
dask arrays. Nothing here touches the network: MNIST and CIFAR-10 are read
from local folders, MNIST-1D is generated, the digits ship with scikit-learn.
"""

from daskann.data._batches import SERIALIZED, BatchOrder, coarse_indices
from daskann.data._cifar import load_cifar10
from daskann.data._datasets import (
    DATASETS,
    Dataset,
    as_dask,
    load_dataset,
    load_digits,
    make_linear,
    make_mnist1d,
    train_val_split,
    upsample_signals,
)
from daskann.data._idx import load_mnist_idx

__all__ = [
    "DATASETS",
    "SERIALIZED",
    "BatchOrder",
    "Dataset",
    "as_dask",
    "coarse_indices",
    "load_cifar10",
    "load_dataset",
    "load_digits",
    "load_mnist_idx",
    "make_linear",
    "make_mnist1d",
    "train_val_split",
    "upsample_signals",
]
