"""Parameters and steps every protocol shares: which set, on which data and model (``SET_PARAMS``),
and, for the DD-Ranking protocols, how a method's own evaluation is reproduced (``PRESET_PARAMS``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from ddlib.data.datasets import list_datasets
from ddlib.data.distilled import DistilledSet
from ddlib.models import list_models
from ddlib.data.digest import tensor_digest
from ddlib.boards.table import FULL_IPC  # the ipc of a ``full`` cell: all images, shown as "all"
from ddlib.protocols.cell import Cell
from ddlib.store.tags import CONSTRUCTION_TAG, SET_DIGEST_TAG
from ddlib.protocols.leakage import check_set
from ddlib.protocols.preset_eval import DEFAULT_MODEL, LR_GRID, LR_POLICIES, LR_SEARCHES, LR_SELECT
from ddlib.protocols.side_plan import resolve_preset
from ddlib.protocols.spec import Param
from ddlib.methods.sources import MODEL_KINDS, obtain_set, resolve_source, validate_source
from ddlib.engine.recipe import Recipe
from ddlib.specs.shown import shown

# Which set, compared with which random subset, on which data and model.
SET_PARAMS = {
    "dataset": Param("digits", "the real dataset (digits, mnist, cifar10, ..., imagefolder:<path>)"),
    "data_root": Param(None, "where the dataset is (null: $DDLIB_DATA); a folder, archive or file", "str"),
    "method": Param("random", "the set: a built-in method (random, kcenter, herding, el2n, aum, ccs, dm, ...), full, "
                              "or a grid method"),
    "source": Param(None, "where the set comes from (null: the built-in method); the runner fills it from "
                          "the grid's methods section", "dict"),
    "ipc": Param(1, "images per class"),
    "model": Param("convnet", "the architecture trained on the set (ddlib.models)"),
    "seeds": Param([0, 1, 2, 3, 4], "evaluation seeds, one model each (DD-Ranking reports 5)", "list[int]"),
    "device": Param("auto", "auto, cpu, cuda, cuda:N or mps"),
    "train_per_class": Param(None, "CPU smoke runs only: real training images per class (null: all)", "int"),
    "test_size": Param(None, "CPU smoke runs only: a class-stratified test subset (null: the whole test set)", "int"),
    "epochs": Param(None, "training epochs (one name everywhere): preset_epochs under a preset, else recipe's "
                          "epochs and aug_epochs", "int"),
}

# How the method's own evaluation is reproduced (ddlib.protocols.preset_eval), against which random subset.
PRESET_PARAMS = {
    "model": Param(None, "null: the preset's student (its model), else convnet; a name here always wins", "str"),
    "baseline_seed": Param(None, "null: each evaluation seed draws its own random subset (DD-Ranking); an int: "
                                 "one subset for all", "int"),
    "preset": Param(None, "the method's evaluation preset: params/methods/<name>.yaml or a path (null: hard labels "
                          "only)", "str"),
    "preset_epochs": Param(None, "override the preset's epochs (CPU smoke runs)", "int"),
    "teacher_recipe": Param({}, "Recipe keys over the preset's teacher recipe (how the suite trains teachers)"),
    "teacher_checkpoints": Param(None, "your own teachers instead: one state_dict path per ensemble member",
                                 "list[str]"),
    "lr_policy": Param("paper", "paper | symmetric | fixed (ddlib.protocols.preset_eval)"),
    "lr_select": Param("validation", "where an lr search is scored: validation | test (the peer's choice, labelled)"),
    "lr_grid": Param(list(LR_GRID), "the learning rates an lr search tries", "list[float]"),
    "lr_search": Param("full", "full | halving (successive halving, labelled)"),
    "val_fraction": Param(0.1, "held out of the real training set of every cell for lr searches (null: none)"),
}



MAX_SEED = 2**32 - 1  # NumPy's RandomState takes no more; torch's generators take up to 2**64 - 1


def positive_int(value) -> bool:
    """Whether ``value`` is an int >= 1 (a bool is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device(device) -> None:
    """A device torch can name: checked here, not first inside a kernel (which device exists is the
    worker's business: a grid may be launched from a machine without the GPU its workers have)."""
    if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        raise ValueError(f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")


def check_weight(p: dict, key: str) -> None:
    """Refuse a score weight (``w``, ``gamma``) outside [0, 1], naming the key."""
    if not isinstance(p[key], (int, float)) or isinstance(p[key], bool) or not 0 <= p[key] <= 1:
        raise ValueError(f"{key} must be a number in [0, 1], got {p[key]!r}")


def check_recipe(p: dict, key: str, base: Recipe | None = None) -> Recipe:
    """The recipe under ``key`` (a mapping of Recipe keys), or a ValueError naming the key."""
    if not isinstance(p[key], dict):
        raise ValueError(f"{key} must be a mapping of recipe keys, got {p[key]!r}")
    try:
        return Recipe.from_dict(p[key], base=base)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{key}: {e}") from None


def validate_set_params(protocol: str, defaults: dict, params: dict, trained_models: bool = False) -> dict:
    """Fill defaults, refuse unknown names, check the set parameters and resolve the source
    (errors name the key). ``trained_models``: the protocol also takes sources that are trained
    models (``kind: checkpoint``), not sets."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for protocol {protocol}; known: {sorted(defaults)}")
    p = {**defaults, **params}
    prefixes = tuple(name[: -len("<path>")] for name in list_datasets() if name.endswith(":<path>"))  # imagefolder:, stream:
    if not isinstance(p["dataset"], str) or not (p["dataset"] in list_datasets() or p["dataset"].startswith(prefixes)):
        raise ValueError(f"dataset: unknown dataset {p['dataset']!r}; known: {list_datasets()}")
    if "model" in p and p["model"] is not None and p["model"] not in list_models():
        raise ValueError(f"model: unknown model {p['model']!r}; known: {list_models()}")
    check_device(p["device"])
    if p["data_root"] is not None:
        if not isinstance(p["data_root"], str):
            raise ValueError(f"data_root must be null or a path, got {p['data_root']!r}")
        if not Path(p["data_root"]).expanduser().exists():
            raise ValueError(f"data_root: {p['data_root']} does not exist")
    p["source"] = validate_source(p["method"], p["source"]) if p["source"] is not None else resolve_source(p["method"])
    if p["source"]["kind"] in MODEL_KINDS and not trained_models:
        raise ValueError(f"method {p['method']!r}: kind {p['source']['kind']!r} is a trained model, not a set; "
                         f"protocol {protocol} needs a set (only adversarial attacks checkpoints)")
    if p["source"]["kind"] == "full":
        p["ipc"] = FULL_IPC  # the whole training set: one cell, one leaderboard row, whatever ipc the grid crossed it with
    elif not positive_int(p["ipc"]):
        raise ValueError(f"ipc must be a positive integer, got {p['ipc']!r}")
    seeds = p["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers, got {shown(seeds)}")
    if not all(0 <= s <= MAX_SEED for s in seeds):
        bad = next(s for s in seeds if not 0 <= s <= MAX_SEED)
        raise ValueError(f"seeds must lie in 0..{MAX_SEED} (2**32 - 1, what every generator takes), got {shown(bad)}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat, got {seeds!r}")
    for key in ("train_per_class", "test_size"):
        if p[key] is not None and not positive_int(p[key]):
            raise ValueError(f"{key} must be null or a positive integer, got {p[key]!r}")
    if p.get("epochs") is not None:
        _fold_epochs(p, params)
    return p


def _fold_epochs(p: dict, given: dict) -> None:
    """``epochs``: one name for "what the set is trained for", written into the key the protocol
    trains by (so ``epochs: 5`` is the very cell ``preset_epochs: 5`` or ``recipe: {epochs: 5}`` is):
    a preset's ``preset_epochs``; otherwise the recipe's epochs, and ``aug_epochs`` where the protocol
    trains with augmentation at its own epochs (DC-Bench)."""
    epochs = p["epochs"]
    if not positive_int(epochs):
        raise ValueError(f"epochs must be a positive integer, got {shown(epochs)}")
    if "preset_epochs" in p and p.get("preset") is not None:
        targets = {"preset_epochs": p["preset_epochs"]}
    else:
        targets = {"recipe.epochs": (p["recipe"] or {}).get("epochs") if isinstance(p.get("recipe"), dict) else None}
        if "aug_epochs" in p:
            targets["aug_epochs"] = p["aug_epochs"] if "aug_epochs" in given else None
    for key, value in targets.items():
        if value is not None and value != epochs:
            raise ValueError(f"epochs: {epochs} and {key}: {value} disagree; give one of them")
    for key in targets:
        if key == "recipe.epochs":
            p["recipe"] = {**(p["recipe"] or {}), "epochs": epochs}
        else:
            p[key] = epochs
    p["epochs"] = None


def validate_common(protocol: str, defaults: dict, params: dict) -> dict:
    """:func:`validate_set_params`, then the preset parameters of the DD-Ranking protocols; a null
    ``model`` becomes the preset's student (else ``convnet``)."""
    p = validate_set_params(protocol, defaults, params)
    if p["baseline_seed"] is not None and (not isinstance(p["baseline_seed"], int) or isinstance(p["baseline_seed"], bool)
                                           or not 0 <= p["baseline_seed"] <= MAX_SEED):
        raise ValueError(f"baseline_seed must be null (the evaluation seed) or an integer in 0..{MAX_SEED}, "
                         f"got {p['baseline_seed']!r}")
    if p["preset_epochs"] is not None and not positive_int(p["preset_epochs"]):
        raise ValueError(f"preset_epochs must be null or a positive integer, got {p['preset_epochs']!r}")
    preset = None
    if p["preset"] is not None:
        try:
            preset = resolve_preset(p["preset"])
        except (ValueError, OSError) as e:
            raise ValueError(f"preset: {e}") from None
    if p["model"] is None:
        p["model"] = (preset.model if preset is not None and preset.model else None) or DEFAULT_MODEL
    if p["lr_policy"] not in LR_POLICIES:
        raise ValueError(f"lr_policy must be one of {LR_POLICIES}, got {p['lr_policy']!r}")
    if p["lr_select"] not in LR_SELECT:
        hint = " ('none' is now lr_policy: fixed)" if p["lr_select"] == "none" else ""
        raise ValueError(f"lr_select must be one of {LR_SELECT}, got {p['lr_select']!r}{hint}")
    if p["lr_search"] not in LR_SEARCHES:
        raise ValueError(f"lr_search must be one of {LR_SEARCHES}, got {p['lr_search']!r}")
    grid = p["lr_grid"]
    if not isinstance(grid, list) or not grid or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in grid):
        raise ValueError(f"lr_grid must be a non-empty list of positive numbers, got {grid!r}")
    fraction = p["val_fraction"]
    if fraction is None:
        if p["lr_policy"] != "fixed" and p["lr_select"] == "validation":
            raise ValueError("val_fraction: null (no validation split) leaves nothing to score the lr search on; "
                             "give a fraction, or lr_select: test, or lr_policy: fixed")
    elif isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        raise ValueError(f"val_fraction must be null or a number in (0, 1), got {fraction!r}")
    checkpoints = p["teacher_checkpoints"]
    if checkpoints is not None and (not isinstance(checkpoints, list) or not all(isinstance(c, str) for c in checkpoints)):
        raise ValueError(f"teacher_checkpoints must be null or a list of paths, got {checkpoints!r}")
    check_recipe(p, "teacher_recipe")
    return p


def set_digest(distilled: DistilledSet) -> str:
    """What a set is, for the keys: its images, labels, soft labels and learned lr."""
    import torch

    lr = None if distilled.learned_lr is None else torch.tensor(float(distilled.learned_lr), dtype=torch.float64)
    return tensor_digest(distilled.images, distilled.labels, distilled.soft_labels, lr)


def obtain(cell: Cell) -> DistilledSet:
    """The cell's distilled set (made or loaded), as pixels, logged as an image grid. A set stored in
    ZCA space (``zca_space``) is turned back into pixels with the cell's one ZCA (:meth:`Cell.zca`, fitted
    as MTT/DATM/DD-Ranking fit theirs), so a preset with ``zca: true`` feeds the student the stored values.

    The set's digest (:func:`set_digest`, of the set as trained on) is tagged on the cell
    (:data:`~ddlib.protocols.cell.SET_DIGEST_TAG`) and is part of every leaderboard row's key: the
    cell's config key, which the runner skips FINISHED cells by, is computed before the set exists, so
    a built-in method (random, kcenter, dm) whose code came to produce another set would otherwise be
    pooled with its old cells. Every evaluation is keyed by its training tensors already, so nothing
    trained on one set is reused for another; and a change of what a built-in kind produces bumps
    its entry of :data:`ddlib.methods.sources.BUILTIN_REVISIONS`, part of the config key, so a rerun
    recomputes such cells instead of skipping them.

    The set is then checked against the cell's test and validation splits (:mod:`ddlib.protocols.leakage`:
    logged, flagged where images leaked, refused in strict mode before anything trains)."""
    p = cell.params
    with cell.guard():
        distilled = obtain_set(p["method"], p["source"], cell.dataset, p["ipc"], device=cell.device,
                               progress=cell.progress)
        if distilled.zca_space:
            distilled = _from_zca_space(cell, distilled)
        cell.tracker.set_tags(cell.run_id, {SET_DIGEST_TAG: set_digest(distilled)})
        log_construction(cell, distilled)
        cell.log_set(distilled, "distilled")
        check_set(cell, distilled)
    return distilled


def log_construction(cell: Cell, distilled: DistilledSet) -> None:
    """What the set cost to make (:mod:`ddlib.methods.cost`), on the cell's run: measured seconds and FLOPs for a
    built-in method, the declared GPU hours for another; the device as a tag. Metrics only: no key changes."""
    made = distilled.provenance.get("construction") if isinstance(distilled.provenance, dict) else None
    if not made:
        return
    tags = {CONSTRUCTION_TAG: "declared" if made.get("declared") else "measured"}
    if made.get("device"):
        tags[f"{CONSTRUCTION_TAG}.device"] = made["device"]
    if made.get("seconds_unknown_parts"):
        tags[f"{CONSTRUCTION_TAG}.unknown_parts"] = made["seconds_unknown_parts"]
    values = {"construction_seconds": made.get("seconds"), "construction_flops": made.get("flops"),
              "construction_gpu_hours": made.get("gpu_hours")}
    cell.tracker.set_tags(cell.run_id, tags)
    cell.tracker.log_metrics(cell.run_id, {k: float(v) for k, v in values.items() if v is not None})


def _from_zca_space(cell: Cell, distilled: DistilledSet) -> DistilledSet:
    from dataclasses import replace

    from ddlib.engine.augment import zca_to_pixels

    ds = cell.unsplit if cell.unsplit is not None else cell.dataset
    pixels = zca_to_pixels(distilled.images, cell.zca()).cpu()
    provenance = {**distilled.provenance, "zca_space": f"stored ZCA-whitened; inverted with ZCA(eps=0.1) fitted on the "
                                                      f"[0, 1] pixels of {len(ds.train_labels)} real training images "
                                                      f"of {ds.name} (the one a preset with zca: true whitens with)"}
    cell.tracker.set_tags(cell.run_id, {"ddlib.zca_space": provenance["zca_space"]})
    return replace(distilled, images=pixels.contiguous(), zca_space=False, provenance=provenance)
