"""Rank stability: is a leaderboard's order of methods a property of the methods, or of one seed,
one architecture or one score weight? Kendall's tau-b (:func:`ddlib.stats.rank_stability`) of the
method ranking under each setting against the leaderboard's own ranking:

* across **seeds**: each seed's per-seed score against the mean over seeds (every scored board);
* across **architectures**: DC-Bench's transfer accuracies on each architecture against the
  reference architecture the sets were distilled with;
* across **w / gamma / alpha**: LRS, ARS and CREI recomputed at each weight of DD-Ranking's sweep
  (0.1 ... 0.9) against the default 0.5.

Rankings are compared within one setting of everything else (a ``family`` at one IPC) and need at
least 3 methods to mean anything (tau of 2 items is +-1); blocks with fewer are left out.
"""

from __future__ import annotations

import json

import pandas as pd

from ddlib.report import beard, ddranking
from ddlib.report.ddranking import SWEEP
from ddlib.stats import rank_stability

__all__ = ["SCORED", "stability_table"]

# board name -> its score (the column its rank groups use)
SCORED = {"lrs": "lrs", "ars": "ars", "beard": "crei", "augmentation": "acc_aug_avg", "transfer": "acc_reference",
          "nas": "spearman"}
MIN_METHODS = 3


def _blocks(board: pd.DataFrame):
    keys = [k for k in ("family", "ipc") if k in board]
    if board.empty or not keys or "method" not in board:
        return
    for _, block in board.groupby(keys, sort=False):
        if block["method"].nunique() >= MIN_METHODS and not block["method"].duplicated().any():
            yield block


def _rows(name: str, across: str, block: pd.DataFrame, table: pd.DataFrame) -> list[dict]:
    first = block.iloc[0]
    return [{"board": name, "dataset": first["dataset"], "ipc": first.get("ipc"), "across": across,
             **{k: v for k, v in r.items()}} for r in table.to_dict("records")]


def across_seeds(name: str, board: pd.DataFrame, score: str) -> list[dict]:
    column = f"{score}_per_seed"
    out = []
    if column not in board:
        return out
    for block in _blocks(board):
        per_seed = pd.DataFrame([json.loads(v) for v in block[column]], index=list(block["method"].astype(str)))
        per_seed.columns = [f"seed {c}" for c in per_seed.columns]
        means = block.set_index(block["method"].astype(str))[f"{score}_mean"].rename("mean over seeds")
        table = rank_stability(pd.concat([per_seed, means], axis=1), reference="mean over seeds")
        out += _rows(name, "seed", block, table)
    return out


def across_architectures(board: pd.DataFrame) -> list[dict]:
    out = []
    for block in _blocks(board):
        archs = [c for c in block.columns if c.startswith("acc_") and c.endswith("_mean")
                 and c not in ("acc_reference_mean", "acc_transfer_mean", "acc_others_avg_mean")]
        scores = block.set_index(block["method"].astype(str))[archs]
        scores.columns = [c[len("acc_"):-len("_mean")] for c in archs]
        reference = str(block["model"].iloc[0])
        if reference in scores:
            out += _rows("transfer", "architecture", block, rank_stability(scores, reference=reference))
    return out


def across_weights(name: str, boards: dict[float, pd.DataFrame], score: str, weight: str) -> list[dict]:
    """``boards``: the same leaderboard computed at each weight."""
    base = boards.get(0.5)
    out = []
    if base is None or base.empty:
        return out
    for block in _blocks(base):
        methods = list(block["method"].astype(str))
        columns = {}
        for value, board in boards.items():
            mine = board[board["method"].astype(str).isin(methods) & board["family"].isin(block["family"])]
            if "ipc" in board:
                mine = mine[mine["ipc"] == block["ipc"].iloc[0]]
            columns[f"{weight} = {value:g}"] = mine.set_index(mine["method"].astype(str))[f"{score}_mean"]
        table = rank_stability(pd.DataFrame(columns), reference=f"{weight} = 0.5")
        out += _rows(name, weight, block, table)
    return out


def stability_table(boards: dict[str, pd.DataFrame], weights: bool = True) -> pd.DataFrame:
    """Kendall's tau of every ranking setting against its reference, for every leaderboard in ``boards``
    (name -> board, as :data:`SCORED` names them); with ``weights``, the LRS / ARS / CREI sweeps too
    (read from MLflow again at each weight)."""
    rows = []
    for name, score in SCORED.items():
        board = boards.get(name)
        if board is not None and not board.empty:
            rows += across_seeds(name, board, score)
    if boards.get("transfer") is not None and not boards["transfer"].empty:
        rows += across_architectures(boards["transfer"])
    if weights:
        for name, build, score, weight in (("lrs", lambda v: ddranking.lrs_leaderboard(w=v), "lrs", "w"),
                                           ("ars", lambda v: ddranking.ars_leaderboard(gamma=v), "ars", "gamma"),
                                           ("beard", lambda v: beard.robustness_leaderboard(alpha=v), "crei", "alpha")):
            if boards.get(name) is None or boards[name].empty:
                continue
            rows += across_weights(name, {v: build(v) for v in SWEEP}, score, weight)
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows)
    table["ipc"] = table["ipc"].astype("Int64") if table["ipc"].notna().all() else table["ipc"]
    return table[["board", "dataset", "ipc", "across", "setting", "reference", "tau", "items"]]
