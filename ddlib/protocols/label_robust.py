"""DD-Ranking's Label-Robust Score for one distilled set (one grid cell).

Trains the same model with the same recipe and seeds on the distilled set, on a random
subset of the same size (``baseline_seed``) and on the full training set, all with hard
labels, then per seed: HLR = acc_real - acc_syn, IOR = acc_syn - acc_rdm, LRS(HLR, IOR, w).
Scores are reported as mean +- std over seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddlib import metrics
from ddlib.data import list_datasets
from ddlib.distilled import DistilledSet
from ddlib.models import list_models
from ddlib.protocol import Cell
from ddlib.select import random_subset
from ddlib.sources import obtain_set, resolve_source, validate_source
from ddlib.train import Recipe

PROTOCOL = "label_robust"

# The notebook's parameters cell holds exactly these names (plus run_id and experiment).
PARAMS = {
    "dataset": "digits",
    "data_root": None,
    "method": "random",
    "source": None,  # None: a built-in method (random, kcenter, dm); else a source spec
    "ipc": 1,
    "model": "convnet",
    "seeds": [0, 1, 2],
    "recipe": {},  # hard-label recipe for the distilled and the random set (ddlib.train.Recipe keys)
    "real_recipe": {},  # overrides for the full-data reference (e.g. fewer epochs)
    "w": 0.5,
    "baseline_seed": 0,
    "device": "auto",
    # CPU smoke runs only: fewer real images (per class) and a stratified test subset. null = full.
    "train_per_class": None,
    "test_size": None,
}


def validate(params: dict) -> dict:
    """Fill defaults and check every value; errors name the key."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for protocol {PROTOCOL}; known: {sorted(PARAMS)}")
    p = {**PARAMS, **params}
    if not isinstance(p["dataset"], str) or not (p["dataset"] in list_datasets() or p["dataset"].startswith("imagefolder:")):
        raise ValueError(f"dataset: unknown dataset {p['dataset']!r}; known: {list_datasets()}")
    if p["model"] not in list_models():
        raise ValueError(f"model: unknown model {p['model']!r}; known: {list_models()}")
    if not isinstance(p["ipc"], int) or isinstance(p["ipc"], bool) or p["ipc"] < 1:
        raise ValueError(f"ipc must be a positive integer, got {p['ipc']!r}")
    seeds = p["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat, got {seeds!r}")
    if not isinstance(p["w"], (int, float)) or not 0 <= p["w"] <= 1:
        raise ValueError(f"w must be a number in [0, 1], got {p['w']!r}")
    if not isinstance(p["baseline_seed"], int):
        raise ValueError(f"baseline_seed must be an integer, got {p['baseline_seed']!r}")
    for key in ("train_per_class", "test_size"):
        if p[key] is not None and (not isinstance(p[key], int) or isinstance(p[key], bool) or p[key] < 1):
            raise ValueError(f"{key} must be null or a positive integer, got {p[key]!r}")
    for key in ("recipe", "real_recipe"):
        if not isinstance(p[key], dict):
            raise ValueError(f"{key} must be a mapping of recipe keys, got {p[key]!r}")
    try:
        base = Recipe.from_dict(p["recipe"])
        Recipe.from_dict(p["real_recipe"], base=base)
    except ValueError as e:
        raise ValueError(f"recipe: {e}") from None
    p["source"] = validate_source(p["method"], p["source"]) if p["source"] is not None else resolve_source(p["method"])
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
    return Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)


def obtain(cell: Cell) -> DistilledSet:
    """The cell's distilled set (made or loaded), logged as an image grid."""
    p = cell.params
    with cell.guard():
        distilled = obtain_set(p["method"], p["source"], cell.dataset, p["ipc"], device=cell.device, progress=cell.progress)
        cell.log_set(distilled, "distilled")
    return distilled


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
        rows = []
        for s, r, f in zip(syn, rdm, real):
            h = metrics.hlr(f.accuracy, s.accuracy)
            i = metrics.ior(s.accuracy, r.accuracy)
            rows.append({"seed": s.seed, "acc_syn_hard": s.accuracy, "acc_rdm_hard": r.accuracy,
                         "acc_real_hard": f.accuracy, "hlr": h, "ior": i, "lrs": metrics.lrs(h, i, p["w"])})
        cell.log_per_seed(rows)
        per_seed = pd.DataFrame(rows)
        summary = {}
        for col in per_seed.columns.drop("seed"):
            summary[f"{col}_mean"], summary[f"{col}_std"] = metrics.mean_std(per_seed[col])
        cell.tracker.log_metrics(cell.run_id, summary)
    return LabelRobustResult(per_seed, summary)
