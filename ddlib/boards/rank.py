"""Aggregating a board: mean, std and bootstrap interval over seeds per row, sanity notes, and rank groups
from paired comparisons (imports scores/ and the reading of :mod:`.read`; never protocols/ or report/)."""

from __future__ import annotations

import json
import math
from typing import Sequence

import pandas as pd

from ddlib.boards import known
from ddlib.boards.read import CONSTRUCTION_VALUES, KEY_COLUMNS, QUICK_NOTE, SET_TAGS, SPLIT_TAGS
from ddlib.scores import metrics, stats

__all__ = ["aggregate", "leakage_note", "stale_note", "row_names", "rank_caption", "INTERVALS", "UNRANKED_LEAK",
           "UNRANKED_STALE"]

# How every leaderboard's intervals and rank groups are made (stated in captions).
INTERVALS = {"resamples": stats.RESAMPLES, "level": stats.LEVEL, "seed": stats.SEED}
# What a board's rank says of a row left out of the ranking: its set holds test (or validation) images.
UNRANKED_LEAK = "not ranked: the set holds test images"
UNRANKED_STALE = "not ranked: computed under revision {revision} (the protocol is at {current}): rerun the cell"


def _sanity(sub: pd.DataFrame) -> str:
    """A row's sanity flag: its full-data reference or distilled-set accuracy (mean over seeds) near
    chance (:func:`ddlib.scores.metrics.near_chance`); empty when all is well or the class count is unknown."""
    classes = sub["classes"].dropna()
    if classes.empty:
        return ""
    means = {k: float(sub[k].mean()) for k in metrics.SANITY_VALUES if k in sub and sub[k].notna().any()}
    return "; ".join(metrics.near_chance(means, int(classes.iloc[0])))


def leakage_note(sub: pd.DataFrame) -> str:
    """The ``ddlib.leakage`` notes of the cells a row pools (test or validation images in the set:
    :mod:`ddlib.protocols.leakage`); empty where none."""
    if "leakage" not in sub:
        return ""
    return "; ".join(dict.fromkeys(str(v) for v in sub["leakage"] if isinstance(v, str) and v))


def stale_note(sub: pd.DataFrame) -> str:
    """Why a row computed under an earlier revision of its protocol is not ranked (empty where its cells
    are of the protocol's revision now, or where that cannot be told): its number is of another
    definition (each protocol's ``history`` says what changed), shown on the board but never ranked,
    headlined or pooled with today's."""
    if "revision" not in sub or "protocol" not in sub:
        return ""
    current = known.revision(str(sub["protocol"].iloc[0]))
    if current is None:  # not installed here
        return ""
    try:
        revisions = {int(r) for r in sub["revision"] if r is not None and not (isinstance(r, float) and math.isnan(r))}
    except (ValueError, TypeError):  # a hand-written tag
        return ""
    if not revisions or max(revisions) >= current:
        return ""
    return UNRANKED_STALE.format(revision=max(revisions), current=current)


def aggregate(df: pd.DataFrame, value_cols: Sequence[str], row_params: Sequence[str],
              sort: Sequence[str] = (), descending: str | None = None) -> pd.DataFrame:
    """Mean and std over seeds of ``value_cols`` per group, each with its bootstrap interval
    (``<col>_low``, ``<col>_high``: :data:`INTERVALS`); ``config`` (the group hash) is kept only
    where two groups share every row param (e.g. two grids that differ in a recipe); ``runs``: the
    cell runs the row pools; ``precision`` and ``set`` (:data:`KEY_COLUMNS`) where the frame has them,
    ``set`` only where two rows differ by nothing else; ``sanity``: near-chance accuracies and the
    sets' test or validation images (:func:`leakage_note`). With ``descending`` (the board's score), rows compared with each other
    (one ``family`` at one IPC) get rank groups on it: ``rank`` (1 + the rows significantly better,
    paired by seed) and ``tied_with`` (:func:`_rank_groups`)."""
    if df.empty:
        return df
    out, pooled = [], []
    for group, sub in df.groupby("group", sort=False):
        pooled.append(sub)
        row = {p: sub[p].iloc[0] for p in row_params}
        if "data" in sub and "data" not in row:  # the data source, beside the dataset's name
            at = list(row).index("dataset") + 1 if "dataset" in row else 0
            items = list(row.items())
            row = dict([*items[:at], ("data", sub["data"].iloc[0]), *items[at:]])
        row.update({k: sub[k].iloc[0] for k in KEY_COLUMNS if k in sub and k not in row})
        row.update({k: sub[k].iloc[0] for k in ("series", "family") if k in sub})
        row["seeds"] = len(sub)
        if "devices" in sub:  # what the timings and cost columns ran on (not a key: accuracies do not depend on it)
            row["devices"] = ", ".join(sorted({str(d) for d in sub["devices"] if isinstance(d, str)}))
        row.update({k: sub[k].iloc[0] for k in ("construction", *CONSTRUCTION_VALUES) if k in sub})
        present = [c for c in value_cols if c in sub]
        low, high = stats.bootstrap_mean_intervals(sub[present].to_numpy(dtype=float), **INTERVALS) if present \
            else ([], [])
        bounds = dict(zip(present, zip(low, high)))
        for col in value_cols:
            row[f"{col}_mean"], row[f"{col}_std"] = metrics.mean_std(sub[col].dropna()) if col in sub else (
                float("nan"), float("nan"))
            row[f"{col}_low"], row[f"{col}_high"] = (float(v) for v in bounds.get(col, (float("nan"), float("nan"))))
        leak = leakage_note(sub)
        quick = QUICK_NOTE if "quick" in sub and (sub["quick"] == QUICK_NOTE).any() else ""
        notes = [leak, _sanity(sub) if "classes" in sub else "", quick]
        if "classes" in sub or "leakage" in sub:
            row["sanity"] = "; ".join(n for n in notes if n)
        # a set holding test images is never ranked as a result, nor a number of an earlier definition
        row["unranked"] = UNRANKED_LEAK if leak else stale_note(sub)
        row["config"] = group[:8]
        row["runs"] = " ".join(dict.fromkeys(sub["run_id"])) if "run_id" in sub else ""
        out.append(row)
    board = pd.DataFrame(out)
    keys = [p for p in (*row_params, *SPLIT_TAGS) if p in board]
    for column in SET_TAGS:
        if column in board and not board.duplicated(subset=keys, keep=False).any():
            board = board.drop(columns=column)  # no two rows differ by their set only
    if not board.duplicated(subset=keys + [c for c in SET_TAGS if c in board], keep=False).any():
        board = board.drop(columns="config")
    ranked = bool(descending) and descending in df  # a board without its score (no cell computed it) is not ranked
    if ranked:
        board = _rank_groups(board, pooled, descending)
    flagged = board["unranked"] != ""
    if not flagged.any():
        board = board.drop(columns="unranked")
    order = [*sort, *(["unranked"] if flagged.any() else []), *([f"{descending}_mean"] if ranked else [])]
    if order:  # the rows left out of the ranking below the ranked ones of their block, with their reason
        board = board.sort_values(order, ascending=[True] * (len(order) - ranked) + ([False] if ranked else []),
                                  na_position="last", kind="stable")
    return board.reset_index(drop=True)


def row_names(board: pd.DataFrame, base: str = "method") -> list[str]:
    """A name per row: the method, and where one method has several rows (two recipes, two sets,
    two precisions) what tells them apart, so that no table or plot takes two rows for one."""
    names = list(board[base].astype(str))
    for column in ("config", "precision", *SET_TAGS):
        if len(set(names)) == len(names):
            break
        if column in board:
            names = [f"{n} [{str(c)[:8]}]" for n, c in zip(names, board[column])]
    if len(set(names)) < len(names):  # nothing left to tell them apart: number them
        seen: dict[str, int] = {}
        out = []
        for n in names:
            seen[n] = seen.get(n, 0) + 1
            out.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
        names = out
    return names


def _rank_groups(board: pd.DataFrame, pooled: list[pd.DataFrame], score: str,
                 higher_is_better: bool = True) -> pd.DataFrame:
    """``rank`` and ``tied_with`` of every row on ``score`` (``pooled[i]``: row i's per-seed values)
    among the rows it is compared with (the same ``family`` at the same IPC: one setting, every
    method), from paired comparisons of
    the per-seed scores (:func:`ddlib.scores.stats.paired_difference`, by seed, at :data:`INTERVALS`'s
    level). Rows are named by method (and config where one method has two rows)."""
    board = board.copy()
    board["rank"], board["tied_with"] = pd.array([pd.NA] * len(board), dtype="Int64"), ""
    block_keys = [k for k in ("family", "ipc", "ipcs") if k in board]
    if "method" not in board or not block_keys:
        return board
    for _, block in board.groupby(block_keys, sort=False, dropna=False):
        index = list(block.index)
        names = row_names(block)
        seeds = [pooled[i] for i in index]
        left_out = [bool(board.at[i, "unranked"]) if "unranked" in board else False for i in index]
        estimates = [float("nan") if out else float(s[score].mean()) for s, out in zip(seeds, left_out)]

        def different(i, j):
            a, b = seeds[i].dropna(subset=[score]), seeds[j].dropna(subset=[score])
            if a.empty or b.empty:  # a row without the score (NaN by rule, e.g. CREI from one attack) ranks nowhere
                return False
            return stats.paired_difference(a[score].to_numpy(), b[score].to_numpy(), seeds_a=list(a["seed"]),
                                           seeds_b=list(b["seed"]), **INTERVALS).significant

        ranked = stats.rank_groups(names, estimates, different, higher_is_better)
        scored = [e == e for e in estimates]  # NaN estimates: no rank, tied with no one
        board.loc[index, "rank"] = [r if ok else pd.NA for r, ok in zip(ranked["rank"], scored)]
        unscored = {name for name, ok in zip(names, scored) if not ok}
        board.loc[index, "tied_with"] = [", ".join(n for n in t if n not in unscored) if ok else ""
                                         for t, ok in zip(ranked["tied_with"], scored)]
    # the per-seed scores themselves (the CSV's raw data; the summary's rank stability across seeds)
    board[f"{score}_per_seed"] = [json.dumps({str(int(s)): float(v) for s, v in zip(sub["seed"], sub[score])
                                              if pd.notna(v)}) for sub in pooled]
    return board


def rank_caption(score: str, seeds=None) -> str:
    """What the ``rank`` and ``tied_with`` columns mean, for a table's caption (``seeds``: the seed
    counts of its rows, for the caveat: :func:`ddlib.scores.stats.seed_caveat`)."""
    return (f"rank: 1 + the rows whose {score.upper()} is significantly higher (paired by seed, "
            f"{100 * INTERVALS['level']:g} % bootstrap interval of the difference excludes 0); equal ranks and "
            f"'tied with' are not significantly different. {stats.describe_method(**INTERVALS, seeds=seeds)}.")
