"""Leaderboards built from MLflow: per-seed values are pooled over runs, scores recomputed from them.

Each FINISHED cell run logs its per-seed accuracies as metric histories (step = seed). A
leaderboard row is one *group* (the cell's params without seeds): runs of the same group are
pooled seed by seed (the newest run wins a seed), so a grid that splits seeds over several
runs and a grid that lists them in one run give the same row. Scores are recomputed from
the accuracies with the pure functions of :mod:`ddlib.metrics`, so ``w`` can be changed here.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from ddlib import metrics
from ddlib.tracking import TAG, Tracker, client, default_tags

__all__ = ["per_seed_values", "lrs_leaderboard", "ars_leaderboard", "weight_sweep", "format_leaderboard",
           "plot_scores", "log_summary"]

ROW_PARAMS = ("dataset", "ipc", "method", "model", "preset")
VALUE_ORDER = ("acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any", "acc_syn_aug", "acc_rdm_aug",
               "acc_syn_noaug", "acc_rdm_noaug", "hlr", "ior", "ior_aug", "ior_noaug", "lrs", "ars")
SCORES = ("lrs", "ars")  # already on a 0-100 scale; everything else is a fraction shown in percent


def _param(run, name):
    value = run.data.params.get(name)
    if value is None:
        return None
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        return value


def per_seed_values(experiment: str, keys: tuple[str, ...]) -> pd.DataFrame:
    """One row per (group, seed) with the newest FINISHED cell run's value of each of ``keys``."""
    mlflow_client = client()
    found = mlflow_client.get_experiment_by_name(experiment)
    if found is None:
        return pd.DataFrame()
    cells = mlflow_client.search_runs(
        [found.experiment_id],
        filter_string=f"tags.`{TAG['kind']}` = 'cell' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time ASC"], max_results=50000,
    )
    rows: dict[tuple, dict] = {}
    for run in cells:  # oldest first: newer runs overwrite a seed
        group = run.data.tags.get(TAG["group"], run.info.run_id)
        history = {k: {m.step: m.value for m in mlflow_client.get_metric_history(run.info.run_id, k)} for k in keys}
        seeds = set().union(*(h.keys() for h in history.values()))
        for seed in seeds:
            if not all(seed in history[k] for k in keys):
                continue
            row = {"group": group, "seed": seed, "run_id": run.info.run_id}
            row.update({p: _param(run, p) for p in ROW_PARAMS})
            row.update({k: history[k][seed] for k in keys})
            rows[(group, seed)] = row
    return pd.DataFrame(list(rows.values()))


def _leaderboard(experiment: str, keys: tuple[str, ...], derive, score: str) -> pd.DataFrame:
    """Pool per-seed values by group, add derived columns, and aggregate mean and std over seeds."""
    df = per_seed_values(experiment, keys)
    if df.empty:
        return df
    derived = derive(df)
    value_cols = [*keys, *derived]
    out = []
    for group, sub in df.groupby("group", sort=False):
        row = {p: sub[p].iloc[0] for p in ROW_PARAMS}
        row["seeds"] = len(sub)
        for col in value_cols:
            row[f"{col}_mean"], row[f"{col}_std"] = metrics.mean_std(sub[col])
        row["config"] = group[:8]
        out.append(row)
    board = pd.DataFrame(out)
    if not board.duplicated(subset=list(ROW_PARAMS), keep=False).any():
        board = board.drop(columns="config")
    return board.sort_values(["dataset", "ipc", f"{score}_mean"], ascending=[True, True, False]).reset_index(drop=True)


def lrs_leaderboard(experiment: str = "label_robust", w: float = 0.5) -> pd.DataFrame:
    """LRS leaderboard: one row per method x IPC (x dataset, model, preset), mean and std over seeds."""

    def derive(df):
        df["hlr"] = [metrics.hlr(r, s) for r, s in zip(df.acc_real_hard, df.acc_syn_hard)]
        df["ior"] = [metrics.ior(s, r) for s, r in zip(df.acc_syn_any, df.acc_rdm_any)]
        df["lrs"] = [metrics.lrs(h, i, w) for h, i in zip(df.hlr, df.ior)]
        return ["hlr", "ior", "lrs"]

    return _leaderboard(experiment, ("acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any"), derive, "lrs")


def ars_leaderboard(experiment: str = "augmentation_robust", gamma: float = 0.5) -> pd.DataFrame:
    """ARS leaderboard: one row per method x IPC (x dataset, model, preset), mean and std over seeds."""

    def derive(df):
        df["ior_aug"] = [metrics.ior(s, r) for s, r in zip(df.acc_syn_aug, df.acc_rdm_aug)]
        df["ior_noaug"] = [metrics.ior(s, r) for s, r in zip(df.acc_syn_noaug, df.acc_rdm_noaug)]
        df["ars"] = [metrics.ars(a, n, gamma) for a, n in zip(df.ior_aug, df.ior_noaug)]
        return ["ior_aug", "ior_noaug", "ars"]

    keys = ("acc_syn_aug", "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug")
    return _leaderboard(experiment, keys, derive, "ars")


SWEEP = (0.1, 0.3, 0.5, 0.7, 0.9)  # the weights of DD-Ranking's appendix


def weight_sweep(score: str = "lrs", weights=SWEEP, experiment: str | None = None) -> pd.DataFrame:
    """The score (mean over seeds) for each weight: w for LRS, gamma for ARS, one column per weight."""
    build = {"lrs": lambda v: lrs_leaderboard(experiment or "label_robust", w=v),
             "ars": lambda v: ars_leaderboard(experiment or "augmentation_robust", gamma=v)}[score]
    table = None
    for v in weights:
        board = build(v)
        if board.empty:
            return board
        column = board[list(ROW_PARAMS) + [f"{score}_mean"]].rename(columns={f"{score}_mean": f"{score} @ {v:g}"})
        table = column if table is None else table.merge(column, on=list(ROW_PARAMS), how="outer")
    return table


def format_leaderboard(board: pd.DataFrame) -> pd.DataFrame:
    """Readable table: accuracies in percent, differences in points, scores 0-100, as mean ± std."""
    if board.empty:
        return board
    shown = board[[c for c in (*ROW_PARAMS, "config", "seeds") if c in board.columns]].copy()
    known = [b for b in VALUE_ORDER if f"{b}_mean" in board.columns]
    bases = known + sorted({c[: -len("_mean")] for c in board.columns if c.endswith("_mean")} - set(known))
    for base in bases:
        scale = 1.0 if base in SCORES else 100.0
        shown[base.upper() if base in ("hlr", "ior", "ior_aug", "ior_noaug", *SCORES) else base] = [
            f"{m * scale:.1f} ± {s * scale:.1f}" for m, s in zip(board[f"{base}_mean"], board[f"{base}_std"])
        ]
    return shown


def plot_scores(board: pd.DataFrame, score: str = "lrs"):
    """Bar chart of a score per method, grouped by IPC (datasets share the figure via labels)."""
    from ddlib.viz import bar_with_errors

    if board.empty:
        return None
    df = board.assign(series=board["method"].astype(str) + (" / " + board["dataset"].astype(str)
                                                             if board["dataset"].nunique() > 1 else ""))
    title = {"lrs": "Label-Robust Score", "ars": "Augmentation-Robust Score"}[score]
    return bar_with_errors(df, group="ipc", series="series", value=f"{score}_mean", error=f"{score}_std",
                           title=f"{title} (mean ± std over seeds)", ylabel=f"{score.upper()} (0-100)")


def log_summary(tables: dict[str, pd.DataFrame], figures: dict | None = None, experiment: str = "summary") -> str:
    """Save each table as CSV and HTML and each figure as PNG, as artifacts of a new summary run."""
    tracker = Tracker(experiment)
    run_id = tracker.start_run("summary", tags={**default_tags("summary"), TAG["kind"]: "summary"})
    with tempfile.TemporaryDirectory() as tmp:
        for name, table in tables.items():
            table.to_csv(Path(tmp) / f"{name}.csv", index=False)
            shown = format_leaderboard(table) if any(c.endswith("_mean") for c in table.columns) else table
            shown.to_html(Path(tmp) / f"{name}.html", index=False)
            tracker.log_artifact(run_id, Path(tmp) / f"{name}.csv")
            tracker.log_artifact(run_id, Path(tmp) / f"{name}.html")
        for name, fig in (figures or {}).items():
            if fig is not None:
                fig.savefig(Path(tmp) / f"{name}.png", dpi=120)
                tracker.log_artifact(run_id, Path(tmp) / f"{name}.png")
    tracker.end_run(run_id)
    return run_id
