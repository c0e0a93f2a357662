"""The one tracking layer: where the MLflow store lives, and how runs are written and read.

Store: SQLite at ``<project>/mlruns/mlflow.db`` with artifacts under ``<project>/mlruns/artifacts``,
both absolute (papermill runs kernels in other working directories, and a relative
``sqlite:///`` URI would follow them). ``MLFLOW_TRACKING_URI`` overrides the database;
``DDLIB_MLRUNS`` overrides the folder. MLflow 3.17's file store refuses to open, so there is none.

``MLFLOW_TRACKING_URI`` may also name a tracking server (``http://127.0.0.1:5000``, started with
``python -m ddlib server``), which workers on other machines share; artifacts then go through it.

Everything goes through :class:`MlflowClient` with explicit run ids (no global "active run"),
so notebooks, the batch runner and parallel workers never step on each other's state.

Liveness: a cell run being executed carries its owner (``ddlib.owner``: host, process id and the
process's start time) and a heartbeat (``ddlib.heartbeat``: Unix time, renewed while it runs).
:func:`owner_is_gone` says when such a run can no longer finish (its process is gone from this
host, or its heartbeat is older than the stale limit): the runner then marks it KILLED.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pandas as pd

from ddlib.specs import units
from ddlib.specs.version import VERSION
from ddlib.store.cache import cache_dir

__all__ = [
    "mlruns_dir", "tracking_uri", "artifact_root", "init_store", "create_sqlite_store", "client", "Tracker", "runs",
    "config_hash", "flatten", "default_tags", "git_commit", "code_version", "project_folder", "TAG", "is_server_uri", "owner_tag",
    "owner_is_gone", "STALE_AFTER_SECONDS", "unreachable_server", "release_store_locks", "StoreError",
    "check_store_writable", "write_failure", "SHOWN_UNITS",
    "in_shown_units", "run_metrics", "computed_history", "per_seed_names", "per_seed_key", "as_stored",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# A checkout (editable install) holds pyproject.toml beside the package; a wheel's site-packages does not.
IN_CHECKOUT = (PROJECT_ROOT / "pyproject.toml").exists()
# Folders of the checkout that a wheel carries inside the package (pyproject's package-dir).
_WHEEL_FOLDERS = {"notebooks": "notebooks", "params/methods": "presets", "params": "grids"}


def project_folder(name: str) -> Path:
    """``notebooks``, ``params/methods`` or ``params`` (the shipped grids): in place in a checkout, else
    the copy a wheel carries under ``ddlib/_files/`` (so a ``pip install``ed ddlib runs its protocols'
    notebooks and ``ddlib run demo``)."""
    if IN_CHECKOUT:
        return PROJECT_ROOT / name
    return Path(__file__).resolve().parents[1] / "_files" / _WHEEL_FOLDERS[name]

# Tag names written by the suite (MLflow's UI can filter on them).
TAG = {
    "protocol": "protocol",
    "version": "ddlib.version",
    "commit": "ddlib.git_commit",
    "mode_pair": "ddlib.mode_pair",  # BEARD: the same row in the other mode
    "device": "ddlib.device",
    "kind": "ddlib.kind",  # "cell" (one grid cell / notebook run), "eval" (one trained model), "summary"
    "revision": "ddlib.protocol_revision",  # the protocol module's REVISION: what its cells compute
    "engine_revision": "ddlib.engine_revision",  # ddlib.specs.keys.ENGINE_REVISION: what the training engine computes
    "config": "ddlib.config_hash",  # a cell's full resolved params
    "group": "ddlib.group_key",  # a cell's params without seeds: rows of a leaderboard
    "series": "ddlib.series_key",  # ... and without ipc: one method's cells across IPCs (unified scores, curves)
    "family": "ddlib.family_key",  # ... and without method and source: the cells compared with each other
    "data": "ddlib.data",  # how results on a cell's data must be labelled, e.g. "CIFAR-10 (JPEG)"
    "device_name": "ddlib.device_name",  # e.g. "cuda: NVIDIA H100 80GB HBM3" or "cpu x2 threads": what timings ran on
    "eval_key": "ddlib.eval_key",  # what was trained on what, with which seed: reuse key
    "role": "ddlib.role",  # syn / rdm / real ...
    "data_source": "ddlib.data_source",  # where a cell's real data was read from (a path, "sklearn.datasets.load_digits")
    "error": "ddlib.error",
    "owner": "ddlib.owner",  # "host:pid:start time" of the process executing a cell (liveness)
    "heartbeat": "ddlib.heartbeat",  # Unix time, renewed while the cell executes (liveness across hosts)
    "runner": "ddlib.run.runner",  # id of the `ddlib run` invocation that executes a cell
    "estimate": "ddlib.estimate_minutes",  # the runner's estimate of a cell's minutes when it started (ddlib.run.plan)
    "boards_from": "ddlib.boards_from",  # the experiment a summary's or card's boards read (not the protocols' own)
    "units": "ddlib.specs.units",  # "shown": the run's metrics are in ddlib.specs.units' units, per-seed values under per_seed/
    "quick": "ddlib.quick",  # a quick cell (ddlib score --quick): a first look, not a result
}
# What TAG["units"] says on every run whose metrics the Tracker wrote: each metric in the unit ddlib.specs.units
# gives its name (accuracies in %, ...), and a cell's per-seed values as histories ``per_seed/<name>`` (step =
# seed) beside their ``<name>_mean`` and ``<name>_std``. Runs without it (written before) hold computed units
# (fractions) and per-seed histories under the value's own name; the readers below take both.
SHOWN_UNITS = "shown"

# A RUNNING cell whose heartbeat is older than this is taken for dead (its process may be on a
# host this one cannot look at). Heartbeats are written every HEARTBEAT_SECONDS.
STALE_AFTER_SECONDS = float(os.environ.get("DDLIB_STALE_AFTER", 300))
HEARTBEAT_SECONDS = float(os.environ.get("DDLIB_HEARTBEAT", 30))


# Every experiment is a training project to MLflow's UI (3.x opens untagged experiments as GenAI
# projects: traces, token usage); its workflow toggle still decides, so ui_url() asks for training too.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def mlruns_dir() -> Path:
    """``$DDLIB_MLRUNS``, else ``mlruns/`` in the project checkout (editable install), else in the cwd."""
    env = os.environ.get("DDLIB_MLRUNS")
    if env:
        return Path(env).expanduser().resolve()
    if IN_CHECKOUT:
        return PROJECT_ROOT / "mlruns"
    return Path.cwd().resolve() / "mlruns"


def tracking_uri() -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{mlruns_dir() / 'mlflow.db'}"


def artifact_root() -> Path:
    return mlruns_dir() / "artifacts"


def is_server_uri(uri: str | None = None) -> bool:
    """Whether the store is a tracking server (reachable from other machines), not a database file."""
    return (uri or tracking_uri()).startswith(("http://", "https://"))


# --------------------------------------------------------------------------- a store that cannot be written


class StoreError(ValueError):
    """The store cannot be written (a read-only mount, a file where its folder should be, a full disk,
    no permission); the one-line message names it."""


_FULL = "no space left on its disk: free some, then rerun (finished cells are kept)"
_READ_ONLY = "its file system is read-only: set DDLIB_MLRUNS to a folder you can write"
_DENIED = "permission denied: set DDLIB_MLRUNS to a folder you can write"
# What a write failure says, by errno. EACCES and EPERM also come from reads: they count only inside the store.
_WRITE_ERRNOS = {errno.ENOSPC: _FULL, errno.EDQUOT: "its disk quota is used up: free some, then rerun",
                 errno.EROFS: _READ_ONLY}
_DENIED_ERRNOS = (errno.EACCES, errno.EPERM)
# The same failures in the words of SQLite and of the OS, as a notebook's error reaches its worker (text only).
_WRITE_WORDS = {"database or disk is full": _FULL, "no space left on device": _FULL,
                "disk quota exceeded": _WRITE_ERRNOS[errno.EDQUOT], "read-only file system": _READ_ONLY,
                "attempt to write a readonly database": "its database is read-only"}
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\] [^:\]]*: '([^']+)'")


def _store_label(folder: Path | None = None) -> str:
    """The store as a message names it: its folder (with the variable that chose it), or the database
    that ``MLFLOW_TRACKING_URI`` names where that is elsewhere."""
    folder = folder or mlruns_dir()
    return f"{folder} (DDLIB_MLRUNS)" if os.environ.get("DDLIB_MLRUNS") else str(folder)


def redact_uri(uri: str) -> str:
    """A database URI without its password, for printing."""
    scheme, sep, rest = uri.partition("://")
    if sep and "@" in rest and ":" in rest.split("@", 1)[0]:
        user = rest.split("@", 1)[0].split(":", 1)[0]
        return f"{scheme}://{user}:***@{rest.split('@', 1)[1]}"
    return uri


def _database_label() -> str:
    """The store's database as a message names it: the store's folder where it lies there, else its URI
    (a server's, another database's, without a password)."""
    uri, database = tracking_uri(), _sqlite_file(tracking_uri())
    if database is not None and database.parent.is_relative_to(mlruns_dir()):
        return _store_label()
    return f"{database or redact_uri(uri)} (MLFLOW_TRACKING_URI)"


def _sqlite_file(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def _check_folder(folder: Path, label: str) -> None:
    """A folder this process can create or write files in: the nearest one of it and its parents that exists
    must be a folder, and a file written there must fit (no read-only mount, full disk or permission)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise StoreError(f"the store {label} cannot be written: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".ddlib-write-check-") as probe:
            probe.write(b"\0" * 4096)  # a page: a full tmpfs refuses it, an empty file it would take
            probe.flush()
    except OSError as error:
        why = _WRITE_ERRNOS.get(error.errno) or (_DENIED if error.errno in _DENIED_ERRNOS else f"{error.strerror} ({existing})")
        raise StoreError(f"the store {label} cannot be written: {why}") from None


def check_store_writable(path_or_uri: str | os.PathLike | None = None) -> None:
    """Refuse, before anything runs, a store this process cannot write: a :class:`StoreError` whose one
    line names it (MLflow would fail mid-grid instead, in pages of tracebacks). ``path_or_uri``: a store
    folder (``DDLIB_MLRUNS``), or a tracking URI (a ``sqlite:///`` database: its folder and file; a
    server or another database: nothing here to check, :func:`unreachable_server` asks a server);
    default: this process's store, its folder (locks, artifacts) and its database. Creates nothing."""
    if path_or_uri is None:
        folder, database = mlruns_dir(), _sqlite_file(tracking_uri())
        _check_folder(folder, _store_label(folder))
    elif "://" in str(path_or_uri):
        folder, database = None, _sqlite_file(str(path_or_uri))
    else:
        folder, database = Path(path_or_uri).expanduser().absolute(), None
        _check_folder(folder, _store_label(folder) if folder == mlruns_dir() else str(folder))
    if database is None:
        return
    label = f"{database} (MLFLOW_TRACKING_URI)" if os.environ.get("MLFLOW_TRACKING_URI") else str(database)
    if folder is None or not database.parent.is_relative_to(folder):
        _check_folder(database.parent, label)
    if database.is_dir() or (database.exists() and not os.access(database, os.W_OK)):
        raise StoreError(f"the store {label} cannot be written: "
                         + ("it is a folder, not a database file" if database.is_dir() else "the file is read-only"))


def write_failure(error: BaseException) -> str | None:
    """One line saying what could not be written and why, where ``error`` or one of its causes is a full
    disk, a read-only one or, inside the store, a refused permission (the store is named as
    :func:`check_store_writable` names it, another file by its path); None for any other error. What a cell
    whose writes fail midway ends with, instead of MLflow's page of SQL. A notebook's error (papermill's:
    text only, ``evalue``) is read for the same failures in SQLite's and the OS's words."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            if why := _why_not_written(error.errno, error.filename):
                return _cannot_write(error.filename, why)
        text = f"{getattr(error, 'evalue', '') or ''} {error}"
        for number, filename in _ERRNO_IN_TEXT.findall(text):
            if why := _why_not_written(int(number), filename):
                return _cannot_write(filename, why)
        lowered = text.lower()
        for words, why in _WRITE_WORDS.items():
            if words in lowered:
                return _cannot_write(None, why)
        error = error.__cause__ or error.__context__
    return None


def _why_not_written(number: int, filename) -> str | None:
    if number in _DENIED_ERRNOS:
        return _DENIED if filename is not None and _in_store(filename) else None
    return _WRITE_ERRNOS.get(number)


def _in_store(filename) -> bool:
    path = Path(os.fsdecode(filename)).absolute()
    database = _sqlite_file(tracking_uri())
    return path.is_relative_to(mlruns_dir()) or (database is not None and path.is_relative_to(database.parent))


def _cannot_write(filename, why: str) -> str:
    if filename is None:  # the database said it
        return f"the store {_database_label()} cannot be written: {why}"
    if _in_store(filename):
        return f"the store {_store_label()} cannot be written: {why}"
    return f"cannot write {os.fsdecode(filename)}: {why}"


def unreachable_server(uri: str | None = None, timeout: float = 5.0) -> str | None:
    """Why the tracking server does not answer (``None`` when it does, or the store is a file).
    One request to ``/health``: MLflow's client would retry for seconds, then print a traceback."""
    import urllib.error
    import urllib.request

    uri = uri or tracking_uri()
    if not is_server_uri(uri):
        return None
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answers (a proxy may refuse /health): MLflow's own errors say the rest
    except (urllib.error.URLError, OSError) as e:
        return (f"the tracking server {uri} (MLFLOW_TRACKING_URI) does not answer: "
                f"{getattr(e, 'reason', e)}; start it (python -m ddlib server) or unset MLFLOW_TRACKING_URI")
    return None


_CLIENTS: dict[str, Any] = {}


def client():
    """A cached :class:`mlflow.MlflowClient` for the current tracking URI."""
    from mlflow import MlflowClient

    uri = tracking_uri()
    if uri not in _CLIENTS:
        if uri.startswith("sqlite:///"):
            if not Path(uri[len("sqlite:///"):]).exists():
                # a read-only command on a new store creates it: one line where it cannot (the default store by its folder)
                check_store_writable(None if uri == f"sqlite:///{mlruns_dir() / 'mlflow.db'}" else uri)
            create_sqlite_store(Path(uri[len("sqlite:///"):]))
        _CLIENTS[uri] = MlflowClient(tracking_uri=uri)
    return _CLIENTS[uri]


def create_sqlite_store(path: Path) -> None:
    """A new SQLite store, migrated under another name and moved into place whole (nothing where
    ``path`` exists). MLflow migrates a new database step by step, not in one transaction: a Ctrl-C
    midway left a store that every later command failed on ("duplicate column name"). Every ddlib
    command that opens a local store creates it through here, ``ddlib server`` too."""
    if path.exists():
        return
    from mlflow import MlflowClient

    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path.parent / f".{path.name}.create.lock"):
        if path.exists():  # another process created it meanwhile
            return
        new = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.new")  # MLflow caches engines by URI
        try:
            tables = _copy_migrated_tables(new)
            try:
                MlflowClient(tracking_uri=f"sqlite:///{new}").search_experiments(max_results=1)
            except Exception:
                if tables is None:
                    raise
                tables.unlink(missing_ok=True)  # a copy MLflow refuses (another build, same version): drop it
                new.unlink(missing_ok=True)
                new = new.with_name(f"{new.name}.plain")
                MlflowClient(tracking_uri=f"sqlite:///{new}").search_experiments(max_results=1)
            os.replace(new, path)
        finally:
            new.unlink(missing_ok=True)


def _copy_migrated_tables(new: Path) -> Path | None:
    """Start a new database as a copy of MLflow's empty tables, migrated once per machine and MLflow
    version (``$DDLIB_CACHE/mlflow-tables/``), instead of migrating each new file: MLflow runs its
    ~50 schema migrations on every new database (0.6-0.9 s on a 2-core EPYC, paid by the demo's
    runner before any cell starts and by each of the test suite's new stores). The copy is the very
    file MLflow's ``_initialize_tables`` writes; MLflow then checks its schema and adds the Default
    experiment as for any new store. Returns the copied file, or None where anything went wrong
    (another MLflow layout, an unwritable cache): MLflow then migrates ``new`` itself."""
    try:
        import alembic
        import mlflow
        import sqlalchemy
        from mlflow.store.db.utils import _initialize_tables

        cache = cache_dir() / "mlflow-tables"
        tables = cache / f"mlflow-{mlflow.__version__}-alembic-{alembic.__version__}-sqlalchemy-{sqlalchemy.__version__}.db"
        if not tables.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = tables.with_name(f".{tables.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
            try:
                engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
                try:
                    _initialize_tables(engine)
                finally:
                    engine.dispose()
                os.replace(tmp, tables)
            finally:  # interrupted or failed midway: no half-migrated file left in the cache
                tmp.unlink(missing_ok=True)
        shutil.copyfile(tables, new)
        return tables
    except Exception:  # noqa: BLE001 - MLflow creates and migrates the tables itself, as without the copy
        new.unlink(missing_ok=True)
        return None


def release_store_locks(error: BaseException) -> None:
    """Let go of what a store call that an interruption cut short still holds, before anything writes.

    Ctrl-C or SIGTERM raised inside a query (they raise wherever the main thread is: the runner's
    handlers, Python's for Ctrl-C, Jupyter's interrupt) leaves that query's SQLite cursor referenced by
    the traceback's frames, and with it a read lock on a local store that blocks every write: the
    runner's marking of its cells KILLED, its workers', a hand-run cell's FAILED, and every later write
    of that notebook (MLflow waits its 20 s busy timeout, then "database is locked"). For a
    ``KeyboardInterrupt`` (``GridInterrupted`` is one), clears the locals of the finished frames of its
    traceback and of the exceptions it interrupted; the traceback still prints. Other errors keep their
    frames (a post-mortem debugger reads them): their store calls closed their cursors as they unwound.
    Call it where an interruption may be caught."""
    import traceback

    if not isinstance(error, KeyboardInterrupt):
        return
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__context__


def init_store() -> str:
    """Create the database (schema migrations) once, under a lock; call before starting workers."""
    mlruns_dir().mkdir(parents=True, exist_ok=True)
    with file_lock("store-init"):
        client().search_experiments(max_results=1)
    return tracking_uri()


def store_environment() -> dict[str, str]:
    """Variables that point a child process (a worker, a notebook kernel in another working
    directory) at this same store."""
    return {"DDLIB_MLRUNS": str(mlruns_dir()), "MLFLOW_TRACKING_URI": tracking_uri()}


def owner_tag(pid: int | None = None) -> str:
    """``host:pid:start time`` of a process (default: this one). The start time tells a live
    process from a later one that was given the same pid."""
    import psutil

    process = psutil.Process(pid)
    return f"{socket.gethostname()}:{process.pid}:{process.create_time():.3f}"


def owner_is_gone(tags: dict, start_time_ms: int | None = None, now: float | None = None,
                  stale_after: float | None = None) -> bool:
    """Whether a RUNNING run can no longer finish: its owner process is gone from this host, or its
    heartbeat is older than ``stale_after`` seconds, or it has neither owner nor heartbeat (written
    before runs carried them) and started longer ago than that. A run owned by a live process on
    this host, or with a fresh heartbeat, or owned on another host without heartbeats (a cell run
    by hand there), is alive."""
    import psutil

    now = time.time() if now is None else now
    stale_after = STALE_AFTER_SECONDS if stale_after is None else stale_after
    owner = tags.get(TAG["owner"])
    if owner:
        host, pid, started = _parse_owner(owner)
        if host == socket.gethostname():
            try:
                return abs(psutil.Process(pid).create_time() - started) > 1.0
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                return True
    beat = tags.get(TAG["heartbeat"])
    if beat:
        return now - float(beat) > stale_after
    return not owner and start_time_ms is not None and now - start_time_ms / 1000 > stale_after


def _parse_owner(owner: str) -> tuple[str, int, float]:
    host, pid, started = owner.rsplit(":", 2)
    return host, int(pid), float(started)


@contextlib.contextmanager
def file_lock(name: str, on_wait: Callable[[], None] | None = None, wait: bool = True) -> Iterator[bool]:
    """An inter-process lock (flock) so parallel workers do not train or create the same thing twice.
    ``on_wait`` is called once if another process holds it (say so, then wait). ``wait=False`` takes
    it only if it is free: the body runs either way and is given whether it holds the lock."""
    lock_dir = mlruns_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with _lock(lock_dir / f"{name}.lock", on_wait, wait) as held:
        yield held


@contextlib.contextmanager
def _lock(path: Path, on_wait: Callable[[], None] | None = None, wait: bool = True) -> Iterator[bool]:
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def config_hash(config: dict, length: int = 16) -> str:
    """A stable hash of a JSON-able config (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def flatten(values: dict, prefix: str = "") -> dict[str, str]:
    """Nested params as MLflow params: ``{"recipe": {"lr": 0.01}}`` -> ``{"recipe.lr": "0.01"}``."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, prefix=f"{name}."))
        elif isinstance(value, (list, tuple, dict)):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = str(value)
    return flat


def git_commit() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes); for an installed wheel, the
    commit pip recorded where it installed from a git URL (PEP 610's direct_url.json); else "unknown".
    A wheel's folder is never asked: git would answer for whatever repository holds the venv."""
    if not IN_CHECKOUT:
        return _installed_commit() or "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip()
        if not commit:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _installed_commit() -> str | None:
    import importlib.metadata

    try:
        text = importlib.metadata.distribution("ddlib").read_text("direct_url.json")
        return (json.loads(text or "{}").get("vcs_info") or {}).get("commit_id")
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return None


def code_version() -> str:
    """``ddlib <version>``, with `` (commit <sha>)`` where the commit is known: what ``ddlib
    --version`` prints and a leaderboard bundle records."""
    commit = git_commit()
    return f"ddlib {VERSION}" + (f" (commit {commit})" if commit != "unknown" else "")


def default_tags(protocol: str, device: str | None = None) -> dict[str, str]:
    tags = {TAG["protocol"]: protocol, TAG["version"]: VERSION, TAG["commit"]: git_commit()}
    if device is not None:
        tags[TAG["device"]] = str(device)
    return tags


_INPUT_ATTEMPTS = 3
# A concurrent insert of the same dataset, as SQLite and PostgreSQL report it (through a server too).
_UNIQUE_VIOLATION = re.compile(r"UNIQUE constraint failed: datasets\.|UniqueViolation|duplicate key value violates unique "
                               r"constraint")


class Tracker:
    """Writes runs of one experiment. All methods take explicit run ids."""

    def __init__(self, experiment: str):
        self.experiment = experiment
        self.client = client()
        self.experiment_id = self._experiment_id(experiment)

    def _experiment_id(self, name: str) -> str:
        with file_lock("experiments"):
            found = self.client.get_experiment_by_name(name)
            if found is not None:
                if any(found.tags.get(k) != v for k, v in EXPERIMENT_TAGS.items()):  # a store from before the tag
                    for key, value in EXPERIMENT_TAGS.items():
                        self.client.set_experiment_tag(found.experiment_id, key, value)
                return found.experiment_id
            # A database the client writes itself keeps artifacts beside it; a server decides itself
            # (its --artifacts-destination), so that workers on other machines can reach them.
            location = None if is_server_uri() else (artifact_root() / name).as_uri()
            try:
                return self.client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)
            except Exception:  # another host created it between the lookup and here (no shared lock)
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
                return found.experiment_id

    def start_run(self, name: str, params: dict | None = None, tags: dict | None = None,
                  parent_run_id: str | None = None) -> str:
        tags = dict(tags or {})
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        if params:
            self.log_params(run.info.run_id, params)
        return run.info.run_id

    def log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        flat = flatten(params)
        items = [Param(k, v[:6000]) for k, v in flat.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def set_tags(self, run_id: str, tags: dict) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        """Several metrics in one database round trip (one ``log_metric`` each costs ~30 ms)."""
        self._log(run_id, [(k, v, step) for k, v in metrics.items()])

    def log_per_seed(self, run_id: str, rows: Iterable[dict]) -> None:
        """A cell's per-seed values (each row: ``seed`` and values) as histories ``per_seed/<value>``
        (step = seed) in one batch: what the boards pool seed by seed over runs."""
        self._log(run_id, [(f"{units.PER_SEED}{k}", v, int(row["seed"])) for row in rows for k, v in row.items()
                           if k != "seed"])

    def log_series(self, run_id: str, key: str, values: Iterable[float], steps: Iterable[int] | None = None) -> None:
        """A metric history (e.g. per-epoch loss) in batches of 1,000."""
        values = list(values)
        steps = list(steps) if steps is not None else list(range(len(values)))
        self._log(run_id, [(key, v, s) for v, s in zip(values, steps)])

    def _log(self, run_id: str, triples: list[tuple[str, float, int]]) -> None:
        """Computed values (fractions) written in their shown units (:mod:`ddlib.specs.units`: what the MLflow UI
        then shows is what every other surface shows), the run tagged so that readers convert back."""
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        metrics = [Metric(k, units.shown(k, float(v)), now, int(s)) for k, v, s in triples]
        tags = [RunTag(TAG["units"], SHOWN_UNITS)]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i : i + 1000], tags=tags if i == 0 else [])

    def log_artifact(self, run_id: str, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path)

    def log_inputs(self, run_id: str, datasets: list) -> None:
        """Link ``datasets`` (``mlflow.data`` inputs) to a run. MLflow looks a dataset up by experiment,
        name and digest and inserts it where absent, in one transaction: two cells logging the same
        test set at once both insert it, and the second fails on the table's unique key (seen with Ray
        cells writing to a tracking server). Its transaction wrote nothing, so it is tried again, and
        then finds the first one's dataset."""
        from mlflow.exceptions import MlflowException

        for attempt in range(_INPUT_ATTEMPTS):
            try:
                return self.client.log_inputs(run_id, datasets=datasets)
            except MlflowException as error:
                if attempt + 1 == _INPUT_ATTEMPTS or not _UNIQUE_VIOLATION.search(str(error)):
                    raise
                time.sleep(0.1 * (attempt + 1))

    def log_dict(self, run_id: str, obj: dict, name: str) -> None:
        self.client.log_dict(run_id, obj, name)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def fail_run(self, run_id: str, error: BaseException | str, status: str = "FAILED") -> None:
        """Mark a run and its unfinished child runs FAILED (or ``status``: KILLED), recording why."""
        message = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        for child in self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'"
        ):
            self.client.set_terminated(child.info.run_id, status=status)
        self.set_tags(run_id, {TAG["error"]: message})
        self.client.set_terminated(run_id, status=status)

    def kill_run(self, run_id: str, reason: str) -> None:
        """Mark an interrupted run (and its unfinished children) KILLED: never a result, redone on rerun."""
        self.fail_run(run_id, reason, status="KILLED")

    def find_running(self, tags: dict[str, str]) -> list:
        """RUNNING runs of this experiment carrying all ``tags``, oldest first."""
        filters = " and ".join([*(f"tags.`{k}` = '{v}'" for k, v in tags.items()), "attributes.status = 'RUNNING'"])
        return list(self.client.search_runs([self.experiment_id], filter_string=filters,
                                            order_by=["attributes.start_time ASC"], max_results=50000))

    def find_finished(self, tags: dict[str, str], all_experiments: bool = True) -> list:
        """FINISHED runs carrying all ``tags``, newest first."""
        filters = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        filters += " and attributes.status = 'FINISHED'"
        experiment_ids = (
            [e.experiment_id for e in self.client.search_experiments()] if all_experiments else [self.experiment_id]
        )
        return list(self.client.search_runs(experiment_ids, filter_string=filters, order_by=["attributes.start_time DESC"]))


# --------------------------------------------------------------------------- reading metrics back


def in_shown_units(run) -> bool:
    """Whether a run's metrics were written in shown units (:data:`SHOWN_UNITS`), not as computed."""
    return run.data.tags.get(TAG["units"]) == SHOWN_UNITS


def run_metrics(run) -> dict[str, float]:
    """A run's latest metric values in computed units (fractions: what :mod:`ddlib.scores.metrics` takes),
    whichever units it was written in."""
    if not in_shown_units(run):
        return dict(run.data.metrics)
    return {k: units.computed(k, v) for k, v in run.data.metrics.items()}


def computed_history(run, key: str, values: dict[int, float]) -> dict[int, float]:
    """A history read from ``run`` (``{step: value}`` of the stored ``key``) in computed units."""
    if not in_shown_units(run):
        return dict(values)
    return {step: units.computed(key, v) for step, v in values.items()}


def per_seed_key(run, name: str) -> str:
    """The stored name of a cell run's per-seed history of ``name``."""
    return f"{units.PER_SEED}{name}" if in_shown_units(run) else name


def per_seed_names(run) -> list[str]:
    """The values a cell run logged per seed (names without :data:`ddlib.specs.units.PER_SEED`). A run
    written before the prefix: every history but the ``_mean`` / ``_std`` summaries (as read then)."""
    if in_shown_units(run):
        return sorted(k[len(units.PER_SEED):] for k in run.data.metrics if k.startswith(units.PER_SEED))
    return sorted(k for k in run.data.metrics if not k.endswith(("_mean", "_std")))


def as_stored(metrics: dict[str, float]) -> dict[str, float]:
    """Computed values as the store gives them back (shown, then computed again; one rounding of the
    last bit at most), so that a freshly computed result and the same result read back from the store
    are the same floats: a rerun that reuses it gives identical numbers."""
    return {k: units.computed(k, units.shown(k, float(v))) for k, v in metrics.items()}


def runs(protocol: str, status: str | None = "FINISHED", kind: str | None = None, **filters) -> pd.DataFrame:
    """Runs of a protocol's experiment as a DataFrame (``params.*``, ``metrics.*``, ``tags.*`` columns).

    ``filters`` match params by name, e.g. ``runs("label_robust", dataset="digits", ipc=10)``.
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    if client().get_experiment_by_name(protocol) is None:
        return pd.DataFrame()
    clauses = [f"params.`{k}` = '{v}'" for k, v in filters.items()]
    if status:
        clauses.append(f"attributes.status = '{status}'")
    if kind:
        clauses.append(f"tags.`{TAG['kind']}` = '{kind}'")
    return mlflow.search_runs(experiment_names=[protocol], filter_string=" and ".join(clauses), max_results=100000)
