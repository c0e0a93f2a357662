"""DD-Ranking's boards (``lrs``: label_robust's, ``ars``: augmentation_robust's): the Label-Robust and
Augmentation-Robust Scores, their weight sweeps and bar charts, and their report sections."""

from __future__ import annotations

import pandas as pd

from ddlib.boards.rank import aggregate, row_names
from ddlib.boards.read import KEY_COLUMNS, per_seed_values, read_once
from ddlib.protocols import beyond
from ddlib.protocols.cell import POOL_TAG
from ddlib.scores import metrics
from ddlib.store.tags import TAG

__all__ = ["ROW_PARAMS", "WEIGHT_PARAM", "row_params", "ROW_TAGS", "SWEEP", "lrs_leaderboard", "ars_leaderboard",
           "weight_sweep", "plot_scores", "section"]

ROW_PARAMS = ("dataset", "ipc", "method", "model", "preset", "lr_policy")
# The cells' own score weight is part of a row's key, so cells that differ only by it are rows that say so
# (not look-alike duplicates); the board's score column is computed at the board's weight (w=, gamma=).
WEIGHT_PARAM = {"lrs": "w", "ars": "gamma"}
# Part of a row's key besides its params (the group hash holds the revision already; the tags show it
# as a column): the protocol revision, so no row pools cells of two definitions, and the real-data
# pool's identity (its content digest), so no row pools cells scored against different real data.
# Every board's key also holds the resolved precision and the set's digest (ddlib.boards.read).
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
    """The score (mean over seeds) for each weight: w for LRS, gamma for ARS, one column per weight
    (each board read once per weight inside :func:`ddlib.boards.read.one_read`, where no other experiment is named)."""
    weight = WEIGHT_PARAM[score]
    build = {"lrs": lambda v: lrs_leaderboard(experiment or "label_robust", w=v),
             "ars": lambda v: ars_leaderboard(experiment or "augmentation_robust", gamma=v)}[score]
    board_of = build if experiment else (lambda v: read_once(score, {weight: v}, lambda: build(v)))
    table = None
    for v in weights:
        board = board_of(v)
        if board.empty:
            return board
        key = [*row_params(score), "revision", *[c for c in (*KEY_COLUMNS, "config") if c in board]]
        column = board[key + [f"{score}_mean"]].rename(columns={f"{score}_mean": f"{score} @ {v:g}"})
        table = column if table is None else table.merge(column, on=key, how="outer")
    return table


def plot_scores(board: pd.DataFrame, score: str = "lrs"):
    """Bar chart of a score per method, grouped by IPC (datasets share the figure via labels)."""
    if board.empty:
        return None
    df = board.assign(series=[n + (f" / {d}" if board["dataset"].nunique() > 1 else "")
                              for n, d in zip(row_names(board), board["dataset"].astype(str))])
    title = {"lrs": "Label-Robust Score", "ars": "Augmentation-Robust Score"}[score]
    return _bars(df, group="ipc", series="series", value=f"{score}_mean", error=f"{score}_std",
                 title=f"{title} (mean ± std over seeds)", ylabel=f"{score.upper()} (0-100)")


def _bars(df: pd.DataFrame, group: str, series: str, value: str, error: str, title: str, ylabel: str):
    """Grouped bars (one group per ``group`` value, one bar per ``series``) with std error bars. Two
    rows with one (group, series) get a bar each (numbered): a plot never assumes names are unique."""
    import matplotlib.pyplot as plt

    df = df.reset_index(drop=True)
    keyed = df[series].astype(str) + df.groupby([group, series], sort=False).cumcount().map(
        lambda k: "" if k == 0 else f" ({k + 1})")
    groups = list(dict.fromkeys(df[group]))
    names = list(dict.fromkeys(keyed))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups) * max(1, len(names)) * 0.5 + 2), 4))
    position = {g: i for i, g in enumerate(groups)}
    for j, name in enumerate(names):
        rows = df[keyed == name]
        xs = [position[g] + (j - (len(names) - 1) / 2) * width for g in rows[group]]
        ax.bar(xs, list(rows[value]), width=width, yerr=list(rows[error]), capsize=3, label=str(name))
    ax.set_xticks(range(len(groups)), [str(g) for g in groups])
    ax.set_xlabel(group)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def section(name: str, board: pd.DataFrame, boards, plots: bool = True) -> tuple[dict, dict]:
    """What the report shows beside the ``lrs`` or ``ars`` board: its weight sweep (``<name>_sweep``)
    and its bar chart."""
    tables = {f"{name}_sweep": weight_sweep(name)}
    return tables, ({name: plot_scores(board, name)} if plots else {})
