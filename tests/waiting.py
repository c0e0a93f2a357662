"""Tests that order or stop processes wait on events, never on clocks: a cell runs until the test
releases it, and a test waits until what it needs has happened. A timeout here only bounds a failure
(the test fails once it is over); nothing passes because something took long enough or short enough.

Cells a test holds (the probe notebook's with ``DDLIB_PROBE_GATE``, tests/conftest.py; test_runner's
stub cells) call :func:`hold` with a gate folder: they append ``start <id>`` to its ``events`` file
and run on once ``go-<id>`` or ``go-all`` is there (:func:`release`). The events file is appended to
by one write per line, so its order is the order in which things happened, across processes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

BOUND_SECONDS = 600.0  # how long anything may take before its test fails (a loaded 2-core machine)


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen | None = None, every: float = 0.05):
    """``predicate()``'s first true value, polled every ``every`` seconds (a store query: 0.5, not to
    crowd the writers); an AssertionError naming ``what`` after ``timeout`` seconds, or as soon as
    ``process`` has exited (with its output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"the process exited ({process.returncode}) before {what}:\n{output}")
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def note(gate: Path, event: str) -> None:
    """Append one event (``start <id>``, ``end <id>``) to the gate's events file, in one write."""
    fd = os.open(gate / "events", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{event}\n".encode())
    finally:
        os.close(fd)


def events(gate: Path) -> list[str]:
    path = gate / "events"
    return path.read_text().splitlines() if path.exists() else []


def started(gate: Path) -> list[str]:
    """The ids of the held cells that have started, in the order they did."""
    return [event.split(" ", 1)[1] for event in events(gate) if event.startswith("start ")]


def release(gate: Path, cell: str = "all") -> None:
    """Let one held cell (its id) or every one (``all``, those not started yet too) run on to its end."""
    (gate / f"go-{cell}").touch()


def hold(gate: Path, cell: str, bound: float = BOUND_SECONDS) -> None:
    """What a held cell does: say it started, then wait until the test releases it; a TimeoutError after
    ``bound`` seconds (the test's failure, never its pass)."""
    note(gate, f"start {cell}")
    deadline = time.monotonic() + bound
    while not ((gate / f"go-{cell}").exists() or (gate / "go-all").exists()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"cell {cell} was never released ({gate})")
        time.sleep(0.02)


def assert_gone(tree: list, port: int, timeout: float = BOUND_SECONDS) -> None:
    """Wait until every process of ``tree`` (psutil processes: a server and its workers) has exited
    (the event), then check that nothing listens on ``port`` any more."""
    import socket

    import psutil

    _, alive = psutil.wait_procs(tree, timeout=timeout)
    assert not alive, [p.cmdline() for p in alive]
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def kill_leftovers(tree: list) -> None:
    """A failed test's clean-up: kill whatever of ``tree`` still runs."""
    for leftover in tree:
        if leftover.is_running():
            leftover.kill()
