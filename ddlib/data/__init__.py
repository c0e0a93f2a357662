"""Data: real datasets as tensors (``datasets``: the registry and the ``Dataset`` type; ``loaders``:
the registered file-backed datasets, built on ``archives``, ``tree_scan`` (scanning ImageFolder trees)
and ``decode`` (threaded decoding, disk cache)), distilled sets (``distilled``, reading the set formats
registered in ``formats/``), content digests (``digest``) and a set's overlap with a held-out split
(``overlap``: the leakage check); ``streaming``: large ImageFolders (ImageNet) read lazily, batch by
batch. Imports run one way: everything here imports ``datasets``.

The face of the package is the registry: ``from ddlib.data import load_dataset``.
"""

from ddlib.data import loaders as _loaders  # noqa: F401  (registers mnist, cifar10, ..., imagefolder:)
from ddlib.data import streaming as _streaming  # noqa: F401  (registers stream: large ImageFolders read lazily)
from ddlib.data.datasets import DATASETS, Dataset, DatasetError, list_datasets, load_dataset, register_dataset

__all__ = ["DATASETS", "Dataset", "DatasetError", "list_datasets", "load_dataset", "register_dataset"]
