"""A throw-away PostgreSQL cluster on 127.0.0.1 in a temporary directory, for the tracking-server tests.

Used by `.ci/run` (before the virtual environment exists: standard library only) and by the test
fixture when no cluster was started for it::

    python3 tests/postgres_cluster.py start DIR   # prints DDLIB_TEST_POSTGRES=postgresql://...
    python3 tests/postgres_cluster.py stop DIR

The cluster listens on loopback only (and a Unix socket inside DIR), with a random password
(scram-sha-256). As root, PostgreSQL's own tools refuse to run, so they run as the ``postgres``
user (``runuser``), which then owns DIR.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["find_bin", "start", "stop", "ENV"]

ENV = "DDLIB_TEST_POSTGRES"  # the admin URI of a running cluster (tests create their databases in it)
USER = "ddlib"


def find_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (on PATH, or Debian's /usr/lib/postgresql/N/bin)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def _as_owner(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(directory: str | os.PathLike) -> str:
    """Create and start a cluster under ``directory``; returns its URI (database ``postgres``)."""
    bindir = find_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed (no initdb): apt-get install postgresql")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(16)
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(pwfile, "postgres", "postgres")
    pwfile.chmod(0o600)
    data = root / "data"
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = subprocess.run(_as_owner([str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=scram-sha-256",
                                    f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"]), **quiet)
    if run.returncode:
        raise RuntimeError(f"initdb failed: {run.stderr.strip()}")
    pwfile.unlink()
    port = _free_port()
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=200"
    run = subprocess.run(_as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"),
                                    "-w", "-t", "60", "start"]), **quiet)
    if run.returncode:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {run.stderr.strip()} {log[-2000:]}")
    (root / "port").write_text(str(port))
    return f"postgresql://{USER}:{password}@127.0.0.1:{port}/postgres"


def stop(directory: str | os.PathLike) -> None:
    bindir = find_bin()
    data = Path(directory) / "data"
    if bindir is not None and data.is_dir():
        subprocess.run(_as_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit(f"usage: {sys.argv[0]} start|stop DIR")
    if sys.argv[1] == "start":
        print(f"{ENV}={start(sys.argv[2])}")
    else:
        stop(sys.argv[2])
