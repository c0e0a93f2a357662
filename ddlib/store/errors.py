"""A store that cannot be written (a read-only mount, a file where its folder should be, a full disk, no
permission) or a tracking server that does not answer, said in one line. Imports ``store.paths`` only."""

from __future__ import annotations

import errno
import os
import re
import tempfile
from pathlib import Path

from ddlib.store.paths import is_server_uri, mlruns_dir, redact_uri, sqlite_file, tracking_uri

class StoreError(ValueError):
    """The store cannot be written (a read-only mount, a file where its folder should be, a full disk,
    no permission); the one-line message names it."""


_FULL = "no space left on its disk: free some, then rerun (finished cells are kept)"
_READ_ONLY = "its file system is read-only: set DDLIB_MLRUNS to a folder you can write"
_DENIED = "permission denied: set DDLIB_MLRUNS to a folder you can write"
# What a write failure says, by errno. EACCES and EPERM also come from reads: they count only inside the store.
_WRITE_ERRNOS = {errno.ENOSPC: _FULL, errno.EDQUOT: "its disk quota is used up: free some, then rerun",
                 errno.EROFS: _READ_ONLY}
_DENIED_ERRNOS = (errno.EACCES, errno.EPERM)
# The same failures in the words of SQLite and of the OS, as a notebook's error reaches its worker (text only).
_WRITE_WORDS = {"database or disk is full": _FULL, "no space left on device": _FULL,
                "disk quota exceeded": _WRITE_ERRNOS[errno.EDQUOT], "read-only file system": _READ_ONLY,
                "attempt to write a readonly database": "its database is read-only"}
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\] [^:\]]*: '([^']+)'")


def _store_label(folder: Path | None = None) -> str:
    """The store as a message names it: its folder (with the variable that chose it), or the database
    that ``MLFLOW_TRACKING_URI`` names where that is elsewhere."""
    folder = folder or mlruns_dir()
    return f"{folder} (DDLIB_MLRUNS)" if os.environ.get("DDLIB_MLRUNS") else str(folder)



def _database_label() -> str:
    """The store's database as a message names it: the store's folder where it lies there, else its URI
    (a server's, another database's, without a password)."""
    uri, database = tracking_uri(), sqlite_file(tracking_uri())
    if database is not None and database.parent.is_relative_to(mlruns_dir()):
        return _store_label()
    return f"{database or redact_uri(uri)} (MLFLOW_TRACKING_URI)"


def _check_folder(folder: Path, label: str) -> None:
    """A folder this process can create or write files in: the nearest one of it and its parents that exists
    must be a folder, and a file written there must fit (no read-only mount, full disk or permission)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise StoreError(f"the store {label} cannot be written: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".ddlib-write-check-") as probe:
            probe.write(b"\0" * 4096)  # a page: a full tmpfs refuses it, an empty file it would take
            probe.flush()
    except OSError as error:
        why = _WRITE_ERRNOS.get(error.errno) or (_DENIED if error.errno in _DENIED_ERRNOS else f"{error.strerror} ({existing})")
        raise StoreError(f"the store {label} cannot be written: {why}") from None


def check_store_writable(path_or_uri: str | os.PathLike | None = None) -> None:
    """Refuse, before anything runs, a store this process cannot write: a :class:`StoreError` whose one
    line names it (MLflow would fail mid-grid instead, in pages of tracebacks). ``path_or_uri``: a store
    folder (``DDLIB_MLRUNS``), or a tracking URI (a ``sqlite:///`` database: its folder and file; a
    server or another database: nothing here to check, :func:`unreachable_server` asks a server);
    default: this process's store, its folder (locks, artifacts) and its database. Creates nothing."""
    if path_or_uri is None:
        folder, database = mlruns_dir(), sqlite_file(tracking_uri())
        _check_folder(folder, _store_label(folder))
    elif "://" in str(path_or_uri):
        folder, database = None, sqlite_file(str(path_or_uri))
    else:
        folder, database = Path(path_or_uri).expanduser().absolute(), None
        _check_folder(folder, _store_label(folder) if folder == mlruns_dir() else str(folder))
    if database is None:
        return
    label = f"{database} (MLFLOW_TRACKING_URI)" if os.environ.get("MLFLOW_TRACKING_URI") else str(database)
    if folder is None or not database.parent.is_relative_to(folder):
        _check_folder(database.parent, label)
    if database.is_dir() or (database.exists() and not os.access(database, os.W_OK)):
        raise StoreError(f"the store {label} cannot be written: "
                         + ("it is a folder, not a database file" if database.is_dir() else "the file is read-only"))


def write_failure(error: BaseException) -> str | None:
    """One line saying what could not be written and why, where ``error`` or one of its causes is a full
    disk, a read-only one or, inside the store, a refused permission (the store is named as
    :func:`check_store_writable` names it, another file by its path); None for any other error. What a cell
    whose writes fail midway ends with, instead of MLflow's page of SQL. A notebook's error (papermill's:
    text only, ``evalue``) is read for the same failures in SQLite's and the OS's words."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            if why := _why_not_written(error.errno, error.filename):
                return _cannot_write(error.filename, why)
        text = f"{getattr(error, 'evalue', '') or ''} {error}"
        for number, filename in _ERRNO_IN_TEXT.findall(text):
            if why := _why_not_written(int(number), filename):
                return _cannot_write(filename, why)
        lowered = text.lower()
        for words, why in _WRITE_WORDS.items():
            if words in lowered:
                return _cannot_write(None, why)
        error = error.__cause__ or error.__context__
    return None


def _why_not_written(number: int, filename) -> str | None:
    if number in _DENIED_ERRNOS:
        return _DENIED if filename is not None and _in_store(filename) else None
    return _WRITE_ERRNOS.get(number)


def _in_store(filename) -> bool:
    path = Path(os.fsdecode(filename)).absolute()
    database = sqlite_file(tracking_uri())
    return path.is_relative_to(mlruns_dir()) or (database is not None and path.is_relative_to(database.parent))


def _cannot_write(filename, why: str) -> str:
    if filename is None:  # the database said it
        return f"the store {_database_label()} cannot be written: {why}"
    if _in_store(filename):
        return f"the store {_store_label()} cannot be written: {why}"
    return f"cannot write {os.fsdecode(filename)}: {why}"


def unreachable_server(uri: str | None = None, timeout: float = 5.0) -> str | None:
    """Why the tracking server does not answer (``None`` when it does, or the store is a file).
    One request to ``/health``: MLflow's client would retry for seconds, then print a traceback."""
    import urllib.error
    import urllib.request

    uri = uri or tracking_uri()
    if not is_server_uri(uri):
        return None
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answers (a proxy may refuse /health): MLflow's own errors say the rest
    except (urllib.error.URLError, OSError) as e:
        return (f"the tracking server {uri} (MLFLOW_TRACKING_URI) does not answer: "
                f"{getattr(e, 'reason', e)}; start it (python -m ddlib server) or unset MLFLOW_TRACKING_URI")
    return None
