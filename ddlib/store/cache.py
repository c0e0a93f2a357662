"""The one folder where ddlib keeps what it computes once per machine: decoded datasets, extracted
archives, trained feature networks, DM means and DM sets (``features/``), Inductor's kernels (``inductor/``),
MLflow's migrated tables (``mlflow-tables/``) and the peer's virtual environment. ``$DDLIB_CACHE``,
else ``~/.cache/ddlib``; never the user's data folder, which may be read-only or shared.

Torch-free, so the tracking layer and the command line find it without importing torch."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$DDLIB_CACHE`` (read at each call, so a test or a job may redirect it), else ``~/.cache/ddlib``."""
    env = os.environ.get("DDLIB_CACHE")
    return Path(env if env else "~/.cache/ddlib").expanduser()
