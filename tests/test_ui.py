"""``ddlib ui`` (issue 53, 7.5): MLflow's UI dies with the ``ddlib ui`` that started it, however that
ends (a SIGKILL too), and a port already taken is one line, not uvicorn's traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import BOUND_SECONDS, assert_gone, kill_leftovers

ROOT = Path(__file__).resolve().parents[1]


def _ui(store: Path, port: int, stderr=subprocess.PIPE, **popen) -> subprocess.Popen:
    env = {**os.environ, "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "ddlib", "ui", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=stderr, text=True, **popen)


def test_a_taken_port_is_one_line_before_mlflow_starts(tmp_path):
    """`ddlib ui --port P` where something listens on P: one line saying so, exit 2 (before: MLflow
    started, and uvicorn's error, or its traceback, came before ddlib's own line)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ui = _ui(tmp_path / "store", port)
        out, err = ui.communicate(timeout=BOUND_SECONDS)
    assert ui.returncode == 2, (out, err)
    assert err.splitlines() == [f"error: port {port} on 127.0.0.1 is in use (another MLflow UI or server?): "
                                "choose another with --port"], err


@pytest.mark.slow
def test_mlflows_ui_dies_with_ddlib_ui_killed_with_sigkill(tmp_path):
    """SIGKILL of `ddlib ui` alone (the OOM killer, `kill -9`): nothing of it can stop MLflow's UI, which
    runs in a session of its own with its uvicorn workers; they kept listening. The kernel now sends
    MLflow's process SIGTERM when its parent dies (PR_SET_PDEATHSIG), which stops its workers too. Why
    it takes about 20 s: the UI's start (a new store, MLflow's imports, its uvicorn workers) until it
    answers, then the tree's stop; only a real process tree shows a worker left listening."""
    import psutil

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    ui = _ui(tmp_path / "store", port, stderr=subprocess.STDOUT, start_new_session=True)
    tree, lines = [], []
    try:
        for line in ui.stdout:  # the event: MLflow's UI answers (ddlib prints this once /health does)
            lines.append(line)
            if line.startswith("MLflow UI on"):
                break
        else:
            pytest.fail(f"`ddlib ui` exited ({ui.wait()}) before its UI answered: {''.join(lines)}")
        tree = psutil.Process(ui.pid).children(recursive=True)
        assert tree  # MLflow's UI and its uvicorn workers
        ui.send_signal(signal.SIGKILL)
        ui.wait(BOUND_SECONDS)
        assert_gone(tree, port)  # the event: every one of them gone, and the port free
    finally:
        kill_leftovers(tree)
        if ui.poll() is None:
            ui.kill()
            ui.wait(BOUND_SECONDS)
