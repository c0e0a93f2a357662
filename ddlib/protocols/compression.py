"""DC-Bench's compression lens: a set's accuracy at one IPC, next to the full data (one grid cell).

A grid over ``method`` x ``ipc`` (random, K-Center and every method with sets at several IPCs)
traces accuracy against the compression ratio; the full-data accuracy, trained once per
(data, model, recipe, seed) and reused by every cell, is the line they approach. The summary
shows where synthesis stops beating selection.

DC-Bench's compression table trains every set and the whole training set with DSA (1000 epochs):
``augment: dsa`` is the default here, the full-data line included (``real_recipe`` overrides only
its recipe). ``augment: null`` trains without augmentation (300 epochs). Every training follows
DC-Bench's schedule (``scheduler: dc_step``: 1001 epochs, lr x 0.1 and momentum reset after 502;
:mod:`ddlib.protocols.dcbench`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell
from ddlib.protocols.spec import BEYOND_COLUMNS, IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.protocols.common import SET_PARAMS, obtain, validate_set_params
from ddlib.protocols.dcbench import (RECIPE_PARAMS, TrainingCondition, accuracy_rows, check_augment, check_cell_convnets,
                                     check_recipe_params, convnet_for_images, setting_recipe, mean_std_table,
                                     train_settings)
from ddlib.methods.sources import full_set

__all__ = ["PROTOCOL", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "CompressionResult"]

SPEC = ProtocolSpec(
    name="compression", revision=6, order=60, title="DC-Bench: accuracy against images per class",
    summary="a set's accuracy at one IPC next to the full data's (DSA, 1000 epochs)",
    params={
        **SET_PARAMS,
        **RECIPE_PARAMS,
        "augment": Param("dsa", "one augmentation spec (ddlib.engine.augment) or null; DC-Bench trains with DSA", "str"),
        "full_data": Param(True, "also train on the whole training set (once, reused): the reference line"),
    },
    boards=(Board("compression", "DC-Bench: accuracy against images per class",
                  "ddlib.protocols.dcbench_boards:compression_leaderboard", "acc_set", "accuracy of the set",
                  columns=(("acc_set", "accuracy of the set"), ("acc_full", "full training set"),
                           ("relative", "accuracy relative to the full training set"), *BEYOND_COLUMNS),
                  variant=("model",), heading="DC-Bench: accuracy (%) against images per class",
                  section="ddlib.protocols.dcbench_boards:section", pages=("accuracy_vs_ipc",)),),
    headline="compression",
    history=("2: DSA (1000 epochs) by default, as DC-Bench's tables (was: no augmentation)",
             "3: trainings default to precision auto (bf16 where the device computes it natively)",
             "4: DC-Bench's schedule by default (scheduler dc_step: one more epoch, momentum reset at the drop)",
             f"5: {LAYOUT_REVISION}",
             f"6: {IDENTITY_REVISION}"
              "; the 4-layer ConvNet (convnet_d4) by default on 64 px data (Tiny ImageNet), a 3-layer ConvNet "
              "refused there"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()


def validate(params: dict) -> dict:
    """Check a compression cell's params before anything runs (one-line errors naming the key)."""
    p = validate_set_params(PROTOCOL, PARAMS, params)
    convnet_for_images(p, params)
    check_recipe_params(p)
    check_augment(p["augment"], "augment")
    if not isinstance(p["full_data"], bool):
        raise ValueError(f"full_data must be true or false, got {p['full_data']!r}")
    return p


@dataclass(kw_only=True)
class CompressionResult(Result):
    """per_seed: acc_set (the set), acc_full (the whole training set), relative, per seed."""

    images: int  # training images in the set
    ratio: float  # images in the set / images in the training set

    def table(self) -> pd.DataFrame:
        labels = [k[len("acc_"):-len("_mean")] for k in self.summary if k.startswith("acc_") and k.endswith("_mean")]
        return mean_std_table(self.summary, labels)


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """Open the compression cell's MLflow run, its configuration resolved and checked before the set is obtained."""
    cell = Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)
    check_cell_convnets(cell, [cell.params["model"]])
    return cell


def evaluate(cell: Cell, distilled: DistilledSet) -> CompressionResult:
    """Train, test and score: DC-Bench's accuracy of the set against random and K-Center at its IPC (the cell's Result)."""
    p, ds = cell.params, cell.dataset
    recipe = setting_recipe(p, p["augment"])
    real_recipe = setting_recipe(p, p["augment"], full=True)
    with cell.guard():
        rows = accuracy_rows(train_settings(cell, distilled, [TrainingCondition("set", p["model"], recipe, p["augment"])]),
                             p["seeds"])
        if p["full_data"]:
            full = TrainingCondition("full", p["model"], real_recipe, p["augment"])
            real = accuracy_rows(train_settings(cell, full_set(ds), [full], role="real"), p["seeds"])
            for row, ref in zip(rows, real):
                row["acc_full"] = ref["acc_full"]
                row["relative"] = row["acc_set"] / ref["acc_full"] if ref["acc_full"] > 0 else float("nan")
        ratio = len(distilled) / len(ds.train_labels)
        cell.tracker.log_metrics(cell.run_id, {"images": len(distilled), "compression_ratio": ratio})
        per_seed, summary = cell.record_per_seed(rows)
    return CompressionResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                             images=len(distilled), ratio=ratio, run_id=cell.run_id)
