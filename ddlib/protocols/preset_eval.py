"""Train a set the way a method preset says: labels, loss, augmentation, ZCA and learning-rate policy.

Shared by the Label-Robust and Augmentation-Robust protocols. The distilled set and the random
subset go through exactly the same function with the same preset, teachers, augmentation and
learning-rate policy, so the only difference between the two sides is the images.

Label types:

* ``hard``: the set's labels with the preset's loss (cross-entropy).
* ``stored``: soft labels shipped with the set (DATM-style). A random subset has none, so it is
  trained on its one-hot labels with the same loss (soft cross-entropy of a one-hot row is CE).
* ``teacher``: every augmented batch is relabelled online by the preset's teachers (an ensemble
  is averaged in logit space), trained once per (dataset, architecture, recipe) and kept in MLflow.

Learning-rate policy (``lr_select``): ``validation`` (default) trains the first seed at every lr of
the grid, scores each on a class-stratified split held out of the real training set, and keeps the
best; ``test`` does the same on the test set, reproducing DD-Ranking's choice (it is labelled so in
MLflow); ``none`` uses the preset's lr. The search runs only for presets with ``lr_search: true``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from ddlib.data.distilled import DistilledSet
from ddlib.protocols.presets import Preset, load_preset
from ddlib.protocols.cell import Cell, Evaluation
from ddlib.engine.train import Recipe

__all__ = ["LR_GRID", "LR_SELECT", "resolve_preset", "evaluate_with_preset"]

LR_GRID = [0.001, 0.005, 0.01, 0.05, 0.1]
LR_SELECT = ("validation", "test", "none")


def resolve_preset(spec) -> Preset | None:
    """``None`` (hard labels only), a preset name (``params/methods/<name>.yaml``) or a path."""
    if spec is None:
        return None
    return load_preset(spec)


def _teacher_hook(cell: Cell, preset: Preset, teacher_recipe: Recipe, checkpoints: Sequence[str] | None = None):
    from ddlib.engine.labels import TeacherRelabel
    from ddlib.protocols.teachers import get_teachers

    archs = preset.teacher_archs()
    if checkpoints is not None and len(checkpoints) != len(archs):
        raise ValueError(f"teacher_checkpoints: the preset has {len(archs)} teacher(s) {archs}, "
                         f"but {len(checkpoints)} checkpoint(s) were given")
    key = ("teachers", tuple(archs), teacher_recipe, tuple(checkpoints or ()))
    if key not in cell.cache:
        teachers = []
        for seed, arch in enumerate(archs):  # one seed (or checkpoint) per ensemble member
            teachers += get_teachers(cell.dataset, arch, 1, teacher_recipe, seeds=[seed], device=cell.device,
                                     progress=cell.progress,
                                     checkpoint=checkpoints[seed] if checkpoints is not None else None)
        cell.cache[key] = TeacherRelabel(teachers, loss=preset.loss)
    return cell.cache[key]


def _zca(cell: Cell):
    from ddlib.engine.augment import fit_zca

    if "zca" not in cell.cache:
        ds = cell.dataset
        cell.cache["zca"] = fit_zca(ds.train_images, ds.mean, ds.std, device=cell.device)
    return cell.cache["zca"]


def _targets_and_loss(cell: Cell, preset: Preset, subset: DistilledSet, teacher_recipe: Recipe,
                      teacher_checkpoints: Sequence[str] | None = None):
    """(targets, loss hook, loss name) for ``subset`` under ``preset``'s label type."""
    from ddlib.engine.labels import create_loss, stored_targets

    kind = preset.label_type
    if kind == "teacher":
        hook = _teacher_hook(cell, preset, teacher_recipe, teacher_checkpoints)
        return subset.labels, hook, hook.name
    if kind == "stored" and subset.soft_labels is not None:
        loss, name = create_loss(preset.loss)
        temperature = preset.loss.get("temperature", 1.0)
        return stored_targets(subset, temperature=temperature), loss, f"stored:{name}"
    loss, name = create_loss(preset.loss)
    targets = subset.labels
    if kind == "stored":  # random baseline: no stored labels, one-hot rows with the same loss
        targets = torch.nn.functional.one_hot(subset.labels, subset.num_classes).float()
        name = f"onehot:{name}"
    return targets, loss, name


def evaluate_with_preset(
    cell: Cell,
    role: str,
    subset: DistilledSet,
    preset: Preset,
    seeds: Sequence[int],
    *,
    with_augment: bool = True,
    lr_select: str = "validation",
    lr_grid: Sequence[float] = LR_GRID,
    teacher_recipe: Recipe | None = None,
    teacher_checkpoints: Sequence[str] | None = None,
    epochs: int | None = None,
) -> tuple[list[Evaluation], float]:
    """Train ``subset`` under ``preset`` for every seed and test it; returns the evaluations and the lr used.

    ``epochs`` overrides the preset's epochs (CPU smoke runs); it is part of every evaluation's key.
    """
    from ddlib.engine.augment import create_augment

    if lr_select not in LR_SELECT:
        raise ValueError(f"lr_select must be one of {LR_SELECT}, got {lr_select!r}")
    ds = cell.dataset
    recipe = preset.recipe if epochs is None else replace(preset.recipe, epochs=epochs)
    augment = create_augment(preset.augment if with_augment else [], mean=ds.mean, std=ds.std,
                             num_classes=ds.num_classes)
    augment_name = augment.describe() if augment is not None else "none"
    preprocess = _zca(cell) if preset.zca else None
    preprocess_name = "zca(eps=0.1)" if preset.zca else "none"
    targets, loss, loss_name = _targets_and_loss(cell, preset, subset, teacher_recipe or Recipe(), teacher_checkpoints)
    common = dict(augment=augment, augment_name=augment_name, loss=loss, loss_name=loss_name,
                  preprocess=preprocess, preprocess_name=preprocess_name)

    lr = recipe.lr
    if preset.lr_search and lr_select != "none":
        split = "val" if lr_select == "validation" else "test"
        scores = {}
        for candidate in lr_grid:
            (trial,) = cell.train_eval(f"{role}-lr{candidate:g}-{split}", subset.images, targets,
                                       replace(recipe, lr=float(candidate)), list(seeds)[:1], eval_split=split,
                                       **common)
            scores[float(candidate)] = trial.accuracy
        lr = max(scores, key=lambda c: (scores[c], -c))  # ties: the smaller lr
        cell.tracker.set_tags(cell.run_id, {f"ddlib.lr_select.{role}": f"{lr_select}: chose {lr:g} of {sorted(scores)}"
                                            + (" (selected on the TEST set, as the peer does)" if split == "test" else "")})
        cell.tracker.log_metrics(cell.run_id, {f"{role}_lr": lr})
    results = cell.train_eval(role, subset.images, targets, replace(recipe, lr=float(lr)), seeds, **common)
    return results, float(lr)
