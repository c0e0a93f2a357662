"""The list of cell runs (``ddlib runs``): one store query, and nothing heavier than the tracking
layer and pandas (no torch, no SciPy, no leaderboard code), so the command answers in about the
time MLflow takes to open the store."""

from __future__ import annotations

import time

import pandas as pd

from ddlib.store.progress import PROGRESS_TAG
from ddlib.report.ui import cell_link
from ddlib.store.tags import TAG
from ddlib.store.tracking import client

__all__ = ["list_cell_runs"]


def list_cell_runs(status: str | None = None, experiment: str | None = None, now: float | None = None,
                   links: bool = False) -> pd.DataFrame:
    """Every cell run of the store (newest first): experiment, run name, status, start, minutes
    (so far, for a running one), dataset, method, ipc, the error of a failed one (or what a running
    one trains), and its run id; ``links``: and its page in MLflow's UI (:func:`ddlib.report.ui.cell_link`).
    ``status``: finished, failed, running, killed (any case)."""
    mlflow_client = client()
    experiments = [e for e in mlflow_client.search_experiments() if experiment in (None, e.name)]
    if not experiments:
        return pd.DataFrame()
    names = {e.experiment_id: e.name for e in experiments}
    clauses = [f"tags.`{TAG['kind']}` = 'cell'"]
    if status:
        clauses.append(f"attributes.status = '{status.upper()}'")
    runs = mlflow_client.search_runs(list(names), filter_string=" and ".join(clauses),
                                     order_by=["attributes.start_time DESC"], max_results=50000)
    now_ms = (time.time() if now is None else now) * 1000
    rows = []
    for run in runs:
        info, params, tags = run.info, run.data.params, run.data.tags
        end = info.end_time or (now_ms if info.status == "RUNNING" else None)
        rows.append({
            "experiment": names.get(info.experiment_id, info.experiment_id), "name": info.run_name,
            "status": info.status, "started": pd.Timestamp(info.start_time, unit="ms").strftime("%Y-%m-%d %H:%M"),
            "minutes": round(max(0.0, end - info.start_time) / 60000, 1) if end else None,
            "dataset": params.get("dataset"), "method": params.get("method"), "ipc": params.get("ipc"),
            "error": tags.get(TAG["error"], "") or (tags.get(PROGRESS_TAG, "") if info.status == "RUNNING" else ""),
            "run_id": info.run_id,
            **({"link": cell_link(info.experiment_id, info.run_id)} if links else {}),
        })
    return pd.DataFrame(rows)
