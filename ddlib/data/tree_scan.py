"""ImageFolder trees on disk: ``<tree>/train/<class>/...`` with a labelled ``test/<class>``, ``val/<class>``
or Tiny ImageNet's ``val/images`` + ``val_annotations.txt``. Scanning only: which files, which labels
(decoding is :mod:`ddlib.data.decode`). Hidden files and folders are skipped; file lists are sorted,
so every machine reads the same order."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ddlib.data.datasets import DatasetError

__all__ = ["IMAGE_EXTENSIONS", "split_tree", "scan_class_split", "scan_eval_split", "read_words"]

# Same extensions torchvision's ImageFolder accepts, compared case-insensitively (Tiny ImageNet uses .JPEG).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def split_tree(root: Path, aliases: Sequence[str] = ()) -> Path | None:
    """The folder holding ``train/`` plus ``test/`` or ``val/``: ``root`` itself or ``root/<alias>``."""
    for cand in [root, *(root / a for a in aliases)]:
        if (cand / "train").is_dir() and ((cand / "test").is_dir() or (cand / "val").is_dir()):
            return cand
    return None


def _walk_images(folder: Path) -> list[str]:
    """Image files under ``folder`` (recursive, so ``<class>/images/*.JPEG`` works), sorted by path."""
    out: list[str] = []
    stack = [str(folder)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    if e.is_dir():
                        stack.append(e.path)
                    elif e.name.lower().endswith(IMAGE_EXTENSIONS):
                        out.append(e.path)
        except OSError as exc:
            raise DatasetError(f"cannot list {d}: {exc}") from exc
    out.sort()
    return out


def _class_folders(split_dir: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise DatasetError(f"cannot list {split_dir}: {exc}") from exc


def scan_class_split(split_dir: Path, classes: Sequence[str] | None = None) -> tuple[list[str], list[str], list[int]]:
    """(class names, files, labels) for ``split_dir/<class>/...``; ``classes`` fixes the expected names."""
    found = _class_folders(split_dir)
    if classes is None:
        classes = found
        if not classes:
            raise DatasetError(f"{split_dir} holds no class folders")
    elif list(found) != list(classes):
        raise DatasetError(_class_mismatch(split_dir, classes, found))
    files: list[str] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        fs = _walk_images(split_dir / c)
        if not fs:
            raise DatasetError(f"class folder {split_dir / c} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        files += fs
        labels += [i] * len(fs)
    return list(classes), files, labels


def _class_mismatch(split_dir: Path, expected: Sequence[str], found: Sequence[str]) -> str:
    only_train = sorted(set(expected) - set(found))
    only_here = sorted(set(found) - set(expected))
    return (
        f"class folders of {split_dir} differ from train/: "
        f"missing {only_train[:10]}{'...' if len(only_train) > 10 else ''}, "
        f"extra {only_here[:10]}{'...' if len(only_here) > 10 else ''}"
    )


def scan_eval_split(tree: Path, classes: list[str]) -> tuple[Path, list[str], list[int], list[str]]:
    """The labelled held-out split: ``test/<class>``, ``val/<class>``, or Tiny ImageNet's annotated ``val/``.

    Returns (split folder, files, labels, extra files whose change must invalidate the cache).
    ``test/images/`` alone is Tiny ImageNet's unlabelled test set, so it is skipped, not read as one class.
    """
    test, val = tree / "test", tree / "val"
    if test.is_dir() and _class_folders(test) not in ([], ["images"]):
        _, files, labels = scan_class_split(test, classes)
        return test, files, labels, []
    if val.is_dir():
        ann = val / "val_annotations.txt"
        if ann.is_file():
            files, labels = _read_val_annotations(ann, val, classes)
            return val, files, labels, [str(ann)]
        _, files, labels = scan_class_split(val, classes)
        return val, files, labels, []
    if test.is_dir():
        raise DatasetError(f"{test} holds no class folders (unlabelled test images?) and {val} does not exist")
    raise DatasetError(f"{tree} has train/ but neither test/ nor val/")


def _read_val_annotations(ann: Path, val: Path, classes: list[str]) -> tuple[list[str], list[int]]:
    """Tiny ImageNet's ``val/images/*.JPEG`` labelled by ``val_annotations.txt`` (file<TAB>wnid<TAB>box...)."""
    index = {c: i for i, c in enumerate(classes)}
    pairs: list[tuple[str, int]] = []
    try:
        lines = ann.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {ann}: {exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise DatasetError(f"{ann}:{n}: expected '<file>\\t<class>...', got {line!r}")
        fname, wnid = parts[0].strip(), parts[1].strip()
        if wnid not in index:
            raise DatasetError(f"{ann}:{n}: class {wnid!r} has no folder in train/")
        path = val / "images" / fname
        if not path.is_file():
            raise DatasetError(f"{ann}:{n}: {path} does not exist")
        pairs.append((str(path), index[wnid]))
    if not pairs:
        raise DatasetError(f"{ann} lists no images")
    pairs.sort()
    return [p for p, _ in pairs], [lab for _, lab in pairs]


def read_words(path: Path, classes: Sequence[str]) -> tuple[str, ...]:
    """Readable class names from Tiny ImageNet's ``words.txt`` (wnid<TAB>names); () if unreadable."""
    wanted = set(classes)
    names: dict[str, str] = {}
    try:
        for line in path.read_text(errors="replace").splitlines():
            k, _, v = line.partition("\t")
            if k in wanted:
                names[k] = v.strip()
    except OSError:
        return ()
    return tuple(names.get(c, c) for c in classes)
