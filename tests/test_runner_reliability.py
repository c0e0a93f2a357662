"""Kill-safe, idempotent grids: runs are created when a cell starts, a dead RUNNING cell is marked
KILLED and redone, a runner killed with SIGTERM or SIGKILL mid-grid resumes without recomputing
or duplicating anything, a cell over ``--timeout`` fails with its partial notebook, and a cell's
key covers the content of its input files."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from waiting import BOUND_SECONDS, release, started, wait_for

from ddlib.store import tracking
from ddlib.protocols.cell import cell_tags, run_name
from ddlib.run.runner import expand, load_grid, run_grid
from ddlib.store.tracking import TAG, Tracker, owner_is_gone, owner_tag

ROOT = Path(__file__).resolve().parents[1]
TINY = {"dataset": "digits", "seeds": [0], "recipe": {"epochs": 2, "batch_size": 64}, "real_recipe": {"epochs": 1},
        "train_per_class": 20, "test_size": 100}


def write_grid(tmp_path: Path, grid: dict, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(grid))
    return path


def cell_runs(experiment: str = "label_robust", status: str | None = None) -> list:
    client = tracking.client()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    clauses = [f"tags.`{TAG['kind']}` = 'cell'"] + ([f"attributes.status = '{status}'"] if status else [])
    return list(client.search_runs([exp.experiment_id], " and ".join(clauses), max_results=10000))


def all_runs() -> list:
    client = tracking.client()
    ids = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(ids, "", max_results=50000)) if ids else []


# --------------------------------------------------------------------------- liveness (no notebooks)


def test_owner_liveness(mlflow_store):
    me = owner_tag()
    assert not owner_is_gone({TAG["owner"]: me})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = owner_tag(dead.pid)
    dead.wait()
    assert owner_is_gone({TAG["owner"]: gone})
    host, pid, started = me.rsplit(":", 2)
    assert owner_is_gone({TAG["owner"]: f"{host}:{pid}:{float(started) - 100:.3f}"})  # pid reused by a later process
    now = time.time()
    elsewhere = "another-host:4242:1.0"
    assert not owner_is_gone({TAG["owner"]: elsewhere, TAG["heartbeat"]: str(now - 10)}, now=now, stale_after=300)
    assert owner_is_gone({TAG["owner"]: elsewhere, TAG["heartbeat"]: str(now - 400)}, now=now, stale_after=300)
    assert not owner_is_gone({TAG["owner"]: elsewhere}, start_time_ms=0, now=now)  # by hand elsewhere: cannot tell
    assert owner_is_gone({}, start_time_ms=int((now - 400) * 1000), now=now, stale_after=300)  # legacy, no tags


def test_a_cell_stuck_after_its_runner_died_is_marked_killed_and_its_folder_removed(mlflow_store, tmp_path,
                                                                                    monkeypatch):
    """The monitor's last resort: the runner is gone and the cell's notebook does not return within the
    grace period, so the worker exits without the main thread's cleanup. Its run must not stay RUNNING
    until the heartbeat goes stale, and its temporary folder must not stay behind in /tmp."""
    from ddlib.run import executors
    class Exited(Exception):
        pass

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(executors, "ORPHAN_GRACE_SECONDS", 0.0)
    monkeypatch.setattr(executors, "_kill_children", lambda: None)  # nothing of this test process is killed
    monkeypatch.setattr(executors.os, "_exit", fake_exit)
    tracker = Tracker("stuck")
    run_id = tracker.start_run("stuck-cell", params={}, tags={})
    watch = executors._Watch()
    watch.folder = str(tmp_path / "ddlib-cell-stuck")
    Path(watch.folder).mkdir()
    (Path(watch.folder) / "notebook.ipynb").write_text("{}")
    with pytest.raises(Exited):  # a parent pid that is not ours: the runner is gone
        executors._monitor(watch, tracker, run_id, None, None, parent=os.getppid() + 1_000_000)
    run = tracking.client().get_run(run_id)
    assert run.info.status == "KILLED" and "the runner is gone" in watch.reason
    assert not Path(watch.folder).exists()


def test_rerun_marks_dead_running_cells_killed_and_redoes_them(mlflow_store, tmp_path):
    """What a SIGKILL (or a crashed node) leaves behind: RUNNING cells nobody will finish. The next
    run marks them KILLED (never a result) and runs the cells again; a cell another live runner is
    computing is left to it."""
    path = write_grid(tmp_path, {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1, 2, 3]}})
    spec = load_grid(path)
    cells = expand(spec)
    tracking.init_store()
    tracker = Tracker("label_robust")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner = owner_tag(dead.pid)
    dead.wait()
    owners = {1: {TAG["owner"]: dead_owner},  # died on this host
              2: {TAG["owner"]: "another-host:7:1.0", TAG["heartbeat"]: f"{time.time() - 3600:.0f}"},  # silent for an hour
              3: {TAG["owner"]: "another-host:8:1.0", TAG["heartbeat"]: f"{time.time():.0f}"}}  # alive elsewhere
    ids = {}
    for cell in cells:
        ids[cell["ipc"]] = tracker.start_run(run_name("label_robust", cell), params=cell,
                                             tags={**cell_tags("label_robust", cell), **owners[cell["ipc"]]})
    child = tracker.start_run("syn_hard-seed0", tags={TAG["kind"]: "eval"}, parent_run_id=ids[1])

    report = run_grid(path, dry_run=True, progress=False)
    assert sorted(report.reaped) == sorted([ids[1], ids[2]])
    assert report.finished == ["random-ipc1-convnet", "random-ipc2-convnet"]  # would run again
    assert report.elsewhere == ["random-ipc3-convnet"]
    client = tracking.client()
    assert [client.get_run(ids[i]).info.status for i in (1, 2, 3)] == ["KILLED", "KILLED", "RUNNING"]
    assert client.get_run(child).info.status == "KILLED"  # its unfinished child too
    assert "interrupted" in client.get_run(ids[1]).data.tags[TAG["error"]]


def test_a_replaced_input_file_is_a_new_cell(mlflow_store, tmp_path):
    """The skip key covers the content of a cell's input files, not only their paths."""
    from ddlib.run.runner import run_grid

    g = torch.Generator().manual_seed(0)
    set_file = tmp_path / "pub_ipc1.pt"
    torch.save({"images": torch.rand(10, 1, 8, 8, generator=g), "labels": torch.arange(10)}, set_file)
    path = write_grid(tmp_path, {"protocol": "label_robust", "params": TINY, "grid": {"method": ["pub"], "ipc": [1]},
                                 "methods": {"pub": {"kind": "file", "path": str(tmp_path / "pub_ipc{ipc}.pt")}}})
    (cell,) = expand(load_grid(path))
    before = cell_tags("label_robust", cell)
    tracking.init_store()
    tracker = Tracker("label_robust")
    tracker.end_run(tracker.start_run("pub-ipc1-convnet", params=cell, tags=before))  # as if it had run
    assert run_grid(path, dry_run=True, progress=False).skipped == ["pub-ipc1-convnet"]

    torch.save({"images": torch.rand(10, 1, 8, 8, generator=g), "labels": torch.arange(10)}, set_file)  # same path
    after = cell_tags("label_robust", cell)
    assert after[TAG["config"]] != before[TAG["config"]] and after[TAG["group"]] != before[TAG["group"]]
    assert after[TAG["family"]] == before[TAG["family"]]  # the methods it is compared with: unchanged
    report = run_grid(path, dry_run=True, progress=False)
    assert report.skipped == [] and report.finished == ["pub-ipc1-convnet"]


def test_one_set_reached_by_two_paths_is_one_cell(mlflow_store, tmp_path, monkeypatch):
    """A file's identity is its content; its path is a label: `ddlib score ../sets/x.pt` from one
    folder and `ddlib score sets/x.pt` from another (or a copy elsewhere) are one cell and one row."""
    from ddlib.run.runner import run_grid

    g = torch.Generator().manual_seed(0)
    (tmp_path / "sets").mkdir()
    (tmp_path / "work").mkdir()
    payload = {"images": torch.rand(10, 1, 8, 8, generator=g), "labels": torch.arange(10)}
    torch.save(payload, tmp_path / "sets" / "pub_ipc1.pt")
    shutil.copyfile(tmp_path / "sets" / "pub_ipc1.pt", tmp_path / "copy_ipc1.pt")  # the same bytes elsewhere
    monkeypatch.chdir(tmp_path / "work")
    grids = [{"protocol": "label_robust", "params": TINY, "grid": {"method": ["pub"], "ipc": [1]},
              "methods": {"pub": {"kind": "file", "path": path}}}
             for path in ("../sets/pub_ipc{ipc}.pt", str(tmp_path / "work" / ".." / "sets" / "pub_ipc{ipc}.pt"),
                          str(tmp_path / "copy_ipc{ipc}.pt"))]
    cells = [expand(load_grid(write_grid(tmp_path / "work", grid)))[0] for grid in grids]
    assert cells[0]["source"]["path"] == str(tmp_path / "sets" / "pub_ipc{ipc}.pt")  # normalised, no "work/.."
    tags = [cell_tags("label_robust", cell) for cell in cells]
    for key in ("config", "group", "series", "family"):
        assert len({t[TAG[key]] for t in tags}) == 1, key
    tracking.init_store()
    tracker = Tracker("label_robust")
    tracker.end_run(tracker.start_run("pub-ipc1-convnet", params=cells[0], tags=tags[0]))  # as if it had run
    assert run_grid(write_grid(tmp_path / "work", grids[2]), dry_run=True, progress=False).skipped == ["pub-ipc1-convnet"]


def test_ray_executor_refuses_a_database_file(mlflow_store, tmp_path):
    from ddlib.run.executors import ExecutorError

    path = write_grid(tmp_path, {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1]}})
    with pytest.raises(ExecutorError, match=r"needs a tracking server.*python -m ddlib server.*MLFLOW_TRACKING_URI=http"):
        run_grid(path, executor="ray", progress=False)
    assert not (mlflow_store / "mlflow.db").exists()


def test_ray_executor_without_ray_says_how_to_install_it(mlflow_store, tmp_path, monkeypatch, capsys):
    from ddlib.cli import main as cli_main

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    path = write_grid(tmp_path, {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1]}})
    assert cli_main(["run", str(path), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--executor ray needs Ray: pip install 'ddlib[cluster]'" in err, err
    assert not (mlflow_store / "mlflow.db").exists()


def test_gpus_option_parsing():
    from ddlib.run.executors import ExecutorError
    from ddlib.run.runner import parse_gpus

    assert parse_gpus("0,1, 3") == ["0", "1", "3"] and parse_gpus(None) is None
    for bad in ("0,0", "gpu0", ""):
        with pytest.raises(ExecutorError, match="--gpus"):
            parse_gpus(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ExecutorError, match="--gpus auto: no CUDA device"):
            parse_gpus("auto")


@pytest.mark.slow
def test_gpus_give_each_worker_its_own_device(mlflow_store, tmp_path, probe_notebooks, monkeypatch):
    """--gpus 0,1 with one worker per GPU (the CLI's default): worker i's kernels see only device i
    (CUDA_VISIBLE_DEVICES), so the two workers do not share GPU 0 (on a CPU machine the kernels then
    simply find no CUDA device). Both workers get a cell: the first two cells are held until both
    have started (tests/waiting.py), so one worker cannot run both. Why it takes about 15 s: a fresh
    store, two spawned workers and their kernels, four probe cells two at a time; the device is read
    from what each cell's own kernel saw, so each cell needs a real kernel."""
    import threading

    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("DDLIB_NOTEBOOKS", str(probe_notebooks))
    monkeypatch.setenv("DDLIB_PROBE_GATE", str(gate))

    def release_both() -> None:
        try:
            wait_for(lambda: len(started(gate)) == 2, BOUND_SECONDS, "two cells started")
        finally:
            release(gate)  # then every cell runs through (too late, after the bound: the test fails below)

    releaser = threading.Thread(target=release_both, daemon=True)
    releaser.start()
    grid = {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1, 2, 3, 4]}}
    report = run_grid(write_grid(tmp_path, grid), workers=None, gpus="0,1", progress=False)
    releaser.join()
    assert len(report.finished) == 4 and report.ok
    device_of = {}
    for run in cell_runs(status="FINISHED"):
        worker = run.data.tags[TAG["owner"]]
        device_of.setdefault(worker, set()).add(run.data.tags["ddlib.cuda_visible_devices"])
    assert all(len(devices) == 1 for devices in device_of.values())  # a worker keeps its device
    assert len(device_of) == 2 and set().union(*device_of.values()) == {"0", "1"}  # one device each


def test_a_flagged_cell_is_said_on_the_console(mlflow_store, tmp_path, probe_notebooks, monkeypatch, capsys):
    """What a cell flags (near-chance accuracies, a checkpoint with no expected accuracy) is on its
    run (``ddlib.sanity``) and on the console of the runner, not only inside the notebook."""
    from ddlib.cli import main as cli_main

    monkeypatch.setenv("DDLIB_NOTEBOOKS", str(probe_notebooks))
    monkeypatch.setenv("DDLIB_PROBE_FLAG", "released.pth: clean accuracy 11.1 % is near chance")
    grid = {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1]}}
    assert cli_main(["run", str(write_grid(tmp_path, grid))]) == 0
    err = capsys.readouterr().err
    assert "warning: random-ipc1-convnet: released.pth: clean accuracy 11.1 % is near chance" in err, err


# --------------------------------------------------------------------------- end to end (papermill)


def _runner(path: Path, store: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    # the cells' temporary folders go beside the store: a SIGKILL leaves them, and pytest prunes its own
    temp = store.parent / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
           "TMPDIR": str(temp),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "ddlib", "run", str(path), *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_terminal_signals)


def _terminal_signals() -> None:
    """The runner starts as from a terminal: SIGINT and SIGTERM at their defaults and unblocked. A
    child inherits an ignored disposition and the signal mask, and in the whole suite (not alone) the
    pytest process had SIGINT ignored or blocked by then, so the Ctrl-C tests' runner never saw it."""
    import signal as signals

    for signum in (signals.SIGINT, signals.SIGTERM):
        signals.signal(signum, signals.SIG_DFL)
    signals.pthread_sigmask(signals.SIG_UNBLOCK, (signals.SIGINT, signals.SIGTERM))


KILL_GRID = {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1, 2, 3, 4, 5, 6]}}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_killed_grid_resumes_without_recomputing_or_duplicating(how, mlflow_store, tmp_path, probe_notebooks):
    """Kill the runner mid-grid (SIGTERM: it stops its workers and marks their cells KILLED;
    SIGKILL of the runner and its workers: nothing cleans up), then rerun the same command:
    finished cells are not recomputed, interrupted ones are redone, each cell ends with exactly one
    FINISHED run and no run stays RUNNING, and no process of the killed runner (workers, their kernels)
    outlives it. Cells: the probe notebook, held until the test releases them (tests/waiting.py), so the
    kill lands on two running cells after one finished, however loaded the machine. Why it takes 40-50 s:
    the grid runs twice (killed, then resumed)."""
    path = write_grid(tmp_path, KILL_GRID)
    tracking.init_store()  # before the runner: this process polls the store while it runs
    gate = tmp_path / "gate"
    gate.mkdir()
    probe = {"DDLIB_NOTEBOOKS": str(probe_notebooks), "DDLIB_PROBE_GATE": str(gate)}
    runner = _runner(path, mlflow_store, "--workers", "2", env=probe)
    first = wait_for(lambda: started(gate)[:1], BOUND_SECONDS, "a running cell", runner)[0]
    release(gate, first)
    wait_for(lambda: [r for r in cell_runs(status="FINISHED") if r.info.run_id == first], BOUND_SECONDS,
             "the released cell finished", runner, every=0.5)
    wait_for(lambda: len(started(gate)) == 3, BOUND_SECONDS, "two cells running after it", runner)
    tree = psutil.Process(runner.pid).children(recursive=True)  # its workers and their kernels
    if how == "SIGTERM":
        runner.send_signal(signal.SIGTERM)
    else:
        os.killpg(runner.pid, signal.SIGKILL)  # the runner and its pool workers (kernels live in their own sessions)
    output = runner.communicate(timeout=BOUND_SECONDS)[0]
    # orphaned kernels notice their worker is gone (ipykernel polls its parent); SIGTERM: the workers stop them
    _, alive = psutil.wait_procs(tree, timeout=BOUND_SECONDS)
    assert not alive, [p.cmdline() for p in alive]
    done_before = {r.data.tags[TAG["config"]]: r.info.run_id for r in cell_runs(status="FINISHED")}
    interrupted = {r.data.tags[TAG["config"]] for r in cell_runs() if r.info.status != "FINISHED"}
    assert done_before and interrupted, output
    if how == "SIGTERM":
        assert runner.returncode == 143, output
        assert not cell_runs(status="RUNNING"), "SIGTERM must leave no RUNNING cell"
        assert {r.info.status for r in cell_runs() if r.data.tags[TAG["config"]] in interrupted} == {"KILLED"}
    else:
        assert runner.returncode == -signal.SIGKILL

    release(gate)  # the rerun's cells run through
    rerun = _runner(path, mlflow_store, "--workers", "2", env=probe)
    output = rerun.communicate(timeout=900)[0]
    assert rerun.returncode == 0, output
    assert f"skipped {len(done_before)} already finished" in output, output

    finished = cell_runs(status="FINISHED")
    per_config = Counter(r.data.tags[TAG["config"]] for r in finished)
    assert len(per_config) == 6 and set(per_config.values()) == {1}, per_config  # exactly one FINISHED per cell
    for config, run_id in done_before.items():  # not recomputed
        assert next(r.info.run_id for r in finished if r.data.tags[TAG["config"]] == config) == run_id
    assert interrupted <= set(per_config)  # redone
    assert not [r for r in all_runs() if r.info.status == "RUNNING"]  # cells and their children
    assert all("lrs_mean" in r.data.metrics for r in finished)


@pytest.mark.slow
def test_an_interruption_inside_a_store_read_still_marks_the_running_cells_killed(mlflow_store, tmp_path,
                                                                                 probe_notebooks, monkeypatch):
    """SIGTERM (or Ctrl-C) raises wherever the runner's main thread is, also inside a query of the store
    (here: the finished cell's sanity tag). The interrupted query's cursor, kept alive by the traceback,
    held a read lock on the SQLite store: the runner's marking of its running cells KILLED waited
    MLflow's 20 s busy timeout, then failed with "database is locked" instead of stopping the grid (the
    SIGTERM resume test failed so once in the suite). Why it takes about 20 s: a grid of probe cells
    in two spawned workers, stopped when the first cell finishes."""
    from sqlalchemy.orm import loading

    from ddlib.run import runner as runner_module
    monkeypatch.setenv("DDLIB_NOTEBOOKS", str(probe_notebooks))
    monkeypatch.setenv("DDLIB_PROBE_SLEEP", "4")
    real_instances = loading.instances

    def read_interrupted(tracker, run_id):
        def interrupt(*args, **kwargs):
            raise runner_module.GridInterrupted("signal 15")

        loading.instances = interrupt  # the rows of the query are being read when the signal lands
        try:
            return tracker.client.get_run(run_id)
        finally:
            loading.instances = real_instances

    monkeypatch.setattr(runner_module, "_sanity_flag", read_interrupted)
    grid = {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1, 2, 3]}}
    with pytest.raises(runner_module.GridInterrupted):  # not MLflow's "database is locked"
        run_grid(write_grid(tmp_path, grid), workers=2, progress=False)
    assert not cell_runs(status="RUNNING")
    # the other cells: KILLED, or FINISHED where their notebook ended before the stop reached their worker
    assert {r.info.status for r in cell_runs()} <= {"FINISHED", "KILLED"}


@pytest.mark.slow
def test_cell_over_its_timeout_fails_with_the_partial_notebook(mlflow_store, tmp_path, probe_notebooks, monkeypatch):
    """A cell over its timeout is stopped, marked FAILED with the reason, and keeps its partial notebook.
    The probe cell is held, never released: only the timeout ends it (else the test fails after the
    hold's bound). Why it takes about 20 s: the 15 s timeout itself and the kernel's start."""
    monkeypatch.setenv("DDLIB_NOTEBOOKS", str(probe_notebooks))
    monkeypatch.setenv("DDLIB_PROBE_GATE", str(tmp_path))
    grid = {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1]}}
    report = run_grid(write_grid(tmp_path, grid), timeout=15, progress=False)
    assert report.failed == [("random-ipc1-convnet", "timed out after 15 s")]
    (run,) = cell_runs()
    client = tracking.client()
    assert run.info.status == "FAILED" and run.data.tags[TAG["error"]] == "timed out after 15 s"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "notebook")] == ["notebook/label_robust.ipynb"]
    assert "lrs_mean" not in run.data.metrics
    assert run.data.tags[TAG["owner"]].startswith(socket.gethostname() + ":")


# --------------------------------------------------------------------------- Ctrl-C (issue 24.3)


def _read_until(process: subprocess.Popen, text: str, timeout: float) -> str:
    """The runner's output (stdout and stderr) up to ``text``; tqdm writes its bar without a newline."""
    import select

    seen, deadline = "", time.monotonic() + timeout
    while text not in seen:
        if time.monotonic() > deadline or process.poll() is not None:
            raise AssertionError(f"no {text!r} in the runner's output:\n{seen}")
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            seen += os.read(process.stdout.fileno(), 4096).decode(errors="replace")
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("when", ["workers starting", "cells running"])
def test_ctrl_c_stops_the_grid_in_one_line_naming_sigint(when, mlflow_store, tmp_path, probe_notebooks):
    """Ctrl-C (SIGINT to the runner's whole process group, as a terminal sends it) while the pool's
    workers import, or while cells run: one line naming SIGINT, no traceback from a worker, no
    "Kernel died" from papermill, exit status 130, and the running cells KILLED with SIGINT in their
    error tag (the runner used to forward SIGTERM and name that). Why "cells running" takes about 15 s:
    a fresh store, the runner's own start, its two spawned workers' imports and their two probe kernels
    must all be up before the SIGINT can land on running cells (held, never released: they run until
    stopped), then the stop takes a few seconds; "workers starting" (about 6 s) stops as soon as the
    runner's two workers exist, while they import (each used to print a KeyboardInterrupt traceback)."""
    path = write_grid(tmp_path, {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1, 2]}})
    tracking.init_store()
    probe = {"DDLIB_NOTEBOOKS": str(probe_notebooks), "DDLIB_PROBE_GATE": str(tmp_path)}
    runner = _runner(path, mlflow_store, "--workers", "2", env=probe)
    seen = _read_until(runner, "label_robust (", BOUND_SECONDS)  # the runner's bar: next, it starts its workers
    if when == "workers starting":
        wait_for(lambda: len([p for p in psutil.Process(runner.pid).children() if "spawn_main" in " ".join(p.cmdline())])
                 == 2, BOUND_SECONDS, "the runner's two workers", runner)
    else:
        wait_for(lambda: len(started(tmp_path)) == 2, BOUND_SECONDS, "two running cells", runner)
    os.killpg(runner.pid, signal.SIGINT)
    output = seen + runner.communicate(timeout=120)[0]
    assert runner.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output and "Kernel died" not in output, output
    lines = [line for line in re.split(r"[\r\n]", output) if "interrupted" in line]
    assert lines == ["interrupted (SIGINT): running cells marked KILLED; rerun the same command to finish the grid"], output
    assert not cell_runs(status="RUNNING")
    if when == "cells running":
        errors = {r.data.tags[TAG["error"]] for r in cell_runs()}
        assert errors == {"interrupted (SIGINT: Ctrl-C): rerun the grid to redo it"}, errors


def test_dry_run_plans_reuse_from_the_evaluations_of_an_interrupted_cell(mlflow_store, tmp_path, capsys):
    """A grid interrupted after some trainings finished: its cell is KILLED, its FINISHED evaluations
    are in the store and a rerun reuses them; the dry run says so (it looked at FINISHED cells only
    and said "nothing found")."""
    from ddlib.cli import main as cli_main

    path = write_grid(tmp_path, {"protocol": "label_robust", "params": {**TINY, "seeds": [0, 1]},
                                 "grid": {"method": ["random", "kcenter"], "ipc": [2]}})
    cells = {c["method"]: c for c in expand(load_grid(path))}
    tracking.init_store()
    tracker = Tracker("label_robust")
    killed = tracker.start_run(run_name("label_robust", cells["random"]), params=cells["random"],
                               tags=cell_tags("label_robust", cells["random"]))
    for role, seed in [("syn_hard", 0), ("rdm_hard", 0), ("real_hard", 0), ("syn_hard", 1)]:  # what finished
        child = tracker.start_run(f"{role}-s{seed}", params={"role": role, "seed": seed},
                                  tags={TAG["kind"]: "eval", TAG["role"]: role, TAG["eval_key"]: f"{role}{seed}"},
                                  parent_run_id=killed)
        tracker.end_run(child)
    tracker.start_run("rdm_hard-s1", params={"role": "rdm_hard", "seed": 1},  # interrupted mid-training
                      tags={TAG["kind"]: "eval", TAG["role"]: "rdm_hard"}, parent_run_id=killed)
    tracker.kill_run(killed, "interrupted (SIGINT: Ctrl-C): rerun the grid to redo it")

    assert cli_main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    random_cell = out[out.index("[run]  random-ipc2"):out.index("[run]  kcenter-ipc2")]
    kcenter_cell = out[out.index("[run]  kcenter-ipc2"):]
    assert "reuse:  rdm_hard (seeds 0), real_hard (seeds 0), syn_hard (seeds 0, 1)" in random_cell, random_cell
    assert "reuse:  rdm_hard (seeds 0), real_hard (seeds 0)\n" in kcenter_cell, kcenter_cell  # not random's own set


# --------------------------------------------------------------------------- progress per model (issue 24.9)


def test_the_runner_shows_each_running_cells_model_epoch_and_eta(mlflow_store, tmp_path, probe_notebooks, monkeypatch,
                                                                  capsys):
    """Under the grid's bar, a line per running cell: the model it trains (role, seed, lr), the epoch
    and the ETA, read from the progress file its kernel writes (the probe writes one as
    Cell.train_eval does); the worker mirrors it to the run's ``ddlib.store.progress`` tag. The cell is held
    (tests/waiting.py) until both have shown it: a cell that ended at once would show neither. Why it
    takes about 11 s: a fresh store, the spawned worker's imports and the probe kernel's start, then
    the console's (every 0.5 s) and the worker's (every 1 s) reads of its progress file."""
    import threading

    from ddlib.run import console

    from ddlib.run import runner
    shown = threading.Event()

    class Lines(console.CellLines):  # says when the console printed the cell's line
        def _print_plain(self, lines):
            super()._print_plain(lines)
            if "random-ipc1-convnet" in lines:
                shown.set()

    def release_once_shown() -> None:
        try:
            shown.wait(BOUND_SECONDS)
            wait_for(lambda: [r for r in cell_runs(status="RUNNING") if "ddlib.store.progress" in r.data.tags],
                     BOUND_SECONDS, "the run's progress tag", every=0.5)
        finally:
            release(tmp_path)

    monkeypatch.setattr(runner, "CellLines", Lines)
    monkeypatch.setenv("DDLIB_NOTEBOOKS", str(probe_notebooks))
    monkeypatch.setenv("DDLIB_PROBE_PROGRESS", "random-ipc1-convnet")
    monkeypatch.setenv("DDLIB_PROBE_GATE", str(tmp_path))
    monkeypatch.setenv("DDLIB_PROGRESS_TAG_SECONDS", "1")  # read by the spawned worker
    releaser = threading.Thread(target=release_once_shown, daemon=True)
    releaser.start()
    grid = {"protocol": "label_robust", "params": TINY, "grid": {"method": ["random"], "ipc": [1]}}
    report = run_grid(write_grid(tmp_path, grid), progress=True)
    releaser.join()
    assert report.finished == ["random-ipc1-convnet"]
    line = "syn_hard · seed 0 · lr 0.01 · model 2/2 · epoch 12/30 · ETA 0:54"
    err = capsys.readouterr().err
    # minutes since the cell started (of the runner's estimate, where the model of its work gives one)
    assert re.search(rf"random-ipc1-convnet: \[\d+\.\d( of ~\d+\.\d)? min\] {line}", err), err
    assert cell_runs()[0].data.tags["ddlib.store.progress"] == line  # what `ddlib runs` shows, and Ray's runner reads


@pytest.mark.filterwarnings("ignore:sanity")  # one epoch: near chance, as intended
def test_a_cell_writes_the_model_it_trains_where_the_worker_says(mlflow_store, tmp_path, monkeypatch):
    """A cell's trainings write their progress to ``DDLIB_PROGRESS_FILE`` (set by its worker): the
    last record is the last model trained, at its last epoch."""
    import json

    from ddlib.protocols import label_robust

    progress_file = tmp_path / "progress.json"
    monkeypatch.setenv("DDLIB_PROGRESS_FILE", str(progress_file))
    monkeypatch.setenv("DDLIB_PROGRESS_SECONDS", "0")
    cell = label_robust.open_cell(**{**TINY, "method": "random", "ipc": 1, "lr_policy": "fixed"})
    label_robust.evaluate(cell, label_robust.obtain(cell))
    cell.close()
    record = json.loads(progress_file.read_text())
    assert {k: record[k] for k in ("cell", "role", "seeds", "lrs", "epoch", "epochs")} == {
        "cell": "random-ipc1-convnet", "role": "rdm_hard", "seeds": [0], "lrs": [0.01], "epoch": 2, "epochs": 2}
    # what it trained, per role (the dry run's count of models and image-epochs): 10 images x 2 epochs,
    # and the reference on the 200 real images for 1 epoch
    run = tracking.client().get_run(cell.run_id)
    assert json.loads(run.data.tags["ddlib.trainings"]) == {
        role: {"models": 1, "trained": 1, "image_epochs": n, "trained_image_epochs": n}
        for role, n in (("syn_hard", 20), ("rdm_hard", 20), ("real_hard", 200))}
    assert run.data.metrics["models_trained"] == 3 and run.data.metrics["image_epochs_trained"] == 240


# --------------------------------------------------------------------------- what a cell will cost (issue 24.8)


def test_dry_run_counts_models_and_image_epochs_and_says_how_good_the_last_estimate_was(
        mlflow_store, tmp_path, probe_notebooks, monkeypatch, capsys):
    """From what an earlier cell of the setting recorded (``ddlib.trainings``: per role, models and
    image-epochs) and what the store holds, the dry run says per cell how many models it needs, how
    many it trains (and their image-epochs) and reuses; its minutes are scaled from the earlier
    cell's by image-epochs trained; and it says how the earlier cell's estimate (tagged by the runner
    when it started) compared with its minutes. The runner tags each cell it starts with its estimate."""
    import json

    from ddlib.cli import main as cli_main
    from ddlib.protocols.cell import TRAININGS_TAG

    path = write_grid(tmp_path, {"protocol": "label_robust", "params": {**TINY, "seeds": [0, 1], "lr_policy": "fixed"},
                                 "grid": {"method": ["random", "kcenter"], "ipc": [2]}})
    cells = {c["method"]: c for c in expand(load_grid(path))}
    tracking.init_store()
    tracker = Tracker("label_robust")
    client = tracking.client()
    start = int(time.time() * 1000) - 600_000
    trainings = {"syn_hard": {"models": 2, "trained": 2, "image_epochs": 80, "trained_image_epochs": 80},
                 "rdm_hard": {"models": 2, "trained": 2, "image_epochs": 80, "trained_image_epochs": 80},
                 "real_hard": {"models": 2, "trained": 2, "image_epochs": 400, "trained_image_epochs": 400}}
    earlier = client.create_run(tracker.experiment_id, start_time=start, run_name="random-ipc2-convnet",
                                tags={**cell_tags("label_robust", cells["random"]), TAG["estimate"]: "2.0",
                                      TRAININGS_TAG: json.dumps(trainings)}).info.run_id
    tracker.log_params(earlier, cells["random"])
    for seed in (0, 1):
        child = tracker.start_run(f"real_hard-s{seed}", params={"role": "real_hard", "seed": seed},
                                  tags={TAG["kind"]: "eval", TAG["role"]: "real_hard"}, parent_run_id=earlier)
        tracker.end_run(child)
    client.set_terminated(earlier, "FINISHED", end_time=start + 180_000)  # 3 minutes

    assert cli_main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[run]  kcenter-ipc2-convnet: ~0.9 min (this setting at this IPC: 1 earlier run(s), by image-epochs; " \
           "last time (random-ipc2-convnet) estimated 2.0 min, took 3.0)" in out, out
    # and K-Center's feature network (1 epoch on the 180 images left by the validation split), outside the store
    assert ("models: 7 models; trains 5 (rdm_hard 2, selection: feature network (cached on this machine) 1, syn_hard 2) "
            "= 340 image-epochs; reuses 2 (real_hard 2)") in out, out

    monkeypatch.setenv("DDLIB_NOTEBOOKS", str(probe_notebooks))
    assert run_grid(path, progress=False).finished == ["kcenter-ipc2-convnet"]
    started = next(r for r in cell_runs() if r.info.run_name == "kcenter-ipc2-convnet")
    assert float(started.data.tags[TAG["estimate"]]) == pytest.approx(3.0 * 160 / 560, abs=1e-3)


def test_progress_lines_in_a_log_are_printed_on_a_new_model_not_per_epoch(capsys, monkeypatch):
    """Not a terminal (a log file, CI): a running cell's line is printed when it starts another model
    (or after ``PLAIN_PROGRESS_SECONDS``), not redrawn per epoch (a 3-minute demo wrote thousands of
    lines into its log)."""
    from ddlib.run import console
    current = {"a": "[0.1 min] syn_hard · seed 0 · lr 0.01 · model 1/3 · epoch 1/200 · ETA 0:10"}
    lines = console.CellLines(1, lambda: dict(current), disable=False, terminal=False)
    lines.refresh()
    for epoch in range(2, 50):
        current["a"] = f"[0.2 min] syn_hard · seed 0 · lr 0.01 · model 1/3 · epoch {epoch}/200 · ETA 0:09"
        lines.refresh()
    current["a"] = "[0.3 min] syn_hard · seed 1 · lr 0.01 · model 2/3 · epoch 1/200 · ETA 0:08"
    lines.refresh()
    monkeypatch.setattr(console, "PLAIN_PROGRESS_SECONDS", 0.0)
    current["a"] = "[0.4 min] syn_hard · seed 1 · lr 0.01 · model 2/3 · epoch 9/200 · ETA 0:07"
    lines.refresh()
    lines.close()
    printed = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert printed == ["  a: [0.1 min] syn_hard · seed 0 · lr 0.01 · model 1/3 · epoch 1/200 · ETA 0:10",
                       "  a: [0.3 min] syn_hard · seed 1 · lr 0.01 · model 2/3 · epoch 1/200 · ETA 0:08",
                       "  a: [0.4 min] syn_hard · seed 1 · lr 0.01 · model 2/3 · epoch 9/200 · ETA 0:07"], printed


# --------------------------------------------------------------------------- matched compute (issue 27.5)


@pytest.mark.filterwarnings("ignore:sanity")
def test_matched_compute_trains_the_random_subsets_for_the_sets_images_seen(mlflow_store):
    """``matched_compute: true``: the random subsets are also trained for as many images seen as the
    set. A set of 2 + 9 x 1 = 11 images (IPC 2: its largest class) trained 4 epochs sees 44 images;
    its random subset holds 20, so it trains round(4 x 11 / 20) = 2 epochs (40 images seen), and
    ``ior_matched`` is the set's accuracy against that model's. A set of IPC x classes images needs
    no other training: its ``acc_rdm_matched`` is ``acc_rdm_any``."""
    import json

    import torch

    from ddlib.data.distilled import DistilledSet
    from ddlib.protocols import label_robust

    params = {**TINY, "method": "random", "ipc": 2, "lr_policy": "fixed", "recipe": {"epochs": 4},
              "matched_compute": True}
    cell = label_robust.open_cell(**params)
    full = label_robust.obtain(cell)
    keep = torch.tensor([i for i, y in enumerate(full.labels.tolist()) if y == 0 or i not in
                         {j for c in range(1, 10) for j in (full.labels == c).nonzero().flatten().tolist()[1:]}])
    unequal = DistilledSet(full.images[keep], full.labels[keep], full.num_classes, method="random")
    assert len(unequal) == 11 and unequal.ipc == 2
    result = label_robust.evaluate(cell, unequal)
    cell.close()
    run = tracking.client().get_run(cell.run_id)
    trainings = json.loads(run.data.tags["ddlib.trainings"])
    assert trainings["syn_hard"]["image_epochs"] == 11 * 4 and trainings["rdm_matched"]["image_epochs"] == 20 * 2
    seeds = result.per_seed
    assert list(seeds["ior_matched"]) == pytest.approx(list(seeds["acc_syn_any"] - seeds["acc_rdm_matched"]))

    equal_cell = label_robust.open_cell(**{**params, "seeds": [0]})
    equal = label_robust.evaluate(equal_cell, label_robust.obtain(equal_cell))
    equal_cell.close()
    assert "rdm_matched" not in json.loads(tracking.client().get_run(equal_cell.run_id).data.tags["ddlib.trainings"])
    assert (equal.per_seed["acc_rdm_matched"] == equal.per_seed["acc_rdm_any"]).all()
    from ddlib.protocols.ddranking_boards import lrs_leaderboard

    board = lrs_leaderboard()
    assert {"acc_rdm_matched_mean", "ior_matched_mean"} <= set(board.columns)
    assert board["ior_matched_mean"].notna().all()
