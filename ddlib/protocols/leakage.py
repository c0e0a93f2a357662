"""Every set a cell obtains is checked against the dataset's test split (the whole split, also where
``test_size`` reduces the one the cell scores on) and the cell's validation split
(:func:`ddlib.data.overlap.find_overlap`: exact copies and near-duplicates) before anything trains.

What is recorded on the cell run (tags, so that no per-seed reader takes them for values):
``ddlib.leakage_test_exact`` / ``_near`` / ``_dataset`` and ``ddlib.leakage_val_exact`` / ``_near``
(counts; ``_dataset``: training images of the set that the dataset itself holds in its test split),
``ddlib.leakage_test_pairs`` / ``ddlib.leakage_val_pairs`` (``set index = split index``, ``~`` for a
near-duplicate), ``ddlib.leakage_measure``, the artifacts ``leakage/leakage.json`` (every match) and
``leakage/<split>_pairs.png`` (each leaked set image beside its split image). Where images leaked, the
cell is flagged (:meth:`Cell.flag`: the console and the notebook warn) and tagged ``ddlib.leakage``,
which every leaderboard shows in its ``sanity`` column.

Strict mode refuses a set with any test image (exact or near) before anything trains: the cell is
FAILED with a one-line message. It is asked for with ``ddlib run --strict``, ``ddlib score --strict``,
``ddlib.score(strict=True)`` or ``DDLIB_STRICT=1`` in the environment (what the runner hands its
kernels: a refusal changes no number, so it is no parameter and no part of any key).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from ddlib.data.distilled import DistilledSet
from ddlib.data.overlap import MEASURE, Overlap, digests, find_overlap
from ddlib.store.tags import LEAKAGE_TAG

__all__ = ["LEAKAGE_TAG", "STRICT_ENV", "STRICT_TAG", "LeakageRefused", "check_set", "strict_from_env",
           "test_leaked", "pairs_grid"]

STRICT_TAG = "ddlib.strict"  # "1" on a cell run in strict mode
STRICT_ENV = "DDLIB_STRICT"
SPLIT_NAMES = {"test": "test", "val": "validation"}
MAX_TAG = 5000  # MLflow's tag value limit
MIN_SIDE = 32  # pixels: smaller images are enlarged (nearest) in the pairs grid


class LeakageRefused(ValueError):
    """Strict mode: the set holds test images."""


def strict_from_env() -> bool:
    """Strict mode asked for by the environment (``DDLIB_STRICT`` set to anything but ``0`` or nothing)."""
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0")


def check_set(cell, distilled: DistilledSet) -> dict[str, Overlap]:
    """Check ``distilled`` (pixels) against the cell's test split and, where it holds one out, its
    validation split; log, flag, and in strict mode refuse (:class:`LeakageRefused`). The test split is
    the dataset's whole one, as the dry run checks it (:func:`ddlib.protocols.inputs.set_leakage`): a
    reduced one (``test_size``) hides no test image the set holds."""
    whole = _whole_dataset(cell)
    training = set(digests(whole.train_images))  # the data a set may use: the whole training split
    overlaps = {"test": find_overlap(distilled.images, whole.test_images, "test", training, device=cell.device)}
    if cell.validation is not None:  # a set may use the pool, not the images held out to score lr searches on
        pool = set(digests(cell.dataset.train_images))
        overlaps["val"] = find_overlap(distilled.images, cell.validation[0], "val", pool, device=cell.device)
    splits = {"test": whole.test_images, "val": cell.validation[0] if cell.validation is not None else None}
    _log(cell, distilled, overlaps, splits)
    summaries = [o.summary(SPLIT_NAMES[name]) for name, o in overlaps.items() if o.leaked]
    if summaries:
        cell.tracker.set_tags(cell.run_id, {LEAKAGE_TAG: f"leakage: {'; '.join(summaries)}"[:MAX_TAG]})
    test = overlaps["test"]
    if cell.strict and test.leaked:
        raise LeakageRefused(f"strict: the set holds test images of {cell.dataset.label}: {test.summary()} "
                             f"({test.pairs(4)}); refused before training (the pairs: the cell's leakage/test_pairs.png; "
                             "without --strict it is scored and flagged)")
    for name, overlap in overlaps.items():
        if overlap.leaked:
            consequence = ("its test accuracies are not a result" if name == "test"
                           else "the lr search was scored on images the set holds")
            cell.flag(f"leakage: {overlap.summary(SPLIT_NAMES[name])} ({overlap.pairs(4)}): {consequence}")
    return overlaps


def _whole_dataset(cell):
    """The cell's dataset before ``train_per_class`` / ``test_size`` reduced it (cached by
    :func:`ddlib.data.datasets.load_dataset`: no second read)."""
    data = cell.unsplit if cell.unsplit is not None else cell.dataset
    if not data.extra.get("reduced"):
        return data
    from ddlib.data.datasets import load_dataset

    return load_dataset(cell.params["dataset"], cell.params.get("data_root"))


def test_leaked(tags: dict) -> int:
    """How many test images a finished cell's set held (0 where it was not checked)."""
    return sum(int(tags.get(f"ddlib.leakage_test_{kind}", 0) or 0) for kind in ("exact", "near"))


def _log(cell, distilled: DistilledSet, overlaps: dict[str, Overlap], splits: dict) -> None:
    tags = {"ddlib.leakage_measure": MEASURE}
    if cell.strict:
        tags[STRICT_TAG] = "1"
    record = {"measure": MEASURE, "set_size": len(distilled)}
    for name, overlap in overlaps.items():
        tags[f"ddlib.leakage_{name}_exact"] = str(len(overlap.exact))
        tags[f"ddlib.leakage_{name}_near"] = str(len(overlap.near))
        if name == "test":
            tags["ddlib.leakage_test_dataset"] = str(len(overlap.dataset))
        if overlap.leaked:
            tags[f"ddlib.leakage_{name}_pairs"] = ",".join(
                f"{m.index}{'=' if m.exact else '~'}{m.split_index}" for m in overlap.leaked)[:MAX_TAG]
        record[name] = {"split_size": overlap.size, "threshold": overlap.threshold,
                        "matches": [{"set": m.index, name: m.split_index, "distance": m.distance, "exact": m.exact,
                                     "dataset_duplicate": m.training} for m in overlap.matches]}
    cell.tracker.set_tags(cell.run_id, tags)
    cell.tracker.log_dict(cell.run_id, record, "leakage/leakage.json")
    with tempfile.TemporaryDirectory() as tmp:
        for name, overlap in overlaps.items():
            if overlap.leaked:
                path = pairs_grid(distilled.images, splits[name], overlap, Path(tmp) / f"{name}_pairs.png")
                cell.tracker.log_artifact(cell.run_id, path, "leakage")


def pairs_grid(images: torch.Tensor, split_images: torch.Tensor, overlap: Overlap, path: str | os.PathLike,
               limit: int = 64, per_row: int = 4) -> Path:
    """A PNG of the leaked set images, each beside the split image it matches (``per_row`` pairs a row)."""
    from torchvision.utils import save_image

    shown = overlap.leaked[:limit]
    tiles = []
    for m in shown:
        own = images[m.index].detach().cpu().float().clamp(0, 1)
        other = split_images[m.split_index].detach().cpu()
        other = other.float() / 255 if other.dtype == torch.uint8 else other.float().clamp(0, 1)
        if other.shape[0] != own.shape[0]:
            other = other.mean(0, keepdim=True).expand(own.shape[0], -1, -1)
        if other.shape[1:] != own.shape[1:]:
            other = torch.nn.functional.interpolate(other[None], size=own.shape[1:], mode="bilinear")[0]
        tiles += [own, other]
    grid = torch.stack(tiles)
    if grid.shape[-1] < MIN_SIDE:  # 8 x 8 digits: big enough to see
        grid = torch.nn.functional.interpolate(grid, scale_factor=-(-MIN_SIDE // grid.shape[-1]), mode="nearest")
    path = Path(path)
    save_image(grid, path, nrow=2 * min(per_row, len(shown)), padding=2, pad_value=1.0)
    return path

