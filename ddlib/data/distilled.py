"""Distilled sets: one in-memory type for every method's output, and loaders for the common formats.

A :class:`DistilledSet` always holds float pixels (nominally in [0, 1]) so that every protocol
normalises the same way, whatever the file stored. Synthetic images may stray slightly
outside [0, 1] after de-normalisation; they are kept as they are (clamping would change the set).

Formats :func:`load` reads are registered readers, one file each in :mod:`ddlib.data.formats` (DC/DSA/DM
``.pt`` results, MTT output, the plain ``.pt`` dict :func:`save` writes, ``.npz``, ImageFolder trees of
image files); the first whose ``detect`` accepts the path reads it, and adding a format is one file.

ZCA space: MTT and DATM run with ``--zca`` save their images *whitened* (kornia's ZCA of the
[0, 1] pixels, fitted on the whole training set). Such a set is read with ``zca_space=True`` (the caller's flag, or
``zca_space`` stored in the file): its values are kept as stored, neither de-normalised nor range-checked, and the set is
marked ``zca_space``. Turning it back into pixels needs the whitening fitted on the real data
(:func:`ddlib.engine.augment.zca.zca_to_pixels`), which this data layer does not hold: the protocol
that obtains the set does it (:func:`ddlib.protocols.common.obtain`), so every set reaches training
as pixels and a preset with ``zca: true`` whitens it back to the stored values, like the test images.

Security: ``.pt`` files are read with ``torch.load(weights_only=True)`` (numpy scalars and arrays
allow-listed, :data:`NUMPY_SAFE_GLOBALS`); anything else in a file would need full unpickling, which
can run arbitrary code: :func:`load` refuses it unless called with ``trusted=True`` (``trusted: true``
in a grid's file source).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ddlib.data import formats
from ddlib.data.formats import NUMPY_SAFE_GLOBALS, DistilledSetError, SetPath, needs_unpickling
from ddlib.data.formats.base import plain, short

if TYPE_CHECKING:  # ddlib.data.datasets imports the file-backed loaders; keep this module light to import
    from ddlib.data.datasets import Dataset

__all__ = ["DistilledSet", "DistilledSetError", "load", "save", "validate", "image_grid", "grid_layout", "grid_tensor",
           "needs_unpickling",
           "NUMPY_SAFE_GLOBALS", "NORMALIZED_RANGE"]

# Values a set read as pixels may reach before we suspect it was really stored normalised.
PIXEL_RANGE_SLACK = (-0.5, 1.5)
# Pixels a set de-normalised by its format's default may reach before we suspect the guess (or the
# file) is wrong: published DC sets reach [-1.4, 2.6]; a set stored as 0-255 floats reaches ~60.
NORMALIZED_RANGE = (-10.0, 11.0)
# Pixels a caller declared (normalized: false) may reach: unclamped synthetic pixels (published DC sets
# de-normalised reach [-1.4, 2.6]; normalised CIFAR-10 read as pixels [-2.5, 2.8]), never 0-10 or 0-255 values.
DECLARED_PIXEL_RANGE = (-3.0, 4.0)


@dataclass(eq=False)
class DistilledSet:
    """A distilled set as every protocol trains on it: pixels, hard labels and what the file says about them."""
    images: torch.Tensor  # N x C x H x W float32 pixels (uint8 only for the "full" source: the real training set)
    labels: torch.Tensor  # N int64 hard labels
    num_classes: int
    soft_labels: torch.Tensor | None = None  # N x num_classes, per-image targets shipped with the set
    learned_lr: float | None = None  # MTT-style learned learning rate, if the method ships one
    zca_space: bool = False  # images are ZCA-whitened values, not pixels (see the module docstring)
    method: str = ""
    source: str = ""  # file path or recipe that produced it
    provenance: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def class_counts(self) -> list[int]:
        """Images of each class, by class index (0 for a class the set lacks): :attr:`ipc` and the balance checks read it."""
        return torch.bincount(self.labels, minlength=self.num_classes).tolist()

    @property
    def ipc(self) -> int:
        """Images per class (the largest class count when classes are unequal)."""
        return max(self.class_counts)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])  # type: ignore[return-value]

    def __repr__(self) -> str:
        soft = ", soft_labels" if self.soft_labels is not None else ""
        return f"DistilledSet(method={self.method!r}, n={len(self)}, ipc={self.ipc}, shape={self.image_shape}{soft})"


# --------------------------------------------------------------------------- public API


def load(
    path: str | os.PathLike,
    dataset: Dataset,
    *,
    allow_unequal: bool = False,
    normalized: bool | None = None,
    method: str | None = None,
    experiment_index: int = -1,
    zca_space: bool | None = None,
    trusted: bool = False,
) -> DistilledSet:
    """Read a distilled set in any supported format and check it against ``dataset``.

    ``normalized`` overrides the format's default (DC and MTT files are normalised; plain,
    ``.npz`` and image files hold pixels). Normalised images are de-normalised with the
    dataset's mean/std so every set reaches the protocols as pixels. ``experiment_index`` picks one
    of a DC file's experiments (default: the last). ``method``
    defaults to the name stored in the file, else the file (or folder) stem. ``zca_space`` (default:
    the file's own ``zca_space`` flag, else false) says the images are ZCA-whitened: they are kept as
    stored and the set is marked so (see the module docstring).

    Pixels far outside [0, 1] (after de-normalising) are refused rather than trained on, whether
    the normalisation was declared (by the caller or the file) or guessed from the format; a guess
    is held to a tighter range, where a wrong guess shows. ``uint8`` images are pixels whatever the
    format says. Flags (``normalized``, ``zca_space``) are booleans: a string is refused.

    ``trusted=True`` allows full unpickling of a ``.pt`` file the safe loader refuses (it can run
    arbitrary code: only for files you trust). Raises :class:`DistilledSetError` (message starting
    with ``path``) for anything unreadable or inconsistent with ``dataset``.
    """
    path = Path(path)
    for key, value in (("normalized", normalized), ("zca_space", zca_space), ("trusted", trusted)):
        if value is not None and not isinstance(value, bool):
            raise DistilledSetError(f"{path}: {key} must be true, false or None, got {value!r}")
    if not path.exists():
        raise DistilledSetError(f"{path}: no such file or directory")
    raw = formats.read(SetPath(path, dataset, experiment_index, trusted))

    images = _as_tensor(raw["images"], path, "images")
    labels = _as_tensor(raw["labels"], path, "labels")
    soft = raw.get("soft_labels")
    soft = _as_tensor(soft, path, "soft_labels").float() if soft is not None else None
    # A 2-D float label tensor is a soft-label matrix (e.g. DATM-style MTT output).
    if labels.ndim == 2 and labels.is_floating_point():
        if soft is None:
            soft = labels.float()
        labels = labels.argmax(dim=1)
    images = _layout(images, dataset.channels)
    # Explicit statements (caller, or a flag in the file) beat the format's default guess.
    explicit = normalized if normalized is not None else raw.get("normalized")
    is_normalized = bool(explicit) if explicit is not None else raw["default_normalized"]
    if images.dtype == torch.uint8:  # 0-255 pixels, whatever the format's default says
        if explicit:
            raise DistilledSetError(f"{path}: images are uint8 (0-255 pixels) but the set is declared normalised; "
                                    "drop normalized: true")
        images, is_normalized = images.float().div_(255.0), False
    elif images.is_floating_point():
        images = images.detach().float()

    whitened = bool(zca_space) if zca_space is not None else bool(raw.get("zca_space") or False)
    provenance = dict(raw.get("provenance") or {})
    provenance.setdefault("format", raw["format"])
    lr = raw.get("lr")
    ds = DistilledSet(
        images=images,
        labels=labels,
        num_classes=dataset.num_classes,
        soft_labels=soft,
        learned_lr=_as_float(lr, path, "lr") if lr is not None else None,
        method=method if method is not None else (raw.get("method") or raw["stem"]),
        source=str(path),
        provenance=provenance,
        zca_space=whitened,
    )
    if whitened:
        provenance["zca_space"] = "stored ZCA-whitened; turned into pixels with the cell's whitening"
    elif is_normalized and images.is_floating_point() and images.ndim == 4 and images.shape[1] == dataset.channels:
        ds.images = denormalize(images, dataset.mean, dataset.std)

    validate(ds, dataset, path, allow_unequal)
    ds.labels = ds.labels.long()
    ds.images = ds.images.contiguous()

    if not whitened:
        _check_range(ds.images, path, dataset.name, raw["format"], is_normalized, explicit is not None)
    return ds


def _check_range(images: torch.Tensor, path: Path, dataset: str, fmt: str, normalized: bool, declared: bool) -> None:
    """Refuse pixels that no image holds, whatever the flag said: a flag picks the transform
    (de-normalise or not), never whether the result is checked. Read as pixels by the format's guess,
    the bound is tight (:data:`PIXEL_RANGE_SLACK`: a wrong guess shows there); declared pixels may go
    a little further (:data:`DECLARED_PIXEL_RANGE`: unclamped synthetic pixels, never 0-10 values);
    de-normalised ones up to :data:`NORMALIZED_RANGE`, wide enough for published DC sets ([-1.4, 2.6])."""
    if images.dtype == torch.uint8 or images.numel() == 0:
        return
    lo, hi = float(images.min()), float(images.max())
    bound = NORMALIZED_RANGE if normalized else DECLARED_PIXEL_RANGE if declared else PIXEL_RANGE_SLACK
    if bound[0] <= lo and hi <= bound[1]:
        return
    said = "declared" if declared else f"the {fmt} format's default"
    # pixels must be in [0, 1] whatever the flag: normalized=False alone never admits 0-16 or 0-255 values
    scale = "scale them to [0, 1] (0-255 values: store them as uint8, or divide by 255)"
    if normalized:
        raise DistilledSetError(
            f"{path}: de-normalised with {dataset}'s mean/std ({said}), the images span [{lo:.3g}, {hi:.3g}] in "
            "pixels, far outside [0, 1]: the file holds something else than normalised images"
            + (f"; if they are pixels in [0, 1] pass normalized=False (normalized: false in the source spec), else {scale}"
               if not declared else ""))
    advice = (f"if the images are normalised with the dataset's mean/std pass normalized=True; if they are pixels, {scale}"
              if not declared else f"pixels (normalized: false) must lie near [0, 1]: {scale}")
    raise DistilledSetError(f"{path}: read as pixels ({said}) but values span [{lo:.3g}, {hi:.3g}], far outside [0, 1]; "
                            f"{advice}")


def validate(ds: DistilledSet, dataset: Dataset, path: str | os.PathLike, allow_unequal: bool = False) -> None:
    """Refuse a set that would silently give a wrong score: wrong shape, bad labels, missing or
    unequal classes, non-finite values. Raises :class:`DistilledSetError` starting with ``path``."""

    def fail(problem: str) -> None:
        raise DistilledSetError(f"{path}: {problem}")

    images, labels, soft = ds.images, ds.labels, ds.soft_labels
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        fail(f"images must be N x C x H x W, got shape {_shape(images)}")
    if tuple(images.shape[1:]) != tuple(dataset.image_shape):
        fail(f"image shape does not match the dataset: expected {tuple(dataset.image_shape)} for {dataset.name}, "
             f"got {tuple(images.shape[1:])}")
    if not images.is_floating_point():
        fail(f"images must be float pixels, got dtype {images.dtype}")
    if len(images) == 0:
        fail("the set holds no images")
    if not isinstance(labels, torch.Tensor) or labels.ndim != 1:
        fail(f"labels must be a 1-D tensor of class indices, got shape {_shape(labels)}")
    if len(labels) != len(images):
        fail(f"number of labels ({len(labels)}) does not match number of images ({len(images)})")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        fail(f"labels must be integer class indices, got dtype {labels.dtype} (cast them to int64)")
    num_classes = dataset.num_classes
    if ds.num_classes != num_classes:
        fail(f"set declares {ds.num_classes} classes but {dataset.name} has {num_classes}")
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if len(bad):
        shown = ", ".join(str(v) for v in sorted(set(bad.tolist()))[:10])
        fail(f"labels out of range: expected 0..{num_classes - 1} for {dataset.name}, found {shown}")
    counts = torch.bincount(labels.long(), minlength=num_classes).tolist()
    missing = [c for c, n in enumerate(counts) if n == 0]
    if missing:
        names = ", ".join(f"{c} ({dataset.class_names[c]})" for c in missing)
        fail(f"classes missing (no images): {names}")
    if not allow_unequal and len(set(counts)) > 1:
        shown = ", ".join(f"{dataset.class_names[c]}={n}" for c, n in enumerate(counts))
        fail(f"unequal images per class ({shown}); pass allow_unequal=True to accept")
    n_bad = int((~torch.isfinite(images)).sum())
    if n_bad:
        fail(f"images contain {n_bad} NaN/Inf values")
    if soft is not None:
        if not isinstance(soft, torch.Tensor) or tuple(soft.shape) != (len(images), num_classes):
            fail(f"soft labels must be N x num_classes = {(len(images), num_classes)}, got {_shape(soft)}")
        n_bad = int((~torch.isfinite(soft.float())).sum())
        if n_bad:
            fail(f"soft labels contain {n_bad} NaN/Inf values")
    if ds.learned_lr is not None and not (math.isfinite(ds.learned_lr) and ds.learned_lr > 0):
        fail(f"the learned learning rate (lr) must be a positive finite number, got {ds.learned_lr}")


def save(ds: DistilledSet, path: str | os.PathLike) -> Path:
    """Write ``ds`` as a plain ``.pt`` dict (pixels, ``normalized: False``) that :func:`load` reads
    back identically and that ``torch.load(weights_only=True)`` accepts (no pickled objects)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "images": ds.images.detach().cpu().float().contiguous(),
        "labels": ds.labels.detach().cpu().long().contiguous(),
        "normalized": False,
        "zca_space": bool(ds.zca_space),
        "method": ds.method,
        "provenance": plain(ds.provenance),
    }
    if ds.soft_labels is not None:
        payload["soft_labels"] = ds.soft_labels.detach().cpu().float().contiguous()
    if ds.learned_lr is not None:
        payload["lr"] = float(ds.learned_lr)
    torch.save(payload, path)
    return path


def grid_layout(ds: DistilledSet, max_per_class: int = 10) -> dict:
    """The layout :func:`grid_tensor` draws (recorded beside the PNG so a report can cut it back into
    labelled tiles): one line per class, ``columns`` images each, tiles of H x W, ``padding`` pixels."""
    return {"rows": ds.num_classes, "columns": max(1, min(max_per_class, max(ds.class_counts))),
            "tile": list(ds.image_shape[1:]), "padding": 2}


def grid_tensor(ds: DistilledSet, max_per_class: int = 10) -> torch.Tensor:
    """A C x H x W image with one row per class (up to ``max_per_class`` images each). Pixels are
    clamped to [0, 1] for display only; empty slots stay black."""
    from torchvision.utils import make_grid

    images = ds.images.detach().cpu()
    images = images.float().div_(255.0) if images.dtype == torch.uint8 else images.float()
    labels = ds.labels.detach().cpu().long()
    layout = grid_layout(ds, max_per_class)
    ncol = layout["columns"]
    tiles = torch.zeros((ds.num_classes * ncol, *images.shape[1:]))
    for c in range(ds.num_classes):
        picked = images[labels == c][:ncol]
        tiles[c * ncol : c * ncol + len(picked)] = picked
    tiles = torch.nan_to_num(tiles).clamp_(0.0, 1.0)
    return make_grid(tiles, nrow=ncol, padding=layout["padding"], pad_value=1.0)


def image_grid(ds: DistilledSet, path: str | os.PathLike, max_per_class: int = 10) -> Path:
    """Save :func:`grid_tensor` as a PNG, for a quick look at a set in MLflow."""
    from torchvision.utils import save_image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_image(grid_tensor(ds, max_per_class), path)
    return path


def denormalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Undo ``(x - mean) / std`` per channel: normalised images back to pixels."""
    m = torch.tensor(mean, dtype=images.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=images.dtype).view(1, -1, 1, 1)
    return images * s + m


# --------------------------------------------------------------------------- helpers


def _as_tensor(value: Any, path: Path, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise DistilledSetError(f"{path}: {what} is an object array, expected numbers")
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (list, tuple)):
        try:
            return torch.as_tensor(np.asarray(value))
        except Exception as exc:
            raise DistilledSetError(f"{path}: {what} is not a numeric array ({short(exc)})") from exc
    raise DistilledSetError(f"{path}: {what} must be a tensor or array, got {type(value).__name__}")


def _as_float(value: Any, path: Path, what: str) -> float:
    try:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        arr = np.asarray(value, dtype=np.float64)
        if arr.size != 1:
            raise ValueError(f"{arr.size} values")
        return float(arr.reshape(-1)[0])
    except Exception as exc:
        raise DistilledSetError(f"{path}: {what} must be a single number, got {_shape(value)}") from exc


def _layout(images: torch.Tensor, channels: int) -> torch.Tensor:
    """NHWC -> NCHW and N x H x W -> N x 1 x H x W, so every format ends up NCHW."""
    if images.ndim == 3:
        return images.unsqueeze(1)
    if images.ndim == 4 and images.shape[-1] == channels and images.shape[1] != channels:
        return images.permute(0, 3, 1, 2).contiguous()
    return images


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return str(tuple(shape)) if shape is not None else type(value).__name__
