"""An ImageFolder tree of image files (PNG, JPEG, BMP, TIFF, WebP, PPM/PGM), ``<path>/<class>/<file>``,
class folders named by the dataset's class names or by indices ``0..C-1`` (ASCII digits); a class
folder holding anything else (a dangling link, a text file) is refused, hidden files are skipped.
Pixels as float in [0, 1] (16-bit PNGs keep their depth)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ddlib.data.decode import image_array
from ddlib.data.formats.base import DistilledSetError, SetPath, set_format, short
from ddlib.data.tree_scan import IMAGE_EXTENSIONS


def detect(src: SetPath) -> bool:
    """A directory with at least one visible sub-folder (a class folder)."""
    return src.path.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in src.path.iterdir())


@set_format("imagefolder", priority=50, detect=detect,
            detects="an ImageFolder directory")
def read(src: SetPath) -> dict:
    """Every image of every class folder, decoded to the dataset's channels and checked against its image shape."""
    from PIL import Image

    path, dataset = src.path, src.dataset
    folders = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = [p.name for p in folders]
    index_of = {n: i for i, n in enumerate(dataset.class_names)}
    if all(n in index_of for n in names):
        classes = [index_of[n] for n in names]
    elif all(_class_index(n, dataset.num_classes) is not None for n in names):
        classes = [_class_index(n, dataset.num_classes) for n in names]
    else:
        unknown = [n for n in names if n not in index_of and _class_index(n, dataset.num_classes) is None]
        raise DistilledSetError(
            f"{path}: class folders not recognised: {', '.join(unknown) or ', '.join(names)}; expected the class names "
            f"of {dataset.name} ({', '.join(dataset.class_names[:10])}{', ...' if dataset.num_classes > 10 else ''}) "
            f"or indices 0..{dataset.num_classes - 1}, not a mix"
        )
    if len(set(classes)) != len(classes):
        raise DistilledSetError(f"{path}: two class folders name the same class: {', '.join(names)}")
    mode = {1: "L", 3: "RGB"}.get(dataset.channels)
    if mode is None:
        raise DistilledSetError(f"{path}: cannot read images for a {dataset.channels}-channel dataset")
    images, labels, ignored = [], [], []
    for folder, c in sorted(zip(folders, classes), key=lambda fc: fc[1]):
        for file in _image_files(path, folder, ignored):
            try:
                with Image.open(file) as img:
                    arr = image_array(img, mode, full_range=True)  # float pixels: 16-bit PNGs keep their depth
            except Exception as exc:
                raise DistilledSetError(
                    f"{path}: unreadable or corrupt image {file.relative_to(path)} ({type(exc).__name__}: {short(exc)})"
                ) from exc
            arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
            if arr.shape != tuple(dataset.image_shape):
                raise DistilledSetError(
                    f"{path}: image shape does not match the dataset: expected {tuple(dataset.image_shape)} for "
                    f"{dataset.name}, got {arr.shape} in {file.relative_to(path)}"
                )
            images.append(arr)
            labels.append(c)
    if not images:
        raise DistilledSetError(f"{path}: no {'/'.join(IMAGE_EXTENSIONS)} images in the class folders")
    return {
        "images": np.stack(images).astype(np.float32),
        "labels": np.asarray(labels, dtype=np.int64),
        "default_normalized": False,
        "stem": path.name,
        "provenance": {"ignored_files": ignored[:20] + ([f"... {len(ignored) - 20} more"] if len(ignored) > 20 else [])}
        if ignored else None,
    }


def _class_index(name: str, num_classes: int) -> int | None:
    """A class folder named by its index: ASCII digits only (``"²".isdigit()`` is true, ``int("²")`` fails)."""
    if re.fullmatch(r"[0-9]+", name) and int(name) < num_classes:
        return int(name)
    return None


def _image_files(root: Path, folder: Path, ignored: list[str]) -> list[Path]:
    """The images of one class folder, sorted. A file that is no image (notes, metadata) is skipped
    and listed in ``ignored``; an image this reader cannot take (``.gif``), a dangling link or a
    subfolder is refused rather than dropped without a word: the set would silently lose images."""
    from PIL import Image

    files = []
    for f in sorted(folder.iterdir()):
        if f.name.startswith("."):
            continue
        where = f.relative_to(root)
        if f.is_symlink() and not f.exists():
            raise DistilledSetError(f"{root}: {where} is a dangling link (its target does not exist)")
        if not f.is_file():
            raise DistilledSetError(f"{root}: {where} is not an image file (class folders hold images only)")
        suffix = f.suffix.lower()
        if suffix in IMAGE_EXTENSIONS:
            files.append(f)
        elif suffix in Image.registered_extensions():
            raise DistilledSetError(f"{root}: {where} is an image format this reader does not take ({suffix}); save it "
                                    f"as one of {', '.join(IMAGE_EXTENSIONS)} (PNG keeps every pixel)")
        else:
            ignored.append(str(where))
    return files
