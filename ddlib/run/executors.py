"""The worker side of a cell, and what both sides share (:class:`CellJob`, :class:`CellOutcome`, stop signals).
The runner hands cells out through a local process pool (``run.pool``, the default) or Ray (``run.cluster``).

A cell is one papermill execution of its protocol's notebook, done by :func:`execute_cell` in a
worker process (a pool worker, or a Ray worker on any node). The worker owns the cell's MLflow run
from start to end, so a run exists only while someone is executing it:

1. It skips the cell if a FINISHED run of its config appeared meanwhile (another runner).
2. It creates the run, tagged with its owner (host, pid, process start time), a heartbeat and the
   runner's id, then yields to an older live RUNNING run of the same config (deleting its own):
   two runners sharing a store never compute one cell twice at the same time.
3. A monitor thread renews the heartbeat, enforces ``timeout`` (it kills the kernel: papermill
   itself would leave ``exception: None`` in the notebook's metadata) and, in a pool worker,
   notices when the runner is gone (SIGKILL) and stops too.
4. The run ends FINISHED with the executed notebook, FAILED with the partial notebook and the
   error ("timed out after S s" for a timeout), or KILLED when the runner interrupted it.

The runner marks what a killed worker could not (see :func:`ddlib.store.liveness.owner_is_gone`).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ddlib.run import kernels

from ddlib.store import progress
from ddlib.specs.shown import one_line
from ddlib.store.errors import write_failure
from ddlib.store.liveness import HEARTBEAT_SECONDS, owner_is_gone, owner_tag
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker

__all__ = ["CellJob", "CellOutcome", "ExecutorError", "execute_cell", "next_job", "stop_signal", "interrupted",
           "quiet_raised_store_errors"]

# ipykernel 7 warns on every start that its local TCP transport is unencrypted; the kernels of a
# batch run talk only to this process over loopback, and a shutdown logs a spurious
# KeyboardInterrupt, so keep its own log quiet (notebook errors still reach the executed notebook).
KERNEL_ARGUMENTS = ["--log-level=CRITICAL"]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, `kill`: either stops a cell, which is marked KILLED
KERNEL_TAG = "ddlib.kernel"  # "fresh", or "warm: cell N of its kernel" (a worker's kernel kept, ddlib.run.kernels)
ORPHAN_GRACE_SECONDS = 15.0  # after the runner died: time to mark the run KILLED before exiting anyway
# How often a process blocked waiting (the runner on its cells) wakes, so that a stop signal the kernel
# handed to another of its threads is acted on: Python runs handlers in the main thread only, and only
# when that thread runs. The cost is one wake-up a second of an idle process.
SIGNAL_POLL_SECONDS = 1.0
# Modules a worker never needs that its imports would load anyway. jsonschema imports rfc3987_syntax
# wherever it is installed (jupyter-events asks for it) to check the "iri" format, and that module builds a
# Lark parser as it is imported: papermill -> nbformat -> jsonschema made each worker's start 1.0-1.7 s
# longer (a 2-core Zen 4 EPYC). Nothing a worker validates uses that format (nbformat validates with fastjsonschema).
UNUSED_IN_WORKERS = ("rfc3987_syntax",)


class ExecutorError(RuntimeError):
    """An executor cannot start (Ray missing, no tracking server for remote workers, ...)."""


@dataclass
class CellJob:
    """Everything a worker needs to execute one cell (picklable: it travels to pool and Ray workers)."""

    protocol: str
    experiment: str
    name: str
    params: dict
    tags: dict  # the cell's tags (kind, config hash, leaderboard keys) and the default tags
    env: dict  # the store and thread count the worker and its kernel use
    notebook: str  # path of the protocol's notebook
    runner_id: str
    timeout: float | None = None  # seconds for the whole notebook
    force: bool = False  # run even if a FINISHED run of the config exists
    shares: frozenset = frozenset()  # cached work other cells reuse (ddlib.methods.sources.shared_work)


def next_job(pending: Sequence[CellJob], running: Sequence[CellJob], done: set) -> int:
    """Index in ``pending`` of the cell to start next: the first that shares no work with a running
    cell still computing it (K-Center from the same features at IPC 1 and 10 would train the feature
    network twice at once; started one after the other, the second reads the first's cache), else
    the first. ``done``: the shared work of the cells that have ended."""
    busy = set().union(*(job.shares for job in running)) - done
    return next((i for i, job in enumerate(pending) if not job.shares & busy), 0)


@dataclass
class CellOutcome:
    """How one cell's execution ended, as the runner reports it."""

    name: str
    status: str  # finished | failed | killed | skipped (finished meanwhile) | elsewhere (running elsewhere)
    run_id: str | None = None
    error: str | None = None


# --------------------------------------------------------------------------- the worker side


class _Watch:
    """What stops a running notebook (timeout, SIGINT or SIGTERM, the runner gone): the first reason
    wins, and the kernel is killed so that papermill returns at once (``signum``: the signal that
    interrupted it, which the worker exits with)."""

    def __init__(self):
        self.reason: str | None = None
        self.signum: int | None = None
        self.progress: Path | None = None  # the cell's progress file (ddlib.store.progress), mirrored to its run's tag
        self.folder: str | None = None  # the cell's temporary folder, which an exit without its cleanup removes
        self.done = threading.Event()
        self._lock = threading.Lock()

    def stop(self, reason: str, signum: int | None = None) -> None:
        with self._lock:
            if self.reason is None:
                self.reason, self.signum = reason, signum
        _kill_children()

    def filter(self, record: logging.LogRecord) -> bool:
        """Papermill's log, quiet once the cell is stopped: "Kernel died while waiting for execute
        reply" is what killing the kernel on purpose looks like from there."""
        return self.reason is None


_CURRENT: _Watch | None = None  # the cell this process executes (for the SIGTERM handler)


def _kill_children() -> None:
    """Kill this process's descendants: the notebook kernel (in its own session, so a signal to the
    runner's process group does not reach it) and anything it started."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def interrupted(signum: int) -> str:
    """The reason an interrupted cell's run is KILLED with, naming the signal (SIGINT is Ctrl-C)."""
    name = signal.Signals(signum).name
    return f"interrupted ({name}{': Ctrl-C' if signum == signal.SIGINT else ''}): rerun the grid to redo it"


def stop_signal(error: BaseException) -> int:
    """The signal an interruption came from: its ``signum`` (the runner's SIGTERM handler sets it),
    else SIGINT for a KeyboardInterrupt (Ctrl-C), else SIGTERM."""
    signum = getattr(error, "signum", None)
    if signum is not None:
        return int(signum)
    return signal.SIGINT if isinstance(error, KeyboardInterrupt) else signal.SIGTERM


def _on_stop_signal(signum, frame) -> None:
    if _CURRENT is None:
        os._exit(128 + signum)
    _CURRENT.stop(interrupted(signum), signum)


def _relay_stop_signals() -> None:
    """Act on SIGINT and SIGTERM whichever thread the kernel hands them to.

    Linux delivers a signal sent to the process to any thread that does not block it (OpenBLAS's
    pool, the queue feeder, ...). Python's C handler then only marks it; the Python handler waits for
    the main thread, which an idle worker keeps blocked in a read of the pool's call queue: a worker
    stopped between cells stayed alive (1 run in 10 of the test). Python's C handler also writes the
    signal's number to the wakeup fd from whatever thread caught it; a daemon thread reads that and
    acts at once (the main thread's later call of the same handler changes nothing)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def relay() -> None:
        while True:
            for signum in os.read(read, 64):
                if signum in STOP_SIGNALS:
                    _on_stop_signal(signum, None)

    threading.Thread(target=relay, daemon=True, name="ddlib-stop-signals").start()


def _exit_with_the_runner() -> None:
    """A pool worker whose runner died without stopping it (SIGKILL, the OOM killer) gets no more
    cells, but ProcessPoolExecutor's worker waits on its call queue for ever, and its kept kernel,
    which watches the worker, lives on with it. The runner's end makes the worker's parent sentinel
    readable: a worker between cells then exits, and its kernel ends too; a running cell is left to
    its monitor, which marks it KILLED and exits (:func:`_monitor`)."""
    import multiprocessing.connection

    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        while _CURRENT is not None:  # the cell's monitor stops it and exits; a cell that ends first frees this
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="ddlib-runner-watch").start()


def _init_pool_worker(gpu_slots) -> None:
    """Pool worker start: SIGINT (Ctrl-C reaches the runner's whole process group) and SIGTERM
    (which the runner forwards) stop the worker's cell, naming the signal; they were blocked while
    the worker started (:meth:`LocalExecutor.run`), so a Ctrl-C during its imports is no traceback.
    With ``--gpus`` each worker takes one device, which its kernels alone see."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_stop_signal)
    _relay_stop_signals()
    _exit_with_the_runner()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    atexit.register(gc.freeze)  # the runner waits for its workers' exit: no last collection of their stack (ddlib.cli)
    gpu = gpu_slots.get() if gpu_slots is not None else None
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)


def _monitor(watch: _Watch, tracker: Tracker, run_id: str, deadline: float | None, timeout: float | None,
             parent: int | None) -> None:
    next_beat = time.monotonic() + HEARTBEAT_SECONDS
    next_progress, shown = time.monotonic() + progress.TAG_SECONDS, None
    orphaned_at = None
    while not watch.done.wait(0.5):
        now = time.monotonic()
        if now >= next_progress and watch.progress is not None:
            record = progress.read(watch.progress)
            line = progress.describe(record) if record else None
            if line and line != shown:
                try:
                    tracker.set_tags(run_id, {progress.PROGRESS_TAG: line})
                    shown = line
                except Exception:  # noqa: BLE001 - progress is advice; the store may be busy
                    pass
            next_progress = now + progress.TAG_SECONDS
        if now >= next_beat:
            try:
                tracker.set_tags(run_id, {TAG["heartbeat"]: f"{time.time():.0f}"})
            except Exception:  # noqa: BLE001 - a missed beat is retried; the store may be busy
                pass
            next_beat = now + HEARTBEAT_SECONDS
        if deadline is not None and now >= deadline:
            watch.stop(f"timed out after {timeout:g} s")
        if parent is not None and os.getppid() != parent:
            if orphaned_at is None:
                orphaned_at = now
                watch.stop("interrupted: the runner is gone (killed); rerun the grid to redo it")
            elif now - orphaned_at > ORPHAN_GRACE_SECONDS:
                _give_up_orphaned(watch, tracker, run_id)


def _give_up_orphaned(watch: _Watch, tracker: Tracker, run_id: str) -> None:
    """The runner is gone and the cell did not stop within :data:`ORPHAN_GRACE_SECONDS`: mark its
    run KILLED (a rerun then redoes it at once instead of waiting for the heartbeat to go stale),
    remove its temporary folder and exit, leaving the stuck main thread behind."""
    try:
        tracker.kill_run(run_id, watch.reason or "interrupted: the runner is gone (killed)")
    except Exception:  # noqa: BLE001 - the store may be gone too; the heartbeat then tells a rerun
        pass
    if watch.folder:
        shutil.rmtree(watch.folder, ignore_errors=True)
    os._exit(1)


def _leave_out_unused_imports() -> None:
    """Before a worker's first cell imports papermill: the modules of :data:`UNUSED_IN_WORKERS` fail
    to import, as where they are not installed (a process that imported jsonschema already keeps them)."""
    if "jsonschema" not in sys.modules:
        for name in UNUSED_IN_WORKERS:
            sys.modules.setdefault(name, None)


def _plan_setup(job: CellJob) -> str:
    """Code the cell's kernel runs before its notebook: its running plan for its progress line
    (:func:`ddlib.run.timing.hand_plan`; the cell reads it, never the runner's modules)."""
    import json

    return (f"from ddlib.run.timing import hand_plan as _ddlib_hand_plan\n"
            f"_ddlib_hand_plan({job.protocol!r}, {json.dumps(job.params, default=str)!r})\n"
            "del _ddlib_hand_plan\n")


def execute_cell(job: CellJob, watch_parent: bool = False) -> CellOutcome:
    """Execute one cell's notebook under papermill, owning its MLflow run (see the module docstring)."""
    global _CURRENT
    _leave_out_unused_imports()
    import papermill as pm

    os.environ.update(job.env)  # this worker's kernel inherits the store and its share of the cores
    quiet_raised_store_errors()
    tracker = Tracker(job.experiment)
    config = {TAG["config"]: job.tags[TAG["config"]]}
    if not job.force and tracker.find_finished(config, all_experiments=False):
        return CellOutcome(job.name, "skipped")
    tags = {**job.tags, TAG["owner"]: owner_tag(), TAG["heartbeat"]: f"{time.time():.0f}", TAG["runner"]: job.runner_id}
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        tags["ddlib.cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    run_id = tracker.start_run(job.name, params=job.params, tags=tags)
    mine = tracker.client.get_run(run_id).info
    for rival in tracker.find_running(config):
        if rival.info.run_id == run_id or owner_is_gone(rival.data.tags, rival.info.start_time):
            continue
        if (rival.info.start_time, rival.info.run_id) < (mine.start_time, run_id):
            tracker.client.delete_run(run_id)  # an older live run computes this cell: leave it to it
            return CellOutcome(job.name, "elsewhere", rival.info.run_id)

    watch = _Watch()
    _CURRENT = watch
    deadline = time.monotonic() + job.timeout if job.timeout else None
    monitor = threading.Thread(target=_monitor, daemon=True, name="ddlib-cell-monitor",
                               args=(watch, tracker, run_id, deadline, job.timeout,
                                     os.getppid() if watch_parent else None))
    monitor.start()
    notebook = Path(job.notebook)
    papermill_log = logging.getLogger("papermill")
    papermill_log.addFilter(watch)
    try:
        with tempfile.TemporaryDirectory(prefix="ddlib-cell-") as tmp:
            watch.folder = tmp
            out = Path(tmp) / notebook.name
            # the kernel inherits this: where its training loop says how far it is (the runner's folder,
            # or this cell's on a Ray node, where only the run's tag reaches the runner)
            watch.progress = Path(os.environ.get(progress.DIR_ENV) or tmp) / f"{run_id}.json"
            os.environ[progress.FILE_ENV] = str(watch.progress)
            try:
                km = kernels.kernel_for(str(notebook.parent), job.env, {**job.env, progress.FILE_ENV: str(watch.progress)},
                                        KERNEL_ARGUMENTS, setup=_plan_setup(job))
                n = kernels.cells_in_kernel()
                tracker.set_tags(run_id, {KERNEL_TAG: "fresh" if n == 1 else f"warm: cell {n} of its kernel"})
                pm.execute_notebook(
                    str(notebook), str(out),
                    parameters={**job.params, "run_id": run_id, "experiment": job.experiment},
                    kernel_name="python3", progress_bar=False, cwd=str(notebook.parent),
                    extra_arguments=KERNEL_ARGUMENTS, km=km,
                )
                error = None
            except BaseException as exc:  # noqa: BLE001 - any failure marks the run, never a result
                error = exc
            watch.done.set()
            # read once: a stop signal arriving while the outcome is written (the notebook ended before it)
            # must not turn a finished or interrupted cell into a "timed out" FAILED one halfway through
            reason, signum = watch.reason, watch.signum
            if error is not None or reason or not kernels.warm_kernels_enabled():
                kernels.release_kernel()  # the next cell starts from a fresh kernel
            if reason and reason.startswith("interrupted"):
                _unwritten(lambda: tracker.kill_run(run_id, reason))  # else the next run marks it KILLED
                shutil.rmtree(tmp, ignore_errors=True)  # os._exit skips the context manager's cleanup
                os._exit(128 + signum if signum else 1)
            # timed out (the kernel was killed; the notebook holds what it did), or the notebook's own error
            message = reason or (short_error(error) if error is not None else None)
            if out.exists() and (unstored := _unwritten(lambda: tracker.log_artifact(run_id, out, "notebook"))):
                message = unstored if message in (None, unstored) else f"{message}; its notebook not stored: {unstored}"
            if message is None:
                if (message := _unwritten(lambda: tracker.end_run(run_id))) is None:
                    return CellOutcome(job.name, "finished", run_id)
            # where even this cannot be written the run stays RUNNING: the runner marks it with the message
            _unwritten(lambda: tracker.fail_run(run_id, message))
            return CellOutcome(job.name, "failed", run_id, message)
    finally:
        watch.done.set()
        papermill_log.removeFilter(watch)
        os.environ.pop(progress.FILE_ENV, None)
        if watch.progress is not None:
            watch.progress.unlink(missing_ok=True)
        _CURRENT = None


def short_error(error: BaseException) -> str:
    """The notebook's own exception, on one line, not papermill's wrapper with the whole traceback; a
    write the disk refused (full, read-only) as :func:`ddlib.store.errors.write_failure` says it, not as a
    page of MLflow's SQL."""
    if why := write_failure(error):
        return why
    ename, evalue = getattr(error, "ename", None), getattr(error, "evalue", None)
    return one_line(f"{ename}: {evalue}" if ename else f"{type(error).__name__}: {error}")


def _unwritten(write: Callable[[], object]) -> str | None:
    """Do one store write; where the store cannot be written (a full disk, a read-only one), return why
    in one line instead of raising: the cell then ends with that, not with a traceback."""
    try:
        write()
    except Exception as error:  # noqa: BLE001 - only a refused write is caught; the rest is raised
        if (why := write_failure(error)) is None:
            raise
        return why
    return None


def _raised_anyway(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("SQLAlchemy database error")


def quiet_raised_store_errors() -> None:
    """MLflow logs each failed SQLite write with its traceback, then raises it: on a full disk, a page on
    the runner's terminal per heartbeat and per cell. What is raised is handled (:func:`short_error`,
    :func:`_unwritten`, the monitor's retries); the log record goes."""
    logging.getLogger("mlflow.store.db.utils").addFilter(_raised_anyway)
