"""The batch runner: expand a params grid into notebook executions (papermill), tracked in MLflow.

A params file (YAML)::

    protocol: label_robust        # which notebook (ddlib.protocols.PROTOCOLS)
    experiment: label_robust      # optional MLflow experiment name (default: the protocol)
    description: ...              # optional, free text
    params:   {dataset: digits, seeds: [0, 1, 2], recipe: {epochs: 300}}   # every cell
    grid:     {method: [random, kcenter, dm], ipc: [1, 10]}                 # crossed
    methods:  {dc: {kind: file, path: "sets/dc_ipc{ipc}.pt"}}              # optional sources
    gpus_per_cell: 1              # optional, Ray: GPUs each cell's task asks for (default 0)
    cpus_per_cell: 4              # optional, Ray: CPUs each cell's task asks for (default 1)

``grid`` may also be a list of such mappings: the cells are the union of their cross products
(e.g. selection baselines at every IPC, a published method only at the IPCs it was released at).

Every cell is validated, and every input file it names is loaded and checked (a set, teacher
checkpoints, a NAS ground-truth CSV), before anything runs or anything is written to the store:
a bad value or file stops the run with a message naming the params file, the cell and the problem.
A cell whose config (including the content of its input files) already has a FINISHED run is
skipped. Cells execute in a local process pool or on Ray (:mod:`ddlib.run.executors`); each cell's
run is created when its execution starts. A failing notebook's run is marked FAILED with the
partial executed notebook attached; the rest carry on; the exit status is non-zero when anything
failed. An interrupted grid (SIGTERM, Ctrl-C) marks its running cells KILLED, naming the signal; a killed one (SIGKILL)
leaves RUNNING runs that the next run marks KILLED once their owner is gone; either way the rerun
redoes exactly the cells that did not finish.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ddlib.run.executors import (CellJob, CellOutcome, ExecutorError, LocalExecutor, RayExecutor, interrupted,
                             quiet_raised_store_errors, short_error, stop_signal)
from ddlib.store import progress as cell_progress
from ddlib.run.console import CellLines, progress_files, progress_tags
from ddlib.protocols import PROTOCOLS, protocol_module
from ddlib.protocols.cell import cell_tags, run_name
from ddlib.protocols.leakage import LEAKAGE_TAG, STRICT_ENV, test_leaked
from ddlib.store.tracking import (TAG, StoreError, Tracker, check_store_writable, config_hash, default_tags, init_store,
                            is_server_uri, owner_is_gone, project_folder, release_store_locks, store_environment,
                            tracking_uri, write_failure)
from ddlib.specs.shown import shown
from ddlib.specs.yamlfile import YamlFileError, load_yaml

__all__ = ["GridSpec", "load_grid", "expand", "check_data", "check_cell_inputs", "check_cell_leakage",
           "run_grid", "RunReport", "GridError",
           "GridInterrupted", "ExecutorError", "notebooks_dir", "reap_stale_runs", "parse_gpus"]

TOP_LEVEL_KEYS = {"protocol", "experiment", "description", "params", "grid", "methods", "gpus_per_cell",
                  "cpus_per_cell"}


class GridError(ValueError):
    """A params file is unusable; the message names the file and the key."""


class GridInterrupted(KeyboardInterrupt):
    """The runner was told to stop (SIGTERM); its running cells are KILLED, a rerun redoes them."""

    signum = signal.SIGTERM


@dataclass
class GridSpec:
    path: Path
    protocol: str
    experiment: str
    params: dict
    grid: list[dict]  # one or more grids; the cells are the union of their cross products
    methods: dict
    gpus_per_cell: float = 0
    cpus_per_cell: float = 1


@dataclass
class RunReport:
    finished: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (cell name, error)
    elsewhere: list[str] = field(default_factory=list)  # being computed by another live runner
    reaped: list[str] = field(default_factory=list)  # run ids of dead RUNNING cells marked KILLED
    flags: list[tuple[str, str]] = field(default_factory=list)  # (cell name, what its numbers must be read with)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed


def notebooks_dir() -> Path:
    return Path(os.environ.get("DDLIB_NOTEBOOKS", project_folder("notebooks")))


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


def parse_gpus(gpus: str | None) -> list[str] | None:
    """``--gpus``: ``0,1,3`` or ``auto`` (every visible CUDA device) -> device ids; None -> None."""
    if gpus is None:
        return None
    if gpus == "auto":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise ExecutorError("--gpus auto: no CUDA device is visible")
        return [str(i) for i in range(count)]
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids) or len(set(ids)) != len(ids):
        raise ExecutorError(f"--gpus must be 'auto' or distinct device ids like 0,1,2,3, got {gpus!r}")
    return ids


def reap_stale_runs(tracker: Tracker, stale_after: float | None = None) -> list[str]:
    """Mark KILLED every RUNNING cell run of the experiment whose owner is gone (process no longer
    alive on this host, or heartbeat too old): an interrupted cell that nobody will finish.
    Returns their run ids."""
    reaped = []
    for run in tracker.find_running({TAG["kind"]: "cell"}):
        if owner_is_gone(run.data.tags, run.info.start_time, stale_after=stale_after):
            tracker.kill_run(run.info.run_id, "interrupted: its process is gone; the rerun redoes the cell")
            reaped.append(run.info.run_id)
    return reaped


def check_notebook_runner() -> None:
    """A cell is a notebook run by papermill on an ipykernel kernel: both come with the
    ``notebooks`` extra, which a plain ``pip install ddlib`` leaves out (``ddlib.score()`` needs neither)."""
    import importlib.util

    missing = [m for m in ("papermill", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:
        raise ExecutorError(f"running notebooks needs {' and '.join(missing)}, not installed: pip install 'ddlib[notebooks]'")


def run_grid(path: str | os.PathLike, workers: int | None = 1, force: bool = False, dry_run: bool = False,
             progress: bool = True, executor: str = "local", address: str | None = None, gpus: str | None = None,
             timeout: float | None = None, strict: bool = False) -> RunReport:
    """Run every cell of a params file that has no FINISHED run yet.

    ``executor``: ``local`` (a process pool of ``workers``; with ``gpus``, one device per worker)
    or ``ray`` (tasks on the Ray cluster at ``address``, or on a local instance started for the
    run; needs a tracking server). ``timeout``: seconds per cell; a cell over it is stopped and
    FAILED ("timed out after ... s"). ``strict``: every kernel refuses a set holding test images
    (``DDLIB_STRICT=1``, :mod:`ddlib.protocols.leakage`), and a cell that FINISHED earlier with one is
    reported failed, not skipped."""
    started = time.perf_counter()
    if executor not in ("local", "ray"):
        raise ExecutorError(f"executor must be 'local' or 'ray', got {executor!r}")
    if timeout is not None and not timeout > 0:
        raise ExecutorError(f"--timeout must be a positive number of seconds, got {timeout!r}")
    spec = load_grid(path)
    cells = expand(spec)
    check_data(spec, cells)
    check_cell_inputs(spec, cells)
    if not dry_run:
        check_notebook_runner()
    gpu_ids = parse_gpus(gpus) if executor == "local" else None
    if executor == "ray":
        if gpus is not None:
            raise ExecutorError("--gpus places local workers; with --executor ray say gpus_per_cell in the params file")
        RayExecutor.check_installed()
        if not is_server_uri():
            raise ExecutorError(
                f"--executor ray needs a tracking server every Ray worker can reach, not a database file on this "
                f"machine ({tracking_uri()}): start one with `python -m ddlib server` (or `make server`) and set "
                "MLFLOW_TRACKING_URI=http://127.0.0.1:5000")
    workers = workers or (len(gpu_ids) if gpu_ids else 1)
    report = RunReport()
    try:  # a read-only mount, a file in the way, a full disk: one line naming the store, before anything runs
        check_store_writable()
    except StoreError as e:
        raise GridError(str(e)) from None
    quiet_raised_store_errors()
    init_store()  # create the database once, before any worker touches it
    tracker = Tracker(spec.experiment)
    report.reaped = reap_stale_runs(tracker)
    running = {r.data.tags.get(TAG["config"]) for r in tracker.find_running({TAG["kind"]: "cell"})}  # all alive now
    todo = []
    for params in cells:
        tags = cell_tags(spec.protocol, params)
        name = run_name(spec.protocol, params)
        config = {TAG["config"]: tags[TAG["config"]]}
        finished = tracker.find_finished(config, all_experiments=False) if not force else []
        if finished and strict and (leaked := test_leaked(finished[0].data.tags)):
            report.failed.append((name, f"strict: it finished earlier with {leaked} test image(s) in its set "
                                        f"({finished[0].data.tags.get(LEAKAGE_TAG, '')}); refused"))
        elif finished:
            report.skipped.append(name)
        elif tags[TAG["config"]] in running:  # another live runner computes it
            report.elsewhere.append(name)
        else:
            todo.append((name, params, tags))
    if dry_run:
        report.finished = [name for name, _, _ in todo]
        return report
    if not todo:
        report.seconds = time.perf_counter() - started
        return report
    if executor == "ray":
        runner = RayExecutor(address, min(workers, len(todo)), spec.cpus_per_cell, spec.gpus_per_cell)
    else:
        runner = LocalExecutor(min(workers, len(todo)), gpu_ids)
    runner_id = uuid.uuid4().hex[:12]
    # Threads per cell: the cores shared out between the workers, unless DDLIB_NUM_THREADS fixes it
    # (CPU results are bit-identical only for the same thread count). MLflow prints a "View run ...
    # at" line per finished run on a server: not into every notebook.
    threads = os.environ.get("DDLIB_NUM_THREADS") or str(runner.threads_per_cell())
    guesses = _estimates(tracker, spec.protocol, todo, int(threads))
    env = {**store_environment(), "DDLIB_NUM_THREADS": threads, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
           **({STRICT_ENV: "1"} if strict else {})}
    progress_dir = tempfile.mkdtemp(prefix="ddlib-progress-") if executor == "local" and progress else None
    if progress_dir:
        env[cell_progress.DIR_ENV] = progress_dir
    from ddlib.protocols.spec import notebook_folder

    notebook = str((notebook_folder(spec.protocol) or notebooks_dir()) / PROTOCOLS[spec.protocol][0])
    jobs = [CellJob(spec.protocol, spec.experiment, name, params, {**default_tags(spec.protocol), **tags}, env,
                    notebook, runner_id, timeout, force, cell_shares(params)) for name, params, tags in todo]
    bar = tqdm(total=len(jobs), desc=f"{spec.protocol} ({len(report.skipped)} skipped)", disable=not progress)
    source = progress_files(progress_dir, guesses) if progress_dir else progress_tags(tracker, runner_id)
    lines = CellLines(min(runner.workers, len(jobs)), source, disable=not progress)

    errors: dict[str, str] = {}  # run id -> why its cell failed
    from ddlib.report.ui import cell_link

    def record(job: CellJob, outcome: CellOutcome) -> None:
        lines.finish(job.name)
        if outcome.status == "finished":
            report.finished.append(job.name)
            if outcome.run_id:  # its page in MLflow's UI, as `ddlib ui` serves it
                bar.write(f"finished {job.name}: {cell_link(tracker.experiment_id, outcome.run_id)}")
            if outcome.run_id and (flag := _sanity_flag(tracker, outcome.run_id)):
                report.flags.append((job.name, flag))
                bar.write(f"warning: {job.name}: {flag}")
        elif outcome.status == "skipped":
            report.skipped.append(job.name)
        elif outcome.status == "elsewhere":
            report.elsewhere.append(job.name)
        else:
            report.failed.append((job.name, outcome.error or outcome.status))
            if outcome.run_id and outcome.error:
                errors[outcome.run_id] = outcome.error  # what _settle marks it with if its worker could not
        bar.update(1)

    previous = _handle_sigterm()
    lines.start()
    try:
        runner.run(jobs, record)
    except BaseException as stop:
        release_store_locks(stop)  # before _settle writes (an interruption may land inside a store read)
        why = (interrupted(stop_signal(stop)) if isinstance(stop, KeyboardInterrupt)
               else f"the runner stopped ({short_error(stop)}); rerun the grid to redo it")
        _settle(tracker, runner_id, "KILLED", why)
        raise
    finally:
        lines.close()
        bar.close()
        if progress_dir:
            shutil.rmtree(progress_dir, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    _settle(tracker, runner_id, "FAILED", "its worker process died", errors)
    report.seconds = time.perf_counter() - started
    return report


def _estimates(tracker: Tracker, protocol: str, todo: list, threads: int) -> dict[str, float]:
    """Each cell's estimated minutes at the threads it gets (:func:`ddlib.run.estimate.estimates`), tagged on
    its run when it starts: the next dry run says how good the estimate was."""
    from ddlib.run.estimate import estimates

    try:
        guesses = estimates(tracker, protocol, [params for _, params, _ in todo], threads=threads)
    except Exception:  # noqa: BLE001 - an estimate is advice: it must not stop a grid
        return {}
    for name, _, tags in todo:
        if name in guesses:
            tags[TAG["estimate"]] = f"{guesses[name]:.3f}"
    return guesses


def _sanity_flag(tracker: Tracker, run_id: str) -> str | None:
    """The ``ddlib.sanity`` tag of a finished cell (near-chance accuracies, a suspicious checkpoint)."""
    from ddlib.protocols.cell import SANITY_TAG

    try:
        return tracker.client.get_run(run_id).data.tags.get(SANITY_TAG)
    except Exception:  # noqa: BLE001 - a warning must not fail the grid
        return None


def _handle_sigterm():
    """SIGTERM stops the grid like Ctrl-C (workers stopped, running cells KILLED); returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None  # signal handlers can only be set from the main thread

    def stop(signum, frame):
        raise GridInterrupted(f"signal {signum}")

    return signal.signal(signal.SIGTERM, stop)


def _settle(tracker: Tracker, runner_id: str, status: str, reason: str, errors: dict[str, str] | None = None) -> None:
    """Runs of this runner still RUNNING once its executor returned: their worker died or could not mark
    its failed cell itself (a full disk; ``errors``: why each such cell failed), FAILED; or the runner was
    interrupted, KILLED. Where the store still cannot be written they stay RUNNING, with no traceback: the
    cell's outcome said why in one line, and the next run marks them KILLED (their owner is gone)."""
    errors = errors or {}
    try:
        for run in tracker.find_running({TAG["runner"]: runner_id}):
            tracker.fail_run(run.info.run_id, errors.get(run.info.run_id, reason), status=status)
    except Exception as error:
        if write_failure(error) is None:
            raise
