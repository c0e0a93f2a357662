"""Score one distilled set without writing YAML: ``ddlib score SET --dataset D`` and ``ddlib.score()``

Both build the same one-cell grid: the set as a ``file`` source (any format
:func:`ddlib.data.distilled.load` reads: ``.pt``, ``.npz``, an MTT folder, an ImageFolder),
its IPC read from the file, the protocol's defaults under the given parameters. They differ only
in where the cell runs:

* ``ddlib score`` writes the grid as a params file (``<store>/score/<name>.yaml``, rerunnable
  with ``ddlib run``) and runs it through the batch runner: a papermill notebook, tracked in
  MLflow, skipped when the same cell already FINISHED, then prints the cell's per-seed values
  and their mean and std as read back from MLflow (:func:`cell_result`).
* :func:`score` runs the protocol's notebook steps in this process (no kernel) and returns the
  result object the notebook shows (``per_seed``, ``summary``, ...); the cell is a run of the
  same experiment with the same keys, and every model already trained for it (by ``ddlib score``
  or an earlier call) is reused, not trained again.

The same set, parameters and seeds give the same numbers either way (at the same thread count:
``DDLIB_NUM_THREADS``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ddlib.protocols.spec import set_protocols
from ddlib.specs.shown import shown
from ddlib.store import tracking
from ddlib.store.hashing import config_hash
from ddlib.store.paths import mlruns_dir
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker

__all__ = ["score", "score_grid", "cell_result", "CellResult", "SET_PROTOCOLS", "FILE_OPTIONS", "given_file_options",
           "save_arrays", "QUICK", "QUICK_TAG", "quick_params", "quick_note", "tag_quick"]

# Protocols that score a set (nas also needs a ground-truth file: run it from a params file).
SET_PROTOCOLS = tuple(set_protocols())  # from the protocols' specs (nas also needs a ground truth)
FILE_OPTIONS = ("normalized", "allow_unequal", "experiment_index", "zca_space", "trusted")  # keys of a file source

# ``--quick`` (``ddlib.score(quick=True)``): a first look in a minute or two on digits-sized data, never a
# result: one seed, few epochs, a small lr grid, a short full-data reference, two attacks on 200 images.
# They are parameters, so a quick cell has keys (and leaderboard rows) of its own; given parameters win.
_SHORT = {"seeds": [0], "epochs": 30}
_ATTACKS = {"seeds": [0], "epochs": 50, "attacks": ["fgsm", "pgd"], "attack_size": 200}
QUICK = {"label_robust": {**_SHORT, "lr_grid": [0.005, 0.01, 0.05], "real_recipe": {"epochs": 10, "batch_size": 64,
                                                                                    "lr": 0.05}},
         "augmentation_robust": {**_SHORT, "lr_grid": [0.005, 0.01, 0.05]},
         "adversarial": _ATTACKS, "blackbox": {**_ATTACKS, "target_models": ["random"]},
         "augmentation": {**_SHORT, "augmentations": ["none", "dsa"]},
         "transfer": {**_SHORT, "models": ["convnet", "mlp"]},
         "compression": {**_SHORT, "real_recipe": {"epochs": 10}},
         "privacy": {**_SHORT, "members": 200, "real_recipe": {"epochs": 10}},
         "label_regimes": _SHORT}
QUICK_TAG = TAG["quick"]  # on a quick cell's run: what it is (a first look, not a result; every board says so)
_EPOCH_KEYS = ("epochs", "recipe", "preset_epochs", "aug_epochs")  # a given one: the quick epochs step aside


def quick_params(protocol: str, params: dict) -> dict:
    """``params`` over the protocol's quick settings (:data:`QUICK`)."""
    quick = dict(QUICK.get(protocol, {"seeds": [0]}))
    if any(k in params for k in _EPOCH_KEYS):
        quick.pop("epochs", None)
    return {**quick, **params}


def quick_note(protocol: str) -> str:
    """What a quick cell is, in one line (``ddlib score --quick`` prints it; the cell run is tagged with it)."""
    shown_settings = ", ".join(f"{k} {shown(v)}" for k, v in QUICK.get(protocol, {"seeds": [0]}).items())
    return f"quick look ({shown_settings}): a first look, not a result; its cells are rows of their own"


def tag_quick(run_id: str, protocol: str) -> None:
    """Tag a quick cell's run (:data:`QUICK_TAG`) so that the store says what it is."""
    from ddlib.store.tracking import client

    client().set_tag(run_id, QUICK_TAG, quick_note(protocol))


def given_file_options(normalized: bool | None = None, allow_unequal: bool = False, experiment_index: int | None = None,
                       zca_space: bool | None = None, trusted: bool = False) -> dict:
    """The file source's keys a caller gave (``ddlib score``'s flags, :func:`score`'s arguments), as a
    grid's spec would give them: ``None`` (not given) left out, and ``trusted`` / ``allow_unequal`` only
    when true (false is their default: the spec, and so the cell's key, stays the one a user writes).
    ``normalized: false`` and ``zca_space: false`` are kept: they override the format's default and
    the file's own flag. ``experiment_index`` 0 is an index, kept."""
    given = {"normalized": normalized, "allow_unequal": allow_unequal or None, "experiment_index": experiment_index,
             "zca_space": zca_space, "trusted": trusted or None}
    return {k: v for k, v in given.items() if v is not None}


def method_name(path: str | os.PathLike) -> str:
    """A readable method name from a set's file name: ``sets/my_set_ipc10.npz`` -> ``my_set_ipc10``."""
    stem = Path(path).name.split(".")[0] or "set"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)


def _file_source(path: str | os.PathLike, options: dict) -> dict:
    unknown = sorted(set(options) - set(FILE_OPTIONS))
    if unknown:
        raise ValueError(f"unknown file option(s) {unknown}; known: {list(FILE_OPTIONS)}")
    path = os.path.abspath(os.path.expanduser(path))
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{shown(path)}: the file name holds bytes that are not UTF-8; rename it (MLflow records "
                         "paths as UTF-8 text)") from None
    return {"kind": "file", "path": path, **{k: v for k, v in options.items() if v is not None}}


def set_ipc(path: str | os.PathLike, dataset: str, data_root: str | None = None, **options) -> int:
    """The images per class of the set at ``path`` (read and checked against the dataset)."""
    from ddlib.data.datasets import load_dataset
    from ddlib.data.distilled import load

    return load(Path(path).expanduser(), load_dataset(dataset, data_root), **options).ipc


def like_grid(like: str | os.PathLike, protocol: str | None, dataset: str | None) -> tuple[str, str, dict]:
    """(protocol, experiment, params) of an existing grid's setting, to score a set beside its rows
    (``--like GRID.yaml``, or a shipped grid's name: ``--like demo``): the grid's parameters, and every
    crossed value that is one value only; ``method``, ``ipc`` and ``source`` are the set's. A grid that
    crosses anything else (two presets, two recipes) has several settings: the error names the key to
    choose. A grid of a protocol that scores no single set (``nas``) is refused naming the file."""
    from ddlib.run.grid import load_grid

    spec = load_grid(like)  # a path, or a shipped grid's name (`--like demo`)
    if spec.protocol not in SET_PROTOCOLS:
        raise ValueError(f"--like {like}: its protocol {spec.protocol!r} does not score one set; --like takes a grid "
                         f"of {', '.join(SET_PROTOCOLS)}")
    if protocol is not None and protocol != spec.protocol:
        raise ValueError(f"--like {like}: its protocol is {spec.protocol!r}, not {protocol!r}")
    params = {k: v for k, v in spec.params.items() if k not in ("method", "ipc", "source")}
    for grid in spec.grid:
        for key, values in grid.items():
            if key in ("method", "ipc", "source"):
                continue
            if len({repr(v) for v in values}) > 1 or (key in params and params[key] != values[0]):
                raise ValueError(f"--like {like}: the grid crosses {key} ({shown(values)}): it has several settings; "
                                 f"give {key} yourself (--param {key}=...) and a grid of one setting")
            params[key] = values[0]
    if dataset is not None and params.get("dataset", dataset) != dataset:
        raise ValueError(f"--like {like}: its dataset is {params['dataset']!r}, not {dataset!r}")
    return spec.protocol, spec.experiment, params


def score_grid(path: str | os.PathLike, dataset: str | None = None, protocol: str | None = None,
               method: str | None = None, ipc: int | None = None, file_options: dict | None = None,
               experiment: str | None = None, dry_run: bool = False, like: str | os.PathLike | None = None,
               quick: bool = False, **params) -> dict:
    """The one-cell params grid (a params-file mapping) that scores the set at ``path``.

    ``ipc`` is read from the file when not given; ``file_options`` are the file source's keys
    (``normalized``, ``allow_unequal``, ``experiment_index``, ``zca_space``, ``trusted``); ``params`` are the
    protocol's parameters (``seeds``, ``preset``, ``epochs``, ...). ``like``: a grid whose setting
    (protocol, experiment, parameters) the set is scored in, so its row sits beside the grid's
    (``params`` still win). ``dry_run``: nothing that runs a file's code is read (a ``trusted`` file
    only full unpickling reads needs ``ipc``). ``quick``: the protocol's quick settings under the
    given parameters (:data:`QUICK`)."""
    if like is not None:
        protocol, like_experiment, base = like_grid(like, protocol, dataset)
        experiment = experiment or like_experiment
        params = {**base, **params}
        dataset = dataset or base.get("dataset")
    protocol = protocol or "label_robust"
    if dataset is None:
        raise ValueError("give the dataset the set was distilled from (--dataset)")
    if protocol not in SET_PROTOCOLS:
        raise ValueError(f"protocol must be one of {list(SET_PROTOCOLS)}, got {protocol!r}")
    if quick:
        params = quick_params(protocol, params)
    options = dict(file_options or {})
    source = _file_source(path, options)
    if not Path(source["path"]).exists():
        raise ValueError(f"{source['path']}: no such file or folder")
    method = method or method_name(path)
    if ipc is None and dry_run and options.get("trusted"):
        from ddlib.data.distilled import needs_unpickling

        if needs_unpickling(source["path"]):
            raise ValueError(f"{source['path']}: a dry run does not unpickle a file (trusted: only full unpickling reads "
                             "it, which runs its code); give --ipc to plan the cell without reading it")
    if ipc is None:
        ipc = set_ipc(path, dataset, params.get("data_root"), **{k: v for k, v in options.items() if v is not None})
    grid = {"protocol": protocol, "params": {"dataset": dataset, **params},
            "grid": {"method": [method], "ipc": [int(ipc)]}, "methods": {method: source}}
    if experiment:
        grid["experiment"] = experiment
    return grid


def write_grid(grid: dict, folder: str | os.PathLike | None = None) -> Path:
    """Save a score grid as a params file (named by its method and content) that ``ddlib run`` reruns."""
    import yaml

    folder = Path(folder) if folder is not None else mlruns_dir() / "score"
    folder.mkdir(parents=True, exist_ok=True)
    method = grid["grid"]["method"][0]
    path = folder / f"{grid['protocol']}-{method}-{config_hash(grid, 8)}.yaml"
    path.write_text("# written by `ddlib score`; rerun with: python -m ddlib run " + str(path) + "\n"
                    + yaml.safe_dump(grid, sort_keys=False))
    return path


def save_arrays(images: Any, labels: Any, soft_labels: Any = None, folder: str | os.PathLike | None = None) -> Path:
    """Arrays as an ``.npz`` set under ``<store>/sets/``, named by their content (the same arrays
    give the same file, hence the same cell keys: a second call is a rerun, not a new cell)."""
    import hashlib

    arrays = {"images": _numpy(images), "labels": _numpy(labels)}
    if soft_labels is not None:
        arrays["soft_labels"] = _numpy(soft_labels)
    digest = hashlib.sha256()
    for key, value in arrays.items():
        digest.update(f"{key}:{value.dtype}:{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    folder = Path(folder) if folder is not None else mlruns_dir() / "sets"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"set-{digest.hexdigest()[:16]}.npz"
    if not path.exists():
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    return path


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def resolve_cell(grid: dict) -> tuple[str, str, dict]:
    """(protocol, experiment, the cell's validated params) of a one-cell grid, exactly as the batch
    runner resolves it."""
    from ddlib.run.grid import GridSpec, expand

    spec = GridSpec(Path("<score>"), grid["protocol"], grid.get("experiment") or grid["protocol"],
                    grid["params"], [grid["grid"]], grid["methods"])
    cells = expand(spec)
    return spec.protocol, spec.experiment, cells[0]


# --------------------------------------------------------------------------- reading a cell back


class CellResult:
    """A finished cell as MLflow holds it, in shown units (:mod:`ddlib.specs.units`): ``per_seed`` (one row
    per seed), ``summary`` (``<value>_mean`` and ``<value>_std``), ``facts`` (what the cell logged once:
    models trained and reused, ...), the run's id, its data label and its protocol."""

    def __init__(self, run_id: str, per_seed: pd.DataFrame, summary: dict[str, float], data: str | None,
                 name: str, protocol: str = "", facts: dict[str, float] | None = None):
        self.run_id, self.per_seed, self.summary, self.data, self.name = run_id, per_seed, summary, data, name
        self.protocol, self.facts = protocol, dict(facts or {})

    def table(self) -> pd.DataFrame:
        """The per-seed values' mean and std, one row each, as :meth:`ddlib.protocols.spec.Result.table` shows a result."""
        cols = [c for c in self.per_seed.columns if f"{c}_mean" in self.summary]
        return pd.DataFrame({"mean": [self.summary[f"{c}_mean"] for c in cols],
                             "std": [self.summary.get(f"{c}_std", np.nan) for c in cols]}, index=cols)

    def values(self, columns: str = "scores") -> pd.DataFrame:
        """As :meth:`ddlib.protocols.spec.Result.values`: the scores (or ``"all"`` values) with their
        units, mean, std, interval and seeds."""
        from ddlib.protocols.spec import value_names
        from ddlib.scores.tables import value_table

        return value_table(self.per_seed, value_names(self.protocol, self.per_seed, columns))

    def __repr__(self) -> str:
        return f"CellResult({self.name!r}, run {self.run_id}, seeds={list(self.per_seed.get('seed', []))})"


def cell_result(protocol: str, experiment: str, params: dict) -> CellResult | None:
    """The newest FINISHED cell run of these params (its config key), read back from MLflow."""
    from ddlib.specs import units
    from ddlib.protocols.cell import cell_tags, run_name
    from ddlib.store.tracking import per_seed_key, per_seed_names

    tags = cell_tags(protocol, params)
    tracker = Tracker(experiment)
    runs = tracker.find_finished({TAG["config"]: tags[TAG["config"]]}, all_experiments=False)
    if not runs:
        return None
    run = runs[0]
    # as stored where the run holds shown units (no round trip through fractions: the same floats as
    # ddlib.score() returns), else (a run written before) converted
    to_shown = (lambda _key, value: value) if tracking.in_shown_units(run) else units.shown
    logged = {k: to_shown(k, v) for k, v in run.data.metrics.items()}
    summary = {k: v for k, v in logged.items() if k.endswith(("_mean", "_std"))}
    columns: dict[str, dict[int, float]] = {}
    for key in per_seed_names(run):
        if not tracking.in_shown_units(run) and f"{key}_mean" not in summary:
            continue  # a run before per_seed/: a value logged once (models_trained) is no per-seed value
        stored = {m.step: m.value for m in tracker.client.get_metric_history(run.info.run_id, per_seed_key(run, key))}
        columns[key] = {s: to_shown(key, v) for s, v in stored.items()}
    seeds = sorted(set().union(*(c.keys() for c in columns.values()))) if columns else []
    per_seed = pd.DataFrame([{"seed": s, **{k: v.get(s, np.nan) for k, v in columns.items()}} for s in seeds])
    facts = {k: v for k, v in logged.items() if k not in summary and not k.startswith(units.PER_SEED) and k not in columns}
    return CellResult(run.info.run_id, per_seed, summary, run.data.tags.get(TAG["data"]), run_name(protocol, params),
                      protocol, facts)


# --------------------------------------------------------------------------- in process


def _run_steps(protocol: str, experiment: str, params: dict, progress: bool, strict: bool = False):
    """The protocol notebook's steps, in this process: open the cell, obtain the set, evaluate, close.
    ``strict``: refuse a set holding test images (:mod:`ddlib.protocols.leakage`)."""
    from ddlib.protocols import protocol_module

    module = protocol_module(protocol)
    cell = module.open_cell(experiment=experiment, **params)
    cell.progress = progress
    cell.strict = cell.strict or strict
    distilled = module.obtain(cell)
    result = module.evaluate(cell, distilled)
    cell.close()
    return result


def score(images: Any = None, labels: Any = None, *, dataset: str | None = None, protocol: str | None = None,
          path: str | os.PathLike | None = None, soft_labels: Any = None, method: str | None = None,
          ipc: int | None = None, seeds: list[int] | None = None, epochs: int | None = None, preset: str | None = None,
          like: str | os.PathLike | None = None, data_root: str | None = None, device: str | None = None,
          experiment: str | None = None, normalized: bool | None = None, zca_space: bool | None = None,
          trusted: bool = False, allow_unequal: bool = False, experiment_index: int | None = None,
          progress: bool = False, strict: bool = False, quick: bool = False, **params):
    """Score one distilled set in this process and return the protocol's result.

    The Python face of ``ddlib score``: the same names as its options, the notebooks' parameters
    and the grids' keys, and the same cell (the same keys in MLflow), so a finished cell and every
    model already trained for it are reused, not trained again. The set is ``images`` and ``labels``
    (saved under ``<store>/sets/`` by content) or a file or folder ``path``.

    Protocols (``protocol``; :data:`SET_PROTOCOLS`, from :data:`ddlib.protocols.PROTOCOLS`):

    * ``label_robust`` (default): DD-Ranking's Label-Robust Score (LRS);
    * ``augmentation_robust``: DD-Ranking's Augmentation-Robust Score (ARS);
    * ``label_regimes``: the set against random under hard, fixed soft and teacher labels at matched compute;
    * ``adversarial``: BEARD's robustness of models trained on the set, under attacks;
    * ``blackbox``: transfer attacks from surrogate to target models trained on the set;
    * ``augmentation``: DC-Bench's accuracy under each augmentation;
    * ``transfer``: DC-Bench's accuracy on several architectures;
    * ``compression``: DC-Bench's accuracy at the set's IPC beside the full data;
    * ``privacy``: membership inference on the real images the set was made from;
    * ``nas`` scores no single set (it needs a ground-truth file): run it from a params file.

    Args:
        images: the set's pixels in [0, 1] or uint8, N x C x H x W, N x H x W x C or N x H x W (or give ``path``).
        labels: the set's hard labels, one per image.
        dataset: the real dataset the set was distilled from (``digits``, ``cifar10``, ...).
        protocol: what to measure (the list above); default ``label_robust``, with ``like`` the grid's.
        path: a set file or folder (``.pt``, ``.npz``, an MTT folder, an ImageFolder), instead of arrays.
        soft_labels: the set's soft labels (N x classes), with ``images`` and ``labels``.
        method: the set's name in the leaderboards; default ``mine``, or the file's name for ``path``.
        ipc: images per class; default read from the set.
        seeds: evaluation seeds; default the protocol's (5).
        epochs: what the set is trained for (a preset's ``preset_epochs``, else the recipe's epochs).
        preset: the method's evaluation preset (``params/methods/<name>.yaml`` or a path).
        like: a params file (or shipped grid's name) whose setting the set is scored in, to sit beside its rows.
        data_root: where the dataset is; default ``$DDLIB_DATA``.
        device: where models train (``cpu``, ``cuda``, ...); default the best one there is.
        experiment: the MLflow experiment the cell is filed in; default the protocol's name.
        normalized: the file's images are normalised with the dataset's mean and std; default the format's.
        zca_space: the images are ZCA-whitened (MTT ``--zca``); default the file's own flag.
        trusted: a ``.pt`` file the safe loader refuses may be fully unpickled (runs its code).
        allow_unequal: accept unequal images per class.
        experiment_index: which experiment of a DC-format file; default the last.
        progress: show progress bars while models train.
        strict: refuse a set holding test images, exact or near (``LeakageRefused``); else it is scored and flagged.
        quick: a first look under the protocol's quick settings (:data:`QUICK`; tagged, never a result).
        **params: any other protocol parameter (``recipe={...}``, ...; ``help(ddlib.protocols.<protocol>)``).

    Returns:
        The protocol's :class:`ddlib.protocols.spec.Result`: ``per_seed`` (one row per seed, in
        shown units), ``summary`` (``<value>_mean`` and ``<value>_std``), ``run_id`` (the MLflow
        cell run) and ``table()``.

    Raises:
        ValueError: neither or both of arrays and ``path``, no ``dataset``, an unknown protocol or
            parameter, or a set that does not fit the dataset.

    Example::

        import ddlib
        result = ddlib.score(images, labels, dataset="cifar10", seeds=[0, 1, 2])
        result.per_seed, result.summary["lrs_mean"]
        ddlib.score(path="sets/my_set.npz", dataset="digits", protocol="adversarial", quick=True).table()
    """
    named = {"seeds": seeds, "epochs": epochs, "preset": preset, "data_root": data_root, "device": device}
    params = {**{k: v for k, v in named.items() if v is not None}, **params}
    file_options = given_file_options(normalized, allow_unequal, experiment_index, zca_space, trusted)
    if path is None:
        if images is None or labels is None:
            raise ValueError("give images and labels, or path=<a set file>")
        path = save_arrays(images, labels, soft_labels)
        method = method or "mine"
    elif images is not None or labels is not None:
        raise ValueError("give images and labels, or path, not both")
    grid = score_grid(path, dataset, protocol, method=method, ipc=ipc, file_options=file_options,
                      experiment=experiment, like=like, quick=quick, **params)
    try:
        protocol, experiment, cell = resolve_cell(grid)
    except ValueError as e:  # GridError names a placeholder file: say what was called
        raise ValueError(str(e).replace("<score>: ", "ddlib.score: ")) from None
    result = _run_steps(protocol, experiment, cell, progress, strict)
    if quick:
        tag_quick(result.run_id, protocol)
    return result
