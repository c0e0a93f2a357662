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

from ddlib.scores import metrics
from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.spec import BEYOND_COLUMNS, IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.protocols.common import PRESET_PARAMS, SET_PARAMS, check_weight, obtain, validate_common
from ddlib.protocols.preset_eval import SideTrainer
from ddlib.protocols.side_plan import resolve_preset, resolve_sides

__all__ = ["PROTOCOL", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "AugmentationRobustResult"]

SPEC = ProtocolSpec(
    name="augmentation_robust", revision=6, order=20, title="DD-Ranking: Augmentation-Robust Score",
    summary="IOR with and without the preset's augmentation, and ARS, against a random subset of the set's size",
    params={**SET_PARAMS, "gamma": Param(0.5, "ARS's weight on IOR with augmentation"), **PRESET_PARAMS,
            "preset": Param("dsa", "the method's evaluation preset (its augmentation is what ARS removes)")},
    boards=(Board("ars", "DD-Ranking: Augmentation-Robust Score", "ddlib.protocols.ddranking_boards:ars_leaderboard",
                  "ars", "ARS",
                  columns=(("acc_syn_aug", "accuracy with the preset's augmentation"),
                           ("acc_syn_noaug", "accuracy without it"), ("acc_rdm_aug", "random subset, with"),
                           ("acc_rdm_noaug", "random subset, without"), ("ior_aug", "IOR with augmentation"),
                           ("ior_noaug", "IOR without augmentation"), ("ars", "ARS (0-100)"), *BEYOND_COLUMNS),
                  variant=("model", "preset", "gamma"), weight="gamma", section="ddlib.protocols.ddranking_boards:section",
                  pages=("sweep",),
                  heading="DD-Ranking: Augmentation-Robust Score{weight}; accuracies in %, differences in points, "
                          "scores 0-100"),),
    headline="ars",
    history=("2: per-seed random subsets, teacher labels for the random side of stored-soft-label presets, learned lr",
             "3: trainings default to precision auto (bf16 where the device computes it natively)",
             "4: as DD-Ranking's code: ZCA fitted on [0, 1] pixels of the whole training set, in place of normalisation; "
             "the presets' DSA resamples with align_corners=True; CutMix's box is the CutMix authors' rand_bbox; random "
             "baselines from their own stream; the preset's labels.teacher.recipe applied",
             f"5: {LAYOUT_REVISION}",
             f"6: {IDENTITY_REVISION}"
              "; as DD-Ranking's code, mse_ce's CE term sees the images' own labels under CutMix with online "
              "relabelling (EDC, G-VBSM)"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()


def validate(params: dict) -> dict:
    """Check an augmentation_robust cell's params before anything runs (one-line errors naming the key)."""
    p = validate_common(PROTOCOL, PARAMS, params)
    check_weight(p, "gamma")
    if p["preset"] is None:
        raise ValueError("preset: the Augmentation-Robust Score needs a preset (its augmentation is what is removed)")
    if not resolve_preset(p["preset"]).augment:
        raise ValueError(f"preset: {p['preset']!r} has no augmentation, so ARS would compare a setting with itself")
    return p


@dataclass(kw_only=True)
class AugmentationRobustResult(Result):
    """per_seed: four accuracies, IOR with and without augmentation, ARS per seed."""

    sides: pd.DataFrame  # one row per trained side: set, labels, loss, augmentation, ZCA, model, recipe, lr per seed


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """The cell, its sides resolved and checked once (:func:`ddlib.protocols.side_plan.resolve_sides`)."""
    cell = Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)
    with cell.guard():
        cell.resolved = resolve_sides(cell)
    return cell


def evaluate(cell: Cell, distilled: DistilledSet) -> AugmentationRobustResult:
    """The preset's own evaluation with and without its augmentation, of the set and the random subsets;
    IOR with and without, ARS per seed."""
    p, seeds = cell.params, cell.params["seeds"]
    with cell.guard():
        ev = SideTrainer(cell)
        sets = {"syn": ({s: distilled for s in seeds}, "distilled"),
                "rdm": (ev.random_subsets(distilled.ipc, seeds), "random subset")}
        acc = {}
        for variant, setting in (("aug", ev.plan.own), ("noaug", ev.plan.own_without_augment)):
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
    return AugmentationRobustResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                                    sides=ev.sides(), run_id=cell.run_id)
