"""Parameters and steps every protocol shares: which set, on which data and model (``SET_PARAMS``),
and, for the DD-Ranking protocols, how a method's own evaluation is reproduced (``PRESET_PARAMS``)."""

from __future__ import annotations

from ddlib.data.datasets import list_datasets
from ddlib.data.distilled import DistilledSet
from ddlib.models import list_models
from ddlib.protocols.cell import Cell
from ddlib.protocols.preset_eval import LR_GRID, LR_SELECT, resolve_preset
from ddlib.methods.sources import obtain_set, resolve_source, validate_source
from ddlib.engine.train import Recipe

# Which set, compared with which random subset, on which data and model.
SET_PARAMS = {
    "dataset": "digits",
    "data_root": None,
    "method": "random",
    "source": None,  # None: a built-in method (random, kcenter, dm); else a source spec
    "ipc": 1,
    "model": "convnet",
    "seeds": [0, 1, 2, 3, 4],  # DD-Ranking reports 5 seeds
    "device": "auto",
    # CPU smoke runs only: fewer real images (per class) and a stratified test subset. null = full.
    "train_per_class": None,
    "test_size": None,
}

# How the method's own evaluation is reproduced (ddlib.protocols.preset_eval), against which random subset.
PRESET_PARAMS = {
    "baseline_seed": 0,
    "preset": None,  # params/methods/<name>.yaml or a path; null = hard labels only
    "preset_epochs": None,  # override the preset's epochs (CPU smoke runs)
    "teacher_recipe": {},  # how the suite trains teachers on the real data (Recipe keys)
    "teacher_checkpoints": None,  # or your own teachers: one state_dict path per ensemble member
    "lr_select": "validation",  # validation | test (the peer's choice, labelled) | none
    "lr_grid": list(LR_GRID),
    "val_fraction": 0.1,  # held out of the real training set when a preset searches the lr on validation
}


FULL_IPC = 0  # the ipc of a ``full`` cell: all images (shown as "all" in leaderboards)


def positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_weight(p: dict, key: str) -> None:
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


def validate_set_params(protocol: str, defaults: dict, params: dict) -> dict:
    """Fill defaults, refuse unknown names, check the set parameters and resolve the source
    (errors name the key)."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for protocol {protocol}; known: {sorted(defaults)}")
    p = {**defaults, **params}
    if not isinstance(p["dataset"], str) or not (p["dataset"] in list_datasets() or p["dataset"].startswith("imagefolder:")):
        raise ValueError(f"dataset: unknown dataset {p['dataset']!r}; known: {list_datasets()}")
    if "model" in p and p["model"] not in list_models():
        raise ValueError(f"model: unknown model {p['model']!r}; known: {list_models()}")
    p["source"] = validate_source(p["method"], p["source"]) if p["source"] is not None else resolve_source(p["method"])
    if p["source"]["kind"] == "full":
        p["ipc"] = FULL_IPC  # the whole training set: one cell, one leaderboard row, whatever ipc the grid crossed it with
    elif not positive_int(p["ipc"]):
        raise ValueError(f"ipc must be a positive integer, got {p['ipc']!r}")
    seeds = p["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat, got {seeds!r}")
    for key in ("train_per_class", "test_size"):
        if p[key] is not None and not positive_int(p[key]):
            raise ValueError(f"{key} must be null or a positive integer, got {p[key]!r}")
    return p


def validate_common(protocol: str, defaults: dict, params: dict) -> dict:
    """:func:`validate_set_params`, then the preset parameters of the DD-Ranking protocols."""
    p = validate_set_params(protocol, defaults, params)
    if not isinstance(p["baseline_seed"], int):
        raise ValueError(f"baseline_seed must be an integer, got {p['baseline_seed']!r}")
    if p["preset_epochs"] is not None and not positive_int(p["preset_epochs"]):
        raise ValueError(f"preset_epochs must be null or a positive integer, got {p['preset_epochs']!r}")
    if p["preset"] is not None:
        try:
            resolve_preset(p["preset"])
        except (ValueError, OSError) as e:
            raise ValueError(f"preset: {e}") from None
    if p["lr_select"] not in LR_SELECT:
        raise ValueError(f"lr_select must be one of {LR_SELECT}, got {p['lr_select']!r}")
    grid = p["lr_grid"]
    if not isinstance(grid, list) or not grid or not all(isinstance(v, (int, float)) and v > 0 for v in grid):
        raise ValueError(f"lr_grid must be a non-empty list of positive numbers, got {grid!r}")
    if p["val_fraction"] is not None and not (isinstance(p["val_fraction"], (int, float)) and 0 < p["val_fraction"] < 1):
        raise ValueError(f"val_fraction must be null or a number in (0, 1), got {p['val_fraction']!r}")
    checkpoints = p["teacher_checkpoints"]
    if checkpoints is not None and (not isinstance(checkpoints, list) or not all(isinstance(c, str) for c in checkpoints)):
        raise ValueError(f"teacher_checkpoints must be null or a list of paths, got {checkpoints!r}")
    check_recipe(p, "teacher_recipe")
    return p


def open_protocol_cell(protocol: str, p: dict, run_id: str | None, experiment: str | None) -> Cell:
    """Open the cell's run; hold out a validation split when the preset searches the lr on one."""
    preset = resolve_preset(p["preset"])
    needs_validation = preset is not None and preset.lr_search and p["lr_select"] == "validation"
    return Cell.open(protocol, p, run_id=run_id, experiment=experiment,
                     val_fraction=p["val_fraction"] if needs_validation else None)


def preset_options(p: dict) -> dict:
    """Keyword arguments of :func:`ddlib.protocols.preset_eval.evaluate_with_preset` from the params."""
    return dict(lr_select=p["lr_select"], lr_grid=p["lr_grid"], epochs=p["preset_epochs"],
                teacher_recipe=Recipe.from_dict(p["teacher_recipe"]), teacher_checkpoints=p["teacher_checkpoints"])


def obtain(cell: Cell) -> DistilledSet:
    """The cell's distilled set (made or loaded), logged as an image grid."""
    p = cell.params
    with cell.guard():
        distilled = obtain_set(p["method"], p["source"], cell.dataset, p["ipc"], device=cell.device,
                               progress=cell.progress)
        cell.log_set(distilled, "distilled")
    return distilled
