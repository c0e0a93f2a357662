"""DD-Ranking's Label-Robust Score for one distilled set (one grid cell).

Hard-label side: the same model, recipe and seeds on the distilled set and on the full training
set (acc_syn_hard, acc_real_hard; the random subset too, for reference). "Any" side: the distilled
set and a random subset of the same size (``baseline_seed``) under the method's ``preset`` (its
labels, loss, teachers, augmentation, ZCA and learning-rate policy, identical for both sides);
without a preset the "any" side is the hard-label side. Per seed: HLR = acc_real_hard -
acc_syn_hard, IOR = acc_syn_any - acc_rdm_any, LRS(HLR, IOR, w); mean +- std over seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddlib import metrics
from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.common import (PRESET_PARAMS, SET_PARAMS, check_recipe, check_weight, obtain, open_protocol_cell,
                                    preset_options, validate_common)
from ddlib.protocols.preset_eval import evaluate_with_preset, resolve_preset
from ddlib.methods.select import random_subset
from ddlib.engine.train import Recipe

__all__ = ["PROTOCOL", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "LabelRobustResult"]

PROTOCOL = "label_robust"
# What this protocol computes, in the keys of its cells: bump it whenever that changes, so nothing
# computed under an earlier definition is reused or pooled into a leaderboard row with new results.
REVISION = 1

# The notebook's parameters cell holds exactly these names (plus run_id and experiment).
PARAMS = {
    **SET_PARAMS,
    "recipe": {},  # hard-label recipe for the distilled and the random set (ddlib.engine.train.Recipe keys)
    "real_recipe": {},  # overrides for the full-data reference (e.g. fewer epochs)
    "w": 0.5,
    **PRESET_PARAMS,
}


def validate(params: dict) -> dict:
    """Fill defaults and check every value; errors name the key."""
    p = validate_common(PROTOCOL, PARAMS, params)
    check_weight(p, "w")
    check_recipe(p, "real_recipe", base=check_recipe(p, "recipe"))
    return p


@dataclass
class LabelRobustResult:
    per_seed: pd.DataFrame  # one row per seed: accuracies, HLR, IOR, LRS
    summary: dict[str, float]  # mean and std of each column

    def table(self) -> pd.DataFrame:
        cols = [c for c in self.per_seed.columns if c != "seed"]
        return pd.DataFrame({"mean": [self.summary[f"{c}_mean"] for c in cols],
                             "std": [self.summary[f"{c}_std"] for c in cols]}, index=cols)


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    return open_protocol_cell(PROTOCOL, validate(params), run_id, experiment)


def evaluate(cell: Cell, distilled: DistilledSet) -> LabelRobustResult:
    """Hard-label accuracies of the distilled set, the random subset and the full data; HLR, IOR, LRS."""
    p, ds = cell.params, cell.dataset
    with cell.guard():
        recipe = Recipe.from_dict(p["recipe"])
        real_recipe = Recipe.from_dict(p["real_recipe"], base=recipe)
        baseline = random_subset(ds, distilled.ipc, p["baseline_seed"])
        cell.log_set(baseline, "random_baseline")
        syn = cell.train_eval("syn_hard", distilled.images, distilled.labels, recipe, p["seeds"])
        rdm = cell.train_eval("rdm_hard", baseline.images, baseline.labels, recipe, p["seeds"])
        real = cell.train_eval("real_hard", ds.train_images, ds.train_labels, real_recipe, p["seeds"])
        preset = resolve_preset(p["preset"])
        if preset is None:
            syn_any, rdm_any = syn, rdm
        else:
            options = preset_options(p)
            syn_any, _ = evaluate_with_preset(cell, "syn_any", distilled, preset, p["seeds"], **options)
            rdm_any, _ = evaluate_with_preset(cell, "rdm_any", baseline, preset, p["seeds"], **options)
        rows = []
        for s, r, f, sa, ra in zip(syn, rdm, real, syn_any, rdm_any):
            h = metrics.hlr(f.accuracy, s.accuracy)
            i = metrics.ior(sa.accuracy, ra.accuracy)
            rows.append({"seed": s.seed, "acc_syn_hard": s.accuracy, "acc_rdm_hard": r.accuracy,
                         "acc_real_hard": f.accuracy, "acc_syn_any": sa.accuracy, "acc_rdm_any": ra.accuracy,
                         "hlr": h, "ior": i, "lrs": metrics.lrs(h, i, p["w"])})
        per_seed, summary = cell.record_per_seed(rows)
    return LabelRobustResult(per_seed, summary)
