"""Where things live: the checkout or an installed wheel's copy of the notebooks and grids, and the store.

Store: SQLite at ``<project>/mlruns/mlflow.db`` with artifacts under ``<project>/mlruns/artifacts``,
both absolute (papermill runs kernels in other working directories, and a relative
``sqlite:///`` URI would follow them). ``MLFLOW_TRACKING_URI`` overrides the database;
``DDLIB_MLRUNS`` overrides the folder. MLflow 3.17's file store refuses to open, so there is none.
``MLFLOW_TRACKING_URI`` may also name a tracking server (``http://127.0.0.1:5000``, started with
``python -m ddlib server``), which workers on other machines share; artifacts then go through it.
Imports nothing of ddlib.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# A checkout (editable install) holds pyproject.toml beside the package; a wheel's site-packages does not.
IN_CHECKOUT = (PROJECT_ROOT / "pyproject.toml").exists()
# Folders of the checkout that a wheel carries inside the package (pyproject's package-dir).
_WHEEL_FOLDERS = {"notebooks": "notebooks", "params/methods": "presets", "params": "grids"}


def project_folder(name: str) -> Path:
    """``notebooks``, ``params/methods`` or ``params`` (the shipped grids): in place in a checkout, else
    the copy a wheel carries under ``ddlib/_files/`` (so a ``pip install``ed ddlib runs its protocols'
    notebooks and ``ddlib run demo``)."""
    if IN_CHECKOUT:
        return PROJECT_ROOT / name
    return Path(__file__).resolve().parents[1] / "_files" / _WHEEL_FOLDERS[name]


def mlruns_dir() -> Path:
    """``$DDLIB_MLRUNS``, else ``mlruns/`` in the project checkout (editable install), else in the cwd."""
    env = os.environ.get("DDLIB_MLRUNS")
    if env:
        return Path(env).expanduser().resolve()
    if IN_CHECKOUT:
        return PROJECT_ROOT / "mlruns"
    return Path.cwd().resolve() / "mlruns"


def tracking_uri() -> str:
    """The MLflow store's URI: ``MLFLOW_TRACKING_URI``, else the SQLite file under :func:`mlruns_dir`."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{mlruns_dir() / 'mlflow.db'}"


def artifact_root() -> Path:
    """Where runs' artifacts are written beside the SQLite store."""
    return mlruns_dir() / "artifacts"


def is_server_uri(uri: str | None = None) -> bool:
    """Whether the store is a tracking server (reachable from other machines), not a database file."""
    return (uri or tracking_uri()).startswith(("http://", "https://"))


def redact_uri(uri: str) -> str:
    """A database URI without its password, for printing."""
    scheme, sep, rest = uri.partition("://")
    if sep and "@" in rest and ":" in rest.split("@", 1)[0]:
        user = rest.split("@", 1)[0].split(":", 1)[0]
        return f"{scheme}://{user}:***@{rest.split('@', 1)[1]}"
    return uri


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for a server or another scheme)."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def store_environment() -> dict[str, str]:
    """Variables that point a child process (a worker, a notebook kernel in another working
    directory) at this same store."""
    return {"DDLIB_MLRUNS": str(mlruns_dir()), "MLFLOW_TRACKING_URI": tracking_uri()}
