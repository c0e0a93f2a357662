"""DC-Bench's augmentation lens: one set's accuracy under each augmentation (one grid cell).

The set is trained with DC-Bench's recipe under every augmentation of ``augmentations`` (300
epochs without augmentation, 1000 with). Per seed it reports the accuracy under each, and three
summaries DC-Bench reads off its table: without augmentation (``acc_noaug``), the mean over the
augmentations (``acc_aug_avg``) and the best of them (``acc_aug_best``). The best is DC-Bench's:
the augmentation with the highest mean over seeds, reported with that augmentation's accuracies
(so its mean ± std is that augmentation's; its name is the tag ``ddlib.aug_best``), never the
mean of per-seed maxima. Random and K-Center subsets of the same size are rows of the same grid
(``method: [dc, random, kcenter]``), trained identically.

The policy ops (``autoaugment``, ``randaugment``, ``imagenet_aug``) draw once per batch, as DC-Bench's
torchvision calls on the whole batch do (at IPC 1 to 10 the set is one batch, so every image of an
epoch shares one draw): one behaviour under one name, here, in the notebook, ``ddlib score`` and the
params files. Per-image draws are a named option, ``{autoaugment: {draw: image}}``, reported as
``acc_autoaugment_per_image`` (REVISION 4; before, the default drew per image under the bare name).
Trainings follow DC-Bench's schedule (``scheduler: dc_step``, :mod:`ddlib.protocols.dcbench`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.spec import IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.protocols.common import SET_PARAMS, obtain, validate_set_params
from ddlib.protocols.dcbench import (RECIPE_PARAMS, TrainingCondition, accuracy_rows, augment_label, best_by_mean,
                                     check_augment, check_cell_convnets, check_recipe_params, convnet_for_images,
                                     setting_recipe, mean_std_table, train_settings)

__all__ = ["PROTOCOL", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "AugmentationResult"]

SPEC = ProtocolSpec(
    name="augmentation", revision=6, order=40, title="DC-Bench: accuracy without and with augmentation",
    summary="a set's accuracy under each of DC-Bench's augmentations (none, DSA, AutoAugment, RandAugment, ImageNet's)",
    params={
        **SET_PARAMS,
        **RECIPE_PARAMS,
        "augmentations": Param(["none", "dsa", "autoaugment", "randaugment", "imagenet_aug"],
                               "DC-Bench's five settings, each one op of ddlib.engine.augment (a name or {op: {params}}); "
                               "the policies draw once per batch, as DC-Bench", "list"),
    },
    boards=(Board("augmentation", "DC-Bench: accuracy without and with augmentation",
                  "ddlib.protocols.dcbench_boards:augmentation_leaderboard", "acc_aug_avg", "accuracy, mean over augmentations",
                  columns=(("acc_noaug", "no augmentation"), ("acc_aug_avg", "average over the augmentations"),
                           ("acc_aug_best", "best augmentation (highest mean over seeds)")),
                  more_columns=True, variant=("model",),
                  heading="DC-Bench: accuracy (%) under each augmentation"),),
    headline="augmentation",
    history=("2: best augmentation = highest mean over seeds (was: mean of per-seed maxima)",
             "3: trainings default to precision auto (bf16 where the device computes it natively)",
             "4: DC-Bench's schedule by default (scheduler dc_step); policy ops draw once per batch by default (DC-Bench)",
             f"5: {LAYOUT_REVISION}",
             f"6: {IDENTITY_REVISION}"
              "; the 4-layer ConvNet (convnet_d4) by default on 64 px data (Tiny ImageNet), a 3-layer ConvNet "
              "refused there"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()


def validate(params: dict) -> dict:
    """Check an augmentation cell's params before anything runs (one-line errors naming the key)."""
    p = validate_set_params(PROTOCOL, PARAMS, params)
    convnet_for_images(p, params)
    check_recipe_params(p)
    augs = p["augmentations"]
    if not isinstance(augs, list) or not augs:
        raise ValueError(f"augmentations must be a non-empty list, got {augs!r}")
    labels = [augment_label(a) for a in augs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"augmentations: each op may appear once, got {labels}")
    for spec in augs:
        check_augment(None if spec == "none" else spec, "augmentations")
    return p


@dataclass(kw_only=True)
class AugmentationResult(Result):
    """per_seed: acc_<augmentation>..., acc_noaug, acc_aug_avg, acc_aug_best per seed."""

    labels: list[str]
    best: str | None = None  # the augmentation with the highest mean over seeds (acc_aug_best's)

    def table(self) -> pd.DataFrame:
        return mean_std_table(self.summary, [*self.labels, "aug_avg", "aug_best"])


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """Open the augmentation cell's MLflow run, its configuration resolved and checked before the set is obtained."""
    cell = Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)
    check_cell_convnets(cell, [cell.params["model"]])
    return cell


def evaluate(cell: Cell, distilled: DistilledSet) -> AugmentationResult:
    """Train, test and score: DC-Bench's accuracy of the set under each augmentation (the cell's Result)."""
    p = cell.params
    specs = [None if a == "none" else a for a in p["augmentations"]]
    conditions = [TrainingCondition(augment_label(s), p["model"], setting_recipe(p, s), s) for s in specs]
    with cell.guard():
        evaluations = train_settings(cell, distilled, conditions)
        rows = accuracy_rows(evaluations, p["seeds"])
        augmented = [c.label for c in conditions if c.label != "none"]
        best = best_by_mean({label: [row[f"acc_{label}"] for row in rows] for label in augmented}) if augmented else None
        for row in rows:
            if "none" in evaluations:
                row["acc_noaug"] = row["acc_none"]
            if augmented:
                accs = [row[f"acc_{label}"] for label in augmented]
                row["acc_aug_avg"] = sum(accs) / len(accs)
                row["acc_aug_best"] = row[f"acc_{best}"]
        if best is not None:
            cell.tracker.set_tags(cell.run_id, {"ddlib.aug_best": best})
        per_seed, summary = cell.record_per_seed(rows)
    return AugmentationResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                              labels=[c.label for c in conditions], best=best,
                              run_id=cell.run_id)
