"""A store or an output that cannot be written (issue 53, 7.3): a read-only mount, a file where a
folder should be, a full disk before or during a cell, ``ddlib export --out`` to a bad place. Each is
one line naming the store or the path, never pages of MLflow's SQL and tracebacks; a cell whose store
fills up ends FAILED. (A read-only mount or a full disk is simulated: the tests run as any user.)"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import yaml

from ddlib.store import errors, tracking
from ddlib.cli import main as cli_main
from ddlib.store.tracking import TAG

TINY = {"dataset": "digits", "seeds": [0], "recipe": {"epochs": 2, "batch_size": 64}, "real_recipe": {"epochs": 1},
        "train_per_class": 20, "test_size": 100}
GRID = {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1]}}
FULL = "no space left on its disk: free some, then rerun (finished cells are kept)"


def write_grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID))
    return path


def use_store(monkeypatch, store: Path) -> Path:
    monkeypatch.setenv("DDLIB_MLRUNS", str(store))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    return store


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_store_that_cannot_be_written_is_one_line_naming_it_before_anything_runs(where, tmp_path, monkeypatch,
                                                                                  capsys):
    """``DDLIB_MLRUNS`` naming a file, or a folder under one (as a read-only place, it cannot hold the
    store): one line naming the store, exit 2, nothing created (before: FileExistsError's traceback)."""
    blocker = tmp_path / "mlruns"
    blocker.write_text("not a folder")
    store = use_store(monkeypatch, blocker if where == "a file" else blocker / "store")
    assert cli_main(["run", str(write_grid(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: the store {store} (DDLIB_MLRUNS) cannot be written: {blocker} is a file, "
                                "not a folder"], err
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("command", [["summary", "--no-log"], ["runs"], ["leaderboard", "--out", "SITE"],
                                     ["export", "--out", "OUT.csv"]])
def test_a_reading_command_on_a_store_it_cannot_create_is_one_line(command, tmp_path, monkeypatch, capsys):
    """Commands that only read the store create it where it is new: ``DDLIB_MLRUNS`` naming a file is one
    line naming the store, exit 2 (before: FileExistsError's traceback from MLflow's client)."""
    blocker = tmp_path / "mlruns"
    blocker.write_text("not a folder")
    store = use_store(monkeypatch, blocker)
    command = [str(tmp_path / part) if part in ("SITE", "OUT.csv") else part for part in command]
    assert cli_main(command) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: the store {store} (DDLIB_MLRUNS) cannot be written: {blocker} is a file, not a folder"]


@pytest.mark.parametrize("number,why", [(errno.EROFS, "its file system is read-only: set DDLIB_MLRUNS to a folder you can write"),
                                                (errno.ENOSPC, FULL)])
def test_a_read_only_or_full_store_is_refused_before_anything_runs(number, why, tmp_path, monkeypatch):
    """What a read-only mount or a full disk answers to the check's probe file (simulated: root may write
    anywhere, and a test cannot mount): a StoreError naming the store; the folder is not created."""
    def refused(*args, **kwargs):
        raise OSError(number, os.strerror(number))

    store = use_store(monkeypatch, tmp_path / "ro" / "mlruns")
    monkeypatch.setattr(errors.tempfile, "TemporaryFile", refused)
    with pytest.raises(tracking.StoreError) as refusal:
        tracking.check_store_writable()
    assert str(refusal.value) == f"the store {store} (DDLIB_MLRUNS) cannot be written: {why}"
    assert not store.parent.exists()


def test_what_a_refused_write_says_names_the_store_or_the_file(tmp_path, monkeypatch):
    """:func:`ddlib.store.tracking.write_failure`: a full disk, whichever layer says so (an OSError, SQLite's
    words under MLflow's exception, a notebook's error as text), in one line; a refused permission
    outside the store (reading a dataset) is not the store's problem."""
    import sqlite3

    store = use_store(monkeypatch, tmp_path / "mlruns")
    artifact = store / "artifacts" / "1" / "notebook.ipynb"
    assert tracking.write_failure(OSError(errno.ENOSPC, "No space left on device", str(artifact))) == \
        f"the store {store} (DDLIB_MLRUNS) cannot be written: {FULL}"
    assert tracking.write_failure(OSError(errno.ENOSPC, "No space left on device", "/tmp/cell/x.ipynb")) == \
        f"cannot write /tmp/cell/x.ipynb: {FULL}"
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as cause:
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full\n[SQL: INSERT ...]") from cause
    except RuntimeError as error:
        assert tracking.write_failure(error) == f"the store {store} (DDLIB_MLRUNS) cannot be written: {FULL}"

    class NotebookError(Exception):  # papermill's: the kernel's exception as text
        ename, evalue = "OSError", f"[Errno 28] No space left on device: '{artifact}'"

    assert tracking.write_failure(NotebookError()) == f"the store {store} (DDLIB_MLRUNS) cannot be written: {FULL}"
    assert tracking.write_failure(OSError(errno.EACCES, "Permission denied", "/data/cifar10")) is None
    assert tracking.write_failure(ValueError("lr must be positive")) is None


def _cell_on_a_full_disk(job, watch_parent=False):
    """:func:`ddlib.run.executors.execute_cell` in a pool worker whose disk fills up once its cell's run
    exists: from then on every SQLite write of the worker fails as on a full disk (MLflow logs each
    with its traceback, then raises). A pool worker imports it from this module."""
    import sqlite3

    import sqlalchemy
    from sqlalchemy import event

    from ddlib.run import executors

    from ddlib.run import kernels
    def fill_up(*args, **kwargs):
        @event.listens_for(sqlalchemy.engine.Engine, "before_cursor_execute")
        def full(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
                raise sqlite3.OperationalError("database or disk is full")

        return None  # no kernel: the cell's next write fails

    kernels.kernel_for = fill_up
    return executors.execute_cell(job, watch_parent)


def test_a_full_disk_mid_cell_fails_the_cell_in_one_line_naming_the_store(mlflow_store, tmp_path, monkeypatch,
                                                                          capfd):
    """The store's disk fills up while a cell runs: its worker cannot write the run's end either. The
    runner says so in one line naming the store (before: MLflow's traceback for every failed write, a
    page of SQL as the cell's error, the worker's exception) and marks the cell FAILED with it once it
    can (before: "its worker process died"; where the disk stays full, the next run marks it KILLED)."""
    from ddlib.run import executors
    monkeypatch.setattr(executors, "execute_cell", _cell_on_a_full_disk)
    assert cli_main(["run", str(write_grid(tmp_path))]) == 1
    err = capfd.readouterr().err  # the worker's stderr too
    assert "Traceback" not in err and "SQLAlchemy database error" not in err, err
    why = f"the store {mlflow_store} (DDLIB_MLRUNS) cannot be written: {FULL}"
    assert [line for line in err.splitlines() if why in line] == [f"FAILED random-ipc1-convnet: {why}"], err
    (run,) = tracking.client().search_runs([tracking.client().get_experiment_by_name("label_robust").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags[TAG["error"]] == why


# --------------------------------------------------------------------------- ddlib export --out


PUBLISHED = """method,dataset,ipc,model,label_type,hard_label_recovery_mean,improvement_over_random_mean,\
label_robust_score_mean,w,source
DC,CIFAR-10,1,ConvNet-3,hard,52.66,12.40,19.1,0.5,DD-Ranking leaderboard
"""


def test_export_to_a_place_that_cannot_be_written_is_one_line_naming_it(mlflow_store, tmp_path, capsys):
    """``ddlib export --out`` to a full disk (``/dev/full``) or under a file: one line naming the path,
    exit 1 (before: an OSError's traceback)."""
    rows = tmp_path / "published.csv"
    rows.write_text(PUBLISHED)
    assert cli_main(["import", str(rows)]) == 0  # something to export
    blocker = tmp_path / "afile"
    blocker.write_text("")
    places = {blocker / "board.csv": f"{blocker} is a file, not a folder"}
    if Path("/dev/full").exists():
        places["/dev/full"] = "No space left on device"
    capsys.readouterr()
    for out, why in places.items():
        assert cli_main(["export", "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.splitlines() == [f"error: cannot write --out {out}: {why}"], err
