import pytest

from ddlib.store import tracking
from ddlib.store.tracking import TAG, Tracker


def test_store_is_absolute_sqlite_under_mlruns(mlflow_store, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    uri = tracking.tracking_uri()
    assert uri == f"sqlite:///{mlflow_store / 'mlflow.db'}"
    assert tracking.artifact_root().is_absolute()


def test_tracking_uri_env_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/other.db")
    assert tracking.tracking_uri().endswith("other.db")


def test_default_store_is_the_project_mlruns(monkeypatch):
    monkeypatch.delenv("DDLIB_MLRUNS", raising=False)
    assert tracking.mlruns_dir() == tracking.PROJECT_ROOT / "mlruns"


def test_flatten_and_config_hash():
    assert tracking.flatten({"recipe": {"lr": 0.01, "epochs": 3}, "seeds": [0, 1], "x": None}) == {
        "recipe.lr": "0.01", "recipe.epochs": "3", "seeds": "[0, 1]", "x": "None"}
    assert tracking.config_hash({"a": 1, "b": [1, 2]}) == tracking.config_hash({"b": [1, 2], "a": 1})
    assert tracking.config_hash({"a": 1}) != tracking.config_hash({"a": 2})


def test_runs_metrics_artifacts_and_lookup(mlflow_store, tmp_path):
    tracking.init_store()
    tracker = Tracker("unit")
    parent = tracker.start_run("parent", params={"recipe": {"lr": 0.1}, "ipc": 3},
                               tags={TAG["kind"]: "cell", TAG["config"]: "abc"})
    child = tracker.start_run("child", tags={TAG["kind"]: "eval"}, parent_run_id=parent)
    tracker.log_metrics(child, {"test_accuracy": 0.5, "train_seconds": 1.5})
    tracker.log_series(child, "train_loss", [3.0, 2.0, 1.0])
    note = tmp_path / "note.txt"
    note.write_text("hello")
    tracker.log_artifact(parent, note, "files")
    tracker.end_run(child)
    tracker.end_run(parent)

    client = tracking.client()
    assert [m.value for m in client.get_metric_history(child, "train_loss")] == [3.0, 2.0, 1.0]
    assert client.get_run(parent).data.params["recipe.lr"] == "0.1"
    artifact = mlflow_store / "artifacts" / "unit"
    assert list(artifact.rglob("note.txt")), "artifacts land under mlruns/artifacts/<experiment>"
    assert [r.info.run_id for r in tracker.find_finished({TAG["config"]: "abc"})] == [parent]
    assert tracker.find_finished({TAG["config"]: "nope"}) == []

    df = tracking.runs("unit", kind="cell", ipc=3)
    assert list(df["run_id"]) == [parent]
    assert tracking.runs("unit", ipc=4).empty
    assert tracking.runs("no-such-experiment").empty


def test_fail_run_marks_unfinished_children_failed(mlflow_store):
    tracking.init_store()
    tracker = Tracker("unit")
    parent = tracker.start_run("parent")
    done = tracker.start_run("done", parent_run_id=parent)
    tracker.end_run(done)
    running = tracker.start_run("running", parent_run_id=parent)
    tracker.fail_run(parent, ValueError("bad file"))
    client = tracking.client()
    assert client.get_run(parent).info.status == "FAILED"
    assert client.get_run(parent).data.tags[TAG["error"]] == "ValueError: bad file"
    assert client.get_run(running).info.status == "FAILED"
    assert client.get_run(done).info.status == "FINISHED"
    assert [r.info.run_id for r in tracker.find_finished({}, all_experiments=False)] == [done]


def test_default_tags_name_version_and_commit():
    tags = tracking.default_tags("label_robust", "cpu")
    assert tags["protocol"] == "label_robust" and tags[TAG["device"]] == "cpu"
    assert tags[TAG["version"]] and tags[TAG["commit"]]


def test_a_protocol_revision_changes_every_cell_key(monkeypatch):
    """Cells computed under an earlier definition of a protocol are neither skipped as finished nor
    pooled into the same leaderboard row (group, series, family) as new ones."""
    from ddlib.protocols import label_robust
    from ddlib.protocols.cell import cell_tags

    params = label_robust.validate({"method": "random", "ipc": 1})
    before = cell_tags("label_robust", params)
    import ddlib.protocols

    monkeypatch.setattr(ddlib.protocols, "protocol_revision", lambda name: label_robust.SPEC.revision + 1)
    after = cell_tags("label_robust", params)
    for key in ("config", "group", "series", "family"):
        assert before[TAG[key]] != after[TAG[key]], key
    assert after[TAG["revision"]] == str(label_robust.SPEC.revision + 1)


def test_experiments_open_as_training_projects_in_mlflows_ui(mlflow_store):
    """MLflow 3 shows an experiment without ``mlflow.experimentKind`` as a GenAI project; every
    experiment ddlib creates, and any it finds without the tag (an older store), carries it."""
    tracking.init_store()
    made = Tracker("fresh")
    assert made.client.get_experiment(made.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    old = tracking.client().create_experiment("old")
    Tracker("old")
    assert tracking.client().get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"


def test_cell_runs_have_readable_names():
    from ddlib.protocols.cell import run_name

    assert run_name("label_robust", {"dataset": "digits", "method": "dm", "ipc": 10, "model": "convnet"}) == \
        "dm-ipc10-convnet"
    assert run_name("compression", {"method": "full", "ipc": 0, "model": "convnet"}) == "full-convnet"
    assert run_name("adversarial", {"method": "dc", "ipc": 1, "model": "convnet", "mode": "targeted"}) == \
        "dc-ipc1-convnet-targeted"
    assert run_name("nas", {"method": "random", "ipc": 10}) == "random-ipc10-nas201"


def test_a_store_creation_interrupted_midway_leaves_no_broken_store(mlflow_store, monkeypatch):
    """MLflow migrates a new SQLite store step by step: a Ctrl-C midway used to leave a database every
    later command failed on ("duplicate column name"). Interrupted, there is no store; the next
    command creates a whole one."""
    from alembic import command
    from alembic.script import ScriptDirectory
    from mlflow.store.db import utils as db_utils

    real_upgrade = db_utils._upgrade_db

    def upgrade_halfway(engine):
        config = db_utils._get_alembic_config(str(engine.url))
        revisions = list(ScriptDirectory.from_config(config).walk_revisions())
        done, next_one = revisions[len(revisions) // 2].revision, revisions[len(revisions) // 2 - 1].revision
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, done)
            command.upgrade(config, next_one)  # the next step's changes made ...
            command.stamp(config, done, purge=True)  # ... but not recorded: Ctrl-C arrived in between
        raise KeyboardInterrupt

    monkeypatch.setattr(tracking, "_copy_migrated_tables", lambda new: None)  # MLflow migrates the store itself
    monkeypatch.setattr(db_utils, "_upgrade_db", upgrade_halfway)
    with pytest.raises(KeyboardInterrupt):
        tracking.client()
    monkeypatch.setattr(db_utils, "_upgrade_db", real_upgrade)
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    tracker = tracking.Tracker("after")
    tracker.end_run(tracker.start_run("works"))
    assert [r.info.status for r in tracking.client().search_runs([tracker.experiment_id])] == ["FINISHED"]


def _sqlite_layout(path) -> dict:
    """What makes two SQLite stores the same database: every table's and index's SQL, the schema
    revision, the file's persistent pragmas and the rows of every table but experiments' times."""
    import sqlite3

    with sqlite3.connect(path) as db:
        # a table's clauses in sorted order: MLflow's migrations recreate constraints in set order, which
        # varies with PYTHONHASHSEED between any two creations, its own included
        schema = sorted((kind, name, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
                        for kind, name, sql in db.execute("SELECT type, name, sql FROM sqlite_master "
                                                          "WHERE name NOT LIKE 'sqlite_%'"))
        pragmas = {p: db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("journal_mode", "page_size", "auto_vacuum",
                                                                     "user_version", "encoding")}
        revision = db.execute("SELECT version_num FROM alembic_version").fetchall()
        experiments = db.execute("SELECT experiment_id, name, lifecycle_stage FROM experiments").fetchall()
    return {"schema": schema, "pragmas": pragmas, "revision": revision, "experiments": experiments}


def test_a_new_sqlite_store_is_mlflows_own_database_from_the_migrated_copy(tmp_path, monkeypatch):
    """init_store starts a new SQLite store from MLflow's empty tables migrated once per machine and
    MLflow version ($DDLIB_CACHE/mlflow-tables): the same database MLflow's own creation gives (schema,
    revision, pragmas, the Default experiment), without running the migrations again."""
    import mlflow.store.db.utils as db_utils
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "cache"))
    own = tmp_path / "own" / "mlflow.db"
    own.parent.mkdir()
    MlflowClient(f"sqlite:///{own}").search_experiments(max_results=1)  # MLflow's own creation

    def store(name):
        monkeypatch.setenv("DDLIB_MLRUNS", str(tmp_path / name))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / name / 'mlflow.db'}")
        monkeypatch.setattr(tracking, "_CLIENTS", {})
        tracking.init_store()
        Tracker("x").start_run("a run", params={"p": 1})
        return tmp_path / name / "mlflow.db"

    first = store("first")  # migrates the tables once, into the cache
    assert len(list((tmp_path / "cache" / "mlflow-tables").glob("mlflow-*.db"))) == 1
    monkeypatch.setattr(db_utils, "_upgrade_db", lambda engine: pytest.fail("migrated a new store again"))
    second = store("second")
    assert _sqlite_layout(first) == _sqlite_layout(second)
    expected = _sqlite_layout(own)
    expected["experiments"] = [*expected["experiments"], (1, "x", "active")]
    assert _sqlite_layout(second) == expected


def test_an_interrupted_migration_of_the_copied_tables_leaves_nothing_half_made(mlflow_store, tmp_path, monkeypatch):
    """A Ctrl-C while the tables for new stores are migrated leaves neither those tables nor a
    temporary file in the cache, and no store; the next command migrates them whole and uses them."""
    from mlflow.store.db import utils as db_utils

    cache = tmp_path / "cache"
    monkeypatch.setenv("DDLIB_CACHE", str(cache))
    real_upgrade = db_utils._upgrade_db

    def interrupted(engine):
        real_upgrade(engine)
        raise KeyboardInterrupt

    monkeypatch.setattr(db_utils, "_upgrade_db", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tracking.client()
    assert not list(cache.rglob("*")) or not list((cache / "mlflow-tables").iterdir())
    assert not (mlflow_store / "mlflow.db").exists()
    monkeypatch.setattr(db_utils, "_upgrade_db", real_upgrade)
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    tracking.Tracker("after").start_run("works")
    assert len(list((cache / "mlflow-tables").iterdir())) == 1 and (mlflow_store / "mlflow.db").is_file()


def test_copied_tables_mlflow_refuses_are_dropped_and_the_store_made_as_mlflow_makes_it(mlflow_store, tmp_path,
                                                                                      monkeypatch):
    """Tables in the cache that MLflow does not accept (another build with the same version string, a
    damaged file) cost one ordinary migration: the store is made, the bad copy deleted."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("DDLIB_CACHE", str(cache))
    tracking._copy_migrated_tables(tmp_path / "probe.db")  # makes the cached tables
    (tables,) = (cache / "mlflow-tables").iterdir()
    tables.write_bytes(b"not a database")
    tracking.Tracker("x").start_run("works")
    assert (mlflow_store / "mlflow.db").is_file() and not tables.exists()


def test_a_dataset_two_cells_insert_at_once_is_linked_on_a_second_try(mlflow_store, monkeypatch):
    """MLflow inserts a dataset it did not find in the same transaction; a cell that loses that race to
    another (the same test set, logged at once) gets the store's unique-key error, as a Ray cell did
    through a tracking server. The insert is tried again and finds the other's dataset; any other
    error is raised at once."""
    import mlflow.data
    import numpy as np
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.exceptions import MlflowException

    tracker = Tracker("inputs")
    run_id = tracker.start_run("cell")
    dataset = mlflow.data.from_numpy(np.zeros((2, 2)), name="digits test")._to_mlflow_entity()
    inputs = [DatasetInput(dataset, [InputTag("mlflow.data.context", "test")])]
    other = Tracker("inputs")
    real = tracker.client.log_inputs
    calls = []

    def loses_the_race(run, datasets):
        calls.append(run)
        if len(calls) == 1:  # the other cell commits the same dataset while this insert runs
            real(other.start_run("other cell"), datasets=datasets)
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                                  "datasets.name, datasets.digest")
        return real(run, datasets=datasets)

    monkeypatch.setattr(tracker.client, "log_inputs", loses_the_race)
    tracker.log_inputs(run_id, inputs)
    assert len(calls) == 2
    assert [d.dataset.digest for d in tracker.client.get_run(run_id).inputs.dataset_inputs] == [dataset.digest]

    def broken(run, datasets):
        calls.append(run)
        raise MlflowException("(sqlite3.OperationalError) no such table: datasets")

    monkeypatch.setattr(tracker.client, "log_inputs", broken)
    calls.clear()
    with pytest.raises(MlflowException, match="no such table"):
        tracker.log_inputs(run_id, inputs)
    assert len(calls) == 1


def test_an_interrupt_inside_a_store_read_of_a_hand_run_cell_leaves_the_store_writable(mlflow_store, monkeypatch):
    """Jupyter's interrupt (a KeyboardInterrupt) can land inside a query of the store. The cell run by hand
    is marked FAILED and the notebook's later writes go through: the interrupted query's cursor, kept
    alive by the traceback, held a read lock that made MLflow wait 20 s and fail ("database is locked")."""
    from sqlalchemy.orm import loading

    from ddlib.protocols import label_robust

    cell = label_robust.open_cell(dataset="digits", method="random", ipc=1, seeds=[0], lr_policy="fixed")
    real_instances = loading.instances

    def interrupt(*args, **kwargs):
        monkeypatch.setattr(loading, "instances", real_instances)  # one interrupt, as a signal gives
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with cell.guard():
            monkeypatch.setattr(loading, "instances", interrupt)  # the rows are being read when it lands
            cell.tracker.client.get_run(cell.run_id)
    assert cell.tracker.client.get_run(cell.run_id).info.status == "FAILED"
    cell.tracker.set_tags(cell.run_id, {"later": "write"})
