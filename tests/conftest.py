"""Shared pytest fixtures.

Real data lives in ``../shared/data`` beside the repository (see its README.md). It is optional:
tests that need it skip cleanly where it is absent, so the suite runs anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# --------------------------------------------------------------------------- real shared data (data loaders)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only ``../shared/data`` folder, or skip the test where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not present at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def shared_data_or_none() -> Path | None:
    """``../shared/data`` where present, else None (for tests that only add a check when it is there)."""
    return SHARED_DATA if SHARED_DATA.is_dir() else None


@pytest.fixture(scope="session")
def cifar10_jpeg_root(shared_data: Path) -> Path:
    """The folder holding CIFAR-10 (JPEG)'s ``train/`` and ``test/``, extracted once per machine.

    Extracted into ``${DDLIB_CACHE:-~/.cache/ddlib}/cifar10-jpeg`` (never into the read-only shared
    folder); later sessions reuse it. Skips where the tarball is absent.
    """
    archive = shared_data / "cifar10-jpeg.tar.gz"
    if not archive.is_file():
        pytest.skip(f"{archive} not present")
    from ddlib.data.loaders import extract_archive

    cache = Path(os.environ.get("DDLIB_CACHE") or "~/.cache/ddlib").expanduser()
    return extract_archive(archive, cache / "cifar10-jpeg")


# --------------------------------------------------------------------------- threads


@pytest.fixture(scope="module")
def one_thread():
    """For modules of many tiny forward/backward passes (8x8 digits, batches of 16): a second
    intra-op thread adds only overhead there, and much of it when other processes share the cores.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``; the old count is restored."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- MLflow store (tracking, runner)


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> Path:
    """A fresh, private MLflow store for one test (never the user's mlruns/)."""
    from ddlib import tracking

    store = tmp_path / "mlruns"
    monkeypatch.setenv("DDLIB_MLRUNS", str(store))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    return store
