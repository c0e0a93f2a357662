"""A board as shown: values in their units (ddlib.specs.units), mean ± std or mean [interval], rank and
sanity beside; the CSV's numbers; a summary run's artifacts (imports store/, specs/; never protocols/ or report/)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Sequence

import pandas as pd

from ddlib.boards.read import source_tags
from ddlib.specs import units
from ddlib.store.provenance import default_tags
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker

__all__ = ["format_leaderboard", "display_format", "shown_board", "log_summary", "SCORES", "PER_SEED", "FULL_IPC"]

FULL_IPC = 0  # the ipc of a ``full`` cell (every image of its training split): shown as "all" on every board
# The scores on 0-100 (every value's unit: ddlib.specs.units)
SCORES = ("lrs", "ars", "rr", "ae", "crei", "rcr", "rrm", "aem", "creim", "rcrm")
# The headline score first (each board's), then its parts, then the accuracies they come from.
VALUE_ORDER = ("lrs", "ars", "crei", "creim", "acc_aug_avg", "acc_transfer", "acc_set", "spearman",
               "hlr", "ior", "ior_aug", "ior_noaug", "rr", "ae", "rcr",
               "acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any", "acc_rdm_hard", "acc_syn_aug",
               "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug")


def display_format(base: str) -> tuple[float, str]:
    """(scale, format) of a value in its shown unit (:func:`ddlib.specs.units.unit_of`: the one table of units
    the command line, MLflow, the site, the card and the exports read)."""
    unit = units.unit_of(base)
    return unit.scale, unit.fmt


def shown_board(board: pd.DataFrame) -> pd.DataFrame:
    """A board's numbers (``<value>_mean``, ``_std``, ``_low``, ``_high`` and the per-seed JSON) in
    their shown units: what the CSV export and the submission bundle write."""
    out = board.copy()
    for column in out.columns:
        scale = units.unit_of(column[: -len(PER_SEED)] if column.endswith(PER_SEED) else column).scale
        if scale == 1.0:
            continue
        if column.endswith(units.SUMMARY_SUFFIXES) and pd.api.types.is_numeric_dtype(out[column]):
            out[column] = out[column].astype(float) * scale
        elif column.endswith(PER_SEED):
            out[column] = [json.dumps({k: v * scale for k, v in json.loads(text).items()}) if isinstance(text, str)
                           else text for text in out[column]]
    return out


# shown by format_leaderboard in its own place (leakage: in sanity; unranked: in rank)
HIDDEN = ("seeds", "series", "family", "runs", "rank", "tied_with", "sanity", "leakage", "unranked",
          "construction_seconds", "construction_flops", "construction_gpu_hours")  # the cost: its readable column
PER_SEED = "_per_seed"  # <score>_per_seed: {seed: value} as JSON


def format_leaderboard(board: pd.DataFrame, row_params: Sequence[str] | None = None,
                       intervals: bool = False) -> pd.DataFrame:
    """Readable table: accuracies in percent, differences in points, scores 0-100, times in seconds,
    correlations as they are, each as mean ± std (``intervals=True``: mean [low, high], the
    bootstrap interval over seeds); then ``rank`` and ``tied with`` where the board has them."""
    if board.empty:
        return board
    bases = [c[: -len("_mean")] for c in board.columns if c.endswith("_mean")]
    keys = row_params if row_params is not None else [
        c for c in board.columns if not c.endswith(("_mean", "_std", "_low", "_high", PER_SEED)) and c not in HIDDEN]
    shown = board[[c for c in (*keys, "config", "seeds") if c in board.columns]].copy()
    shown = shown.loc[:, ~shown.columns.duplicated()]
    if "ipc" in shown:
        shown["ipc"] = ["all" if v == FULL_IPC else v for v in shown["ipc"]]
    if "rank" in board and board["rank"].notna().any() or "unranked" in board:
        left_out = board["unranked"].fillna("") if "unranked" in board else pd.Series("", index=board.index)
        ranks = board["rank"] if "rank" in board else pd.Series(pd.NA, index=board.index)
        shown["rank"] = [why or ("" if pd.isna(r) else int(r)) for r, why in zip(ranks, left_out)]
        shown["tied with"] = board["tied_with"].fillna("") if "tied_with" in board else ""
        if "sanity" in board and (board["sanity"].fillna("") != "").any():  # beside the rank: what makes a row no result
            shown["sanity"] = board["sanity"].fillna("")
    known = [b for b in VALUE_ORDER if b in bases]
    for base in known + [b for b in bases if b not in known]:
        scale, fmt = display_format(base)
        name = units.display_name(base)
        if intervals and f"{base}_low" in board:
            shown[name] = [
                "n/a" if pd.isna(m) else fmt.format(m * scale) if pd.isna(lo)
                else f"{fmt.format(m * scale)} [{fmt.format(lo * scale)}, {fmt.format(hi * scale)}]"
                for m, lo, hi in zip(board[f"{base}_mean"], board[f"{base}_low"], board[f"{base}_high"])]
        else:
            shown[name] = [
                "n/a" if pd.isna(m) else fmt.format(m * scale) if pd.isna(s)  # a published row may have no std
                else f"{fmt.format(m * scale)} ± {fmt.format(s * scale)}"
                for m, s in zip(board[f"{base}_mean"], board[f"{base}_std"])]
    if "sanity" in board and (board["sanity"].fillna("") != "").any():  # last: what makes a row no result
        shown["sanity"] = board["sanity"].fillna("")
    return shown


def log_summary(tables: dict[str, pd.DataFrame], figures: dict | None = None, experiment: str = "summary") -> str:
    """Save each table as CSV and HTML and each figure as PNG, as artifacts of a new summary run."""
    tracker = Tracker(experiment)
    run_id = tracker.start_run("summary", tags={**default_tags("summary"), TAG["kind"]: "summary", **source_tags()})
    with tempfile.TemporaryDirectory() as tmp:
        for name, table in tables.items():
            shown_board(table).to_csv(Path(tmp) / f"{name}.csv", index=False)  # numbers in ddlib.specs.units' units
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
