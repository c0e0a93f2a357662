"""What the models trained inside a cell left in MLflow: training-loss curves and confusion matrices.

Every evaluation a cell trains is a child run of the cell's run (tag ``ddlib.role``: syn_hard,
rdm_hard, real_hard, ...) with the metric history ``train_loss`` (one step per epoch) and, since
ddlib 0.2, the artifact ``confusion.json`` (test counts, [true class][predicted class]) logged when
the model was tested: nothing is retrained or stored for a report. An evaluation a cell reused from
another cell (the same training tensors, recipe and seed) is a child of the cell that trained it, so
it is found only where that cell is among ``cells``; one evaluated before confusion
matrices were logged has none ("not recorded").
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Iterable
from urllib.parse import urlparse
from urllib.request import url2pathname

from ddlib.protocols.cell import CONFUSION_ARTIFACT
from ddlib.protocols.teachers import _quiet_downloads
from ddlib.store.tags import TAG
from ddlib.store.tracking import client

__all__ = ["evaluation_runs", "loss_curves", "confusion_counts", "artifact_bytes"]


def evaluation_runs(cells: Iterable[str], role: str) -> list:
    """The FINISHED child runs of the cell runs ``cells`` that trained ``role``, one per seed (newest)."""
    cells = [c for c in dict.fromkeys(cells) if c]
    if not cells:
        return []
    mlflow_client = client()
    found = []
    for cell in cells:  # MLflow's filter takes IN for run ids only, not for the parent tag
        found += mlflow_client.search_runs(
            [mlflow_client.get_run(cell).info.experiment_id], max_results=10000,
            filter_string=f"tags.mlflow.parentRunId = '{cell}' and tags.`{TAG['role']}` = '{role}' "
                          f"and attributes.status = 'FINISHED'")
    found.sort(key=lambda run: -run.info.start_time)
    by_seed: dict[str, object] = {}
    for run in found:
        by_seed.setdefault(run.data.params.get("seed", run.info.run_id), run)
    return [by_seed[s] for s in sorted(by_seed, key=lambda s: int(s) if s.isdigit() else 0)]


def loss_curves(cells: Iterable[str], role: str) -> list[list[float]]:
    """The per-epoch training loss of each seed's ``role`` model."""
    mlflow_client = client()
    curves = []
    for run in evaluation_runs(cells, role):
        history = sorted(mlflow_client.get_metric_history(run.info.run_id, "train_loss"), key=lambda m: m.step)
        curves.append([m.value for m in history])
    return [c for c in curves if c]


def confusion_counts(cells: Iterable[str], role: str) -> tuple[list[list[int]] | None, list[str], int]:
    """The confusion counts of the ``role`` models summed over their seeds: (matrix, classes, models);
    (None, [], 0) where none was recorded."""
    total, classes, models = None, [], 0
    for run in evaluation_runs(cells, role):
        data = artifact_bytes(run, CONFUSION_ARTIFACT)
        if data is None:
            continue
        record = json.loads(data)
        matrix = record["matrix"]
        total = matrix if total is None else [[a + b for a, b in zip(r, s)] for r, s in zip(total, matrix)]
        classes, models = record.get("classes") or [str(i) for i in range(len(matrix))], models + 1
    return total, classes, models


def artifact_bytes(run, path: str) -> bytes | None:
    """An artifact's content, or None where the run has none at ``path``. ``run``: an MLflow run or
    its id. Artifacts on this machine's disk (a local store) are read in place: MLflow's listing and
    download look the run up twice per file (a summary reads one confusion matrix per model)."""
    mlflow_client = client()
    info = (mlflow_client.get_run(run) if isinstance(run, str) else run).info
    folder_here = _local_folder(info.artifact_uri)
    if folder_here is not None:
        file = folder_here / path
        return file.read_bytes() if file.is_file() else None
    folder, _, name = path.rpartition("/")
    if name not in {Path(a.path).name for a in mlflow_client.list_artifacts(info.run_id, folder or None)}:
        return None
    with tempfile.TemporaryDirectory(prefix="ddlib-artifact-") as tmp, _quiet_downloads():
        return Path(mlflow_client.download_artifacts(info.run_id, path, tmp)).read_bytes()


def _local_folder(artifact_uri: str | None) -> Path | None:
    """The folder an artifact URI names on this machine (a plain path or ``file:``), else None."""
    parsed = urlparse(artifact_uri or "")
    if parsed.scheme not in ("", "file") or parsed.netloc not in ("", "localhost") or not parsed.path:
        return None
    folder = Path(url2pathname(parsed.path))
    return folder if folder.is_dir() else None
