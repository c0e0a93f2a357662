"""Scale-out: many workers writing one store at once (a PostgreSQL-backed MLflow server, a SQLite
file), the Ray executor on a local CPU Ray instance, and determinism across processes and stores.

The two 40-cell grids (4 workers, 10 cells each) test the runner and the stores under concurrent
writes with the probe notebook (``probe_notebooks`` in conftest.py: it logs the per-seed metrics
through ddlib's tracking layer as the protocol notebooks do, without training), so 40 kernel
starts cost ~150 CPU-s instead of ~450. Real cells (digits, a few epochs) run through the Ray test
and the determinism test. PostgreSQL comes from ``DDLIB_TEST_POSTGRES`` (``.ci/run`` starts a
cluster) or a cluster this module starts where PostgreSQL is installed; its test skips where not.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml

from ddlib.store.tracking import TAG

sys.path.insert(0, str(Path(__file__).resolve().parent))
import postgres_cluster  # noqa: E402
from conftest import PROBE_PER_SEED  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PER_SEED = PROBE_PER_SEED  # the probe notebook logs the label_robust notebook's per-seed metrics
SEEDS = [0, 1]
GRID40 = {"protocol": "label_robust",
          "params": {"dataset": "digits", "seeds": SEEDS},
          "grid": {"method": ["random"], "ipc": list(range(1, 11)), "w": [0.2, 0.4, 0.6, 0.8]}}
REAL = {"protocol": "label_robust",
        "params": {"dataset": "digits", "seeds": SEEDS, "recipe": {"epochs": 20, "batch_size": 64},
                   "real_recipe": {"epochs": 15, "lr": 0.05}, "train_per_class": 20, "test_size": 100},
        "grid": {"method": ["random", "kcenter"], "ipc": [1]},
        "methods": {"kcenter": {"kind": "kcenter", "epochs": 1}}}

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(grid: Path, env: dict, *args: str, timeout: float = 900) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
    done = subprocess.run([sys.executable, "-m", "ddlib", "run", str(grid), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def sqlite_env(store: Path) -> dict:
    return {"DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}


# PyTorch's CPU kernels split reductions by thread: the same seed gives the same bits only for the
# same intra-op thread count (1 vs 2 threads already differ in the loss's 5th digit). `ddlib run`
# shares the cores out between its workers unless DDLIB_NUM_THREADS fixes the count, as here, so
# that runs with different --workers (and Ray) are comparable on any machine.
ONE_THREAD = {"DDLIB_NUM_THREADS": "1"}


def cell_results(tracking_uri: str) -> dict[str, dict]:
    """FINISHED cell runs of experiment label_robust by config hash (asserting there is one per hash),
    each with its per-seed metric histories {metric: {seed: value}}; and that nothing is RUNNING."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("label_robust")
    runs = client.search_runs([exp.experiment_id], f"tags.`{TAG['kind']}` = 'cell'", max_results=1000)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    finished = [r for r in runs if r.info.status == "FINISHED"]
    hashes = Counter(r.data.tags[TAG["config"]] for r in finished)
    assert set(hashes.values()) == {1}, hashes  # no duplicate config hash
    out = {}
    for run in finished:
        out[run.data.tags[TAG["config"]]] = {
            key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, f"per_seed/{key}")}
            for key in PER_SEED}
    return out


def assert_every_per_seed_metric(results: dict[str, dict]) -> None:
    for config, metrics in results.items():
        for key in PER_SEED:
            assert sorted(metrics[key]) == SEEDS, (config, key, metrics[key])


def write(path: Path, grid: dict) -> Path:
    path.write_text(yaml.safe_dump(grid))
    return path


# --------------------------------------------------------------------------- PostgreSQL-backed server


@pytest.fixture(scope="module")
def postgres_admin():
    """The admin URI of a PostgreSQL cluster on 127.0.0.1 (``DDLIB_TEST_POSTGRES``, or started here)."""
    pytest.importorskip("psycopg", reason="psycopg[binary] is not installed (pip install -e '.[cluster]')")
    uri = os.environ.get(postgres_cluster.ENV)
    if uri:
        yield uri
        return
    if postgres_cluster.find_bin() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run installs it)")
    folder = tempfile.mkdtemp(prefix="ddlib-pg-")  # not under pytest's 0700 tmp: the postgres user must enter it
    try:
        uri = postgres_cluster.start(folder)
    except (RuntimeError, OSError) as error:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"cannot start a PostgreSQL cluster here: {error}")
    yield uri
    postgres_cluster.stop(folder)
    shutil.rmtree(folder, ignore_errors=True)


def new_database(admin_uri: str) -> str:
    import psycopg

    name = f"ddlib_test_{secrets.token_hex(4)}"
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return admin_uri.rsplit("/", 1)[0] + "/" + name


def listening_addresses(pid: int) -> set[str]:
    """The addresses the process tree of ``pid`` listens on (TCP)."""
    import psutil

    root = psutil.Process(pid)
    pids = {root.pid, *(c.pid for c in root.children(recursive=True))}
    return {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.pid in pids}


@pytest.fixture
def server(tmp_path):
    """Start `ddlib server` processes on loopback for one test; stopped afterwards."""
    from ddlib.store.server import start_server, stop_server

    started = []

    def start(backend_store_uri: str) -> str:
        port = free_port()
        log = open(tmp_path / f"server-{port}.log", "w")
        process = start_server(backend_store_uri, tmp_path / "artifacts", port=port, workers=2, log=log)
        started.append((process, log))
        assert listening_addresses(process.pid) == {"127.0.0.1"}  # loopback only, by default
        return f"http://127.0.0.1:{port}"

    yield start
    for process, log in started:
        stop_server(process)
        log.close()


def test_a_server_that_does_not_answer_is_one_clear_error_not_a_traceback(monkeypatch, capsys):
    from ddlib.cli import main

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    assert main(["summary", "--no-log"]) == 2
    err = capsys.readouterr().err
    assert f"the tracking server {url} (MLFLOW_TRACKING_URI) does not answer" in err
    assert "Traceback" not in err


def test_a_database_password_never_reaches_the_server_command_line(tmp_path):
    """`ps` shows every process's command line to every user: the store URI goes in the environment."""
    from ddlib.store.server import server_command

    uri = "postgresql://mlflow:s3cret-pw@127.0.0.1:5432/mlflow"
    command, env = server_command(uri, tmp_path / "artifacts")
    assert not [arg for arg in command if "s3cret-pw" in arg]
    assert env["MLFLOW_BACKEND_STORE_URI"] == uri


def test_mlflows_job_execution_is_off_unless_the_environment_turns_it_on(tmp_path, monkeypatch):
    """MLflow's server starts 8 Huey job consumers (GenAI jobs ddlib never submits) unless told not
    to: about 22 CPU-s per server start on two cores. A user's own setting is kept."""
    from ddlib.store.server import server_command

    monkeypatch.delenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", raising=False)
    store = f"sqlite:///{tmp_path / 'x.db'}"
    assert server_command(store, tmp_path)[1]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "true")
    assert server_command(store, tmp_path)[1]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "true"


def test_a_new_sqlite_store_is_created_whole_before_the_server_opens_it(tmp_path):
    """`mlflow server` migrates a new SQLite file step by step in place: a stop during its first start
    left a store every later command failed on. ddlib creates and migrates the file under another name
    and moves it into place (as `ddlib run` and `ddlib ui` do) before the server is started."""
    import sqlite3

    from ddlib.store.server import server_command

    path = tmp_path / "new" / "server.db"
    server_command(f"sqlite:///{path}", tmp_path / "artifacts")
    assert path.is_file()
    with sqlite3.connect(path) as db:  # MLflow's schema, with its migration revision recorded
        assert db.execute("select count(*) from alembic_version").fetchone() == (1,)
        assert db.execute("select name from experiments").fetchall() == [("Default",)]
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith((".new", ".plain"))]  # no half-made file


def test_ddlib_server_binds_loopback_and_sigterm_stops_the_whole_server(tmp_path):
    """`python -m ddlib server` with no --host listens on 127.0.0.1 only, and SIGTERM to it stops
    MLflow's server and its uvicorn workers too (before, they kept listening, orphaned). Why it takes
    about 15 s: mostly the server's start (`ddlib server`, then `mlflow server` creating its new SQLite
    database and starting its uvicorn worker) until it answers, then a few seconds for the whole tree to
    stop; the addresses listened on and the orphans are only seen on a real process tree."""
    import psutil

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "ddlib", "server", "--port", str(port), "--workers", "1",
                                "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                                "--artifacts-destination", str(tmp_path / "artifacts")],
                               env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    tree = []
    try:
        expected = f"point runs at it:  export MLFLOW_TRACKING_URI=http://127.0.0.1:{port}"
        lines = []  # MLflow's own log lines come through the same stdout
        while expected not in lines and len(lines) < 200 and process.poll() is None:
            lines.append(process.stdout.readline().strip())
        assert expected in lines, lines
        tree = psutil.Process(process.pid).children(recursive=True)
        assert listening_addresses(process.pid) == {"127.0.0.1"}
        assert (tmp_path / "server.db").exists()  # MLflow uses the store it was given ...
        assert not [p.cmdline() for p in tree if "server.db" in " ".join(p.cmdline())]  # ... not via argv (ps)
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        gone, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, alive
        with socket.socket() as s:  # nothing listens on the port any more (SO_REUSEADDR: the health
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # check's TIME_WAIT sockets do not count)
            s.bind(("127.0.0.1", port))
    finally:
        for leftover in [process, *tree]:
            if leftover.poll() is None if leftover is process else leftover.is_running():
                leftover.kill()


@pytest.mark.slow
def test_grid_of_40_cells_with_4_workers_into_a_postgres_backed_server(postgres_admin, server, probe_notebooks, tmp_path):
    """40 cells from 4 workers into a tracking server on PostgreSQL: every per-seed metric arrives once.
    Why it takes most of a minute: the server's start, and 40 probe notebooks (no torch, so each is mostly
    its kernel and its MLflow writes) whose concurrent writes are the point; fewer cells rarely overlap."""
    import psycopg

    database = new_database(postgres_admin)
    url = server(database)
    env = {"MLFLOW_TRACKING_URI": url, "DDLIB_MLRUNS": str(tmp_path / "mlruns"), "DDLIB_NOTEBOOKS": str(probe_notebooks)}
    out = run_cli(write(tmp_path / "grid40.yaml", GRID40), env, "--workers", "4")
    assert "finished 40, skipped 0" in out and "failed 0" in out, out
    results = cell_results(url)
    assert len(results) == 40
    assert_every_per_seed_metric(results)
    with psycopg.connect(database) as conn:  # the rows really are in PostgreSQL
        assert conn.execute("SELECT count(*) FROM runs WHERE status = 'FINISHED'").fetchone()[0] == 40
    again = run_cli(write(tmp_path / "grid40.yaml", GRID40), env, "--workers", "4")
    assert "finished 0, skipped 40 already finished" in again, again


@pytest.mark.slow
def test_grid_of_40_cells_with_4_workers_into_sqlite(probe_notebooks, tmp_path):
    """40 cells from 4 workers into one SQLite store: every per-seed metric arrives once, none lost to
    SQLite's locking. Why it takes about half a minute: 40 probe notebooks (no torch, so each is mostly
    its kernel and its MLflow writes); the concurrent writes are the point, and fewer cells rarely overlap."""
    store = tmp_path / "mlruns"
    out = run_cli(write(tmp_path / "grid40.yaml", GRID40), {**sqlite_env(store), "DDLIB_NOTEBOOKS": str(probe_notebooks)},
                  "--workers", "4")
    assert "finished 40, skipped 0" in out and "failed 0" in out, out
    results = cell_results(f"sqlite:///{store / 'mlflow.db'}")
    assert len(results) == 40
    assert_every_per_seed_metric(results)


# --------------------------------------------------------------------------- real cells: determinism, Ray


@pytest.fixture(scope="module")
def real_results(tmp_path_factory) -> dict[str, dict]:
    """The REAL grid (2 cells, 2 seeds, trained for real: 20 epochs on 10-20 images) run by one `ddlib run` process into
    one store."""
    folder = tmp_path_factory.mktemp("real_a")
    store = folder / "mlruns"
    out = run_cli(write(folder / "grid.yaml", REAL), {**sqlite_env(store), **ONE_THREAD}, "--workers", "2")
    assert "finished 2" in out, out
    return cell_results(f"sqlite:///{store / 'mlflow.db'}")


@pytest.mark.slow
def test_same_params_and_seeds_give_the_same_accuracies_across_processes_and_stores(real_results, tmp_path):
    """Another `ddlib run` process (and another worker count) into another store: the same bits.
    Why it takes about half a minute (and its fixture as long, once for the module): a `ddlib run`
    process, its kernel's imports and both cells trained again, which is the check."""
    store = tmp_path / "mlruns"
    out = run_cli(write(tmp_path / "grid.yaml", REAL), {**sqlite_env(store), **ONE_THREAD}, "--workers", "1")
    assert "finished 2" in out, out
    again = cell_results(f"sqlite:///{store / 'mlflow.db'}")
    assert len(again) == 2 and again == real_results  # same config hashes, same per-seed values, bit for bit
    assert_every_per_seed_metric(again)
    accuracies = [v for m in again.values() for v in m["acc_syn_hard"].values()]
    assert len(set(accuracies)) > 1  # real, distinct numbers (not a constant that would match anyway)


@pytest.mark.slow
def test_ray_executor_on_a_local_cpu_ray_instance(real_results, server, tmp_path, monkeypatch):
    """`--executor ray` starts a local Ray instance (CPU), runs each cell as a task writing to a
    tracking server, and gets the same numbers as the process pool. Ray >= 2.5x enables token
    authentication for local clusters: the test gives the instance its own token in the
    environment (nothing written to ~/.ray) instead of turning authentication off. Why it takes about
    a minute: Ray's own start (its GCS, raylet and worker processes) and real cells, whose
    numbers must equal the process pool's."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
    home_token = Path.home() / ".ray" / "auth_token"
    had_token = home_token.exists()
    url = server(f"sqlite:///{tmp_path / 'server.db'}")
    ray_tmp = tempfile.mkdtemp(prefix="ddlib-ray-")  # Ray's socket paths must stay short
    env = {"MLFLOW_TRACKING_URI": url, "DDLIB_MLRUNS": str(tmp_path / "mlruns"), "RAY_TMPDIR": ray_tmp,
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), **ONE_THREAD}
    try:
        out = run_cli(write(tmp_path / "grid.yaml", REAL), env, "--executor", "ray", "--workers", "2")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert "finished 2, skipped 0" in out and "failed 0" in out, out
    results = cell_results(url)
    assert results == real_results  # the same cells, the same per-seed accuracies as the local pool
    assert home_token.exists() == had_token


def test_a_local_ray_start_that_times_out_is_tried_again_then_one_line(monkeypatch, capsys):
    """Ray gives its raylet a fixed 30 s to register and then raises a bare Exception (seen under two busy
    loops beside the suite): the executor starts it again, and after its last try says so in one line."""
    ray = pytest.importorskip("ray")
    from ddlib.run.cluster import RAY_START_ATTEMPTS, RayExecutor
    from ddlib.run.executors import ExecutorError

    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) < failures:
            raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    failures = 2  # the second try starts it
    RayExecutor(None, workers=1)._start_local_ray()
    assert len(calls) == 2 and "try 1 of" in capsys.readouterr().err
    calls.clear()
    failures = RAY_START_ATTEMPTS + 1  # never starts
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(ExecutorError, match=rf"cannot start or reach Ray \(address local\): its node did not start "
                                            rf"in {RAY_START_ATTEMPTS} tries"):
        RayExecutor(None, workers=1).run([], lambda *a: None)
    assert len(calls) == RAY_START_ATTEMPTS
