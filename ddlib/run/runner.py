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
skipped. Cells execute in a local process pool or on Ray (:mod:`ddlib.run.pool`, :mod:`ddlib.run.cluster`); each cell's
run is created when its execution starts. A failing notebook's run is marked FAILED with the
partial executed notebook attached; the rest carry on; the exit status is non-zero when anything
failed. An interrupted grid (SIGTERM, Ctrl-C) marks its running cells KILLED, naming the signal; a killed one (SIGKILL)
leaves RUNNING runs that the next run marks KILLED once their owner is gone; either way the rerun
redoes exactly the cells that did not finish.
"""

from __future__ import annotations

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

from ddlib.run.cluster import RayExecutor
from ddlib.run.executors import (CellJob, CellOutcome, ExecutorError, interrupted, quiet_raised_store_errors, short_error,
                             stop_signal)
from ddlib.run.grid import GridError, cell_shares, check_cell_inputs, check_data, expand, load_grid
from ddlib.run.pool import LocalExecutor
from ddlib.store import progress as cell_progress
from ddlib.run.console import CellLines, progress_files, progress_tags
from ddlib.protocols import PROTOCOLS
from ddlib.protocols.cell import cell_tags, run_name
from ddlib.protocols.leakage import STRICT_ENV, test_leaked
from ddlib.store.tags import LEAKAGE_TAG
from ddlib.store.errors import StoreError, check_store_writable, write_failure
from ddlib.store.liveness import owner_is_gone
from ddlib.store.locks import release_store_locks
from ddlib.store.paths import is_server_uri, project_folder, store_environment, tracking_uri
from ddlib.store.provenance import default_tags
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker, init_store

__all__ = ["run_grid", "RunReport", "GridInterrupted", "notebooks_dir", "reap_stale_runs", "parse_gpus",
           "check_notebook_runner",
           # handed on from run.grid and run.executors, for the command line and tests
           "GridError", "load_grid", "expand", "check_cell_inputs", "cell_shares", "ExecutorError"]


class GridInterrupted(KeyboardInterrupt):
    """The runner was told to stop (SIGTERM); its running cells are KILLED, a rerun redoes them."""

    signum = signal.SIGTERM


@dataclass
class RunReport:
    """What a grid's run did, cell by cell: finished, skipped, failed, elsewhere, reaped."""

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
    """Where the protocols' notebooks are read (``DDLIB_NOTEBOOKS``, else the checkout's or the wheel's)."""
    return Path(os.environ.get("DDLIB_NOTEBOOKS", project_folder("notebooks")))


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
