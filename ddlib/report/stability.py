"""Rank stability: is a leaderboard's order of methods a property of the methods, or of one seed,
one architecture or one score weight? Kendall's tau-b (:func:`ddlib.scores.stats.rank_stability`) of the
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

from ddlib.protocols.spec import board_specs
from ddlib.report.boards import build_board
from ddlib.protocols.ddranking_boards import SWEEP
from ddlib.scores.stats import rank_stability

__all__ = ["scored", "stability_table"]

def scored() -> dict[str, str]:
    """board name -> its score (the column its rank groups use), from the protocols' specs."""
    return {name: board.score for name, (_, board) in board_specs().items() if board.score}
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
    """Kendall tau of each seed's method ranking against the ranking by the mean over seeds, per setting."""
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
    """Kendall tau of each architecture's method ranking against the reference architecture's (transfer)."""
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
    (name -> board, as :func:`scored` names them); with ``weights``, the LRS / ARS / CREI sweeps too
    (read from MLflow again at each weight)."""
    rows = []
    for name, score in scored().items():
        board = boards.get(name)
        if board is not None and not board.empty:
            rows += across_seeds(name, board, score)
    if boards.get("transfer") is not None and not boards["transfer"].empty:
        rows += across_architectures(boards["transfer"])
    if weights:  # every board with a score weight (w, gamma, alpha): its sweep
        for name, (_, board) in board_specs().items():
            if board.weight is None or not board.score or boards.get(name) is None or boards[name].empty:
                continue
            sweep = {v: build_board(name, **{board.weight: v}) for v in SWEEP}
            rows += across_weights(name, sweep, board.score, board.weight)
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows)
    table["ipc"] = table["ipc"].astype("Int64") if table["ipc"].notna().all() else table["ipc"]
    return table[["board", "dataset", "ipc", "across", "setting", "reference", "tau", "items"]]
