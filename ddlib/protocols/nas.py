"""DC-Bench's NAS lens: does training on the set rank architectures like training on the full data?

Per cell (one set): ``num_archs`` NAS-Bench-201 architectures are drawn with ``arch_seed`` (one
per isomorphism class, :func:`ddlib.protocols.nas_space.sample_architectures`), each is built as the reduced
search proxy (``C`` channels, ``N`` cells per stage; DC-Bench uses 3 cells, N=1, instead of the
benchmark's 15) and trained on the set with the recipe, as a discrete network (not a softmax
mixture of operations). Per seed: Spearman's rho and Kendall's tau between the proxy accuracies
and the ground truth (200-epoch test accuracy of the full network on the full data, from
``ground_truth``), and the ground-truth accuracy of the architecture the proxy ranks first
(``top1``). References are other rows of the grid: a random subset and the full data
(``method: [dc, random, full]``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddlib.protocols import nas_space
from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.common import SET_PARAMS, positive_int, obtain, validate_set_params
from ddlib.protocols.dcbench import (RECIPE_PARAMS, Condition, check_augment, check_recipe_params, condition_recipe,
                                     train_conditions)

__all__ = ["PROTOCOL", "PARAMS", "PATH_PARAMS", "validate", "open_cell", "obtain", "evaluate", "NasResult"]

PROTOCOL = "nas"
# What this protocol computes, in the keys of its cells: bump it whenever that changes, so nothing
# computed under an earlier definition is reused or pooled into a leaderboard row with new results.
REVISION = 1
MODEL = "nasbench201"

PARAMS = {
    **{k: v for k, v in SET_PARAMS.items() if k != "model"},  # the models are the sampled architectures
    **RECIPE_PARAMS,
    "augment": None,  # one augmentation spec (ddlib.engine.augment) or null
    "ground_truth": None,  # CSV: architecture string -> accuracy (e.g. ../shared/data/nasbench201-accuracy.csv)
    "gt_column": None,  # accuracy column; null = the one for the dataset (cifar10, cifar100)
    "num_archs": 100,  # DC-Bench's table ranks 100 architectures
    "arch_seed": 0,
    "C": 16,  # channels of the first stage
    "N": 1,  # cells per stage: 1 = DC-Bench's 3-cell proxy (NAS-Bench-201 trains N=5)
}
PATH_PARAMS = ("ground_truth",)  # the batch runner makes these absolute (notebooks run in notebooks/)


def validate(params: dict) -> dict:
    p = validate_set_params(PROTOCOL, PARAMS, params)
    check_recipe_params(p)
    check_augment(p["augment"], "augment")
    for key in ("num_archs", "C", "N"):
        if not positive_int(p[key]):
            raise ValueError(f"{key} must be a positive integer, got {p[key]!r}")
    if p["num_archs"] < 2:
        raise ValueError(f"num_archs must be at least 2 (a rank correlation needs two), got {p['num_archs']}")
    if not isinstance(p["arch_seed"], int):
        raise ValueError(f"arch_seed must be an integer, got {p['arch_seed']!r}")
    if not isinstance(p["ground_truth"], str):
        raise ValueError("ground_truth: give the path of a NAS-Bench-201 accuracy CSV "
                         "(architecture string -> accuracy), e.g. ../shared/data/nasbench201-accuracy.csv")
    if p["gt_column"] is None and p["dataset"] not in nas_space.DATASET_COLUMNS:
        raise ValueError(f"gt_column: no ground-truth column is known for dataset {p['dataset']!r} "
                         f"(known: {sorted(nas_space.DATASET_COLUMNS)}); name the CSV column to rank against")
    return p


@dataclass
class NasResult:
    per_seed: pd.DataFrame  # one row per seed: spearman, kendall, top1, best_possible
    summary: dict[str, float]
    architectures: pd.DataFrame  # arch, ground-truth accuracy, proxy accuracy per seed


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    return Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)


def sample(cell: Cell) -> pd.DataFrame:
    """The cell's architectures with their ground-truth accuracy (percent)."""
    p = cell.params
    with cell.guard():
        table = nas_space.load_ground_truth(p["ground_truth"], column=p["gt_column"],
                                      dataset=None if p["gt_column"] else p["dataset"])
        return nas_space.sample_architectures(table, p["num_archs"], p["arch_seed"])


def evaluate(cell: Cell, distilled: DistilledSet, architectures: pd.DataFrame | None = None) -> NasResult:
    p = cell.params
    recipe = condition_recipe(p, p["augment"])
    with cell.guard():
        archs = sample(cell) if architectures is None else architectures
        conditions = [Condition(f"arch{i:03d}", MODEL, recipe, p["augment"], {"arch": a, "C": p["C"], "N": p["N"]})
                      for i, a in enumerate(archs["arch"])]
        evaluations = train_conditions(cell, distilled, conditions, role="nas")
        table = archs[["arch", "accuracy"]].rename(columns={"accuracy": "ground_truth"}).copy()
        rows = []
        for i, seed in enumerate(p["seeds"]):
            proxy = [100 * evaluations[c.label][i].accuracy for c in conditions]
            table[f"proxy_seed{seed}"] = proxy
            ranks = nas_space.rank_correlation(proxy, table["ground_truth"].to_numpy())
            rows.append({"seed": seed, **{k: ranks[k] for k in ("spearman", "kendall", "top1", "best_possible")}})
        per_seed, summary = cell.record_per_seed(rows)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "architectures.csv"
            table.to_csv(path, index=False)
            cell.tracker.log_artifact(cell.run_id, path)
    return NasResult(per_seed, summary, table)
