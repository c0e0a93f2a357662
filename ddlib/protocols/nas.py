"""DC-Bench's NAS lens: does training on the set rank architectures like training on the full data?

Per cell (one set): ``num_archs`` NAS-Bench-201 architectures are drawn with ``arch_seed``
(uniformly over the cell strings as DC-Bench does, or one per isomorphism class with ``sampling:
isomorphism``; :func:`ddlib.protocols.nas_space.sample_architectures`), each is built as the
reduced search proxy (``C`` channels, ``N`` cells per stage; DC-Bench uses 3 cells, N=1, instead of
the benchmark's 15) and trained on the set with DC-Bench's proxy recipe (50 epochs, SGD lr 0.025
cosine to 0.001, momentum 0.9, weight decay 3e-4, batch 64, gradient norm clipped to 5; IPC 50), with
``augment`` as without (``aug_epochs`` is null here, not the 1000 the other DC-Bench protocols train
augmented sets for).
Its *proxy accuracy* is measured on a validation split held out of the training set
(``val_fraction``: 20 %, 10,000 CIFAR-10 images, as DC-Bench's code holds out; the test set is
never used to rank), averaged over the seeds, and correlated with the ground truth (test accuracy
of the full network after 200 epochs on the full data, from ``ground_truth``): one Spearman's
rho, Kendall's tau and Top-1 (the ground truth of the architecture the proxy ranks first) per
cell. References are other rows of the grid: a random subset and the full data (``method: [dc,
random, full]``; the full data trains 10 epochs on the remaining 80 %, as DC-Bench's).

The proxy's cells use non-affine BatchNorm (``cell_affine=False``, REVISION 4), as DC-Bench's search
cells do (``NAS201SearchCell(..., affine=False, track_running_stats=True)``); NAS-Bench-201's own
networks, the ground truth, are affine. Every architecture is trained as a *discrete* network. DC-Bench's released code
(``darts-pt/nasbench201``, ``TinyNetworkDarts``) instead trains a DARTS supernet whose
architecture weights are a one-hot vector passed through a softmax, so every edge computes a
softmax mixture of all five operations (weight ~0.40 on the chosen one, ~0.15 on each other);
its Table 3 correlations are of those mixtures and cannot be reproduced by a discrete protocol.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ddlib.protocols import nas_space
from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.spec import IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.protocols.common import SET_PARAMS, positive_int, obtain, validate_set_params
from ddlib.protocols.dcbench import (RECIPE_PARAMS, TrainingCondition, check_augment, check_recipe_params, setting_recipe,
                                     train_settings)
from ddlib.engine.recipe import Recipe

__all__ = ["PROTOCOL", "PARAMS", "PATH_PARAMS", "validate", "open_cell", "obtain", "evaluate", "NasResult"]

MODEL = "nasbench201"
# DC-Bench's proxy cells (darts-pt/nasbench201 TinyNetworkDarts -> NAS201SearchCell(affine=False)):
# BatchNorm without learned scale and shift inside the cells; stem, reductions and lastact affine.
CELL_AFFINE = False
# DC-Bench's proxy training (darts-pt/nasbench201/train_search.py defaults): the base of ``recipe``.
PROXY_RECIPE = Recipe(epochs=50, batch_size=64, optimizer="sgd", lr=0.025, momentum=0.9, weight_decay=3e-4,
                      scheduler="cosine", lr_min=0.001, grad_clip=5.0)

SPEC = ProtocolSpec(
    name="nas", revision=6, order=70, title="DC-Bench: neural architecture search on the set",
    summary="NAS-Bench-201 architectures trained on the set as a proxy, rank-correlated with their ground truth",
    params={
        **{k: v for k, v in SET_PARAMS.items() if k != "model"},  # the models are the sampled architectures
        "ipc": Param(50, "images per class (DC-Bench's NAS sets: 50)"),
        **RECIPE_PARAMS,
        "recipe": Param({}, "overrides of DC-Bench's proxy recipe (50 epochs, SGD 0.025 cosine to 0.001, batch 64, clip 5)"),
        # not the shared 1000: DC-Bench's proxies train 50 epochs, and augment alone must not make them train 20x longer
        "aug_epochs": Param(None, "null: the proxy's own epochs (50) with augment as without; a number: those epochs "
                                  "when augment is set", "int"),
        "real_recipe": Param({"epochs": 10}, "the full-data reference: 10 epochs on the training split (DC-Bench)"),
        "augment": Param(None, "one augmentation spec (ddlib.engine.augment) or null; DC-Bench trains without", "str"),
        "ground_truth": Param(None, "CSV: architecture string -> accuracy (e.g. ../shared/data/nasbench201-accuracy.csv)",
                              "str"),
        "gt_column": Param(None, "the accuracy column; null: the one for the dataset (cifar10, cifar100)", "str"),
        "num_archs": Param(100, "architectures sampled and ranked (DC-Bench: 100)"),
        "arch_seed": Param(0, "the architecture sample's seed"),
        "sampling": Param("uniform", "uniform over the cell strings (DC-Bench) | isomorphism (one per isomorphism class)"),
        "val_fraction": Param(0.2, "held out of the training set to measure proxy accuracies (DC-Bench: 20 %)"),
        "C": Param(16, "channels of the first stage"),
        "N": Param(1, "cells per stage: 1 is DC-Bench's 3-cell proxy (NAS-Bench-201 trains 5)"),
    },
    boards=(Board("nas", "DC-Bench: neural architecture search on the set",
                  "ddlib.protocols.dcbench_boards:nas_leaderboard",
                  "spearman", "NAS Spearman rho",
                  columns=(("spearman", "Spearman rho (proxy vs ground truth)"), ("kendall", "Kendall tau"),
                           ("top1", "ground-truth accuracy of the proxy's top architecture (%)"),
                           ("best_possible", "best ground-truth accuracy in the sample (%)")),
                  variant=("num_archs", "arch_seed", "C", "N"),
                  heading="DC-Bench: NAS rank correlation (rho, tau) and Top-1 ground truth (%)"),),
    headline="nas", takes_set=False, path_params=("ground_truth",),
    history=("2: validation split, seed-averaged proxy, DC-Bench's proxy recipe, uniform sampling",
             "3: trainings default to precision auto (bf16 where the device computes it natively)",
             "4: the proxies' cell BatchNorms are affine=False, as DC-Bench's search cells",
             f"5: {LAYOUT_REVISION}",
             f"6: {IDENTITY_REVISION}"
              "; an augment proxy keeps the proxy recipe's 50 epochs (aug_epochs null; was the shared 1000)"),
)
PROTOCOL, REVISION, PARAMS, PATH_PARAMS = SPEC.name, SPEC.revision, SPEC.defaults(), SPEC.path_params


def validate(params: dict) -> dict:
    """Check a nas cell's params before anything runs (one-line errors naming the key)."""
    p = validate_set_params(PROTOCOL, PARAMS, params)
    check_recipe_params(p, base=PROXY_RECIPE)
    check_augment(p["augment"], "augment")
    if p["sampling"] not in nas_space.SAMPLINGS:
        raise ValueError(f"sampling must be one of {list(nas_space.SAMPLINGS)}, got {p['sampling']!r}")
    fraction = p["val_fraction"]
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction < 1:
        raise ValueError(f"val_fraction must be a number in (0, 1): proxy accuracies are never measured on "
                         f"the test set; got {fraction!r}")
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


@dataclass(kw_only=True)
class NasResult(Result):
    """summary: spearman, kendall, top1, best_possible, num_archs of the seed-averaged proxy (DC-Bench's
    numbers: one value each, not a mean); per_seed: each seed's own proxy against the ground truth."""

    architectures: pd.DataFrame  # arch, ground_truth, proxy_seed<s> per seed, proxy (their mean), in percent

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([self.summary])


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """Open the nas cell's MLflow run, its configuration resolved and checked before the set is obtained."""
    p = validate(params)
    return Cell.open(PROTOCOL, p, run_id=run_id, experiment=experiment)


def sample(cell: Cell) -> pd.DataFrame:
    """The cell's architectures with their ground-truth accuracy (percent)."""
    p = cell.params
    with cell.guard():
        return nas_space.sample_ground_truth(p["ground_truth"], p["num_archs"], p["arch_seed"], column=p["gt_column"],
                                             dataset=None if p["gt_column"] else p["dataset"], sampling=p["sampling"])


def arch_key(i: int) -> str:
    """The metric suffix of the ``i``-th sampled architecture (``proxy.arch007``, ``gt.arch007``)."""
    return f"arch{i:03d}"


def evaluate(cell: Cell, distilled: DistilledSet, architectures: pd.DataFrame | None = None) -> NasResult:
    """Train every architecture on the set for each seed, score it on the validation split, and
    correlate the mean over seeds with the ground truth. Per-seed proxy accuracies are logged as
    metric histories (``proxy.archNNN``, step = seed, beside ``gt.archNNN``) so the leaderboard can
    pool seeds over runs and recompute the correlation."""
    p = cell.params
    recipe = setting_recipe(p, p["augment"], base=PROXY_RECIPE)
    with cell.guard():
        archs = sample(cell) if architectures is None else architectures
        kwargs = {"C": p["C"], "N": p["N"], "cell_affine": CELL_AFFINE}
        conditions = [TrainingCondition(arch_key(i), MODEL, recipe, p["augment"], {"arch": a, **kwargs})
                      for i, a in enumerate(archs["arch"])]
        evaluations = train_settings(cell, distilled, conditions, role="nas", eval_split="val")
        table = archs[["arch", "accuracy"]].rename(columns={"accuracy": "ground_truth"}).copy()
        for i, seed in enumerate(p["seeds"]):
            table[f"proxy_seed{seed}"] = [100 * evaluations[c.label][i].accuracy for c in conditions]
        table["proxy"] = table[[f"proxy_seed{seed}" for seed in p["seeds"]]].mean(axis=1)
        ranks = nas_space.rank_correlation(table["proxy"].to_numpy(), table["ground_truth"].to_numpy())
        summary = {k: ranks[k] for k in ("spearman", "kendall", "top1", "best_possible")}
        summary["num_archs"] = len(table)
        cell.tracker.log_per_seed(cell.run_id, [  # one batch: 2 x num_archs x seeds values
            {"seed": seed, **{f"{kind}.{c.label}": value for j, c in enumerate(conditions)
                              for kind, value in (("proxy", table[f"proxy_seed{seed}"].iloc[j]),
                                                  ("gt", table["ground_truth"].iloc[j]))}} for seed in p["seeds"]])
        cell.tracker.log_metrics(cell.run_id, summary)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "architectures.csv"
            table.to_csv(path, index=False)
            cell.tracker.log_artifact(cell.run_id, path)
    per_seed = pd.DataFrame([{"seed": seed, **{k: v for k, v in nas_space.rank_correlation(
        table[f"proxy_seed{seed}"].to_numpy(), table["ground_truth"].to_numpy()).items() if k in summary}}
        for seed in p["seeds"]])
    return NasResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                     architectures=table, run_id=cell.run_id)
