"""Liveness: a cell run being executed carries its owner (``ddlib.owner``: host, process id and the
process's start time) and a heartbeat (``ddlib.heartbeat``: Unix time, renewed while it runs).
:func:`owner_is_gone` says when such a run can no longer finish (its process is gone from this
host, or its heartbeat is older than the stale limit): the runner then marks it KILLED. Imports ``store.tags``.
"""

from __future__ import annotations

import os
import socket
import time

from ddlib.store.tags import TAG

# A RUNNING cell whose heartbeat is older than this is taken for dead (its process may be on a
# host this one cannot look at). Heartbeats are written every HEARTBEAT_SECONDS.
STALE_AFTER_SECONDS = float(os.environ.get("DDLIB_STALE_AFTER", 300))
HEARTBEAT_SECONDS = float(os.environ.get("DDLIB_HEARTBEAT", 30))


def owner_tag(pid: int | None = None) -> str:
    """``host:pid:start time`` of a process (default: this one). The start time tells a live
    process from a later one that was given the same pid."""
    import psutil

    process = psutil.Process(pid)
    return f"{socket.gethostname()}:{process.pid}:{process.create_time():.3f}"


def owner_is_gone(tags: dict, start_time_ms: int | None = None, now: float | None = None,
                  stale_after: float | None = None) -> bool:
    """Whether a RUNNING run can no longer finish: its owner process is gone from this host, or its
    heartbeat is older than ``stale_after`` seconds, or it has neither owner nor heartbeat (written
    before runs carried them) and started longer ago than that. A run owned by a live process on
    this host, or with a fresh heartbeat, or owned on another host without heartbeats (a cell run
    by hand there), is alive."""
    import psutil

    now = time.time() if now is None else now
    stale_after = STALE_AFTER_SECONDS if stale_after is None else stale_after
    owner = tags.get(TAG["owner"])
    if owner:
        host, pid, started = _parse_owner(owner)
        if host == socket.gethostname():
            try:
                return abs(psutil.Process(pid).create_time() - started) > 1.0
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                return True
    beat = tags.get(TAG["heartbeat"])
    if beat:
        return now - float(beat) > stale_after
    return not owner and start_time_ms is not None and now - start_time_ms / 1000 > stale_after


def _parse_owner(owner: str) -> tuple[str, int, float]:
    host, pid, started = owner.rsplit(":", 2)
    return host, int(pid), float(started)
