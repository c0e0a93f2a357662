"""Dataset registry: real training and test sets as tensors, loaded once per process.

Every loader returns a :class:`Dataset` whose images are either ``uint8`` (0-255) or
``float32`` pixels in [0, 1], shaped N x C x H x W. Protocols call :meth:`Dataset.pixels`
to get float pixels and normalise with ``mean``/``std`` themselves, so there is one way
to normalise throughout the suite.

Nothing is downloaded unless a caller passes ``download=True``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ddlib.data.layout import standard_layout
from ddlib.specs.registry import Registry
from ddlib.store.cache import cache_dir

__all__ = [
    "Dataset",
    "DatasetError",
    "DATASETS",
    "PREFIXES",
    "load_dataset",
    "register_dataset",
    "list_datasets",
    "register_prefix",
    "stratified_split",
    "resolve_root",
    "cache_dir",
    "reduce_dataset",
    "stratified_subset",
    "DIGITS_TEST_FRACTION",
    "DIGITS_SPLIT_SEED",
]


DISPLAY_NAMES = {"digits": "digits", "mnist": "MNIST", "fashionmnist": "Fashion-MNIST", "cifar10": "CIFAR-10",
                 "cifar100": "CIFAR-100", "svhn": "SVHN", "tinyimagenet": "Tiny ImageNet"}
JPEG_EXTENSIONS = (".jpg", ".jpeg")


class DatasetError(ValueError):
    """A dataset could not be found or read; the message names the path and the problem."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A real dataset held in memory. Treat the tensors as read-only: they are cached and shared."""

    name: str
    train_images: torch.Tensor  # N x C x H x W, uint8 or float32 in [0, 1]
    train_labels: torch.Tensor  # N, int64
    test_images: torch.Tensor
    test_labels: torch.Tensor
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str = ""  # where it was read from, for provenance
    extra: dict = field(default_factory=dict)

    def __post_init__(self):  # row-major tensors, whatever the loader's strides (ddlib.data.layout)
        for name in ("train_images", "test_images"):
            object.__setattr__(self, name, standard_layout(getattr(self, name)))

    @property
    def label(self) -> str:
        """How results on this data must be labelled: the dataset's usual name and, where the images
        were decoded from JPEG files (the shared CIFAR-10 is a JPEG re-encoding), "(JPEG)", so that
        nobody compares them with numbers on the original images unawares: "CIFAR-10 (JPEG)"."""
        name = DISPLAY_NAMES.get(self.name, self.name)
        extensions = self.extra.get("file_extensions") or ()
        if any(ext.lower() in JPEG_EXTENSIONS for ext in extensions):
            name += " (JPEG)"
        return name

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])  # type: ignore[return-value]

    @property
    def channels(self) -> int:
        return self.image_shape[0]

    @property
    def image_size(self) -> tuple[int, int]:
        return self.image_shape[1], self.image_shape[2]

    def pixels(self, split: str = "train") -> torch.Tensor:
        """Float32 pixels in [0, 1] for ``split`` ("train" or "test")."""
        images = self.train_images if split == "train" else self.test_images
        return to_float_pixels(images)

    def labels(self, split: str = "train") -> torch.Tensor:
        """Hard int64 labels of ``split`` ("train" or "test"), in the order of :meth:`pixels`."""
        return self.train_labels if split == "train" else self.test_labels

    def __repr__(self) -> str:  # tensors make the default repr unreadable
        return (
            f"Dataset({self.name!r}, train={len(self.train_labels)}, test={len(self.test_labels)}, "
            f"image_shape={self.image_shape}, classes={self.num_classes})"
        )


def to_float_pixels(images: torch.Tensor) -> torch.Tensor:
    """Float pixels in [0, 1] from stored images (uint8 divided by 255; float images are pixels already)."""
    if images.dtype == torch.uint8:
        return images.float().div_(255.0)
    return images.float()


# --------------------------------------------------------------------------- registry

Loader = Callable[..., Dataset]
DATASETS: Registry = Registry("dataset")  # name -> loader(root=None, download=False)
PREFIXES: Registry = Registry("dataset prefix")  # "imagefolder" -> loader(path, name) for "imagefolder:<path>"
_CACHE: dict[tuple, Dataset] = {}


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Register ``loader(root=None, download=False) -> Dataset`` as dataset ``name``; a name
    registered twice is refused."""
    def decorator(fn: Loader) -> Loader:
        DATASETS.add(name, fn, defaults={})
        return fn

    return decorator


def register_prefix(prefix: str) -> Callable:
    """Register ``loader(path, name)`` for dataset names ``<prefix>:<path>`` (e.g. ``imagefolder:``)."""
    def decorator(fn):
        PREFIXES.add(prefix, fn, defaults={})
        return fn

    return decorator


def list_datasets() -> list[str]:
    """The names :func:`load_dataset` takes, sorted, then the ``<prefix>:<path>`` forms (``imagefolder:<path>``)."""
    return DATASETS.names() + [f"{prefix}:<path>" for prefix in PREFIXES.names()]


def resolve_root(name: str, root: str | os.PathLike | None) -> Path | None:
    """The folder a dataset is read from: the ``root`` param, else ``$DDLIB_DATA``."""
    if root is None:
        env = os.environ.get("DDLIB_DATA")
        root = env if env else None
    return Path(root).expanduser() if root is not None else None


def load_dataset(name: str, root: str | os.PathLike | None = None, download: bool = False) -> Dataset:
    """Load a dataset by its registered name, with its train and test splits.

    Every protocol reads its real data here, so a dataset name means the same images and split
    everywhere. Loaded once per (name, root) for the life of the process: protocols may call this
    freely. ``digits`` (scikit-learn's 8x8 digits, read from the installed package) needs no files.

    Args:
        name: a registered dataset (:func:`list_datasets`: ``digits``, ``mnist``, ``cifar10``, ...) or ``imagefolder:<path>``.
        root: the folder it is read from; default ``$DDLIB_DATA`` (with neither, only ``download`` fetches one).
        download: fetch missing files with torchvision (into ddlib's cache when no root is given).

    Returns:
        The :class:`Dataset`: images, labels, class names, and the normalisation mean and std.

    Raises:
        DatasetError: an unknown name, or files that cannot be found or read.

    Example:
        >>> data = load_dataset("digits")
        >>> data
        Dataset('digits', train=1347, test=450, image_shape=(1, 8, 8), classes=10)
        >>> data.pixels("test").shape, data.num_classes
        (torch.Size([450, 1, 8, 8]), 10)
    """
    prefix, _, rest = name.partition(":")
    if rest and prefix in PREFIXES:
        path = Path(rest).expanduser()
        key = (prefix, str(path.resolve()))
        if key not in _CACHE:
            _CACHE[key] = PREFIXES.entry(prefix).factory(path, name=name)
        return _CACHE[key]
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; known: {', '.join(list_datasets())}")
    resolved = resolve_root(name, root)
    key = (name, str(resolved.resolve()) if resolved is not None else None)
    if key not in _CACHE:
        _CACHE[key] = DATASETS.entry(name).factory(root=resolved, download=download)
    return _CACHE[key]


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of a class-stratified split: the same seed gives the same split on every machine."""
    rng = np.random.RandomState(seed)
    train_idx, test_idx = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        n_test = int(round(len(idx) * test_fraction))
        test_idx.append(idx[:n_test])
        train_idx.append(idx[n_test:])
    return np.sort(np.concatenate(train_idx)), np.sort(np.concatenate(test_idx))


def stratified_subset(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Sorted indices of exactly ``size`` items, spread over the classes in proportion to their
    counts (largest remainders first, ties to the smaller class index), each class's items drawn
    by ``numpy.random.RandomState(seed)`` as :func:`stratified_split` draws them, so a balanced
    set gives the same subset either way. Every class keeps at least one item."""
    classes, counts = np.unique(labels, return_counts=True)
    if not len(classes) <= size <= len(labels):
        raise ValueError(f"a stratified subset needs between {len(classes)} (one per class) and {len(labels)} "
                         f"items, got {size}")
    share = counts * size / len(labels)
    take = np.maximum(np.floor(share).astype(int), 1)
    while take.sum() < size:  # hand out what rounding down left: largest shortfall first (argmax: lowest class on ties)
        take[np.argmax(np.where(take < counts, share - take, -np.inf))] += 1
    while take.sum() > size:  # take back what the minimum of one per class added: largest excess first
        take[np.argmax(np.where(take > 1, take - share, -np.inf))] -= 1
    rng = np.random.RandomState(seed)
    picked = []
    for c, k in zip(classes, take):
        idx = np.flatnonzero(labels == c)
        picked.append(idx[rng.permutation(len(idx))][:k])
    return np.sort(np.concatenate(picked))


def reduce_dataset(dataset: Dataset, train_per_class: int | None = None, test_size: int | None = None,
                   seed: int = 0) -> Dataset:
    """A smaller copy for CPU smoke runs: at most ``train_per_class`` training images per class and a
    class-stratified test subset of ``test_size`` images, both drawn with ``seed``. ``None`` keeps a
    split whole. The name is kept; ``source`` says what was reduced, so results are never mistaken
    for full-data numbers."""
    if train_per_class is None and test_size is None:
        return dataset
    g = torch.Generator().manual_seed(seed)
    notes = []
    train_images, train_labels = dataset.train_images, dataset.train_labels
    if train_per_class is not None:
        keep = torch.cat([
            idx[torch.randperm(len(idx), generator=g)[:train_per_class]]
            for idx in (torch.nonzero(train_labels == c).flatten() for c in range(dataset.num_classes))
        ]).sort().values
        train_images, train_labels = train_images[keep], train_labels[keep]
        notes.append(f"train {train_per_class}/class")
    test_images, test_labels = dataset.test_images, dataset.test_labels
    if test_size is not None and test_size < len(test_labels):
        keep = torch.from_numpy(stratified_subset(test_labels.numpy(), test_size, seed))
        test_images, test_labels = test_images[keep], test_labels[keep]
        notes.append(f"test {len(keep)}")
    return replace(dataset, train_images=train_images, train_labels=train_labels, test_images=test_images,
                   test_labels=test_labels, source=f"{dataset.source} [reduced: {', '.join(notes)}, seed {seed}]",
                   extra={**dataset.extra, "reduced": True})


# --------------------------------------------------------------------------- digits (embedded)

DIGITS_TEST_FRACTION = 0.25
DIGITS_SPLIT_SEED = 0


def _digits_table() -> np.ndarray:
    """The table ``load_digits`` reads (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the
    label per row), read without importing scikit-learn, which costs every grid cell's kernel over
    a second (scipy and all). The same array as ``load_digits()`` (tested)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return np.loadtxt(path, delimiter=",")
    from sklearn.datasets import load_digits  # another layout: let scikit-learn find it

    bunch = load_digits()
    return np.concatenate([bunch.data, bunch.target[:, None]], axis=1)


@register_dataset("digits")
def load_digits_dataset(root: Path | None = None, download: bool = False) -> Dataset:
    """scikit-learn's ``load_digits``: 1,797 real 8x8 grayscale digits shipped inside the package.

    Split: per class, 25 % to test, chosen by ``numpy.random.RandomState(0)`` (1,347 train /
    450 test). Pixels are the original 0-16 intensities divided by 16.
    """
    raw = _digits_table()
    images = (raw[:, :-1].reshape(-1, 8, 8).astype(np.float32) / 16.0)[:, None]
    labels = raw[:, -1].astype(np.int64)
    train_idx, test_idx = stratified_split(labels, DIGITS_TEST_FRACTION, DIGITS_SPLIT_SEED)
    train = torch.from_numpy(images[train_idx])
    mean = float(train.mean())
    std = float(train.std())
    return Dataset(
        name="digits",
        train_images=train,
        train_labels=torch.from_numpy(labels[train_idx]),
        test_images=torch.from_numpy(images[test_idx]),
        test_labels=torch.from_numpy(labels[test_idx]),
        class_names=tuple(str(i) for i in range(10)),
        mean=(mean,),
        std=(std,),
        source="sklearn.datasets.load_digits",
    )


