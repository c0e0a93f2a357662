"""The one tracking layer: opening the MLflow store (created and migrated once, under a lock), and writing runs
and reading them back. Imports ``specs`` and the store's other modules: where it is (``paths``), the tag names
(``tags``), what stops it being written (``errors``), ``locks``, ``hashing``, which code wrote a run
(``provenance``), whether a running cell's owner lives (``liveness``); what tests and scripts reach as
``tracking.X`` is handed on from them.

Everything goes through :class:`MlflowClient` with explicit run ids (no global "active run"),
so notebooks, the batch runner and parallel workers never step on each other's state.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ddlib.specs import units
from ddlib.store.cache import cache_dir
from ddlib.store.errors import StoreError, check_store_writable, write_failure
from ddlib.store.hashing import config_hash, flatten
from ddlib.store.liveness import owner_is_gone, owner_tag
from ddlib.store.locks import file_lock, path_lock
from ddlib.store.paths import PROJECT_ROOT, artifact_root, is_server_uri, mlruns_dir, project_folder, tracking_uri
from ddlib.store.provenance import code_version, default_tags, git_commit
from ddlib.store.tags import SHOWN_UNITS, TAG

__all__ = [
    "init_store", "create_sqlite_store", "client", "Tracker", "runs", "EXPERIMENT_TAGS",
    "in_shown_units", "run_metrics", "computed_history", "per_seed_names", "per_seed_key", "as_stored",
    # handed on from the modules beside this one, for ``tracking.X`` in tests and scripts
    "TAG", "StoreError", "check_store_writable", "write_failure", "config_hash", "flatten", "owner_is_gone",
    "owner_tag", "PROJECT_ROOT", "artifact_root", "mlruns_dir", "project_folder", "tracking_uri", "code_version",
    "default_tags", "git_commit",
]


# Every experiment is a training project to MLflow's UI (3.x opens untagged experiments as GenAI
# projects: traces, token usage); its workflow toggle still decides, so ui_url() asks for training too.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


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
    with path_lock(path.parent / f".{path.name}.create.lock"):
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


def init_store() -> str:
    """Create the database (schema migrations) once, under a lock; call before starting workers."""
    mlruns_dir().mkdir(parents=True, exist_ok=True)
    with file_lock("store-init"):
        client().search_experiments(max_results=1)
    return tracking_uri()


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
