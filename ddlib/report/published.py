"""Published rows (``ddlib import FILE``, :mod:`ddlib.report.bundle`) read back as a table of their
own: runs of the MLflow experiment ``published`` tagged ``ddlib.kind = published``, never pooled with
measured rows. Its own module so that ``ddlib export`` and the summary read it without importing
the bundle writer (which imports the export)."""

from __future__ import annotations

import pandas as pd

__all__ = ["PUBLISHED_EXPERIMENT", "PUBLISHED_KIND", "LRS_VALUES", "ARS_VALUES", "published_table", "with_verified"]

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
    from ddlib.store.tags import TAG
    from ddlib.store.tracking import client, run_metrics

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


def with_verified(board: pd.DataFrame, published: pd.DataFrame | None = None,
                  tolerance: float | None = None) -> pd.DataFrame:
    """The board with a ``verified`` column (True, False, or None where its method has no published value) and
    ``verified_by`` (each published value's verdict in words): every value the board and the published row of
    its dataset, IPC and method (and model, where both name one) share, measured mean against published
    (:func:`ddlib.scores.verify.verify`: within ``tolerance`` in the value's shown unit, default 1.5 points, or
    inside the row's seed interval). A row is verified when all its shared values are. The board unchanged
    where nothing published matches it."""
    from ddlib.scores.verify import TOLERANCE, verify
    from ddlib.specs import units

    if board.empty or "method" not in board:
        return board
    published = published_table() if published is None else published
    if published.empty:
        return board
    values = [c[: -len("_mean")] for c in board.columns if c.endswith("_mean") and c in published.columns]
    if not values:
        return board
    verdicts, notes = [], []
    for _, row in board.iterrows():
        same = published[(published["dataset"] == row.get("dataset")) & (published["ipc"] == row.get("ipc"))
                         & (published["method"].astype(str).str.lower() == str(row.get("method")).lower())]
        if "model" in same and isinstance(row.get("model"), str):
            same = same[same["model"].isna() | (same["model"] == row.get("model"))]
        found = []
        for value in values if not same.empty else ():
            published_value = same[f"{value}_mean"].dropna()
            if published_value.empty:
                continue
            scale = units.unit_of(value).scale
            found.append((value, verify(row[f"{value}_mean"] * scale, float(published_value.iloc[-1]) * scale,
                                        low=row.get(f"{value}_low", float("nan")) * scale,
                                        high=row.get(f"{value}_high", float("nan")) * scale,
                                        tolerance=TOLERANCE if tolerance is None else tolerance)))
        verdicts.append(bool(all(v.verified for _, v in found)) if found else None)
        notes.append("; ".join(f"{units.display_name(value)} {verdict}" for value, verdict in found))
    if all(v is None for v in verdicts):
        return board
    return board.assign(verified=verdicts, verified_by=notes)
