"""DD-Ranking's Augmentation-Robust Score for one distilled set (one grid cell).

Per evaluation seed, the distilled set and that seed's random subset of the same size are each
trained under the method's preset twice: with the preset's augmentation and without it (labels,
teachers, ZCA, student model unchanged; ``ddranking/metrics/aug_robust.py``). A set that ships no
soft labels under a stored-soft-label preset (the random subset) is labelled by the preset's
teacher (:mod:`ddlib.protocols.preset_eval`). Learning rates follow ``lr_policy``: under ``paper``
the distilled set trains at the method's own (or shipped, learned) lr and the random subset is
searched; a hard-label preset's accuracies are hard-label accuracies, searched for both sides.
IOR_aug = acc_syn_aug - acc_rdm_aug, IOR_noaug = acc_syn_noaug - acc_rdm_noaug,
ARS(IOR_aug, IOR_noaug, gamma); mean +- std over seeds. Every preset trains the same four sides per
seed (syn_aug, rdm_aug, syn_noaug, rdm_noaug): each enters the score. The random subsets come from the
baselines' own stream (:func:`ddlib.methods.select.baseline_subset`), disjoint from every method's
draws, so the ``random`` method is never its own baseline.

ZCA (presets with ``zca: true``: MTT, DATM) is the dataset's one whitening, fitted as MTT, DATM and
DD-Ranking fit theirs (kornia's ``ZCAWhitening(eps=0.1)`` on the whole training set's [0, 1]
pixels, no mean/std normalisation) and applied in place of the normalisation to every training,
validation and test tensor; the same whitening inverts a set stored ZCA-whitened, so the student is
fed the stored values (:meth:`ddlib.protocols.cell.Cell.zca`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddlib import metrics
from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.common import PRESET_PARAMS, SET_PARAMS, check_weight, obtain, open_protocol_cell, validate_common
from ddlib.protocols.preset_eval import Evaluator, resolve_preset

__all__ = ["PROTOCOL", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "AugmentationRobustResult"]

PROTOCOL = "augmentation_robust"
# What this protocol computes, in the keys of its cells: bump it whenever that changes, so nothing
# computed under an earlier definition is reused or pooled into a leaderboard row with new results.
# 2: per-seed random subsets, teacher labels for the random side of stored-soft-label presets,
# learned lr, lr_policy, one real-data pool, ZCA-space sets, the preset's student model.
# 3: trainings default to precision auto (bf16 where the device computes it natively).
# 4: as DD-Ranking's code (tests/test_conformance_ddranking.py): ZCA fitted on [0, 1] pixels of the whole
# training set, in place of normalisation; the presets' DSA resamples with align_corners=True; CutMix's box
# is the CutMix authors' rand_bbox; random baselines from their own stream (no longer the `random`
# method's draw at seed 0); the preset's labels.teacher.recipe applied.
REVISION = 4

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
    sides: pd.DataFrame  # one row per trained side: set, labels, loss, augmentation, ZCA, model, recipe, lr per seed


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    return open_protocol_cell(PROTOCOL, validate(params), run_id, experiment)


def evaluate(cell: Cell, distilled: DistilledSet) -> AugmentationRobustResult:
    p, seeds = cell.params, cell.params["seeds"]
    with cell.guard():
        ev = Evaluator(cell)
        sets = {"syn": ({s: distilled for s in seeds}, "distilled"),
                "rdm": (ev.random_subsets(distilled.ipc, seeds), "random subset")}
        acc = {}
        for variant, with_augment in (("aug", True), ("noaug", False)):
            setting = ev.own_setting(with_augment)
            for side, (subsets, name) in sets.items():
                acc[f"{side}_{variant}"] = ev.run(f"{side}_{variant}", side, subsets, setting, seeds, name)
        rows = []
        for i, seed in enumerate(seeds):
            a = {key: evals[i].accuracy for key, evals in acc.items()}
            ior_aug = metrics.ior(a["syn_aug"], a["rdm_aug"])
            ior_noaug = metrics.ior(a["syn_noaug"], a["rdm_noaug"])
            rows.append({"seed": seed, **{f"acc_{k}": v for k, v in a.items()}, "ior_aug": ior_aug,
                         "ior_noaug": ior_noaug, "ars": metrics.ars(ior_aug, ior_noaug, p["gamma"])})
        per_seed, summary = cell.record_per_seed(rows)
    return AugmentationRobustResult(per_seed, summary, ev.sides())
