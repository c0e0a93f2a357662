"""DD-Ranking's Augmentation-Robust Score for one distilled set (one grid cell).

The distilled set and a random subset of the same size are each trained under the method's
preset twice: with the preset's augmentation and without it (labels, teachers, ZCA and the
learning-rate policy unchanged). Per seed: IOR_aug = acc_syn_aug - acc_rdm_aug, IOR_noaug =
acc_syn_noaug - acc_rdm_noaug, ARS(IOR_aug, IOR_noaug, gamma); mean +- std over seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddlib import metrics
from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.common import (PRESET_PARAMS, SET_PARAMS, check_weight, obtain, open_protocol_cell,
                                    preset_options, validate_common)
from ddlib.protocols.preset_eval import evaluate_with_preset, resolve_preset
from ddlib.methods.select import random_subset

__all__ = ["PROTOCOL", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "AugmentationRobustResult"]

PROTOCOL = "augmentation_robust"
# What this protocol computes, in the keys of its cells: bump it whenever that changes, so nothing
# computed under an earlier definition is reused or pooled into a leaderboard row with new results.
REVISION = 1

# The notebook's parameters cell holds exactly these names (plus run_id and experiment).
PARAMS = {**SET_PARAMS, "gamma": 0.5, **PRESET_PARAMS, "preset": "dsa"}


def validate(params: dict) -> dict:
    p = validate_common(PROTOCOL, PARAMS, params)
    check_weight(p, "gamma")
    if p["preset"] is None:
        raise ValueError("preset: the Augmentation-Robust Score needs a preset (its augmentation is what is removed)")
    if not resolve_preset(p["preset"]).augment:
        raise ValueError(f"preset: {p['preset']!r} has no augmentation, so ARS would compare a setting with itself")
    return p


@dataclass
class AugmentationRobustResult:
    per_seed: pd.DataFrame  # one row per seed: four accuracies, IOR with and without augmentation, ARS
    summary: dict[str, float]


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    return open_protocol_cell(PROTOCOL, validate(params), run_id, experiment)


def evaluate(cell: Cell, distilled: DistilledSet) -> AugmentationRobustResult:
    p, ds = cell.params, cell.dataset
    with cell.guard():
        preset = resolve_preset(p["preset"])
        baseline = random_subset(ds, distilled.ipc, p["baseline_seed"])
        cell.log_set(baseline, "random_baseline")
        options = preset_options(p)
        acc = {}
        for side, subset in (("syn", distilled), ("rdm", baseline)):
            for variant, with_augment in (("aug", True), ("noaug", False)):
                acc[f"{side}_{variant}"], _ = evaluate_with_preset(
                    cell, f"{side}_{variant}", subset, preset, p["seeds"], with_augment=with_augment, **options)
        rows = []
        for i, seed in enumerate(p["seeds"]):
            a = {key: evals[i].accuracy for key, evals in acc.items()}
            ior_aug = metrics.ior(a["syn_aug"], a["rdm_aug"])
            ior_noaug = metrics.ior(a["syn_noaug"], a["rdm_noaug"])
            rows.append({"seed": seed, **{f"acc_{k}": v for k, v in a.items()}, "ior_aug": ior_aug,
                         "ior_noaug": ior_noaug, "ars": metrics.ars(ior_aug, ior_noaug, p["gamma"])})
        per_seed, summary = cell.record_per_seed(rows)
    return AugmentationRobustResult(per_seed, summary)
