"""DD-Ranking's Label-Robust Score for one distilled set (one grid cell).

Per evaluation seed (DD-Ranking, Li et al., arXiv 2505.13300; ``ddranking/metrics/hard_label.py``
and ``soft_label.py``):

* **Hard-label side**: the distilled set (acc_syn_hard) and that seed's random subset of the same
  size (acc_rdm_hard) on hard labels with cross-entropy. With a ``preset`` it is the method's own
  evaluation with hard labels: its recipe, augmentation (DSA for DSA/DM/MTT/DataDAM/DATM; no CutMix
  where the preset says ``use_aug_for_hard: false``), ZCA and student model; without one, the grid's
  ``recipe`` and ``model`` and no augmentation.
* **Full-data reference** (acc_real_hard): the whole real training set, the validation split
  included (DD-Ranking trains it on its ``dst_train``, the whole training set; nothing of this side
  is chosen on the validation split: its lr is never searched), hard labels, ``real_recipe``, no
  augmentation (DD-Ranking's fixed ``REAL_DATA_TRAINING_CONFIG``), ZCA-whitened where the preset
  says ``zca: true`` (DD-Ranking's ``get_dataset(use_zca)`` whitens the ``dst_train`` its real side
  trains on, and the test set: DATM, MTT). It depends only on the dataset, model, recipe and
  whitening: identical in every cell that shares them, whatever the preset. The first cell
  that needs it trains it right after the distilled set's hard-label side (where a broken set
  fails); a cell that finds another training it does its own sides first, then waits for it (the
  order changes no number).
* **"Any" side**: the distilled set (acc_syn_any) and the random subset (acc_rdm_any) under the
  method's own evaluation (its labels, loss, teachers, augmentation, ZCA). For a hard-label preset,
  and without a preset, it *is* the hard-label side: HLR and IOR come from one accuracy, as in
  DD-Ranking's hard-label evaluator.
* **What is trained**: only what a score needs. Without a preset or with a hard-label preset:
  syn_hard, rdm_hard (= the "any" side) and real_hard. With a soft-label preset (stored or teacher
  labels): syn_hard, real_hard, syn_any and rdm_any; the random subset's hard-label accuracy enters
  no score there and is not trained (DD-Ranking's soft-label evaluator does not train it either), so
  ``acc_rdm_hard`` is absent from those cells.
* **Random subsets** come from the baselines' own stream (:func:`ddlib.methods.select.baseline_subset`),
  disjoint from every method's draws, so the ``random`` method is never its own baseline.
* Learning rates: ``lr_policy`` (:mod:`ddlib.protocols.preset_eval`); ``paper`` follows DD-Ranking's
  code: it searches the hard-label accuracies and the random subset, and trains the distilled set
  at the method's own (or learned, shipped) lr under its own evaluation. For a hard-label preset
  whose set ships its lr (MTT) that evaluation *is* the hard-label side, so acc_syn_hard trains at
  the learned lr, unsearched (``LabelRobustScoreHard.compute_metrics(syn_lr=...)``), where the
  paper's text says every hard-label accuracy is searched (named in docs/deviations.md;
  ``lr_policy: symmetric`` searches it).

HLR = acc_real_hard - acc_syn_hard, IOR = acc_syn_any - acc_rdm_any, LRS(HLR, IOR, w); mean +- std
over seeds. Deviations from the peer's code, all named in docs/deviations.md: searches are scored on a
validation split held out of the training set (``lr_select: test`` reproduces the peer and is
tagged so), a model's accuracy is taken at its last epoch (the peer keeps the best of every 20th
epoch on the test set), and accuracies are fractions (the peer's percent inputs leave [0, 100]).

ZCA (presets with ``zca: true``: MTT, DATM) is the dataset's one whitening, fitted as MTT, DATM and
DD-Ranking fit theirs (kornia's ``ZCAWhitening(eps=0.1)`` on the whole training set's [0, 1]
pixels, no mean/std normalisation) and applied in place of the normalisation to every training,
validation and test tensor; the same whitening inverts a set stored ZCA-whitened, so the student is
fed the stored values (:meth:`ddlib.protocols.cell.Cell.zca`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from ddlib.scores import metrics
from ddlib.data.distilled import DistilledSet
from ddlib.engine.recipe import Recipe, epochs_trained
from ddlib.protocols.cell import Cell
from ddlib.protocols.spec import BEYOND_COLUMNS, IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.protocols.common import (PRESET_PARAMS, SET_PARAMS, check_recipe, check_weight, obtain,
                                    validate_common)
from ddlib.protocols.preset_eval import SideTrainer
from ddlib.protocols.side_plan import resolve_sides

__all__ = ["PROTOCOL", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "LabelRobustResult"]

# What this protocol computes is in the keys of its cells: the spec's revision changes whenever that
# changes, so nothing computed under an earlier definition is reused or pooled into a leaderboard row.
SPEC = ProtocolSpec(
    name="label_robust", revision=6, order=10, title="DD-Ranking: Label-Robust Score",
    summary="HLR, IOR and LRS of a set against a random subset of its size, under the method's own evaluation",
    params={
        **SET_PARAMS,
        "recipe": Param({}, "the hard-label recipe without a preset (Recipe keys); the base of real_recipe"),
        "real_recipe": Param({}, "overrides for the full-data reference (e.g. fewer epochs)"),
        "w": Param(0.5, "LRS's weight on IOR (against 1 - w on HLR)"),
        "matched_compute": Param(False, "also the random subset trained for the set's images seen (ior_matched)"),
        **PRESET_PARAMS,
    },
    boards=(Board("lrs", "DD-Ranking: Label-Robust Score", "ddlib.protocols.ddranking_boards:lrs_leaderboard", "lrs", "LRS",
                  columns=(("acc_syn_any", "accuracy under the method's own preset (acc_syn_any)"),
                       ("acc_syn_hard", "accuracy, hard labels (acc_syn_hard)"),
                       ("acc_rdm_any", "random subset, same evaluation (acc_rdm_any)"),
                       ("acc_real_hard", "full training set, hard labels (acc_real_hard)"),
                       ("hlr", "HLR = acc_real_hard - acc_syn_hard (lower is better)"),
                       ("ior", "IOR = acc_syn_any - acc_rdm_any"), ("lrs", "LRS (0-100)"),
                       ("acc_rdm_matched", "random subset trained for the set's images seen (matched_compute)"),
                       ("ior_matched", "IOR against it: acc_syn_any - acc_rdm_matched (matched_compute)"),
                       *BEYOND_COLUMNS),
                  variant=("model", "preset", "w"), weight="w", section="ddlib.protocols.ddranking_boards:section",
                  pages=("radar", "accuracy_vs_ipc", "sweep"),
                  heading="DD-Ranking: Label-Robust Score{weight}; accuracies in %, differences in points, scores 0-100"),),
    headline="lrs",
    history=("2: hard side under the preset's evaluation, per-seed random subsets, teacher labels for the random side "
             "of stored-soft-label presets, learned lr, lr_policy, one real-data pool, ZCA-space sets",
             "3: trainings default to precision auto (bf16 where the device computes it natively)",
             "4: as DD-Ranking's code (tests/test_conformance_ddranking.py): ZCA fitted on [0, 1] pixels of the whole "
             "training set, in place of normalisation; the presets' DSA resamples with align_corners=True; CutMix's box "
             "is the CutMix authors' rand_bbox; random baselines from their own stream; the preset's "
             "labels.teacher.recipe applied; the full-data reference on the whole training set; no rdm_hard side under "
             "soft-label presets",
             f"5: {LAYOUT_REVISION}",
             f"6: {IDENTITY_REVISION}"
              "; as DD-Ranking's code, mse_ce's CE term sees the images' own labels under CutMix/Mixup with online "
              "relabelling (EDC, G-VBSM), and the full-data reference is ZCA-whitened under a ZCA preset (MTT, "
              "DATM) and trained with the preset's DSA under a soft-label preset with use_aug_for_hard (DATM)"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()


def validate(params: dict) -> dict:
    """Fill defaults and check every value; errors name the key."""
    p = validate_common(PROTOCOL, PARAMS, params)
    check_weight(p, "w")
    check_recipe(p, "real_recipe", base=check_recipe(p, "recipe"))
    return p


@dataclass(kw_only=True)
class LabelRobustResult(Result):
    """per_seed: accuracies, HLR, IOR, LRS per seed; summary: their mean and std."""

    sides: pd.DataFrame  # one row per trained side: set, labels, loss, augmentation, ZCA, model, recipe, lr per seed


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """The cell, its sides resolved and checked once (:func:`ddlib.protocols.side_plan.resolve_sides`)."""
    cell = Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)
    with cell.guard():
        recipe = Recipe.from_dict(cell.params["recipe"])
        cell.resolved = resolve_sides(cell, recipe, Recipe.from_dict(cell.params["real_recipe"], base=recipe))
    return cell


def evaluate(cell: Cell, distilled: DistilledSet) -> LabelRobustResult:
    """Hard-label and "any" accuracies of the distilled set and the random subsets, the full-data
    reference; HLR, IOR, LRS per seed."""
    p, seeds = cell.params, cell.params["seeds"]
    with cell.guard():
        ev = SideTrainer(cell)
        plan, real_recipe = ev.plan, ev.plan.real_recipe
        syn_sets = {s: distilled for s in seeds}
        rdm_sets = ev.random_subsets(distilled.ipc, seeds)
        hard = plan.hard
        syn = ev.run("syn_hard", "syn", syn_sets, hard, seeds, "distilled")  # first: a broken set fails here
        # The full-data reference, shared by every cell of the data: next, by the first cell that needs
        # it; a cell that finds another training it does its own sides first, then waits for it.
        real = ev.run_real("real_hard", real_recipe, seeds, unless_busy=True)
        hard_only = plan.hard_only
        # the random subset's hard-label accuracy is a score's input only where it is the "any" side
        rdm = ev.run("rdm_hard", "rdm", rdm_sets, hard, seeds, "random subset") if hard_only else None
        if hard_only:
            syn_any, rdm_any = syn, rdm  # one accuracy under the method's own (hard-label) evaluation
        else:
            own = plan.own
            syn_any = ev.run("syn_any", "syn", syn_sets, own, seeds, "distilled")
            rdm_any = ev.run("rdm_any", "rdm", rdm_sets, own, seeds, "random subset")
        matched = matched_random(ev, distilled, rdm_sets, rdm_any, hard if hard_only else own, seeds) \
            if p["matched_compute"] else None
        real = real if real is not None else ev.run_real("real_hard", real_recipe, seeds)  # now waiting for it
        rows = []
        for k, (s, f, sa, ra) in enumerate(zip(syn, real, syn_any, rdm_any)):
            h = metrics.hlr(f.accuracy, s.accuracy)
            i = metrics.ior(sa.accuracy, ra.accuracy)
            rows.append({"seed": s.seed, "acc_syn_hard": s.accuracy,
                         **({"acc_rdm_hard": rdm[k].accuracy} if rdm is not None else {}),
                         "acc_real_hard": f.accuracy, "acc_syn_any": sa.accuracy, "acc_rdm_any": ra.accuracy,
                         "hlr": h, "ior": i, "lrs": metrics.lrs(h, i, p["w"]),
                         **({"acc_rdm_matched": matched[k].accuracy,
                             "ior_matched": metrics.ior(sa.accuracy, matched[k].accuracy)} if matched else {})})
        per_seed, summary = cell.record_per_seed(rows)
    return LabelRobustResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                             sides=ev.sides(), run_id=cell.run_id)


def matched_random(ev: SideTrainer, distilled: DistilledSet, rdm_sets: dict, rdm_any: list, setting, seeds) -> list:
    """The random subsets trained for as many images seen as the distilled side ("Hard truths about
    soft labels", CVPR 2026: compare at matched compute). Both sides train the same recipe, so they
    see as many images whenever the set holds IPC x classes images (then the ``rdm_any`` models are
    the comparison and nothing is trained); a set with unequal classes holds fewer than its random
    subset (whose IPC is the set's largest class), and its random subsets train the whole number of
    epochs that brings their images seen nearest to the set's (epochs trained x set images)."""
    n_set = len(distilled.images)
    n_random = len(next(iter(rdm_sets.values())).images)
    if n_set == n_random:
        return rdm_any
    trained = epochs_trained(setting.recipe)  # epochs + 1 under DC-Bench's dc_step schedule
    epochs = max(1, round(trained * n_set / n_random - (trained - setting.recipe.epochs)))
    matched = replace(setting, name=f"{setting.name}, matched compute", recipe=replace(setting.recipe, epochs=epochs))
    return ev.run("rdm_matched", "rdm", rdm_sets, matched, seeds, f"random subset, {epochs} epochs (matched compute)")
