"""MTT output (also DATM, FTD): ``images_<tag>.pt`` and ``labels_<tag>.pt`` (optionally ``lr_<tag>.pt``)
in one folder, given as the folder (``<tag>`` = ``best``) or as the path of ``images_<tag>.pt``.
Images normalised with the dataset's mean/std; labels hard (N) or soft (N x C float)."""

from __future__ import annotations

import re
from pathlib import Path

from ddlib.data.formats.base import DistilledSetError, SetPath, set_format, torch_load

_IMAGES = re.compile(r"^images_(?P<tag>.+)\.pt$")


def _images_file(src: SetPath) -> Path | None:
    """The ``images_<tag>.pt`` an MTT set at ``src.path`` starts from, or None if it is no MTT set."""
    path = src.path
    if path.is_dir():
        return path / "images_best.pt" if (path / "images_best.pt").is_file() else None
    match = _IMAGES.match(path.name)
    return path if match and (path.parent / f"labels_{match['tag']}.pt").is_file() else None


def files(path: Path) -> list[Path] | None:
    """The files an MTT set at ``path`` would load (None: ``path`` is no MTT layout)."""
    if path.is_dir():
        return [path / name for name in ("images_best.pt", "labels_best.pt", "lr_best.pt")]
    if (match := _IMAGES.match(path.name)) is not None:
        return [path, path.parent / f"labels_{match['tag']}.pt", path.parent / f"lr_{match['tag']}.pt"]
    return None


@set_format("mtt", priority=10, files=files, detect=lambda src: _images_file(src) is not None,
            detects="an MTT directory or images_<tag>.pt")
def read(src: SetPath) -> dict:
    """The ``images_<tag>.pt``, ``labels_<tag>.pt`` and optional ``lr_<tag>.pt`` of one MTT run (normalised images)."""
    images_path = _images_file(src)
    assert images_path is not None
    stem = src.path.name if src.path.is_dir() else (src.path.parent.name or src.path.stem)
    tag = _IMAGES.match(images_path.name)["tag"]  # type: ignore[index]
    folder = images_path.parent
    labels_path, lr_path = folder / f"labels_{tag}.pt", folder / f"lr_{tag}.pt"
    if not labels_path.is_file():
        raise DistilledSetError(f"{images_path}: missing keys: no labels_{tag}.pt next to {images_path.name}")
    images, _ = torch_load(images_path, src.trusted)
    labels, _ = torch_load(labels_path, src.trusted)
    lr = torch_load(lr_path, src.trusted)[0] if lr_path.is_file() else None
    return {
        "images": images,
        "labels": labels,
        "lr": lr,
        "default_normalized": True,
        "stem": stem,
        "provenance": {"files": [p.name for p in (images_path, labels_path, lr_path) if p.is_file()]},
    }
