"""The blackbox protocol's boards from its experiment: per attack, a target x surrogate matrix.

Each ``blackbox`` cell is one surrogate (its method's models) and logs, per seed, the robust accuracy
of every target model under each attack crafted on it (``transfer.<attack>.<target>``). Here the cells
of one setting (the same data, model, recipe, training, attacks, mode and space: one ``family``) at
one IPC are put together: one row per (attack, target), the target in the ``method`` column, with
``from.<surrogate>`` the robust accuracy under the attack crafted on each surrogate, ``white_box_acc``
the diagonal (the target as its own surrogate, where it was one), ``transfer_acc`` the mean over the
*other* surrogates (the board's score: robustness to transferred attacks, higher is better) and
``clean_acc`` the target's clean accuracy; mean and std over seeds (seed s of a surrogate is scored on
seed s of each target). Rows are ranked within one attack.

The board ``blackbox_irr`` scores each (surrogate, target) pair over the attacks: ROME's I-RR
(``rr_rome``: :func:`ddlib.scores.metrics.rr`'s ``rome``, 100·(1 − mean ASR · max ASR / clean²) with the
target's clean accuracy and its robust accuracies under the surrogate's attacks), beside BEARD's RR
and the ``rome+`` variant. That is ROME's black-box heatmap (Zhou et al., ICML 2025): BEARD's toolkit
turns a transfer log into one white-box log per target (``Code/metrics/black_box/convert_to_white_box.py``)
and scores it with ``calculate_rr(..., 'rome')``; the heatmap is its targeted mode, where DeepFool and
AutoAttack are left out (ddlib skips them there). The attacks are the cell's that ran (two at least, as
for every RR: with fewer it is NaN).
"""

from __future__ import annotations

import pandas as pd

from ddlib.boards.rank import aggregate
from ddlib.boards.read import per_seed_values
from ddlib.scores import metrics

__all__ = ["ROW_PARAMS", "transfer_leaderboard", "transfer_matrix", "irr_leaderboard", "irr_rows", "irr_matrix"]

EXPERIMENT = "blackbox"
ROW_PARAMS = ("dataset", "ipc", "method", "attack", "model", "training", "mode", "target", "space")
_CELL_PARAMS = ("dataset", "ipc", "method", "model", "training", "mode", "target", "space")


def _rows(experiment: str) -> pd.DataFrame:
    """One row per (setting, IPC, attack, target, seed), its ``from.<surrogate>`` values beside."""
    df = per_seed_values(experiment, ("clean_acc",), _CELL_PARAMS, match=lambda k: k.startswith(("transfer.", "clean.")))
    if df.empty:
        return df
    rows: dict[tuple, dict] = {}
    for _, cell in df.iterrows():
        for column in (c for c in df.columns if c.startswith("transfer.")):
            if pd.isna(cell[column]):
                continue
            _, attack, target = column.split(".", 2)
            key = (cell["family"], cell["ipc"], attack, target, cell["seed"])
            row = rows.setdefault(key, {
                "group": f"{cell['family']}|{cell['ipc']}|{attack}|{target}", "family": f"{cell['family']}|{attack}",
                "series": f"{cell['family']}|{attack}|{target}", "seed": cell["seed"], "run_id": [],
                "data": cell["data"], "classes": cell["classes"], "precision": cell.get("precision"),
                **{p: cell[p] for p in _CELL_PARAMS}, "method": target, "attack": attack,
                "target": cell["target"] if cell["mode"] == "targeted" else "",
                "clean_acc": cell.get(f"clean.{target}", float("nan"))})
            row["run_id"].append(cell["run_id"])
            if isinstance(cell.get("leakage"), str) and cell["leakage"]:  # the surrogate's set (its cell's check)
                row["leakage"] = "; ".join(dict.fromkeys(filter(None, (row.get("leakage"), cell["leakage"]))))
            row[f"from.{cell['method']}"] = cell[column]
    for row in rows.values():
        row["run_id"] = " ".join(dict.fromkeys(row["run_id"]))
        others = [v for k, v in row.items() if k.startswith("from.") and k != f"from.{row['method']}"]
        row["transfer_acc"] = sum(others) / len(others) if others else float("nan")
        row["white_box_acc"] = row.get(f"from.{row['method']}", float("nan"))
    return pd.DataFrame(list(rows.values()))


def transfer_leaderboard(experiment: str = EXPERIMENT) -> pd.DataFrame:
    """One row per dataset x IPC x target x attack x setting: clean accuracy, robust accuracy under
    transfer (mean over the other surrogates: the score), white-box, and one column per surrogate."""
    df = _rows(experiment)
    if df.empty:
        return df
    df = _common_surrogates(df)
    sources = sorted(c for c in df.columns if c.startswith("from."))
    return aggregate(df, ["clean_acc", "transfer_acc", "white_box_acc", *sources], (*ROW_PARAMS, "surrogates"),
                     sort=("dataset", "attack", "mode", "family", "ipc"), descending="transfer_acc")


def _common_surrogates(df: pd.DataFrame) -> pd.DataFrame:
    """Each row's ``transfer_acc`` over the surrogates that attacked it in every one of its seeds
    (a surrogate run for one seed only would make the seeds' means average different surrogates),
    and those surrogates named in ``surrogates``."""
    df = df.copy()
    df["surrogates"] = ""
    for _, block in df.groupby("group", sort=False):
        own = {f"from.{m}" for m in block["method"]}
        common = sorted(c for c in block.columns if c.startswith("from.") and c not in own and block[c].notna().all())
        df.loc[block.index, "transfer_acc"] = block[common].mean(axis=1) if common else float("nan")
        df.loc[block.index, "surrogates"] = ", ".join(c[len("from."):] for c in common)
    return df


def transfer_matrix(board: pd.DataFrame, attack: str) -> pd.DataFrame:
    """One attack's matrix from the board: rows the surrogates, columns the targets, robust accuracy in %
    (mean over seeds); one setting and IPC at a time (filter the board first where it has several)."""
    sub = board[board["attack"] == attack]
    if sub.empty:
        return pd.DataFrame()
    columns = [c for c in sub.columns if c.startswith("from.") and c.endswith("_mean")]
    matrix = sub.set_index("method")[columns].T
    matrix.index = [c[len("from."): -len("_mean")] for c in columns]
    matrix.index.name, matrix.columns.name = "surrogate", "target"
    return 100 * matrix.dropna(how="all")


IRR_VALUES = ("rr_rome", "rr", "rr_rome_plus")  # ROME's I-RR first (the board's score), BEARD's RR, rome+
_IRR_NAMES = {"rr": "beard", "rr_rome": "rome", "rr_rome_plus": "rome+"}


def irr_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell (a surrogate) and seed of :func:`~ddlib.boards.read.per_seed_values`' frame, one row per
    target: ``rr_rome`` (I-RR), ``rr`` and ``rr_rome_plus`` from the target's clean accuracy
    (``clean.<target>``) and its robust accuracies under transfer (``transfer.<attack>.<target>``, the
    attacks this cell ran), as :func:`ddlib.scores.metrics.rr` takes them (%); NaN with fewer than two attacks."""
    rows = []
    for _, cell in df.iterrows():
        by_target: dict[str, list[float]] = {}
        for column in (c for c in df.columns if c.startswith("transfer.")):
            if pd.notna(cell[column]):
                by_target.setdefault(column.split(".", 2)[2], []).append(100 * float(cell[column]))
        for target, accs in by_target.items():
            clean = 100 * float(cell.get(f"clean.{target}", float("nan")))
            enough = len(accs) >= metrics.MIN_ATTACKS and pd.notna(clean)
            rows.append({"group": f"{cell['family']}|{cell['ipc']}|{cell['method']}|{target}",
                         "family": cell["family"], "series": f"{cell['family']}|{cell['method']}|{target}",
                         "seed": cell["seed"], "run_id": cell["run_id"], "data": cell["data"],
                         "classes": cell["classes"], "precision": cell.get("precision"),
                         **{p: cell[p] for p in _CELL_PARAMS}, "surrogate": cell["method"], "method": target,
                         "target": cell["target"] if cell["mode"] == "targeted" else "",
                         "leakage": cell.get("leakage"), "attacks_scored": len(accs),
                         **{name: metrics.rr(clean, accs, variant) if enough else float("nan")
                            for name, variant in _IRR_NAMES.items()}})
    return pd.DataFrame(rows)


def irr_leaderboard(experiment: str = EXPERIMENT) -> pd.DataFrame:
    """One row per dataset x IPC x target x surrogate x setting: ROME's I-RR of the target under the
    surrogate's transferred attacks (the score), BEARD's RR and ``rome+``; mean and std over seeds."""
    df = per_seed_values(experiment, ("clean_acc",), _CELL_PARAMS, match=lambda k: k.startswith(("transfer.", "clean.")))
    if df.empty:
        return df
    rows = irr_rows(df)
    if rows.empty:
        return rows
    return aggregate(rows, [*IRR_VALUES, "attacks_scored"], (*ROW_PARAMS[:3], "surrogate", *ROW_PARAMS[4:]),
                     sort=("dataset", "mode", "family", "ipc"), descending="rr_rome")


def irr_matrix(board: pd.DataFrame, value: str = "rr_rome") -> pd.DataFrame:
    """ROME's heatmap from :func:`irr_leaderboard`: rows the surrogates, columns the targets, ``value``
    (mean over seeds, 0-100); one setting and IPC at a time (filter the board first where it has several)."""
    if board.empty:
        return pd.DataFrame()
    matrix = board.pivot_table(index="surrogate", columns="method", values=f"{value}_mean", aggfunc="first", sort=False)
    matrix.index.name, matrix.columns.name = "surrogate", "target"
    return matrix
