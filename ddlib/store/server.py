"""A shared MLflow tracking server: ``python -m ddlib server`` (``make server``).

Several runners at once, and Ray workers on other machines, need one store they can all reach:
``mlflow server`` over a database (PostgreSQL in production, this checkout's SQLite file by
default) that also serves the artifacts (uploads go through it, so workers need no shared disk).
It binds to 127.0.0.1 unless told otherwise: MLflow's server has no authentication, so exposing it
(``--host 0.0.0.0``) is a decision to take with a firewall or a proxy in front. Runs reach it with
``MLFLOW_TRACKING_URI=http://127.0.0.1:5000``.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from ddlib.store.paths import artifact_root, is_server_uri, tracking_uri
from ddlib.store.paths import redact_uri as _redact
from ddlib.store.tracking import create_sqlite_store

__all__ = ["ServerError", "server_command", "mlflow_server_env", "JOB_EXECUTION_ENV", "start_server", "stop_server",
           "wait_healthy", "serve", "run_foreground", "LOOPBACK", "check_port_free"]

LOOPBACK = "127.0.0.1"


class ServerError(RuntimeError):
    """The tracking server could not start or did not become healthy; says why."""


def _defaults(backend_store_uri: str | None, artifacts_destination: str | os.PathLike | None) -> tuple[str, str]:
    if backend_store_uri is None:
        if is_server_uri():
            raise ServerError(f"MLFLOW_TRACKING_URI points at a server ({tracking_uri()}); "
                              "give the server's own store with --backend-store-uri")
        backend_store_uri = tracking_uri()
    if backend_store_uri.startswith("sqlite:///") and "?" not in backend_store_uri:
        # a new file is created and migrated whole before MLflow opens it: the server's own migration
        # runs step by step, and a stop midway would leave a store no later command can open
        create_sqlite_store(Path(backend_store_uri.removeprefix("sqlite:///")))
    if artifacts_destination is None:
        artifacts_destination = artifact_root()
    destination = str(artifacts_destination)
    if "://" not in destination:  # a folder: absolute, and there
        Path(destination).expanduser().mkdir(parents=True, exist_ok=True)
        destination = str(Path(destination).expanduser().absolute())
    return backend_store_uri, destination


# MLflow's server runs "jobs" (GenAI prompt optimisation, scorers, trace rollups) in Huey consumer
# processes it starts with the server unless this is false: 8 more processes, which took 31-33 CPU-s in
# their first 20 s against 9.3-9.6 s without them, and /health 3-4 s later (2-core EPYC; bench/README.md).
# ddlib uses none of these jobs; a user who does sets the variable to true and it is left as it is.
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def mlflow_server_env(**extra: str) -> dict[str, str]:
    """The environment of an MLflow server or UI ddlib starts: this process's, ``extra``, and MLflow's
    job execution off unless the environment already says (:data:`JOB_EXECUTION_ENV`)."""
    return {JOB_EXECUTION_ENV: "false", **os.environ, **extra}


def server_command(backend_store_uri: str | None = None, artifacts_destination: str | os.PathLike | None = None,
                   host: str = LOOPBACK, port: int = 5000, workers: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The ``mlflow server`` command line (this interpreter's MLflow) and its environment. The
    backend store URI travels in ``MLFLOW_BACKEND_STORE_URI``, never on the command line, where
    every user of the machine could read a database password with ``ps``."""
    backend, destination = _defaults(backend_store_uri, artifacts_destination)
    command = [sys.executable, "-m", "mlflow", "server", "--artifacts-destination", destination, "--serve-artifacts",
               "--host", host, "--port", str(port)]
    if workers is not None:
        command += ["--workers", str(workers)]
    return command, mlflow_server_env(MLFLOW_BACKEND_STORE_URI=backend)


def check_port_free(host: str, port: int) -> None:
    """A :class:`ServerError` in one line where nothing can listen on ``host:port`` (another server has
    it, or the port or host is not one this process may take), before MLflow starts: its server would
    print uvicorn's traceback first. Checked with the ``SO_REUSEADDR`` uvicorn binds with, so closed
    connections still waiting on the port (TIME_WAIT) do not count."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        if getattr(error, "errno", None) == errno.EADDRINUSE:
            raise ServerError(f"port {port} on {host} is in use (another MLflow UI or server?): "
                              "choose another with --port") from None
        raise ServerError(f"cannot listen on {host} port {port}: {error.strerror or error}") from None
    except OverflowError:
        raise ServerError(f"--port must be 0-65535, got {port}") from None


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stops_with_this_process():
    """A ``preexec_fn`` for the MLflow server or UI process ddlib starts: Linux sends it SIGTERM when this
    process ends, however it ends (SIGKILL, the OOM killer), as the kernels of a grid end with their
    worker (ipykernel watches its parent) and the workers with their runner. The MLflow command
    forwards SIGTERM to its uvicorn server, which stops its workers: nothing is left listening. The
    child checks its parent once more after asking, in case that died first. Linux counts the thread
    that started the child as its parent: start it from one that lives as long (the main thread). None
    where there is no ``prctl`` (not Linux): Ctrl-C or SIGTERM still stop the group (:func:`run_foreground`)."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def wait_healthy(url: str, process: subprocess.Popen | None = None, timeout: float = 180.0) -> None:
    """Poll ``url/health`` until it answers OK; :class:`ServerError` if the process exits or time runs out
    (the first start on an empty PostgreSQL database runs MLflow's schema migrations: tens of seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServerError(f"the server exited with status {process.returncode} before answering {url}/health")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.5)
    raise ServerError(f"{url}/health did not answer within {timeout:.0f} s")


def start_server(backend_store_uri: str | None = None, artifacts_destination: str | os.PathLike | None = None,
                 host: str = LOOPBACK, port: int = 5000, workers: int | None = None, log: IO | None = None,
                 timeout: float = 180.0) -> subprocess.Popen:
    """Start the server in the background and return once ``/health`` answers (the caller stops it)."""
    command, env = server_command(backend_store_uri, artifacts_destination, host, port, workers)
    check_port_free(host, port)
    process = subprocess.Popen(command, env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else
                               subprocess.DEVNULL, start_new_session=True, preexec_fn=_stops_with_this_process())
    try:
        wait_healthy(f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}", process, timeout)
    except BaseException:
        stop_server(process)
        raise
    return process


def stop_server(process: subprocess.Popen, timeout: float = 20.0) -> None:
    """Stop a server started by :func:`start_server` (its whole process group: uvicorn's workers too)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def serve(backend_store_uri: str | None = None, artifacts_destination: str | os.PathLike | None = None,
          host: str = LOOPBACK, port: int = 5000, workers: int | None = None) -> int:
    """Run the server in the foreground until interrupted; prints where runs should point."""
    command, env = server_command(backend_store_uri, artifacts_destination, host, port, workers)
    backend, destination = env["MLFLOW_BACKEND_STORE_URI"], command[command.index("--artifacts-destination") + 1]
    if host not in (LOOPBACK, "localhost", "::1"):
        print(f"warning: binding to {host}: anyone who can reach this port can read and write every run "
              "(MLflow's server has no authentication)", file=sys.stderr)
    url = f"http://{LOOPBACK if host in ('0.0.0.0', '::') else host}:{port}"
    check_port_free(host, port)
    return run_foreground(command, env, url, f"MLflow server at {url} (store {_redact(backend)}, artifacts "
                                             f"{destination})\npoint runs at it:  export MLFLOW_TRACKING_URI={url}")


def run_foreground(command: list[str], env: dict[str, str] | None, url: str, ready: str) -> int:
    """Run an MLflow server command (``mlflow server`` or ``mlflow ui``) until it exits or this
    process is told to stop. It runs in its own process group, stopped as a whole (MLflow runs
    uvicorn and job workers under it) on Ctrl-C, SIGTERM and SIGHUP: stopping ``ddlib server`` or
    ``ddlib ui`` must not leave a server listening. ``ready`` is printed once ``url/health`` answers,
    not before (the first start can take a minute under load). A SIGKILL of this process stops it too
    (:func:`_stops_with_this_process`)."""
    process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_stops_with_this_process())

    def stop_on_signal(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        wait_healthy(url, process)
        print(ready, flush=True)
        while True:  # woken each second: a signal the kernel handed to another thread is acted on
            try:
                return process.wait(1.0)
            except subprocess.TimeoutExpired:
                continue
    except KeyboardInterrupt:
        stop_server(process)
        return 0
    except BaseException:
        stop_server(process)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
