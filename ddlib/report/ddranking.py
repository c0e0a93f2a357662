"""DD-Ranking's leaderboards: the Label-Robust and Augmentation-Robust Scores, and their weight sweeps."""

from __future__ import annotations

import pandas as pd

from ddlib.scores import metrics
from ddlib.protocols import beyond
from ddlib.protocols.cell import POOL_TAG
from ddlib.report.boards import build_board
from ddlib.report.core import KEY_COLUMNS, aggregate, per_seed_values
from ddlib.store.tracking import TAG

__all__ = ["ROW_PARAMS", "WEIGHT_PARAM", "row_params", "ROW_TAGS", "SWEEP", "lrs_leaderboard", "ars_leaderboard",
           "weight_sweep", "plot_scores"]

ROW_PARAMS = ("dataset", "ipc", "method", "model", "preset", "lr_policy")
# The cells' own score weight is part of a row's key, so cells that differ only by it are rows that say so
# (not look-alike duplicates); the board's score column is computed at the board's weight (w=, gamma=).
WEIGHT_PARAM = {"lrs": "w", "ars": "gamma"}
# Part of a row's key besides its params (the group hash holds the revision already; the tags show it
# as a column): the protocol revision, so no row pools cells of two definitions, and the real-data
# pool's identity (its content digest), so no row pools cells scored against different real data.
# Every board's key also holds the resolved precision and the set's digest (ddlib.report.core).
ROW_TAGS = {"revision": TAG["revision"], "pool": POOL_TAG}
MATCHED_COMPUTE = ("acc_rdm_matched", "ior_matched")  # per-seed values of cells run with matched_compute: true


def row_params(score: str) -> tuple[str, ...]:
    """The params that key a row of the ``score`` board ("lrs", "ars"): ROW_PARAMS and the cells' weight."""
    return (*ROW_PARAMS, WEIGHT_PARAM[score])


def _leaderboard(experiment: str, keys: tuple[str, ...], derive, score: str, roles: tuple[str, ...]) -> pd.DataFrame:
    """Pool per-seed values by group, add derived columns, and aggregate mean and std over seeds; then
    the calibration, class-wise fairness and cost of the ``roles``' models (:mod:`ddlib.protocols.beyond`)."""
    params = row_params(score)
    df = per_seed_values(experiment, keys, params, row_tags=ROW_TAGS,
                         match=lambda k: beyond.is_beyond(k) or k in MATCHED_COMPUTE)
    if df.empty:
        return df
    derived = derive(df) + [k for k in MATCHED_COMPUTE if k in df]  # label_robust's matched_compute: true
    extra = beyond.board_columns(df, roles)
    return aggregate(df, [*keys, *derived, *extra], (*params, "revision"), sort=("dataset", "ipc"), descending=score)


def lrs_leaderboard(experiment: str = "label_robust", w: float = 0.5) -> pd.DataFrame:
    """LRS leaderboard: one row per method x IPC (x dataset, model, preset), mean and std over seeds."""

    def derive(df):
        df["hlr"] = [metrics.hlr(r, s) for r, s in zip(df.acc_real_hard, df.acc_syn_hard)]
        df["ior"] = [metrics.ior(s, r) for s, r in zip(df.acc_syn_any, df.acc_rdm_any)]
        df["lrs"] = [metrics.lrs(h, i, w) for h, i in zip(df.hlr, df.ior)]
        return ["hlr", "ior", "lrs"]

    return _leaderboard(experiment, ("acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any"), derive, "lrs",
                        ("syn_any", "syn_hard"))


def ars_leaderboard(experiment: str = "augmentation_robust", gamma: float = 0.5) -> pd.DataFrame:
    """ARS leaderboard: one row per method x IPC (x dataset, model, preset), mean and std over seeds."""

    def derive(df):
        df["ior_aug"] = [metrics.ior(s, r) for s, r in zip(df.acc_syn_aug, df.acc_rdm_aug)]
        df["ior_noaug"] = [metrics.ior(s, r) for s, r in zip(df.acc_syn_noaug, df.acc_rdm_noaug)]
        df["ars"] = [metrics.ars(a, n, gamma) for a, n in zip(df.ior_aug, df.ior_noaug)]
        return ["ior_aug", "ior_noaug", "ars"]

    keys = ("acc_syn_aug", "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug")
    return _leaderboard(experiment, keys, derive, "ars", ("syn_aug",))


SWEEP = (0.1, 0.3, 0.5, 0.7, 0.9)  # the weights of DD-Ranking's appendix


def weight_sweep(score: str = "lrs", weights=SWEEP, experiment: str | None = None) -> pd.DataFrame:
    """The score (mean over seeds) for each weight: w for LRS, gamma for ARS, one column per weight."""
    # the board itself (built once per weight inside boards.one_read) where no other experiment is named
    build = {"lrs": lambda v: lrs_leaderboard(experiment, w=v) if experiment else build_board("lrs", w=v),
             "ars": lambda v: ars_leaderboard(experiment, gamma=v) if experiment else build_board("ars", gamma=v)}[score]
    table = None
    for v in weights:
        board = build(v)
        if board.empty:
            return board
        key = [*row_params(score), "revision", *[c for c in (*KEY_COLUMNS, "config") if c in board]]
        column = board[key + [f"{score}_mean"]].rename(columns={f"{score}_mean": f"{score} @ {v:g}"})
        table = column if table is None else table.merge(column, on=key, how="outer")
    return table


def plot_scores(board: pd.DataFrame, score: str = "lrs"):
    """Bar chart of a score per method, grouped by IPC (datasets share the figure via labels)."""
    from ddlib.report.viz import bar_with_errors

    if board.empty:
        return None
    from ddlib.report.core import row_names

    df = board.assign(series=[n + (f" / {d}" if board["dataset"].nunique() > 1 else "")
                              for n, d in zip(row_names(board), board["dataset"].astype(str))])
    title = {"lrs": "Label-Robust Score", "ars": "Augmentation-Robust Score"}[score]
    return bar_with_errors(df, group="ipc", series="series", value=f"{score}_mean", error=f"{score}_std",
                           title=f"{title} (mean ± std over seeds)", ylabel=f"{score.upper()} (0-100)")
