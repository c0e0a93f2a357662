"""A grid: its params file read and checked (:func:`load_grid`), its cells expanded and validated as each
protocol says (:func:`expand`), and their data and input files loaded and checked before anything runs.
Imports ``protocols``, ``methods``, ``data`` and the store's hashing; never the runner's executors."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from ddlib.protocols import PROTOCOLS, protocol_module
from ddlib.protocols.cell import run_name
from ddlib.specs.shown import shown
from ddlib.specs.yamlfile import YamlFileError, load_yaml
from ddlib.store.hashing import config_hash

__all__ = ["GridSpec", "GridError", "load_grid", "expand", "absolute_paths", "cell_shares", "check_data",
           "check_cell_inputs", "check_cell_leakage"]

TOP_LEVEL_KEYS = {"protocol", "experiment", "description", "params", "grid", "methods", "gpus_per_cell",
                  "cpus_per_cell"}


class GridError(ValueError):
    """A params file is unusable; the message names the file and the key."""


@dataclass
class GridSpec:
    """A params file read and checked: its protocol, experiment, fixed params and grids."""

    path: Path
    protocol: str
    experiment: str
    params: dict
    grid: list[dict]  # one or more grids; the cells are the union of their cross products
    methods: dict
    gpus_per_cell: float = 0
    cpus_per_cell: float = 1


def load_grid(path: str | os.PathLike) -> GridSpec:
    """The params file at ``path``, or the shipped grid it names (``demo``: :mod:`ddlib.run.shipped_grids`)."""
    from ddlib.run.shipped_grids import grid_file

    try:
        path = grid_file(path)
        raw = load_yaml(path)
    except YamlFileError as e:
        raise GridError(str(e)) from None
    if not isinstance(raw, dict):
        raise GridError(f"{path}: expected a mapping at the top level, got {shown(raw)}")
    unknown = sorted(map(str, set(raw) - TOP_LEVEL_KEYS))
    if unknown:
        raise GridError(f"{path}: unknown top-level key(s) {unknown}; allowed: {sorted(TOP_LEVEL_KEYS)}")
    protocol = raw.get("protocol")
    if protocol not in PROTOCOLS:
        raise GridError(f"{path}: protocol must be one of {sorted(PROTOCOLS)}, got {shown(protocol)}")
    experiment = raw.get("experiment") or protocol
    if not isinstance(experiment, str):
        raise GridError(f"{path}: experiment must be a name, got {shown(experiment)}")
    for key, default in (("gpus_per_cell", 0), ("cpus_per_cell", 1)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise GridError(f"{path}: {key} must be a non-negative number, got {shown(value)}")
    if raw.get("cpus_per_cell", 1) == 0:
        raise GridError(f"{path}: cpus_per_cell must be positive, got 0")
    grids = raw.get("grid") or {}
    grids = grids if isinstance(grids, list) else [grids]
    spec = GridSpec(path, protocol, experiment, raw.get("params") or {}, grids, raw.get("methods") or {},
                    raw.get("gpus_per_cell", 0), raw.get("cpus_per_cell", 1))
    for key in ("params", "methods"):
        if not isinstance(getattr(spec, key), dict):
            raise GridError(f"{path}: '{key}' must be a mapping, got {shown(getattr(spec, key))}")
    from ddlib.methods.sources import validate_source

    for method, source in spec.methods.items():
        try:
            validate_source(method, source)
        except ValueError as e:
            raise GridError(f"{path}: methods.{method}: {e}") from None
    for i, grid in enumerate(spec.grid):
        where = "grid" if len(spec.grid) == 1 else f"grid[{i}]"
        if not isinstance(grid, dict):
            raise GridError(f"{path}: '{where}' must be a mapping (or 'grid' a list of mappings)")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise GridError(f"{path}: {where}.{key} must be a non-empty list, got {shown(values)}")
            if key == "method" and not all(isinstance(v, str) and v for v in values):
                bad = next(v for v in values if not isinstance(v, str) or not v)
                raise GridError(f"{path}: {where}.method: each method must be a name, got {shown(bad)}")
        overlap = sorted(set(grid) & set(spec.params))
        if overlap:
            raise GridError(f"{path}: {overlap} appear in both params and {where}")
    return spec


def _absolute(value: str) -> str:
    """An absolute, normalised path (``main/../sets/x.npz`` -> ``sets/x.npz``'s absolute path)."""
    return os.path.abspath(os.path.expanduser(value))


def absolute_paths(params: dict, path_params: tuple[str, ...] = ()) -> dict:
    """``params`` with every path taken from where ddlib runs, absolute (kernels run in notebooks/, and a
    params file ``ddlib score`` writes is rerun from anywhere): ``data_root``, the protocol's
    ``path_params``, ``teacher_checkpoints`` and a ``preset`` given as a file."""
    out = dict(params)
    for key in ("data_root", *path_params):
        if isinstance(out.get(key), str):
            out[key] = _absolute(out[key])
    if isinstance(out.get("teacher_checkpoints"), list):
        out["teacher_checkpoints"] = [_absolute(c) if isinstance(c, str) else c for c in out["teacher_checkpoints"]]
    preset = out.get("preset")
    if isinstance(preset, str) and (preset.endswith((".yaml", ".yml")) or "/" in preset):
        out["preset"] = _absolute(preset)
    return out


def cell_shares(params: dict) -> frozenset[str]:
    """The cached work a cell's set shares with other cells of its data (K-Center's features, DM's
    real means: :func:`ddlib.methods.sources.shared_work`), so the local pool starts no two cells that
    would compute it at once (:func:`ddlib.run.executors.next_job`)."""
    from ddlib.methods.sources import shared_work

    source = params.get("source")
    data = tuple(params.get(k) for k in ("dataset", "data_root", "train_per_class", "val_fraction"))
    return frozenset(f"{data} {name}" for name in shared_work(source)) if isinstance(source, dict) else frozenset()


def expand(spec: GridSpec) -> list[dict]:
    """All cells of the grid as fully resolved, validated notebook params."""
    module = protocol_module(spec.protocol)
    combos = [dict(zip(grid, combo)) for grid in spec.grid for combo in itertools.product(*grid.values())]
    cells = []
    for combo in combos:
        cell = {**spec.params, **combo}
        unknown = sorted(map(str, set(cell) - set(module.SPEC.params)))
        if unknown:
            raise GridError(f"{spec.path}: unknown parameter(s) {unknown} for protocol {spec.protocol}; "
                            f"known: {sorted(module.SPEC.params)}")
        method = cell.get("method")
        if method is not None and "source" in module.SPEC.params and cell.get("source") is None:
            from ddlib.methods.sources import resolve_source

            try:
                source = resolve_source(method, spec.methods)
            except ValueError as e:
                raise GridError(f"{spec.path}: {e}") from None
            if source.get("kind") in ("file", "checkpoint"):  # kernels run elsewhere: make paths absolute
                source["path"] = _absolute(source["path"])
            cell["source"] = source
        if hasattr(module, "fill_sources"):  # methods named in other params (blackbox's target_models)
            try:
                cell = module.fill_sources(cell, spec.methods)
            except ValueError as e:
                raise GridError(f"{spec.path}: {e}") from None
        cell = absolute_paths(cell, module.SPEC.path_params)
        try:
            cell = module.validate(cell)
        except ValueError as e:
            raise GridError(f"{spec.path}: {e}") from None
        if cell not in cells:  # overlapping grids name some cells twice
            cells.append(cell)
    return cells


def check_data(spec: GridSpec, cells: list[dict]) -> list[str]:
    """Load each distinct (dataset, data_root) once: a missing root or unreadable file fails here."""
    from ddlib.data.datasets import load_dataset

    seen, out = {}, []
    for cell in cells:
        key = (cell["dataset"], cell.get("data_root"))
        if key in seen:
            continue
        try:
            ds = load_dataset(*key)
        except (ValueError, OSError) as e:
            raise GridError(f"{spec.path}: cell {run_name(spec.protocol, cell)}: dataset {key[0]!r}"
                            + (f" at {key[1]}" if key[1] else "") + f": {e}") from None
        seen[key] = ds
        out.append(f"{ds.label}: {len(ds.train_labels)} train / {len(ds.test_labels)} test images, "
                   f"{ds.num_classes} classes, from {ds.source}")
    return out


def check_cell_inputs(spec: GridSpec, cells: list[dict], run_code: bool = True) -> list[str]:
    """Load and check every input file of every cell (:func:`ddlib.protocols.inputs.check_inputs`),
    each distinct one once, before anything runs; a :class:`GridError` names the cell and the file.
    ``run_code=False`` (a dry run) leaves out files that only full unpickling reads (``trusted:
    true``); the returned notes say which."""
    from ddlib.protocols.inputs import check_inputs, input_files

    checked: set[str] = set()
    notes: list[str] = []
    for cell in cells:
        if not input_files(cell):
            continue
        per_seed_files = (cell.get("source") or {}).get("kind") == "checkpoint"  # one model file per seed
        key = config_hash({k: v for k, v in cell.items() if k != "device" and (k != "seeds" or per_seed_files)})
        if key in checked:
            continue
        try:
            notes += [f"cell {run_name(spec.protocol, cell)}: {note}" for note in check_inputs(cell, run_code=run_code)]
        except ValueError as e:
            raise GridError(f"{spec.path}: cell {run_name(spec.protocol, cell)}: {e}") from None
        checked.add(key)
    return notes


def check_cell_leakage(spec: GridSpec, cells: list[dict]) -> list[str]:
    """The dry run's leakage check of every distinct file set (:func:`ddlib.protocols.inputs.set_leakage`):
    one line per set that holds test images."""
    from ddlib.protocols.inputs import set_leakage

    seen: set[str] = set()
    out = []
    for cell in cells:
        key = config_hash({k: cell.get(k) for k in ("source", "method", "ipc", "dataset", "data_root")})
        if key in seen:
            continue
        seen.add(key)
        if note := set_leakage(cell):
            out.append(f"cell {run_name(spec.protocol, cell)}: {note}")
    return out
