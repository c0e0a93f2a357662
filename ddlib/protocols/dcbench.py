"""What DC-Bench's protocols share: train one set under several *conditions* and report accuracies.

DC-Bench (Cui et al., NeurIPS 2022 Datasets & Benchmarks) looks at a distilled set through
several lenses that differ only in how the set is trained: under which augmentation
(``augmentation``), at which size (``compression``), on which architecture (``transfer``). Each
lens is a list of :class:`TrainingCondition` given to :func:`train_settings`, which trains every
condition with the one training loop through :meth:`ddlib.protocols.cell.Cell.train_eval` (so identical
trainings are reused across cells and protocols).

DC-Bench's recipe (:data:`DCBENCH_RECIPE`, the base of ``recipe``): ConvNet, SGD lr 0.01, momentum 0.9,
weight decay 5e-4, batch 256; 300 epochs without augmentation, 1000 with (``recipe`` holds the
former, ``aug_epochs`` the latter); and DC's schedule as DC-Bench's code runs it
(``EvaluatorUtils.evaluate_synset_dataset``, DC's ``utils.evaluate_synset``): ``Epoch + 1`` epochs
(301 / 1001), lr x 0.1 after epoch ``Epoch // 2 + 1`` with a new SGD optimizer, so momentum
restarts: ``scheduler: dc_step``. (Before REVISION 4 these protocols trained ``Epoch`` epochs
and kept momentum across the drop at ``Epoch // 2``: ``recipe: {scheduler: step}`` still does.) Its compression and
transfer tables (Tables 2, 5, 6) train every set, and the whole
training set, with DSA; those two protocols therefore train with ``augment: dsa`` by default.

DC-Bench's ConvNet follows the images: depth 3 at 32 px, its ``convnet4`` (four conv-norm-ReLU-pool
blocks) on Tiny ImageNet's 64 px (the 3-layer one leaves an 8x8 map, a classifier 4x as wide). Here
(:func:`convnet_for_images`) an unset ``model`` (and transfer's ``models``) is ``convnet_d4`` where the
dataset's name says 64 px (``tinyimagenet``), and a 3-layer ConvNet at 64 px or more is refused, by
name before the cell starts, or once another dataset is loaded and turns out that large.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from ddlib.engine.augment import create_augment
from ddlib.data.distilled import DistilledSet
from ddlib.protocols.cell import Cell, TrainedModel
from ddlib.protocols.spec import Param
from ddlib.protocols.common import positive_int, check_recipe
from ddlib.engine.recipe import Recipe

__all__ = ["DCBENCH_RECIPE", "RECIPE_PARAMS", "TrainingCondition", "train_settings", "check_recipe_params", "augment_label",
           "setting_recipe", "accuracy_rows", "best_by_mean", "DEEPER_CONVNET", "convnet_for_images",
           "check_convnet_depth", "check_cell_convnets"]

# DC-Bench's evaluation recipe: Recipe's defaults (SGD 0.01, momentum 0.9, wd 5e-4, batch 256, 300
# epochs) under DC's own schedule (301 epochs, lr x 0.1 and momentum reset after the first 152).
DCBENCH_RECIPE = Recipe(scheduler="dc_step")

# How every condition is trained unless it says otherwise.
RECIPE_PARAMS = {
    "recipe": Param({}, "Recipe keys over DC-Bench's recipe (300 epochs without augmentation, SGD 0.01, dc_step)"),
    "aug_epochs": Param(1000, "epochs when a condition trains with an augmentation (DC-Bench); null: the recipe's"),
    "real_recipe": Param({}, "overrides when training on the whole training set (method full, the full-data reference)"),
}


# The 3-layer ConvNets and the 4-layer ones DC-Bench trains instead from 64 px (its `convnet4`).
DEEPER_CONVNET = {"convnet": "convnet_d4", "convnet_bn": "convnet_d4_bn"}
DEEP_IMAGES = 64  # px: from here on DC-Bench's ConvNet has 4 layers (ddlib.methods.select.feature_model_name)
# Datasets whose image size the name says, so the default is decided before any data is read.
NAMED_IMAGE_SIZES = {"tinyimagenet": 64}


def check_convnet_depth(models: list[str], image_size, key: str = "model", where: str = "") -> None:
    """Refuse a 3-layer ConvNet on images of 64 px or more, where DC-Bench trains its 4-layer one."""
    if min(image_size if isinstance(image_size, (tuple, list)) else (image_size,)) < DEEP_IMAGES:
        return
    for name in models:
        if name in DEEPER_CONVNET:
            raise ValueError(f"{key}: {name} is the 3-layer ConvNet; on {where or 'these'} images of "
                             f"{DEEP_IMAGES} px or more DC-Bench trains the 4-layer one: give {DEEPER_CONVNET[name]}")


def convnet_for_images(p: dict, given: dict) -> None:
    """Where the dataset's name says its images are 64 px: an unset ``model`` (and ``models``) becomes
    the 4-layer ConvNet, and a 3-layer one given is refused before anything runs."""
    size = NAMED_IMAGE_SIZES.get(p["dataset"])
    if size is None or size < DEEP_IMAGES:
        return
    if "model" not in given:
        p["model"] = DEEPER_CONVNET.get(p["model"], p["model"])
    if "models" in p and "models" not in given:
        p["models"] = [DEEPER_CONVNET.get(m, m) for m in p["models"]]
    check_convnet_depth([p["model"]], size, "model", f"{p['dataset']}'s")
    check_convnet_depth(p.get("models") or [], size, "models", f"{p['dataset']}'s")


def check_cell_convnets(cell: Cell, models: list[str], key: str = "model") -> None:
    """Once the cell's data is loaded (a dataset the name does not size): :func:`check_convnet_depth`,
    the cell marked failed before anything trains."""
    ds = cell.dataset
    with cell.guard():
        check_convnet_depth(models, ds.image_size, key, f"{ds.name}'s")


@dataclass(frozen=True)
class TrainingCondition:
    """One condition a set is trained under, one DC-Bench column: a label (the metric is ``acc_<label>``),
    model, recipe, augmentation spec."""

    label: str
    model: str
    recipe: Recipe
    augment: object = None  # an augmentation spec (ddlib.engine.augment), None = none
    model_kwargs: dict | None = None


def check_recipe_params(p: dict, base: Recipe | None = None) -> Recipe:
    """Check ``recipe`` (on top of ``base``, the protocol's default recipe, :data:`DCBENCH_RECIPE` unless
    given), ``real_recipe`` and ``aug_epochs``."""
    recipe = check_recipe(p, "recipe", base=DCBENCH_RECIPE if base is None else base)
    check_recipe(p, "real_recipe", base=recipe)
    if p["aug_epochs"] is not None and not positive_int(p["aug_epochs"]):
        raise ValueError(f"aug_epochs must be null or a positive integer, got {p['aug_epochs']!r}")
    return recipe


def augment_label(spec) -> str:
    """The short name of a single-op augmentation spec: ``"dsa"`` or ``{dsa: {...}}`` -> ``dsa``. A
    policy op drawn per image (``{autoaugment: {draw: image}}``) is ``autoaugment_per_image``: the
    bare name (``acc_autoaugment``) always means DC-Bench's one draw per batch."""
    if spec is None:
        return "none"
    if isinstance(spec, str):
        return spec
    if isinstance(spec, dict) and len(spec) == 1:
        op, params = next(iter(spec.items()))
        per_image = isinstance(params, dict) and params.get("draw") == "image"
        return f"{op}_per_image" if per_image else str(op)
    raise ValueError(f"each augmentation must be one op, a name or {{op: {{params}}}}, got {spec!r}")


def check_augment(spec, key: str) -> None:
    """Validate an augmentation spec before anything runs (create_augment names the op and the key)."""
    try:
        create_augment(spec, mean=(0.5,), std=(0.5,), num_classes=10)
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None


def setting_recipe(p: dict, augment, full: bool | None = None, base: Recipe | None = None) -> Recipe:
    """The params' recipe (on top of ``base``, the protocol's default), with ``aug_epochs`` when the
    condition trains with an augmentation, and ``real_recipe``'s overrides on top when it trains
    on the whole training set (``full``; by default, when the cell's method is the ``full`` source).
    ``base`` defaults to :data:`DCBENCH_RECIPE`."""
    recipe = Recipe.from_dict(p["recipe"], base=DCBENCH_RECIPE if base is None else base)
    if augment_label(augment) != "none" and p["aug_epochs"] is not None:
        recipe = replace(recipe, epochs=p["aug_epochs"])
    if full if full is not None else p["source"].get("kind") == "full":
        recipe = Recipe.from_dict(p["real_recipe"], base=recipe)
    return recipe


def train_settings(cell: Cell, subset: DistilledSet, conditions: list[TrainingCondition], role: str = "syn",
                     keep_models: bool = False, eval_split: str = "test") -> dict[str, list[TrainedModel]]:
    """Train ``subset`` under every condition for the cell's seeds: ``{label: [TrainedModel per seed]}``,
    scored on the test set or (``eval_split="val"``) on the cell's held-out validation split."""
    ds = cell.dataset
    out = {}
    with cell.guard():
        for c in conditions:
            hook = create_augment(c.augment, mean=ds.mean, std=ds.std, num_classes=ds.num_classes)
            out[c.label] = cell.train_eval(
                f"{role}-{c.label}", subset.images, subset.labels, c.recipe, cell.params["seeds"], model=c.model,
                augment=hook, model_kwargs=c.model_kwargs,
                keep_models=keep_models, eval_split=eval_split)
    return out


def accuracy_rows(evaluations: dict[str, list[TrainedModel]], seeds: list[int]) -> list[dict]:
    """One row per seed: ``{"seed": s, "acc_<label>": accuracy, ...}``."""
    return [{"seed": seed, **{f"acc_{label}": evals[i].accuracy for label, evals in evaluations.items()}}
            for i, seed in enumerate(seeds)]


def best_by_mean(accuracies: dict[str, list[float]]) -> str:
    """DC-Bench's "best": the label whose accuracies (one per seed) have the highest mean; the first
    in order on a tie. Its mean and std over seeds are reported, never a mean of per-seed maxima
    (which is biased upward: each seed would pick its own luckiest augmentation)."""
    if not accuracies:
        raise ValueError("no accuracies to choose the best from")
    means = {label: sum(values) / len(values) for label, values in accuracies.items()}
    return max(means, key=lambda label: (means[label], -list(means).index(label)))


def mean_std_table(summary: dict[str, float], labels: list[str], prefix: str = "acc_") -> pd.DataFrame:
    """Accuracies in percent, mean and std over seeds, one row per label the summary has."""
    labels = [label for label in labels if f"{prefix}{label}_mean" in summary]
    return pd.DataFrame({"mean %": [100 * summary[f"{prefix}{label}_mean"] for label in labels],
                         "std %": [100 * summary[f"{prefix}{label}_std"] for label in labels]}, index=labels)
