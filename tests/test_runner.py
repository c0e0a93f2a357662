"""The batch runner end to end: papermill executions tracked in MLflow, skipping, failures."""

import math
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ddlib.store import tracking
from ddlib import report
from ddlib.cli import main as cli_main
from ddlib.protocols import label_robust
from ddlib.run.runner import GridError, expand, load_grid, run_grid
from ddlib.store.tracking import TAG

TINY = {
    "protocol": "label_robust",
    "params": {"dataset": "digits", "seeds": [0], "recipe": {"epochs": 2, "batch_size": 64},
               "real_recipe": {"epochs": 1}, "lr_policy": "fixed"},
    "grid": {"method": ["random", "broken"], "ipc": [1]},
    # passes every check before the run (a corrupt file would not: see test_hostile_inputs.py) and
    # fails in the notebook: DM with an absurd step size distils NaN images, their training loss is NaN
    "methods": {"broken": {"kind": "dm", "iterations": 3, "lr_img": 1e30}},
}


def write_grid(tmp_path, grid) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


@pytest.fixture
def tiny_grid(tmp_path):
    return write_grid(tmp_path, TINY), "syn_hard: training loss became nan"


# ------------------------------------------------------------------ validation before anything runs


@pytest.mark.parametrize(
    "change,message",
    [
        ({"colour": "red"}, "unknown top-level key.*colour"),
        ({"protocol": "nope"}, "protocol must be one of"),
        ({"params": {"dataset": "digits", "epoch": 3}}, r"unknown parameter\(s\) \['epoch'\]"),  # a typo of epochs
        ({"params": {"dataset": "digits", "recipe": {"epoch": 3}}}, "unknown recipe key.*'epoch'"),
        ({"grid": {"method": ["random"], "ipc": [0]}}, "ipc must be a positive integer"),
        ({"params": {"dataset": "nosuchset"}}, "dataset: unknown dataset 'nosuchset'"),
        ({"params": {"dataset": "digits", "model": "resnet9000"}}, "model: unknown model"),
        ({"params": {"dataset": "digits", "seeds": "0"}}, "seeds must be a non-empty list"),
        ({"params": {"dataset": "digits", "w": 2}}, "w must be a number in"),
        ({"grid": {"method": ["mystery"]}}, "method 'mystery' has no source"),
        ({"grid": {"ipc": 3}}, "grid.ipc must be a non-empty list"),
        ({"methods": {"x": {"kind": "dm", "iters": 3}}, "grid": {"method": ["x"]}}, "unknown key 'iters'"),
    ],
)
def test_bad_params_fail_before_running_and_name_the_key(tmp_path, change, message):
    grid = {"protocol": "label_robust", "params": {"dataset": "digits"}, "grid": {"method": ["random"], "ipc": [1]}}
    grid.update(change)
    with pytest.raises(GridError, match=message) as info:
        expand(load_grid(write_grid(tmp_path, grid)))
    assert "grid.yaml" in str(info.value)


def test_unreadable_params_file(tmp_path):
    with pytest.raises(GridError, match="cannot read"):
        load_grid(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("protocol: [unclosed")
    with pytest.raises(GridError, match="not valid YAML"):
        load_grid(bad)


def test_expand_crosses_the_grid_and_resolves_sources(tmp_path):
    grid = {"protocol": "label_robust", "params": {"dataset": "digits"},
            "grid": {"method": ["random", "dm", "pub"], "ipc": [1, 10]},
            "methods": {"pub": {"kind": "file", "path": "sets/pub_ipc{ipc}.pt"}}}
    cells = expand(load_grid(write_grid(tmp_path, grid)))
    assert len(cells) == 6
    assert {(c["method"], c["ipc"]) for c in cells} == {(m, i) for m in ("random", "dm", "pub") for i in (1, 10)}
    pub = next(c for c in cells if c["method"] == "pub")
    assert Path(pub["source"]["path"]).is_absolute()
    assert all(set(c) == set(label_robust.PARAMS) for c in cells)


def test_repository_params_files_are_valid(shared_data_or_none):
    root = Path(__file__).resolve().parents[1] / "params"
    files = sorted(root.glob("*.yaml"))
    assert files, "no params files"
    for path in files:
        try:
            cells = expand(load_grid(path))
        except GridError as e:  # a data_root under ../shared/data, absent on this machine
            if shared_data_or_none is None and "does not exist" in str(e):
                continue
            raise
        assert cells, path


# ------------------------------------------------------------------ end to end (papermill)


@pytest.mark.slow
def test_grid_runs_skips_finished_and_marks_failures(mlflow_store, tiny_grid, tmp_path, capsys):
    """A grid with a good and a broken cell: the good one FINISHES, the broken one FAILS with its error,
    and a rerun skips the finished cell. Why it takes half a minute: two real notebook kernels (the
    failure must come through papermill as users see it) and the rerun's."""
    path, broken = tiny_grid
    outcome = run_grid(path, workers=2, progress=False)
    assert outcome.finished == ["random-ipc1-convnet"]
    assert len(outcome.failed) == 1
    name, error = outcome.failed[0]
    assert name == "broken-ipc1-convnet"
    assert error.startswith("NonFiniteLossError: ") and broken in error

    client = tracking.client()
    exp = client.get_experiment_by_name("label_robust")
    cells = {r.data.tags["mlflow.runName"]: r for r in client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{TAG['kind']}` = 'cell'")}
    ok, bad = cells["random-ipc1-convnet"], cells["broken-ipc1-convnet"]
    assert ok.info.status == "FINISHED" and bad.info.status == "FAILED"
    assert broken in bad.data.tags[TAG["error"]]
    assert "lrs_mean" in ok.data.metrics and "lrs_mean" not in bad.data.metrics  # never a result
    for run in (ok, bad):  # the executed (or partial) notebook is attached
        assert [a.path for a in client.list_artifacts(run.info.run_id, "notebook")] == ["notebook/label_robust.ipynb"]
    ok_files = {a.path for a in client.list_artifacts(ok.info.run_id)}
    assert {"config.json", "images", "sets"} <= ok_files
    evals = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG['kind']}` = 'eval'")
    # random method: the baseline comes from a stream of its own, so it is never the method's own
    # subset (issue 22; it was, and one evaluation served both with IOR 0 by construction); plus real
    assert sorted(r.data.tags[TAG["role"]] for r in evals) == ["rdm_hard", "real_hard", "syn_hard"]
    digests = {r.data.tags[TAG["role"]]: r.data.params["train_digest"] for r in evals}
    assert digests["rdm_hard"] != digests["syn_hard"]
    assert all(r.data.tags["mlflow.parentRunId"] == ok.info.run_id for r in evals)
    assert len(client.get_metric_history(evals[0].info.run_id, "train_loss")) in (1, 2)

    # second pass: the finished cell is skipped, the failed one is retried (and fails again)
    again = run_grid(path, workers=1, progress=False)
    assert again.skipped == ["random-ipc1-convnet"] and again.finished == [] and len(again.failed) == 1

    # the CLI exits non-zero and lists the failure; `--summary` (make demo) prints none after a failure
    assert cli_main(["run", str(path), "--summary"]) == 1
    captured = capsys.readouterr()
    assert "FAILED broken-ipc1-convnet" in captured.err and "[lrs]" not in captured.out

    board = report.lrs_leaderboard()
    assert list(board["method"]) == ["random"]
    row = board.iloc[0]
    assert math.isfinite(row["lrs_mean"])  # scored (LRS's values: test_metrics' published rows)
    assert cli_main(["summary"]) == 0
    out = capsys.readouterr().out
    assert "random" in out and "python -m ddlib ui" in out
    # a grid whose cells all finished: `run --summary` prints the same leaderboard, in the runner's process
    finished_only = tmp_path / "finished_only.yaml"
    finished_only.write_text(yaml.safe_dump({**TINY, "grid": {"method": ["random"], "ipc": [1]}}))
    assert cli_main(["run", str(finished_only), "--summary"]) == 0
    again_out = capsys.readouterr().out
    assert again_out.startswith("finished 0, skipped 1 already finished, failed 0")
    assert out.split("saved ")[0] in again_out  # the leaderboard as `ddlib summary` printed it


def test_cell_run_by_hand_owns_its_run_and_fails_cleanly(mlflow_store, tmp_path):
    params = dict(dataset="digits", method="random", ipc=1, seeds=[0, 1], recipe={"epochs": 2},
                  real_recipe={"epochs": 1}, lr_policy="fixed")
    cell = label_robust.open_cell(**params)
    distilled = label_robust.obtain(cell)
    result = label_robust.evaluate(cell, distilled)
    cell.close()
    client = tracking.client()
    run = client.get_run(cell.run_id)
    assert run.info.status == "FINISHED"
    assert list(result.per_seed["seed"]) == [0, 1]
    assert run.data.metrics["lrs_mean"] == pytest.approx(result.summary["lrs_mean"])
    history = client.get_metric_history(cell.run_id, "per_seed/acc_syn_hard")
    assert sorted(m.step for m in history) == [0, 1]

    # the same evaluations again: reused, not retrained
    cell2 = label_robust.open_cell(**params)
    again = label_robust.evaluate(cell2, label_robust.obtain(cell2))
    cell2.close()
    assert again.per_seed.equals(result.per_seed)
    # 2 seeds x (syn, rdm, real): the baselines never are the random method's set (issue 22)
    assert len(client.search_runs([run.info.experiment_id], f"tags.`{TAG['kind']}` = 'eval'")) == 6

    bad_file = tmp_path / "nan.pt"
    torch.save({"images": torch.full((10, 1, 8, 8), float("nan")), "labels": torch.arange(10)}, bad_file)
    cell3 = label_robust.open_cell(**{**params, "method": "nan", "source": {"kind": "file", "path": str(bad_file)}})
    with pytest.raises(ValueError, match="nan.pt"):
        label_robust.obtain(cell3)
    assert client.get_run(cell3.run_id).info.status == "FAILED"


@pytest.mark.slow
def test_a_warm_kernel_gives_a_fresh_kernels_numbers(tmp_path, monkeypatch):
    """One worker runs its cells in one kernel (ddlib.run.kernels): a cell in a kept kernel gives bit for
    bit the metrics of a fresh kernel (DDLIB_WARM_KERNEL=0), the runs say which kernel they had, and
    a failed cell's kernel is not reused. Why it takes most of a minute: the same small grid twice, in
    a kept and in fresh kernels (each fresh one starts and imports the stack), with real trainings:
    a probe notebook would not show a kernel carrying state into the numbers."""
    methods = {**TINY["methods"], "kcenter": {"kind": "kcenter", "epochs": 1}, "kcenter_b": {"kind": "kcenter", "epochs": 2}}

    def run(name: str, warm: str, grid_methods: list[str]) -> dict:
        store = tmp_path / name
        monkeypatch.setenv("DDLIB_MLRUNS", str(store))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
        monkeypatch.setenv("DDLIB_WARM_KERNEL", warm)
        monkeypatch.setattr(tracking, "_CLIENTS", {})
        (tmp_path / name).mkdir()
        path = write_grid(tmp_path / name, {**TINY, "grid": {"method": grid_methods, "ipc": [1]}, "methods": methods})
        run_grid(path, workers=1, progress=False)
        client = tracking.client()
        exp = client.get_experiment_by_name("label_robust")
        return {r.data.tags["mlflow.runName"]: r for r in client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`{TAG['kind']}` = 'cell'")}

    warm = run("warm", "1", ["random", "kcenter", "broken", "kcenter_b"])
    fresh = run("fresh", "0", ["random", "kcenter"])
    assert {name: (r.info.status, r.data.tags.get("ddlib.kernel")) for name, r in warm.items()} == {
        "random-ipc1-convnet": ("FINISHED", "fresh"),
        "kcenter-ipc1-convnet": ("FINISHED", "warm: cell 2 of its kernel"),
        "broken-ipc1-convnet": ("FAILED", "warm: cell 3 of its kernel"),
        "kcenter_b-ipc1-convnet": ("FINISHED", "fresh")}  # after the failed cell, a fresh kernel
    assert {r.data.tags.get("ddlib.kernel") for r in fresh.values()} == {"fresh"}
    a = {k: v for k, v in warm["kcenter-ipc1-convnet"].data.metrics.items() if "seconds" not in k}
    b = {k: v for k, v in fresh["kcenter-ipc1-convnet"].data.metrics.items() if "seconds" not in k}
    assert a.keys() == b.keys() and "lrs_mean" in a
    assert [k for k in a if not (a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]))] == []


@pytest.fixture
def taken_port():
    """A local TCP port this test holds (listening): a kernel told to bind it dies of "Address already in use"."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_kernel_that_dies_on_a_taken_port_is_replaced(monkeypatch, caplog, taken_port):
    """jupyter_client frees the ports it picked before the kernel binds them; when another process took
    one meanwhile, the kernel dies with "Address already in use" before it answers kernel_info (a grid
    cell failed so on a 2-core Zen 3). Here the first kernel is given a port this test holds: it dies
    for real, and the cell gets a second kernel, alive and answering, instead of a failure."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    from ddlib.run import executors

    from ddlib.run import kernels
    made = []

    def manager():
        km = (AsyncKernelManager(kernel_name="python3", cache_ports=False, shell_port=taken_port)
              if not made else AsyncKernelManager(kernel_name="python3"))
        made.append(km)
        return km

    monkeypatch.setattr(kernels, "_manager", manager)
    monkeypatch.setattr(kernels, "_state", {"km": None, "key": None, "cells": 0, "atexit": True})
    try:
        with caplog.at_level("WARNING", logger="ddlib.run.kernels"):
            km = kernels.kernel_for(os.getcwd(), {}, {}, executors.KERNEL_ARGUMENTS)
        assert len(made) == 2 and km is made[1]
        assert not run_sync(made[0].is_alive)() and run_sync(km.is_alive)()
        assert "died before it answered (attempt 1 of 3)" in caplog.text
        kc = km.blocking_client()
        kc.start_channels()
        try:
            assert kc.execute_interactive("1 + 1", timeout=30)["content"]["status"] == "ok"
        finally:
            kc.stop_channels()
    finally:
        kernels.release_kernel()


def test_a_kernel_that_keeps_dying_fails_the_cell_with_a_clear_error(monkeypatch, taken_port):
    """Three kernels in a row on a taken port: the cell fails, saying the kernel did not start and why."""
    from jupyter_client.manager import AsyncKernelManager

    from ddlib.run import executors

    from ddlib.run import kernels
    monkeypatch.setattr(kernels, "_manager", lambda: AsyncKernelManager(
        kernel_name="python3", cache_ports=False, shell_port=taken_port))
    monkeypatch.setattr(kernels, "_state", {"km": None, "key": None, "cells": 0, "atexit": True})
    with pytest.raises(RuntimeError, match=r"did not start \(attempt 3 of 3\): Kernel died before replying"):
        kernels.kernel_for(os.getcwd(), {}, {}, executors.KERNEL_ARGUMENTS)
    assert kernels._state["km"] is None


def test_a_kept_kernel_freezes_what_survives_and_thaws_it_every_few_cells():
    """The prelude's `gc.freeze()` keeps a kept kernel's collections to the new cell's objects; every
    UNFREEZE_EVERY cells it unfreezes first, so frozen objects that became cyclic garbage are collected."""
    from ddlib.run.kernels import UNFREEZE_EVERY, _prelude

    assert "freeze()" in _prelude({"A": "1"}, 2) and "unfreeze()" not in _prelude({"A": "1"}, 2)
    thawing = _prelude({}, UNFREEZE_EVERY)
    assert thawing.index("unfreeze()") < thawing.index("%reset -f") < thawing.rindex("freeze()")


def test_the_pool_starts_no_two_cells_that_would_compute_the_same_at_once():
    """The demo lists K-Center and DM at IPC 1 and 10 side by side; started together, both cells of a
    pair would train K-Center's feature network (or embed DM's real batches) at once. The pool starts
    the second of a pair only after the first ended (its cache is there), other cells meanwhile."""
    from ddlib.run.executors import CellJob, next_job
    from ddlib.run.runner import cell_shares

    cells = expand(load_grid(Path(__file__).resolve().parents[1] / "params" / "demo.yaml"))
    pending = [CellJob("label_robust", "e", f"{c['method']}-{c['ipc']}", c, {}, {}, "", "", shares=cell_shares(c))
               for c in cells]
    assert [job.name for job in pending][2:6] == ["kcenter-1", "kcenter-10", "dm-1", "dm-10"]
    started, running, done = [], [], set()
    while pending or running:  # two workers; cells end in the order they started
        while pending and len(running) < 2:
            running.append(pending.pop(next_job(pending, running, done)))
            started.append(running[-1].name)
        done |= running.pop(0).shares
    assert started == ["random-1", "random-10", "kcenter-1", "dm-1", "kcenter-10", "dm-10", "dm_kcenter-10", "dm_noise-10",
                       "dm_kcenter-1", "dm_noise-1"]
    # a cell whose shared work no other cell computes starts in grid order; if every cell waits, the first starts
    blocked = CellJob("label_robust", "e", "b", {}, {}, {}, "", "", shares=frozenset({"x"}))
    assert next_job([blocked, blocked], [blocked], set()) == 0 and next_job([blocked], [blocked], {"x"}) == 0


def test_ray_hands_cells_over_as_slots_free_keeping_shared_work_apart(monkeypatch):
    """Ray got every cell at once and ran them in grid order: K-Center at IPC 1 and 10 started together
    and, on two nodes, both trained the feature network. Cells now go to Ray as its slots free, chosen
    then as the local pool chooses (``next_job``); Ray itself is faked here (the real one: test_scale_out)."""
    import types

    from ddlib.run.cluster import RayExecutor
    from ddlib.run.executors import CellJob, CellOutcome
    from ddlib.run.runner import cell_shares

    submitted, outcomes = [], []
    task = types.SimpleNamespace(remote=lambda job, watch: submitted.append(job.name) or job.name)
    fake = types.SimpleNamespace(
        is_initialized=lambda: True, cluster_resources=lambda: {"CPU": 2.0},
        remote=lambda fn: types.SimpleNamespace(options=lambda **kw: task),
        wait=lambda refs, num_returns, timeout=None: (refs[:1], refs[1:]),  # the oldest cell in flight ends first
        get=lambda ref: CellOutcome(ref, "finished"), cancel=lambda ref, force: None, shutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "ray", fake)
    cells = expand(load_grid(Path(__file__).resolve().parents[1] / "params" / "demo.yaml"))
    jobs = [CellJob("label_robust", "e", f"{c['method']}-{c['ipc']}", c, {}, {}, "", "", shares=cell_shares(c))
            for c in cells]
    RayExecutor("auto", workers=1).run(jobs, lambda job, outcome: outcomes.append(outcome.status))
    assert submitted == ["random-1", "random-10", "kcenter-1", "dm-1", "kcenter-10", "dm-10", "dm_kcenter-10",
                         "dm_noise-10", "dm_kcenter-1", "dm_noise-1"]  # the local pool's order (test above)
    assert outcomes == ["finished"] * 10
    ray = RayExecutor("auto", workers=1, cpus_per_cell=1, gpus_per_cell=1)
    assert ray.cells_at_once({"CPU": 16.0, "GPU": 4.0}, 10) == 4  # the scarcer resource decides
    assert RayExecutor("auto", workers=6).cells_at_once({"CPU": 2.0}, 10) == 6  # at least --workers
    assert RayExecutor("auto", workers=1).cells_at_once({"CPU": 64.0}, 3) == 3  # never more than the cells
    assert RayExecutor("auto", workers=1, cpus_per_cell=0).cells_at_once({}, 5) == 5  # asks for nothing: all


def _gated_cell(job, watch_parent=False):
    """A cell that runs until the test releases it (tests/waiting.py: ``start <name>`` when it starts,
    ``end <name>`` when it returns, in its gate folder's events): which cell starts when is the pool's
    choice, which ends when is the test's. A pool worker imports it from this module."""
    from waiting import hold, note

    from ddlib.run.executors import CellOutcome

    gate = Path(job.params["gate"])
    hold(gate, job.name)
    note(gate, f"end {job.name}")
    return CellOutcome(job.name, "finished")


def _held(gate: Path, name: str, shares=()):
    from ddlib.run import executors
    return executors.CellJob("label_robust", "e", name, {"gate": str(gate)}, {}, {}, "", "", shares=frozenset(shares))


def test_the_local_pool_starts_a_cell_sharing_work_only_after_the_cell_computing_it(tmp_path, monkeypatch):
    """The real LocalExecutor, two spawned workers, cells that run until the test ends them: while the
    first K-Center cell computes the features, the pool starts cells sharing nothing (on the worker free
    at first, and on the one the test frees), not the second K-Center cell that comes before them in the
    grid; that one starts once the first has ended. The order is forced by events (a cell ends when the
    test says), not by how long cells sleep. (Where only such cells are left, a free worker starts one
    anyway: computing again beats idling; ``next_job``'s test above.)"""
    import threading

    from waiting import BOUND_SECONDS, events, release, started, wait_for

    from ddlib.run import executors
    from ddlib.run.pool import LocalExecutor
    monkeypatch.setattr(executors, "execute_cell", _gated_cell)
    jobs = [_held(tmp_path, "kcenter-1", {"features"}), _held(tmp_path, "kcenter-10", {"features"}),
            _held(tmp_path, "random-1"), _held(tmp_path, "random-10")]
    outcomes, errors = [], []

    def run() -> None:
        try:
            LocalExecutor(2).run(jobs, lambda job, outcome: outcomes.append(outcome.status))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    pool = threading.Thread(target=run, daemon=True)
    pool.start()
    try:
        wait_for(lambda: len(started(tmp_path)) == 2, BOUND_SECONDS, "two cells started")
        assert sorted(started(tmp_path)) == ["kcenter-1", "random-1"]  # not kcenter-10, second in the grid
        release(tmp_path, "random-1")
        wait_for(lambda: len(started(tmp_path)) == 3, BOUND_SECONDS, "a third cell started")
        assert started(tmp_path)[2] == "random-10"  # the freed worker: kcenter-1 still computes the features
        release(tmp_path, "kcenter-1")
        wait_for(lambda: len(started(tmp_path)) == 4, BOUND_SECONDS, "the fourth cell started")
        order = events(tmp_path)
        assert order.index("end kcenter-1") < order.index("start kcenter-10"), order
    finally:
        release(tmp_path)
        pool.join(BOUND_SECONDS)
    assert not pool.is_alive() and not errors, errors
    assert outcomes == ["finished"] * 4


def _idle_worker_with_a_kept_kernel(pids) -> None:
    """A pool worker between cells: its handlers set, its kept kernel started; then it waits."""
    import time

    from ddlib.run import executors

    from ddlib.run import kernels
    executors._init_pool_worker(None)
    km = kernels.kernel_for(os.getcwd(), {}, {}, executors.KERNEL_ARGUMENTS)
    pids.put(km.provisioner.pid)
    time.sleep(600)  # until the test's SIGTERM


def test_a_worker_stopped_between_cells_takes_its_kept_kernel_with_it():
    """The kept kernel runs in a session of its own (a Ctrl-C to the runner's process group misses it):
    a worker stopped while no cell runs exits at once, and its kernel, which watches its parent, ends
    too: no kernel outlives the grid. (Its bounds only bound a failure: the worker would sleep 600 s.)"""
    import multiprocessing
    import signal

    import psutil
    from waiting import BOUND_SECONDS, wait_for

    context = multiprocessing.get_context("spawn")
    pids = context.Queue()
    worker = context.Process(target=_idle_worker_with_a_kept_kernel, args=(pids,))
    worker.start()
    kernel = pids.get(timeout=BOUND_SECONDS)
    assert psutil.pid_exists(kernel)
    os.kill(worker.pid, signal.SIGTERM)
    worker.join(120)
    assert worker.exitcode == 128 + signal.SIGTERM

    def gone() -> bool:
        try:
            return psutil.Process(kernel).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 120, "the kept kernel gone with its worker")


def _idle_worker_whose_main_thread_blocks_the_stop_signals(pids) -> None:
    """A pool worker between cells where the kernel hands SIGTERM to a thread other than the main one
    (it may pick any thread that does not block it; here the main thread blocks it, so it must)."""
    import signal
    import threading
    import time

    from ddlib.run import executors
    executors._init_pool_worker(None)
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # a thread that takes it
    signal.pthread_sigmask(signal.SIG_BLOCK, executors.STOP_SIGNALS)
    pids.put(os.getpid())
    time.sleep(600)


def test_a_worker_stops_at_once_whichever_of_its_threads_the_signal_reaches():
    """Linux delivers a signal sent to a process to any of its threads that does not block it, and
    Python runs the handler only in the main thread, once that thread runs: an idle worker, its main
    thread blocked in a read of the pool's queue, stayed alive after SIGTERM (the test above failed 1
    run in 10). Here the main thread blocks the signal, so another thread must take it; the worker
    exits with 128 + SIGTERM on the signal (before the relay: not before its 600 s sleep ended; the
    join's bound only bounds the failure)."""
    import multiprocessing
    import signal

    from waiting import BOUND_SECONDS

    context = multiprocessing.get_context("spawn")
    pids = context.Queue()
    worker = context.Process(target=_idle_worker_whose_main_thread_blocks_the_stop_signals, args=(pids,))
    worker.start()
    assert pids.get(timeout=BOUND_SECONDS) == worker.pid
    os.kill(worker.pid, signal.SIGTERM)
    worker.join(120)
    alive = worker.exitcode is None
    if alive:
        worker.kill()
        worker.join()
    assert not alive and worker.exitcode == 128 + signal.SIGTERM


def test_a_worker_goes_without_the_iri_format_checker_and_still_validates_notebooks():
    """jsonschema builds rfc3987_syntax's Lark parser as it is imported (1.0-1.7 s of each worker's
    start); a worker leaves that module out. Papermill's notebooks still validate, and a broken one
    still fails validation."""
    import subprocess

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "label_robust.ipynb"
    code = f"""
import sys
from ddlib.run import executors
executors._leave_out_unused_imports()
import nbformat, papermill
nb = nbformat.read({str(notebook)!r}, as_version=4)
nbformat.validate(nb)
del nb["cells"][0]["source"]
try:
    nbformat.validate(nb)
except nbformat.ValidationError:
    print("broken notebook refused")
print("left out:", sys.modules.get("rfc3987_syntax", "never imported") is None)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["broken notebook refused", "left out: True"], done.stdout


def test_the_pool_workers_exit_when_their_runner_is_killed(tmp_path):
    """SIGKILL of the runner alone (the OOM killer, `kill -9 PID`): ProcessPoolExecutor's workers wait on
    their call queue for ever, an idle one with its kept kernel. Each worker watches its parent: here
    one is idle (its cell, released at once, has ended) and one runs a held stub cell that has no
    monitor; both exit (before: both were still there, adopted by init)."""
    import signal
    import subprocess

    import psutil
    from waiting import BOUND_SECONDS, events, release, wait_for

    tests = Path(__file__).resolve().parent
    code = f"""
import os, sys
sys.path[:0] = [{str(tests.parent)!r}, {str(tests)!r}]
from ddlib.run import executors, pool
import test_runner
if __name__ == "__main__":
    executors.execute_cell = test_runner._gated_cell
    jobs = [test_runner._held(test_runner.Path({str(tmp_path)!r}), name) for name in ("idle", "busy")]
    pool.LocalExecutor(2).run(jobs, lambda job, outcome: print("ended", job.name, flush=True))
"""
    release(tmp_path, "idle")
    runner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    workers = []
    try:
        # both cells started (so both workers are up), and the first has ended: its worker is idle
        wait_for(lambda: {"start busy", "end idle"} <= set(events(tmp_path)), BOUND_SECONDS,
                 "one cell ended and one running", runner)
        workers = [p for p in psutil.Process(runner.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in workers]
        runner.send_signal(signal.SIGKILL)
        runner.wait(120)
        gone, alive = psutil.wait_procs(workers, timeout=120)
        assert not alive, f"workers left behind: {[p.pid for p in alive]}"
    finally:
        runner.kill()
        for worker in workers:  # adopted by init where they outlived the runner
            try:
                worker.kill()
            except psutil.NoSuchProcess:
                pass


class _Stopped(Exception):
    pass


def test_the_runner_stops_its_cells_when_another_of_its_threads_took_the_signal(tmp_path, monkeypatch):
    """The runner waits on its cells; a SIGTERM the kernel handed to another of its threads (tqdm's
    monitor, OpenBLAS's pool) must stop the grid now, not when a cell ends. Here the main thread blocks
    SIGTERM while a helper thread sends it, once both cells run, so the helper's thread takes it; the
    cells, held until the test releases them, are stopped, and the handler's exception reaches the
    caller while they still run. Only if it does not (after a bound) does the helper release them, so
    that the grid ends and the test fails: no cell may have ended."""
    import signal
    import threading

    from waiting import BOUND_SECONDS, events, release, started, wait_for

    from ddlib.run import executors
    from ddlib.run.pool import LocalExecutor
    monkeypatch.setattr(executors, "execute_cell", _gated_cell)
    returned = threading.Event()

    def stop(signum, frame):
        raise _Stopped

    def send() -> None:
        try:
            wait_for(lambda: len(started(tmp_path)) == 2, BOUND_SECONDS, "both cells running")
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            if not returned.wait(120):
                release(tmp_path)  # the grid did not stop: end its cells, so that it returns and the test fails

    jobs = [_held(tmp_path, f"held-{i}") for i in range(2)]
    previous = signal.signal(signal.SIGTERM, stop)
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    try:
        with pytest.raises(_Stopped):
            LocalExecutor(2).run(jobs, lambda job, outcome: None)
    finally:
        returned.set()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGTERM, previous)
    assert not [event for event in events(tmp_path) if event.startswith("end")]  # no cell ended


def test_workers_share_the_cores_this_process_may_use_not_the_machines(monkeypatch):
    """On a Slurm or container share of a large node, os.cpu_count() is the node's: two workers would
    each run the node's cores in threads on the few granted (the suite saw a 6 s distillation take
    90 s at twice the threads of its cores). The runner reads the CPU affinity."""
    import os

    from ddlib.engine import device
    from ddlib.run.pool import LocalExecutor

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 4, 5, 6})
    assert device.usable_cores() == 4
    assert LocalExecutor(2).threads_per_cell() == 2 and LocalExecutor(8).threads_per_cell() == 1
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS has none: the machine's count
    assert device.usable_cores() == 64
