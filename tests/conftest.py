"""Shared pytest fixtures.

Real data lives in ``../shared/data`` beside the repository (see its README.md). It is optional:
tests that need it skip cleanly where it is absent, so the suite runs anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# --------------------------------------------------------------------------- parallel test workers (pytest-xdist)

# `make test` runs the suite in one pytest-xdist worker per core it may use plus one, at most 4 (`-n N
# --dist loadfile`: a test module stays on one worker, so its module fixtures are built once). The cores are shared out
# like the runner's workers share them: torch in two processes with two OpenMP threads each on two
# cores spins in each other's way (a DM distillation took 14x its time so). Set before torch is
# imported, and inherited by the notebooks and `ddlib run` processes the tests start; a test that
# needs its own count still sets it.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _threads = str(max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "DDLIB_NUM_THREADS"):
        os.environ.setdefault(_name, _threads)

# The slowest modules first (their summed test durations in seconds: `--durations=0`, three workers on
# a 2-core Zen 3 EPYC (25/1, AVX2 only), 2026-11-28, less what that day's cuts of the BEARD and bf16
# tests saved), so that with `--dist loadfile` the workers start on them and finish together instead
# of one worker running the last long module alone. Modules not named keep their order after these.
SLOW_MODULES_FIRST = {
    "test_integration_cifar10_benchmarks.py": 529, "test_scale_out.py": 363, "test_runner_reliability.py": 314,
    "test_runner.py": 202, "test_protocols_presets.py": 196, "test_protocol_adversarial.py": 186,
    "test_notebooks.py": 160, "test_newcomer.py": 126, "test_select_distill.py": 109,
    "test_conformance_ddranking.py": 107, "test_report.py": 103, "test_gpu_check.py": 99,
    "test_models_transfer.py": 98, "test_batched.py": 94, "test_train.py": 90, "test_integration_mnist.py": 83,
    "test_leakage.py": 71, "test_privacy.py": 70, "test_integration_cifar10.py": 69, "test_coresets.py": 39,
}


def pytest_collection_modifyitems(config, items):
    weight = {name: -seconds for name, seconds in SLOW_MODULES_FIRST.items()}
    items.sort(key=lambda item: weight.get(item.path.name, 0))  # stable: the order inside a module stays


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
    from ddlib.store.cache import cache_dir
    from ddlib.data.loaders import extract_archive

    return extract_archive(archive, cache_dir() / "cifar10-jpeg")


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
    from ddlib.store import tracking
    store = tmp_path / "mlruns"
    monkeypatch.setenv("DDLIB_MLRUNS", str(store))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    return store


# --------------------------------------------------------------------------- a probe notebook (runner, stores)

PROBE_PER_SEED = ("acc_syn_hard", "acc_real_hard", "lrs")
PROBE = """\
import os, time
from ddlib.store.tracking import Tracker

if os.environ.get("DDLIB_PROBE_PROGRESS"):  # a cell that says where its training is, as Cell.train_eval does
    from types import SimpleNamespace
    from ddlib.store.progress import writer_from_env
    writer_from_env(os.environ["DDLIB_PROBE_PROGRESS"])("syn_hard", SimpleNamespace(
        runs=((seeds[0], 0.01),), epoch=12, epochs=30, models_before=1, models=2, eta_seconds=54.0))
time.sleep(float(os.environ.get("DDLIB_PROBE_SLEEP", "0")))  # a cell that takes a while, without using a core
if os.environ.get("DDLIB_PROBE_GATE"):  # a cell that runs until the test releases it (tests/waiting.py)
    import sys
    from pathlib import Path
    sys.path.insert(0, TESTS)
    from waiting import hold
    hold(Path(os.environ["DDLIB_PROBE_GATE"]), run_id)
tracker = Tracker(experiment)
values = {seed: {"acc_syn_hard": 0.5 + ipc / 100 + seed / 1000, "acc_real_hard": 0.9 + seed / 1000,
                 "lrs": 100 * w * ipc / 10 + seed} for seed in seeds}
tracker.log_per_seed(run_id, [{"seed": seed, **row} for seed, row in values.items()])  # per seed, batched
tracker.log_metrics(run_id, {f"{k}_mean": sum(row[k] for row in values.values()) / len(values) for k in values[seeds[0]]})
if os.environ.get("DDLIB_PROBE_FLAG"):  # a cell whose numbers must be read with a caveat (Cell.flag)
    tracker.set_tags(run_id, {"ddlib.sanity": os.environ["DDLIB_PROBE_FLAG"]})
"""


@pytest.fixture(scope="session")
def probe_notebooks(tmp_path_factory) -> Path:
    """A notebooks folder (for ``DDLIB_NOTEBOOKS``) whose ``label_robust.ipynb`` logs per-seed metrics
    (``PROBE_PER_SEED``, step = seed) through ddlib's tracking layer as the protocol notebooks do,
    without importing torch or training: a kernel start costs ~3 CPU-s instead of ~10, so tests of
    the runner and the stores can run dozens of cells. ``DDLIB_PROBE_SLEEP`` (seconds) makes each
    cell last that long; ``DDLIB_PROBE_FLAG`` sets the cell's ``ddlib.sanity`` tag;
    ``DDLIB_PROBE_PROGRESS`` (the cell's name) writes a training progress record (:mod:`ddlib.store.progress`);
    ``DDLIB_PROBE_GATE`` (a folder) holds each cell, its run id its name, until the test releases it
    (tests/waiting.py: tests that order or stop cells wait on that, not on how long cells sleep)."""
    import nbformat

    folder = tmp_path_factory.mktemp("probe_notebooks")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("run_id = None\nexperiment = 'label_robust'\nseeds = [0]\nipc = 1\nw = 0.5")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(f"TESTS = {str(Path(__file__).resolve().parent)!r}\n{PROBE}")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "label_robust.ipynb")
    return folder


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """Where the browser tests keep their screenshots: $DDLIB_SCREENSHOTS, else a pytest temporary
    folder (printed)."""
    folder = Path(os.environ["DDLIB_SCREENSHOTS"]) if os.environ.get("DDLIB_SCREENSHOTS") \
        else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {folder}")
    return folder


@pytest.fixture(scope="session")
def chromium() -> str:
    """Chromium's path; the test (and whatever fixture asks for this first) is skipped where none is installed."""
    from browser import chromium_path

    path = chromium_path()
    if path is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    return path


@pytest.fixture
def browser(tmp_path, chromium):
    """A headless Chromium (tests/browser.py); skipped where none is installed."""
    from browser import Browser

    session = Browser(tmp_path / "chromium-profile")
    yield session
    session.close()
