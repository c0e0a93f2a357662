"""Locks: inter-process file locks (flock) in the store's folder, and letting go of the SQLite read lock
an interrupted store call leaves behind. Imports ``store.paths`` only."""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Callable, Iterator

from ddlib.store.paths import mlruns_dir


@contextlib.contextmanager
def file_lock(name: str, on_wait: Callable[[], None] | None = None, wait: bool = True) -> Iterator[bool]:
    """An inter-process lock (flock) so parallel workers do not train or create the same thing twice.
    ``on_wait`` is called once if another process holds it (say so, then wait). ``wait=False`` takes
    it only if it is free: the body runs either way and is given whether it holds the lock."""
    lock_dir = mlruns_dir() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with path_lock(lock_dir / f"{name}.lock", on_wait, wait) as held:
        yield held


@contextlib.contextmanager
def path_lock(path: Path, on_wait: Callable[[], None] | None = None, wait: bool = True) -> Iterator[bool]:
    """An exclusive flock on ``path`` while the block runs (yields False at once when busy and ``wait`` is False)."""
    with open(path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def release_store_locks(error: BaseException) -> None:
    """Let go of what a store call that an interruption cut short still holds, before anything writes.

    Ctrl-C or SIGTERM raised inside a query (they raise wherever the main thread is: the runner's
    handlers, Python's for Ctrl-C, Jupyter's interrupt) leaves that query's SQLite cursor referenced by
    the traceback's frames, and with it a read lock on a local store that blocks every write: the
    runner's marking of its cells KILLED, its workers', a hand-run cell's FAILED, and every later write
    of that notebook (MLflow waits its 20 s busy timeout, then "database is locked"). For a
    ``KeyboardInterrupt`` (``GridInterrupted`` is one), clears the locals of the finished frames of its
    traceback and of the exceptions it interrupted; the traceback still prints. Other errors keep their
    frames (a post-mortem debugger reads them): their store calls closed their cursors as they unwound.
    Call it where an interruption may be caught."""
    import traceback

    if not isinstance(error, KeyboardInterrupt):
        return
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__context__

