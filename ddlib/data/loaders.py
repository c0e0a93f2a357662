"""File-backed dataset loaders: mnist, fashionmnist, cifar10, cifar100, svhn, tinyimagenet, ImageFolder.

Registered into :mod:`ddlib.data.datasets` on import. Every loader reads what the user already has on disk
(a torchvision folder, an ImageFolder tree, an ``.npz``) and downloads only when asked to with
``download=True``, so a benchmark never silently fetches data or measures something else than
what its config names.

The parts they share live one concern per module: :mod:`~ddlib.data.archives` (archives extracted
into the cache), :mod:`~ddlib.data.tree_scan` (scanning trees: class folders, val annotations) and
:mod:`~ddlib.data.decode` (threaded decoding into one uint8 array, kept in a disk cache under
``${DDLIB_CACHE:-~/.cache/ddlib}``); their public names are importable from here as well.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ddlib.data.archives import extract_archive, extracted_tree, is_archive
from ddlib.data.datasets import Dataset, DatasetError, cache_dir, register_dataset, register_prefix
from ddlib.data.decode import decode_image_files, histogram_stats, image_array
from ddlib.data.tree_scan import IMAGE_EXTENSIONS, read_words, scan_class_split, scan_eval_split, split_tree

__all__ = [
    "cache_dir",
    "extract_archive",
    "decode_image_files",
    "histogram_stats",
    "image_array",
    "load_imagefolder_dataset",
    "IMAGE_EXTENSIONS",
]

MNIST_CLASSES = tuple(str(i) for i in range(10))
# torchvision.datasets.FashionMNIST.classes, copied so the .npz path need not import torchvision (~2 s);
# tests check the two stay equal.
FASHIONMNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)


# --------------------------------------------------------------------------- root handling


def _require_root(name: str, root: Path | None, download: bool) -> Path:
    """The folder to read ``name`` from; a clear error instead of guessing when none was given."""
    if root is None:
        if download:
            # Somewhere that is ours to write to; never the current directory.
            return cache_dir() / "datasets"
        raise DatasetError(
            f"dataset {name!r} needs a data folder: pass root=... to load_dataset or set the "
            f"DDLIB_DATA environment variable (or pass download=True to fetch it with torchvision)"
        )
    root = Path(root).expanduser()
    if not root.exists() and not download:
        raise DatasetError(f"{name}: {root} does not exist")
    return root


def _torchvision_root(root: Path, base_folder: str) -> Path | None:
    """The root torchvision wants (the parent of ``base_folder``) if ``root`` is or holds that folder."""
    if root.name == base_folder and root.is_dir():
        return root.parent
    if (root / base_folder).is_dir():
        return root
    return None


# --------------------------------------------------------------------------- ImageFolder


def _load_tree(
    name: str,
    tree: Path,
    *,
    channels: int | None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    num_classes: int | None = None,
) -> Dataset:
    """A Dataset from ``tree/train/<class>/*`` and its labelled test/val split, through the disk cache."""
    train_dir = tree / "train"
    classes, train_files, train_labels = scan_class_split(train_dir)
    if num_classes is not None and len(classes) != num_classes:
        raise DatasetError(f"{name}: expected {num_classes} class folders in {train_dir}, found {len(classes)}")
    eval_dir, test_files, test_labels, extra_files = scan_eval_split(tree, classes)
    files = train_files + test_files
    tag = f"imagefolder-{tree.name}" if name.startswith("imagefolder:") else name  # readable cache file names
    images, tmean, tstd, cache_file, from_cache = decode_image_files(
        files, root=tree, n_train=len(train_files), channels=channels, tag=tag, extra_files=extra_files
    )
    n = len(train_files)
    images_t = torch.from_numpy(images)
    extensions = sorted({os.path.splitext(p)[1].lower() for p in files})
    extra = {
        "layout": "imagefolder",
        "test_split": eval_dir.name,
        "file_extensions": tuple(extensions),
        "cache_file": str(cache_file) if cache_file else None,
        "from_cache": from_cache,
        "computed_mean": tmean,
        "computed_std": tstd,
    }
    if (tree / "words.txt").is_file():  # Tiny ImageNet: wnid -> readable names
        extra["class_descriptions"] = read_words(tree / "words.txt", classes)
    return Dataset(
        name=name,
        train_images=images_t[:n],
        train_labels=torch.tensor(train_labels, dtype=torch.int64),
        test_images=images_t[n:],
        test_labels=torch.tensor(test_labels, dtype=torch.int64),
        class_names=tuple(classes),
        mean=tuple(mean) if mean is not None else tmean,
        std=tuple(std) if std is not None else tstd,
        source=str(tree),
        extra=extra,
    )


@register_prefix("imagefolder")
def load_imagefolder_dataset(path: str | os.PathLike, name: str | None = None) -> Dataset:
    """Any ImageFolder tree: ``path/train/<class>/*`` with ``path/test/<class>/*`` (or ``val/``).

    ``path`` may also be a .tar/.tar.gz/.zip of such a tree (extracted into the cache). Images are
    RGB unless every one is grayscale; all must share one size; mean/std come from the training pixels.
    """
    path = Path(path).expanduser()
    label = name or f"imagefolder:{path}"
    if is_archive(path):
        path = extracted_tree(path)
    if not path.exists():
        raise DatasetError(f"{label}: {path} does not exist")
    if not path.is_dir():
        raise DatasetError(f"{label}: {path} is not a folder (expected train/ and test/ or val/ inside)")
    tree = split_tree(path)
    if tree is None:
        raise DatasetError(f"{label}: {path} needs a train/ folder and a test/ or val/ folder of class folders")
    return _load_tree(label, tree, channels=None)


# --------------------------------------------------------------------------- npz + torchvision helpers


def _to_nchw(arr: np.ndarray, path: Path, key: str) -> torch.Tensor:
    """N x H x W, N x H x W x C or N x C x H x W (C in 1, 3) to an N x C x H x W uint8/float32 tensor."""
    if arr.ndim == 3:
        arr = arr[:, None]
    elif arr.ndim == 4 and arr.shape[-1] in (1, 3) and arr.shape[1] not in (1, 3):
        arr = arr.transpose(0, 3, 1, 2)
    elif not (arr.ndim == 4 and arr.shape[1] in (1, 3)):
        raise DatasetError(f"{path}: {key} has shape {arr.shape}; expected N x H x W or N x C x H x W")
    if arr.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(arr))
    if np.issubdtype(arr.dtype, np.floating):
        if arr.size and (arr.min() < 0 or arr.max() > 1):
            raise DatasetError(f"{path}: {key} is float but not in [0, 1] (range {arr.min()}..{arr.max()})")
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    if np.issubdtype(arr.dtype, np.integer) and (arr.size == 0 or (arr.min() >= 0 and arr.max() <= 255)):
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.uint8))
    raise DatasetError(f"{path}: {key} has dtype {arr.dtype}; expected uint8 or float in [0, 1]")


def _labels(arr, path: Path | str, key: str, n: int, num_classes: int) -> torch.Tensor:
    arr = np.asarray(arr)
    if arr.ndim == 2 and 1 in arr.shape:  # (N, 1) column vectors, as some exporters write
        arr = arr.reshape(-1)
    if arr.ndim != 1 or len(arr) != n:
        raise DatasetError(f"{path}: {key} has shape {arr.shape}; expected ({n},) to match the images")
    if not np.issubdtype(arr.dtype, np.integer):
        raise DatasetError(f"{path}: {key} has dtype {arr.dtype}; expected integer class indices")
    if n and (arr.min() < 0 or arr.max() >= num_classes):
        raise DatasetError(f"{path}: {key} has labels {arr.min()}..{arr.max()}; expected 0..{num_classes - 1}")
    return torch.from_numpy(arr.astype(np.int64))


def _from_npz(name: str, path: Path, class_names, mean, std) -> Dataset:
    """Keras-style ``x_train/y_train/x_test/y_test`` arrays; no pickles are loaded."""
    keys = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DatasetError(f"{path}: missing keys {missing} (found {sorted(z.files)}); expected {list(keys)}")
            arrays = {k: z[k] for k in keys}
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - bad zip, truncated file, pickled object arrays...
        raise DatasetError(f"cannot read {path}: {exc}") from exc
    xtr = _to_nchw(arrays["x_train"], path, "x_train")
    xte = _to_nchw(arrays["x_test"], path, "x_test")
    if xtr.shape[1:] != xte.shape[1:]:
        raise DatasetError(f"{path}: x_train images are {tuple(xtr.shape[1:])} but x_test are {tuple(xte.shape[1:])}")
    k = len(class_names)
    return Dataset(
        name=name,
        train_images=xtr,
        train_labels=_labels(arrays["y_train"], path, "y_train", len(xtr), k),
        test_images=xte,
        test_labels=_labels(arrays["y_test"], path, "y_test", len(xte), k),
        class_names=tuple(class_names),
        mean=mean,
        std=std,
        source=str(path),
        extra={"layout": "npz"},
    )


def _torchvision(name: str, fn, tv_root: Path, download: bool):
    """Call a torchvision dataset constructor, turning its errors into ones that name the folder."""
    try:
        return fn(str(tv_root), download)
    except (RuntimeError, OSError, ValueError) as exc:
        raise DatasetError(f"{name}: cannot read torchvision files under {tv_root}: {exc}") from exc


def _not_found(name: str, root: Path, looked_for: str) -> DatasetError:
    return DatasetError(f"{name}: nothing usable under {root}: looked for {looked_for}; pass download=True to fetch it")


# --------------------------------------------------------------------------- MNIST-like


def _load_mnist_like(name, root, download, *, npz_names, tv_name, aliases, class_names, mean, std) -> Dataset:
    root = _require_root(name, root, download)
    if root.is_file():
        if root.suffix.lower() == ".npz":
            return _from_npz(name, root, class_names, mean, std)
        raise DatasetError(f"{name}: {root} is a file but not an .npz; pass the .npz or a folder")
    for folder in [root, *(root / a for a in aliases)]:
        for n in npz_names:
            if (folder / n).is_file():
                return _from_npz(name, folder / n, class_names, mean, std)
    tv_root = _torchvision_root(root, tv_name)
    if tv_root is None:
        if not download:
            raise _not_found(name, root, f"{' or '.join(npz_names)} or a torchvision {tv_name}/raw folder")
        tv_root = root
    import torchvision  # imported late: it costs ~2 s and the .npz path does not need it

    tv_cls = getattr(torchvision.datasets, tv_name)
    train = _torchvision(name, lambda r, d: tv_cls(r, train=True, download=d), tv_root, download)
    test = _torchvision(name, lambda r, d: tv_cls(r, train=False, download=d), tv_root, download)
    return Dataset(
        name=name,
        train_images=train.data[:, None].contiguous(),
        train_labels=train.targets.to(torch.int64),
        test_images=test.data[:, None].contiguous(),
        test_labels=test.targets.to(torch.int64),
        class_names=tuple(class_names),
        mean=mean,
        std=std,
        source=str(Path(tv_root) / tv_name),
        extra={"layout": "torchvision"},
    )


@register_dataset("mnist")
def load_mnist(root: Path | None, download: bool = False) -> Dataset:
    """MNIST: ``mnist.npz`` (x_train/y_train/x_test/y_test) or a torchvision ``MNIST/`` folder."""
    return _load_mnist_like(
        "mnist", root, download, npz_names=("mnist.npz",), tv_name="MNIST", aliases=("mnist", "MNIST"),
        class_names=MNIST_CLASSES, mean=(0.1307,), std=(0.3081,),
    )


@register_dataset("fashionmnist")
def load_fashionmnist(root: Path | None, download: bool = False) -> Dataset:
    """Fashion-MNIST: ``fashion-mnist.npz``/``fashionmnist.npz`` or a torchvision ``FashionMNIST/`` folder."""
    return _load_mnist_like(
        "fashionmnist", root, download, npz_names=("fashion-mnist.npz", "fashionmnist.npz"),
        tv_name="FashionMNIST", aliases=("fashionmnist", "fashion-mnist", "FashionMNIST"),
        class_names=FASHIONMNIST_CLASSES, mean=(0.2861,), std=(0.3530,),
    )


# --------------------------------------------------------------------------- CIFAR


def _load_cifar(name, root, download, *, tv_name, base_folder, aliases, num_classes, mean, std) -> Dataset:
    root = _require_root(name, root, download)
    if is_archive(root):
        root = extracted_tree(root)
    tv_root = _torchvision_root(root, base_folder)
    if tv_root is None:
        tree = split_tree(root, aliases)
        if tree is not None:
            return _load_tree(name, tree, channels=3, mean=mean, std=std, num_classes=num_classes)
        if not download:
            raise _not_found(
                name, root,
                f"{base_folder}/ (torchvision) or train/ + test/ class folders (ImageFolder, also under {'/, '.join(aliases)}/)",
            )
        tv_root = root
    import torchvision  # imported late: it costs ~2 s and the ImageFolder path does not need it

    tv_cls = getattr(torchvision.datasets, tv_name)
    train = _torchvision(name, lambda r, d: tv_cls(r, train=True, download=d), tv_root, download)
    test = _torchvision(name, lambda r, d: tv_cls(r, train=False, download=d), tv_root, download)
    src = Path(tv_root) / base_folder
    return Dataset(
        name=name,
        train_images=torch.from_numpy(np.ascontiguousarray(train.data.transpose(0, 3, 1, 2))),
        train_labels=_labels(train.targets, src, "train labels", len(train.data), len(train.classes)),
        test_images=torch.from_numpy(np.ascontiguousarray(test.data.transpose(0, 3, 1, 2))),
        test_labels=_labels(test.targets, src, "test labels", len(test.data), len(train.classes)),
        class_names=tuple(train.classes),
        mean=mean,
        std=std,
        source=str(src),
        extra={"layout": "torchvision"},
    )


@register_dataset("cifar10")
def load_cifar10(root: Path | None, download: bool = False) -> Dataset:
    """CIFAR-10: torchvision ``cifar-10-batches-py/`` or an ImageFolder tree (mean/std as in the DC code)."""
    return _load_cifar(
        "cifar10", root, download, tv_name="CIFAR10", base_folder="cifar-10-batches-py",
        aliases=("cifar10", "CIFAR10", "cifar-10"), num_classes=10,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010),
    )


@register_dataset("cifar100")
def load_cifar100(root: Path | None, download: bool = False) -> Dataset:
    """CIFAR-100 (fine labels): torchvision ``cifar-100-python/`` or an ImageFolder tree."""
    return _load_cifar(
        "cifar100", root, download, tv_name="CIFAR100", base_folder="cifar-100-python",
        aliases=("cifar100", "CIFAR100", "cifar-100"), num_classes=100,
        mean=(0.5071, 0.4866, 0.4409), std=(0.2673, 0.2564, 0.2762),
    )


# --------------------------------------------------------------------------- SVHN


@register_dataset("svhn")
def load_svhn(root: Path | None, download: bool = False) -> Dataset:
    """SVHN (train + test, no extra): torchvision's ``train_32x32.mat``/``test_32x32.mat``, label 10 read as 0."""
    name = "svhn"
    root = _require_root(name, root, download)
    folder = next((f for f in (root, root / "svhn", root / "SVHN") if (f / "train_32x32.mat").is_file()), None)
    if folder is None:
        if not download:
            raise _not_found(name, root, "train_32x32.mat and test_32x32.mat (also under svhn/ or SVHN/)")
        folder = root
    import torchvision  # imported late: it costs ~2 s

    SVHN = torchvision.datasets.SVHN
    train = _torchvision(name, lambda r, d: SVHN(r, split="train", download=d), folder, download)
    test = _torchvision(name, lambda r, d: SVHN(r, split="test", download=d), folder, download)
    return Dataset(
        name=name,
        train_images=torch.from_numpy(np.ascontiguousarray(train.data)),
        train_labels=_labels(train.labels, folder, "train labels", len(train.data), 10),
        test_images=torch.from_numpy(np.ascontiguousarray(test.data)),
        test_labels=_labels(test.labels, folder, "test labels", len(test.data), 10),
        class_names=MNIST_CLASSES,
        mean=(0.4377, 0.4438, 0.4728),
        std=(0.1980, 0.2010, 0.1970),
        source=str(folder),
        extra={"layout": "torchvision"},
    )


# --------------------------------------------------------------------------- Tiny ImageNet


@register_dataset("tinyimagenet")
def load_tinyimagenet(root: Path | None, download: bool = False) -> Dataset:
    """Tiny ImageNet (64x64 RGB): original ``tiny-imagenet-200`` layout or an ImageFolder tree.

    The held-out split is ``test/<wnid>`` if present, else ``val/<wnid>`` or the original
    ``val/images`` + ``val_annotations.txt`` (the original ``test/`` has no labels).
    """
    name = "tinyimagenet"
    if root is None and download:
        raise DatasetError("tinyimagenet cannot be downloaded by ddlib (torchvision has no loader for it); "
                           "get tiny-imagenet-200.zip and pass its folder (or the zip) as root")
    root = _require_root(name, root, False)
    if is_archive(root):
        root = extracted_tree(root)
    tree = split_tree(root, ("tiny-imagenet-200", "tinyimagenet", "tiny-imagenet"))
    if tree is None:
        raise DatasetError(
            f"{name}: nothing usable under {root}: looked for train/ plus test/ or val/ "
            f"(also under tiny-imagenet-200/); ddlib cannot download it"
        )
    return _load_tree(name, tree, channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
