"""The batch runner: expand a params grid into notebook executions (papermill), tracked in MLflow.

A params file (YAML)::

    protocol: label_robust        # which notebook (ddlib.protocols.PROTOCOLS)
    experiment: label_robust      # optional MLflow experiment name (default: the protocol)
    description: ...              # optional, free text
    params:   {dataset: digits, seeds: [0, 1, 2], recipe: {epochs: 300}}   # every cell
    grid:     {method: [random, kcenter, dm], ipc: [1, 10]}                 # crossed
    methods:  {dc: {kind: file, path: "sets/dc_ipc{ipc}.pt"}}              # optional sources

``grid`` may also be a list of such mappings: the cells are the union of their cross products
(e.g. selection baselines at every IPC, a published method only at the IPCs it was released at).

Every cell is validated before anything runs (an unknown key or a bad value names the key).
A cell whose config already has a FINISHED run is skipped; a failing notebook's run is marked
FAILED with the partial executed notebook attached; the rest carry on; the exit status is
non-zero when anything failed.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from ddlib.protocols.cell import cell_tags, run_name
from ddlib.protocols import PROTOCOLS, protocol_module
from ddlib.tracking import PROJECT_ROOT, TAG, Tracker, default_tags, init_store, store_environment

__all__ = ["GridSpec", "load_grid", "expand", "run_grid", "RunReport", "GridError", "notebooks_dir"]

# ipykernel 7 warns on every start that its local TCP transport is unencrypted; the kernels of a
# batch run talk only to this process over loopback, and a shutdown logs a spurious
# KeyboardInterrupt, so keep its own log quiet (notebook errors still reach the executed notebook).
KERNEL_ARGUMENTS = ["--log-level=CRITICAL"]
TOP_LEVEL_KEYS = {"protocol", "experiment", "description", "params", "grid", "methods"}


class GridError(ValueError):
    """A params file is unusable; the message names the file and the key."""


@dataclass
class GridSpec:
    path: Path
    protocol: str
    experiment: str
    params: dict
    grid: list[dict]  # one or more grids; the cells are the union of their cross products
    methods: dict


@dataclass
class RunReport:
    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (cell name, error)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed


def notebooks_dir() -> Path:
    return Path(os.environ.get("DDLIB_NOTEBOOKS", PROJECT_ROOT / "notebooks"))


def load_grid(path: str | os.PathLike) -> GridSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise GridError(f"{path}: cannot read params file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise GridError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise GridError(f"{path}: expected a mapping at the top level")
    unknown = sorted(set(raw) - TOP_LEVEL_KEYS)
    if unknown:
        raise GridError(f"{path}: unknown top-level key(s) {unknown}; allowed: {sorted(TOP_LEVEL_KEYS)}")
    protocol = raw.get("protocol")
    if protocol not in PROTOCOLS:
        raise GridError(f"{path}: protocol must be one of {sorted(PROTOCOLS)}, got {protocol!r}")
    grids = raw.get("grid") or {}
    grids = grids if isinstance(grids, list) else [grids]
    spec = GridSpec(path, protocol, raw.get("experiment") or protocol, raw.get("params") or {},
                    grids, raw.get("methods") or {})
    for key in ("params", "methods"):
        if not isinstance(getattr(spec, key), dict):
            raise GridError(f"{path}: '{key}' must be a mapping")
    for i, grid in enumerate(spec.grid):
        where = "grid" if len(spec.grid) == 1 else f"grid[{i}]"
        if not isinstance(grid, dict):
            raise GridError(f"{path}: '{where}' must be a mapping (or 'grid' a list of mappings)")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise GridError(f"{path}: {where}.{key} must be a non-empty list, got {values!r}")
        overlap = sorted(set(grid) & set(spec.params))
        if overlap:
            raise GridError(f"{path}: {overlap} appear in both params and {where}")
    return spec


def expand(spec: GridSpec) -> list[dict]:
    """All cells of the grid as fully resolved, validated notebook params."""
    module = protocol_module(spec.protocol)
    combos = [dict(zip(grid, combo)) for grid in spec.grid for combo in itertools.product(*grid.values())]
    cells = []
    for combo in combos:
        cell = {**spec.params, **combo}
        unknown = sorted(set(cell) - set(module.PARAMS))
        if unknown:
            raise GridError(f"{spec.path}: unknown parameter(s) {unknown} for protocol {spec.protocol}; "
                            f"known: {sorted(module.PARAMS)}")
        method = cell.get("method")
        if method is not None and "source" in module.PARAMS and cell.get("source") is None:
            from ddlib.methods.sources import resolve_source

            try:
                source = resolve_source(method, spec.methods)
            except ValueError as e:
                raise GridError(f"{spec.path}: {e}") from None
            if source.get("kind") in ("file", "checkpoint"):  # kernels run elsewhere: make paths absolute
                source["path"] = str(Path(source["path"]).expanduser().absolute())
            cell["source"] = source
        for key in ("data_root", *getattr(module, "PATH_PARAMS", ())):  # relative to where `ddlib run` runs
            if isinstance(cell.get(key), str):
                cell[key] = str(Path(cell[key]).expanduser().absolute())
        try:
            cell = module.validate(cell)
        except ValueError as e:
            raise GridError(f"{spec.path}: {e}") from None
        if cell not in cells:  # overlapping grids name some cells twice
            cells.append(cell)
    return cells


def _execute_cell(protocol: str, experiment: str, params: dict, run_id: str, env: dict) -> tuple[str, str | None]:
    """Run one notebook under papermill (in a worker process); returns (run_id, error or None)."""
    import papermill as pm

    os.environ.update(env)  # this worker's kernel inherits the store and its share of the cores
    tracker = Tracker(experiment)
    notebook = notebooks_dir() / PROTOCOLS[protocol][0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / notebook.name
        try:
            pm.execute_notebook(
                str(notebook), str(out), parameters={**params, "run_id": run_id, "experiment": experiment},
                kernel_name="python3", progress_bar=False, cwd=str(notebook.parent),
                extra_arguments=KERNEL_ARGUMENTS,
            )
        except BaseException as error:  # noqa: BLE001 - any failure marks the run FAILED
            if out.exists():
                tracker.log_artifact(run_id, out, "notebook")
            message = _short_error(error)
            tracker.fail_run(run_id, message)
            return run_id, message
        tracker.log_artifact(run_id, out, "notebook")
        tracker.end_run(run_id)
        return run_id, None


def _short_error(error: BaseException) -> str:
    """The notebook's own exception line, not papermill's wrapper with the whole traceback."""
    ename, evalue = getattr(error, "ename", None), getattr(error, "evalue", None)
    if ename:
        return f"{ename}: {evalue}"
    return f"{type(error).__name__}: {error}"


def run_grid(path: str | os.PathLike, workers: int = 1, force: bool = False, dry_run: bool = False,
             progress: bool = True) -> RunReport:
    """Run every cell of a params file that has no FINISHED run yet."""
    started = time.perf_counter()
    spec = load_grid(path)
    cells = expand(spec)
    report = RunReport()
    init_store()  # create the database once, before any worker touches it
    tracker = Tracker(spec.experiment)
    todo = []
    for params in cells:
        tags = cell_tags(spec.protocol, params)
        name = run_name(spec.protocol, params)
        if not force and tracker.find_finished({TAG["config"]: tags[TAG["config"]]}, all_experiments=False):
            report.skipped.append(name)
            continue
        todo.append((name, params, tags))
    if dry_run:
        report.finished = [name for name, _, _ in todo]
        return report
    workers = max(1, min(workers, len(todo) or 1))
    env = {**store_environment(), "DDLIB_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}
    pending = {}
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        for name, params, tags in todo:
            run_id = tracker.start_run(name, params=params, tags={**default_tags(spec.protocol), **tags})
            pending[pool.submit(_execute_cell, spec.protocol, spec.experiment, params, run_id, env)] = (name, run_id)
        bar = tqdm(total=len(todo), desc=f"{spec.protocol} ({len(report.skipped)} skipped)", disable=not progress)
        for future in as_completed(pending):
            name, run_id = pending[future]
            try:
                _, error = future.result()
            except BaseException as e:  # the worker itself died
                error = _short_error(e)
                tracker.fail_run(run_id, error)
            if error:
                report.failed.append((name, error))
            else:
                report.finished.append(name)
            bar.update(1)
        bar.close()
    report.seconds = time.perf_counter() - started
    return report
