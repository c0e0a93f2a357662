"""Published rows (``ddlib import FILE``, :mod:`ddlib.report.bundle`) read back as a table of their
own: runs of the MLflow experiment ``published`` tagged ``ddlib.kind = published``, never pooled with
measured rows. Its own module so that ``ddlib export`` and the summary read it without importing
the bundle writer (which imports the export)."""

from __future__ import annotations

import pandas as pd

__all__ = ["PUBLISHED_EXPERIMENT", "PUBLISHED_KIND", "LRS_VALUES", "ARS_VALUES", "published_table"]

PUBLISHED_EXPERIMENT = "published"
PUBLISHED_KIND = "published"  # the ddlib.kind tag of a published row (cells are "cell")
# DD-Ranking's result key -> (ddlib's board column, factor from ddlib's unit to the published one)
LRS_VALUES = {"hard_label_recovery": ("hlr", 100.0), "improvement_over_random": ("ior", 100.0),
              "label_robust_score": ("lrs", 1.0)}
ARS_VALUES = {"with_aug_scores": ("ior_aug", 100.0), "without_aug_scores": ("ior_noaug", 100.0),
              "augmentation_robust_score": ("ars", 1.0)}


def published_table() -> pd.DataFrame:
    """Every published row, in ddlib's board units (``hlr_mean`` as a fraction, ``lrs_mean`` 0-100),
    with ``source`` = "published" and its ``reference``: shown beside the boards, never pooled."""
    from ddlib.store.tracking import TAG, client, run_metrics

    mlflow_client = client()
    found = mlflow_client.get_experiment_by_name(PUBLISHED_EXPERIMENT)
    if found is None:
        return pd.DataFrame()
    runs = mlflow_client.search_runs([found.experiment_id], filter_string=f"tags.`{TAG['kind']}` = '{PUBLISHED_KIND}'",
                                     order_by=["attributes.start_time ASC"], max_results=50000)
    rows = []
    for run in runs:
        params = run.data.params
        row = {"source": "published", "reference": params.get("reference")}
        row.update({c: params.get(c) for c in ("dataset", "data", "ipc", "method", "model", "label_type", "num_eval",
                                                 "w", "gamma") if c in params})
        row["ipc"] = int(row["ipc"])
        logged = run_metrics(run)
        for column, _ in (*LRS_VALUES.values(), *ARS_VALUES.values()):
            for stat in ("mean", "std"):
                row[f"{column}_{stat}"] = logged.get(f"{column}_{stat}", float("nan"))
        rows.append(row)
    table = pd.DataFrame(rows)
    bases = [c[: -len("_mean")] for c in table.columns if c.endswith("_mean")]
    empty = [f"{b}_{s}" for b in bases if table[f"{b}_mean"].isna().all() for s in ("mean", "std")]
    return table.drop(columns=empty).sort_values(["dataset", "ipc", "method"], kind="stable").reset_index(drop=True)
