"""Reading leaderboards out of MLflow: per-seed values pooled over runs, then mean and std over seeds.

Each FINISHED cell run logs its per-seed values as metric histories (step = seed). A leaderboard
row is one *group* (the cell's params without seeds): runs of the same group are pooled seed by
seed (the newest run wins a seed), so a grid that splits seeds over several runs and a grid that
lists them in one run give the same row. Scores are recomputed from the logged accuracies with the
pure functions of :mod:`ddlib.metrics`, so their weights can be changed at summary time.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from ddlib import metrics
from ddlib.protocols.common import FULL_IPC
from ddlib.tracking import TAG, Tracker, client, default_tags

__all__ = ["per_seed_values", "aggregate", "format_leaderboard", "log_summary", "SCORES", "UNSCALED"]

# Shown as logged (0-100 scores, seconds, correlations, percent already); every other value is a
# fraction shown in percent.
SCORES = ("lrs", "ars", "rr", "ae", "crei", "rcr", "rrm", "aem", "creim", "rcrm")
UNSCALED = (*SCORES, "spearman", "kendall", "top1", "best_possible", "images", "tau")
VALUE_ORDER = ("acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any", "acc_syn_aug", "acc_rdm_aug",
               "acc_syn_noaug", "acc_rdm_noaug", "hlr", "ior", "ior_aug", "ior_noaug", "lrs", "ars")
UPPER = ("hlr", "ior", "ior_aug", "ior_noaug", *SCORES)


def _value(text):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def _param(run, name):
    """A cell's param as logged; a mapping (logged flattened, ``training.pgd_at.steps``) comes back
    as its compact JSON, so a leaderboard row still names it in one cell."""
    params = run.data.params
    if name in params:
        return _value(params[name])
    nested = {k[len(name) + 1:]: v for k, v in params.items() if k.startswith(f"{name}.")}
    if not nested:
        return None
    tree: dict = {}
    for path, text in sorted(nested.items()):
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _value(text)
    return json.dumps(tree, separators=(", ", ": "))


def _per_seed_key(key: str) -> bool:
    """A per-seed history, not a cell's ``<value>_mean`` / ``<value>_std`` summary."""
    return not key.endswith(("_mean", "_std"))


def per_seed_values(experiment: str, keys: Sequence[str] = (), row_params: Sequence[str] = (),
                    match: Callable[[str], bool] | None = None, row_tags: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per (group, seed) of FINISHED cell runs: the newest run's value of each of ``keys``
    (a seed missing one of them is left out) and of every other per-seed metric whose name
    ``match`` accepts (missing ones are NaN), next to the run's ``row_params`` and ``row_tags``
    (column -> tag). Columns ``group``, ``series`` (the group without the IPC) and ``family`` (the
    series without the method: what the methods are compared within) say which cells belong together;
    the ``row_tags`` values are part of all three (runs on another device are another row)."""
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
        tags = run.data.tags
        split = "".join(f"|{tags.get(tag)}" for tag in (row_tags or {}).values())
        group = tags.get(TAG["group"], run.info.run_id) + split
        extra = sorted(k for k in run.data.metrics if match and match(k) and _per_seed_key(k) and k not in keys)
        history = {k: {m.step: m.value for m in mlflow_client.get_metric_history(run.info.run_id, k)}
                   for k in (*keys, *extra)}
        seeds = set().union(*(h.keys() for h in history.values())) if history else set()
        for seed in sorted(seeds):
            if not all(seed in history[k] for k in keys):
                continue
            row = {"group": group, "series": tags.get(TAG["series"], group) + split,
                   "family": tags.get(TAG["family"], group) + split,
                   "seed": seed, "run_id": run.info.run_id}
            row.update({p: _param(run, p) for p in row_params})
            row.update({column: tags.get(tag) for column, tag in (row_tags or {}).items()})
            row.update({k: history[k].get(seed, float("nan")) for k in history})
            rows[(group, seed)] = row
    return pd.DataFrame(list(rows.values()))


def aggregate(df: pd.DataFrame, value_cols: Sequence[str], row_params: Sequence[str],
              sort: Sequence[str] = (), descending: str | None = None) -> pd.DataFrame:
    """Mean and std over seeds of ``value_cols`` per group; ``config`` (the group hash) is kept
    only where two groups share every row param (e.g. two grids that differ in a recipe)."""
    if df.empty:
        return df
    out = []
    for group, sub in df.groupby("group", sort=False):
        row = {p: sub[p].iloc[0] for p in row_params}
        row.update({k: sub[k].iloc[0] for k in ("series", "family") if k in sub})
        row["seeds"] = len(sub)
        for col in value_cols:
            row[f"{col}_mean"], row[f"{col}_std"] = metrics.mean_std(sub[col].dropna()) if col in sub else (
                float("nan"), float("nan"))
        row["config"] = group[:8]
        out.append(row)
    board = pd.DataFrame(out)
    if not board.duplicated(subset=[p for p in row_params if p in board], keep=False).any():
        board = board.drop(columns="config")
    order = [*sort, *([f"{descending}_mean"] if descending else [])]
    if order:
        board = board.sort_values(order, ascending=[True] * len(sort) + ([False] if descending else []),
                                  na_position="last")
    return board.reset_index(drop=True)


def _display(base: str) -> tuple[float, str]:
    """(scale, format) of a value: fractions become percent; scores, seconds, correlations stay."""
    if base in ("spearman", "kendall", "tau") or base.endswith(".tau"):
        return 1.0, "{:.2f}"
    if base.endswith("seconds_per_sample"):
        return 1.0, "{:.4f}"
    if base in UNSCALED or base.endswith("seconds"):
        return 1.0, "{:.2f}"
    return 100.0, "{:.1f}"


def format_leaderboard(board: pd.DataFrame, row_params: Sequence[str] | None = None) -> pd.DataFrame:
    """Readable table: accuracies in percent, differences in points, scores 0-100, times in seconds,
    correlations as they are, each as mean ± std."""
    if board.empty:
        return board
    bases = [c[: -len("_mean")] for c in board.columns if c.endswith("_mean")]
    keys = row_params if row_params is not None else [c for c in board.columns if not c.endswith(("_mean", "_std"))
                                                      and c not in ("seeds", "series", "family")]
    shown = board[[c for c in (*keys, "config", "seeds") if c in board.columns]].copy()
    shown = shown.loc[:, ~shown.columns.duplicated()]
    if "ipc" in shown:
        shown["ipc"] = ["all" if v == FULL_IPC else v for v in shown["ipc"]]
    known = [b for b in VALUE_ORDER if b in bases]
    for base in known + [b for b in bases if b not in known]:
        scale, fmt = _display(base)
        shown[base.upper() if base in UPPER else base] = [
            "n/a" if pd.isna(m) else f"{fmt.format(m * scale)} ± {fmt.format(s * scale)}"
            for m, s in zip(board[f"{base}_mean"], board[f"{base}_std"])
        ]
    return shown


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
