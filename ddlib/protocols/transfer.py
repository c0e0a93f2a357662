"""DC-Bench's transfer lens: one set trained on several architectures (one grid cell).

A distilled set is usually made with a ConvNet; does it still train a ResNet, a ViT, an MLP?
Per seed the cell reports the accuracy on every architecture of ``models`` (the model registry's
names), the accuracy on the reference ``model`` (ConvNet), DC-Bench's "Transfer" column
(``acc_transfer``: the mean over MLP, ResNet-18, ResNet-152 and ViT only, as its Table 2 prints;
present when ``models`` has all four) and, beside it, the mean over every architecture but the
reference (``acc_others_avg``). Whether the *ranking of methods* survives the change of
architecture needs several cells: the summary gives Kendall's tau between the method ranking on
the reference model and on each other one.

DC-Bench trains every architecture with DSA (1000 epochs): ``augment: dsa`` is the default, under
DC-Bench's schedule (``scheduler: dc_step``: 1001 epochs, lr x 0.1 and momentum reset after 502;
:mod:`ddlib.protocols.dcbench`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ddlib.data.distilled import DistilledSet
from ddlib.models import create_model, list_models
from ddlib.protocols.cell import Cell
from ddlib.protocols.spec import IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.protocols.common import SET_PARAMS, obtain, validate_set_params
from ddlib.protocols.dcbench import (RECIPE_PARAMS, TrainingCondition, accuracy_rows, check_augment, check_convnet_depth,
                                     check_recipe_params, convnet_for_images, setting_recipe, mean_std_table,
                                     train_settings)
from ddlib.engine.recipe import Recipe

__all__ = ["PROTOCOL", "PARAMS", "DCBENCH_TRANSFER_MODELS", "validate", "open_cell", "obtain", "evaluate",
           "TransferResult"]

SPEC = ProtocolSpec(
    name="transfer", revision=6, order=50, title="DC-Bench: transfer across architectures",
    summary="a set trained on several architectures: DC-Bench's Transfer (MLP, ResNet-18, ResNet-152, ViT) and the rest",
    params={
        **SET_PARAMS,
        "model": Param("convnet", "the reference architecture the set was distilled with"),
        **RECIPE_PARAMS,
        "models": Param(["convnet", "mlp", "lenet", "alexnet", "vgg11", "resnet18", "resnet152", "vit"],
                        "the architectures trained on the set (ddlib.models)", "list[str]"),
        "model_recipes": Param({}, "per-architecture recipe overrides, e.g. {vit: {optimizer: adam, lr: 0.001}}"),
        "augment": Param("dsa", "one augmentation spec (ddlib.engine.augment) or null; DC-Bench trains with DSA", "str"),
    },
    boards=(Board("transfer", "DC-Bench: transfer across architectures",
                  "ddlib.protocols.dcbench_boards:transfer_leaderboard",
                  "acc_transfer", "DC-Bench Transfer (mean over MLP, ResNet-18, ResNet-152, ViT)",
                  columns=(("acc_reference", "reference architecture (the set's own)"),
                           ("acc_transfer", "DC-Bench Transfer: mean over MLP, ResNet-18, ResNet-152, ViT"),
                           ("acc_others_avg", "mean over every other architecture")),
                  more_columns=True, variant=("model",), heading="DC-Bench: accuracy (%) across architectures",
                  section="ddlib.protocols.dcbench_boards:section",
                  derived=(("transfer_tau", "ddlib.protocols.dcbench_boards:transfer_tau"),)),),
    headline="transfer",
    history=("2: DSA (1000 epochs) by default; DC-Bench's four-architecture Transfer average",
             "3: trainings default to precision auto (bf16 where the device computes it natively)",
             "4: DC-Bench's schedule by default (scheduler dc_step: one more epoch, momentum reset at the drop)",
             f"5: {LAYOUT_REVISION}",
             f"6: {IDENTITY_REVISION}"
              "; the 4-layer ConvNet (convnet_d4) by default on 64 px data (Tiny ImageNet, in the default models "
              "too), a 3-layer ConvNet refused there"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()
# The architectures DC-Bench's "Transfer" column averages (Table 2: Random CIFAR-10 IPC 10,
# (25.08 + 29.52 + 15.84 + 26.21) / 4 = 24.16).
DCBENCH_TRANSFER_MODELS = ("mlp", "resnet18", "resnet152", "vit")


def validate(params: dict) -> dict:
    """Check a transfer cell's params before anything runs (one-line errors naming the key)."""
    p = validate_set_params(PROTOCOL, PARAMS, params)
    convnet_for_images(p, params)
    base = check_recipe_params(p)
    check_augment(p["augment"], "augment")
    models = p["models"]
    if not isinstance(models, list) or not models or len(set(models)) != len(models):
        raise ValueError(f"models must be a non-empty list of distinct model names, got {models!r}")
    unknown = [m for m in models if m not in list_models()]
    if unknown:
        raise ValueError(f"models: unknown model(s) {unknown}; known: {list_models()}")
    if p["model"] not in models:
        raise ValueError(f"models must include the reference model {p['model']!r}, got {models}")
    overrides = p["model_recipes"]
    if not isinstance(overrides, dict) or any(m not in models for m in overrides):
        raise ValueError(f"model_recipes must map names in models to recipe overrides, got {overrides!r}")
    for name, values in overrides.items():
        try:
            Recipe.from_dict(values, base=base)
        except (ValueError, TypeError) as e:
            raise ValueError(f"model_recipes.{name}: {e}") from None
    return p


@dataclass(kw_only=True)
class TransferResult(Result):
    """per_seed: acc_<model>..., acc_reference, acc_transfer, acc_others_avg per seed."""

    models: list[str]

    def table(self) -> pd.DataFrame:
        return mean_std_table(self.summary, [*self.models, "transfer", "others_avg"])


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """Open the transfer cell's MLflow run, its configuration resolved and checked before the set is obtained."""
    cell = Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)
    ds = cell.dataset
    with cell.guard():  # an architecture that cannot take these images fails now, not after the others trained
        check_convnet_depth(cell.params["models"], ds.image_size, "models", f"{ds.name}'s")
        for name in cell.params["models"]:
            try:
                create_model(name, ds.channels, ds.num_classes, ds.image_size)
            except ValueError as e:
                raise ValueError(f"models: {name} cannot be trained on {ds.name} "
                                 f"({ds.channels}x{ds.image_size[0]}x{ds.image_size[1]}): {e}") from None
    return cell


def evaluate(cell: Cell, distilled: DistilledSet) -> TransferResult:
    """Train, test and score: DC-Bench's accuracy of the set across architectures (the cell's Result)."""
    p = cell.params
    recipe = setting_recipe(p, p["augment"])
    conditions = [TrainingCondition(m, m, Recipe.from_dict(p["model_recipes"].get(m, {}), base=recipe), p["augment"])
                  for m in p["models"]]
    with cell.guard():
        rows = accuracy_rows(train_settings(cell, distilled, conditions), p["seeds"])
        others = [m for m in p["models"] if m != p["model"]]
        dcbench = set(DCBENCH_TRANSFER_MODELS) <= set(p["models"])
        for row in rows:
            row["acc_reference"] = row[f"acc_{p['model']}"]
            if dcbench:
                row["acc_transfer"] = sum(row[f"acc_{m}"] for m in DCBENCH_TRANSFER_MODELS) / len(DCBENCH_TRANSFER_MODELS)
            if others:
                row["acc_others_avg"] = sum(row[f"acc_{m}"] for m in others) / len(others)
        per_seed, summary = cell.record_per_seed(rows)
    return TransferResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                          models=list(p["models"]), run_id=cell.run_id)
