"""Leaderboards as files (CSV, Markdown, LaTeX) with what made each row: recipe, epochs, data source,
code version; and the list of cell runs (``ddlib runs``).

A leaderboard row pools the cell runs of one configuration; two rows that differ only in their
training recipe used to be told apart by a hash (``config``). The export reads the row's runs back
and names the recipe itself: ``recipe`` (the grid's recipe as logged, ``{}`` for the protocol's
defaults), ``epochs`` (what the distilled set was trained for: the preset's epochs, or
``preset_epochs``, or the recipe's), ``real_epochs`` (the full-data reference's, where the protocol
has one), ``data_source`` (where the real data was read from) and ``code`` (ddlib's version and
git commit of every run in the row).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pandas as pd

from ddlib.boards.read import param
from ddlib.boards.table import format_leaderboard, shown_board
from ddlib.report.runs import list_cell_runs  # noqa: F401 (re-exported)
from ddlib.store.tags import TAG
from ddlib.store.tracking import client

__all__ = ["FORMATS", "RECIPE_COLUMNS", "recipe_columns", "row_recipe", "export_tables", "write_export", "list_cell_runs"]

FORMATS = ("csv", "markdown", "latex")
RECIPE_COLUMNS = ("recipe", "epochs", "real_epochs", "data_source", "code")
SKIPPED_BOARDS = ("eps_curves",)  # not one row per configuration (one per attack strength)


def _epochs(run) -> int | str | None:
    """The epochs the set was trained for: ``preset_epochs``, else the preset's own, else the recipe's."""
    if param(run, "preset_epochs") not in (None, "None"):
        return int(param(run, "preset_epochs"))
    preset = param(run, "preset")
    if preset not in (None, "None"):
        try:
            from ddlib.protocols.presets import load_preset

            return int(load_preset(preset).recipe.epochs)
        except Exception:  # noqa: BLE001 - a preset file moved since: say which preset
            return f"preset {preset}"
    return _recipe_epochs(run, "recipe")


def _mapping(run, name: str) -> dict | None:
    """A mapping param as logged (``recipe``), or None where the run has no such param."""
    value = param(run, name)
    value = json.loads(value) if isinstance(value, str) else value
    return value if isinstance(value, dict) else None


def _recipe_epochs(run, key: str, base: str | None = None) -> int | None:
    """The epochs of the recipe ``key`` (over ``base``'s keys, as the protocol merges them)."""
    from ddlib.engine.recipe import Recipe

    values = _mapping(run, key)
    if values is None:
        return None
    try:
        return Recipe.from_dict({**((_mapping(run, base) or {}) if base else {}), **values}).epochs
    except (ValueError, TypeError):
        return None


def _join(values: Iterable) -> str:
    seen = [str(v) for v in dict.fromkeys(v for v in values if v not in (None, ""))]
    return "; ".join(seen)


def recipe_columns(run_ids: Iterable[str]) -> dict[str, str]:
    """The recipe columns of one leaderboard row, from its cell runs (values that differ between the
    runs are joined with "; ")."""
    mlflow_client = client()
    runs = [mlflow_client.get_run(r) for r in run_ids if r]
    recipes = []
    for run in runs:
        value = _mapping(run, "recipe")
        recipes.append(None if value is None else json.dumps(value, sort_keys=True) if value else "{} (defaults)")
    commits = [f"{run.data.tags.get(TAG['version'], '?')} ({run.data.tags.get(TAG['commit'], 'unknown')[:12]})"
               for run in runs]
    real = [_recipe_epochs(run, "real_recipe", base="recipe") for run in runs]
    return {
        "recipe": _join(recipes),
        "epochs": _join(_epochs(run) for run in runs),
        "real_epochs": _join(real),
        "data_source": _join(run.data.tags.get(TAG["data_source"]) for run in runs),
        "code": _join(commits),
    }


def _recipe_summary(run) -> str | None:
    """A row's recipe in a few words: the preset's name (and its ``preset_epochs``), else the grid's
    recipe as ``key value`` pairs, "defaults" for the protocol's own."""
    preset = param(run, "preset")
    if preset not in (None, "None", ""):
        return f"preset {preset}"
    value = _mapping(run, "recipe")
    if value is None:
        return None
    return ", ".join(f"{k} {json.dumps(v) if isinstance(v, (dict, list)) else v}" for k, v in sorted(value.items())) \
        or "defaults"


def row_recipe(run_ids: Iterable[str]) -> dict[str, str]:
    """``recipe`` (:func:`_recipe_summary`) and ``epochs`` of one leaderboard row, for the site and the
    report cards (values that differ between the row's runs are joined with "; ")."""
    mlflow_client = client()
    runs = [mlflow_client.get_run(r) for r in run_ids if r]
    return {"recipe": _join(_recipe_summary(run) for run in runs), "epochs": _join(_epochs(run) for run in runs)}


def _with_recipe(board: pd.DataFrame) -> pd.DataFrame:
    """``board`` with the recipe columns after its row parameters (before the values)."""
    if board.empty or "runs" not in board:
        return board
    extra = pd.DataFrame([recipe_columns(str(r).split()) for r in board["runs"]], index=board.index)
    extra = extra.loc[:, [c for c in RECIPE_COLUMNS if (extra[c] != "").any()]]
    values = [i for i, c in enumerate(board.columns) if c.endswith(("_mean", "_std", "_low", "_high"))]
    at = values[0] if values else len(board.columns)
    return pd.concat([board.iloc[:, :at], extra, board.iloc[:, at:]], axis=1)


def export_tables(boards=None, names: Iterable[str] | None = None, formatted: bool = True) -> dict[str, pd.DataFrame]:
    """Every non-empty leaderboard (or those ``names``) with the recipe columns; ``formatted``: as
    the summary prints them (mean ± std as text), else the numbers (``_mean``, ``_std``, ``_low``,
    ``_high``: the CSV's), both in the units of :mod:`ddlib.specs.units` (accuracies in %, ...)."""
    if boards is None:
        from ddlib.report.boards import load_boards

        boards = load_boards()
    wanted = list(names) if names else [n for n in boards.tables if n not in SKIPPED_BOARDS]
    unknown = sorted(set(wanted) - set(boards.tables) - {"published"})
    if unknown:
        raise ValueError(f"unknown leaderboard(s) {unknown}; known: {sorted(boards.tables)}")
    out = {}
    for name in wanted:
        board = boards[name]
        if board.empty:
            continue
        table = _with_recipe(board)
        if formatted and any(c.endswith("_mean") for c in table.columns):
            keys = [c for c in table.columns if not c.endswith(("_mean", "_std", "_low", "_high", "_per_seed"))
                    and c not in ("series", "family", "runs", "seeds", "rank", "tied_with", "config", "sanity", "unranked")]
            table = format_leaderboard(table, row_params=keys)
        elif not formatted:
            table = shown_board(table)
        out[name] = table.reset_index(drop=True)
    if not names or "published" in wanted:
        from ddlib.report.published import published_table

        published = published_table()  # imported rows (ddlib import): their own table, never pooled
        if not published.empty:
            out["published"] = format_leaderboard(published) if formatted else shown_board(published)
    return out


def write_export(path: str | Path, fmt: str, tables: dict[str, pd.DataFrame]) -> Path:
    """Write ``tables`` to one file: CSV (one table with a ``board`` column), Markdown (a heading and
    a pipe table per board) or LaTeX (a ``tabular`` per board, with a comment naming it)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        frames = [t.assign(board=name)[["board", *t.columns]] for name, t in tables.items()]
        (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()).to_csv(path, index=False)
        return path
    parts = []
    for name, table in tables.items():
        text = table.astype(str)
        if fmt == "markdown":
            parts.append(f"## {name}\n\n" + _markdown(text))
        else:
            parts.append(f"% leaderboard: {name}\n" + text.to_latex(index=False, escape=True))
    path.write_text("\n\n".join(parts) + "\n")
    return path


def _markdown(table: pd.DataFrame) -> str:
    """A GitHub pipe table (pandas' to_markdown needs tabulate, which is not a dependency)."""
    def cell(value: str) -> str:
        return value.replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(cell(str(c)) for c in table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([header, rule, *rows])
