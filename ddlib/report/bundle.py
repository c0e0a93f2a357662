"""Results for public leaderboards: a submission bundle (``ddlib export --bundle DIR``) and published
rows read back for comparison (``ddlib import FILE``).

The bundle holds, per leaderboard row (one set under one protocol): the set's content digest, the
data label its cells ran on (e.g. "CIFAR-10 (JPEG)"), each cell run's logged config, its per-seed
values, ddlib's version and commit, and the row's mean and std; beside it the rows in the layout of
DD-Ranking's leaderboard (:data:`DDRANKING_COLUMNS`) and ddlib's own export of every board.

DD-Ranking's layout: its leaderboard space reads a data.csv of ``method, verified, date, dataset,
ipc, label_type, hlr, ior`` (:data:`LEADERBOARD_COLUMNS`, first in ``ddranking.csv``; that file is
not in its GitHub repository, so the formats of date and label_type are ddlib's reading); after
them ddlib's columns: the result keys of DD-Ranking's released ``compute_metrics``
(``ddranking==0.2.0``: ``hard_label_recovery_mean``, ..., ``augmentation_robust_score_std``) in
the units the leaderboard and the paper publish: HLR, IOR and the with/without-augmentation
differences in percentage points, LRS and ARS on 0-100. The row columns say what was scored.

Published rows (:func:`import_published`) are stored as runs of the MLflow experiment ``published``
tagged ``ddlib.kind = published``: never a cell, so no leaderboard pools them with measured rows;
``ddlib summary`` and ``ddlib export`` show them in a table of their own, labelled "published"."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ddlib.boards.read import reading_from
from ddlib.report.published import (ARS_VALUES, LRS_VALUES, PUBLISHED_EXPERIMENT, PUBLISHED_KIND,  # noqa: F401
                                     published_table)
from ddlib.specs.shown import shown

__all__ = ["DDRANKING_COLUMNS", "LEADERBOARD_COLUMNS", "PUBLISHED_EXPERIMENT", "write_bundle", "ddranking_rows",
           "import_published",
           "published_table", "read_ddranking_rows"]

BUNDLE_FORMAT = 2  # 2: values in ddlib.specs.units' shown units (accuracies in %), per-row flag and ranked
UNITS_NOTE = ("accuracies in %, HLR and IOR in points, LRS, ARS and BEARD's scores 0-100, times in seconds, "
              "membership-inference AUC 0-1 (ddlib.specs.units)")
ROW_KEY_TAG = "ddlib.published_key"  # a published row's content: importing a file twice adds nothing

# The columns of DD-Ranking's leaderboard space (its data.csv), in its order: first in ddranking.csv.
# verified: the row reproduces its method's published value (ddlib import: within 1.5 points or the seed
# interval, ddlib.scores.verify), else false; why a set is no result is in flag; date: the export's day
# (YYYY-MM-DD, UTC); label_type: hard | soft; hlr, ior: the LRS means in points (empty on ARS rows).
LEADERBOARD_COLUMNS = ("method", "verified", "date", "dataset", "ipc", "label_type", "hlr", "ior")
PEER_SYNONYMS = {"hlr": "hard_label_recovery_mean", "ior": "improvement_over_random_mean"}  # data.csv's names
ROW_COLUMNS = ("method", "dataset", "ipc", "model", "label_type", "num_eval")
VALUE_COLUMNS = tuple(f"{key}_{stat}" for key in (*LRS_VALUES, *ARS_VALUES) for stat in ("mean", "std"))
# flag: why the row is no result (the set holds test images; accuracies near chance), empty where it is one
DDRANKING_COLUMNS = (*LEADERBOARD_COLUMNS, "model", "num_eval", *VALUE_COLUMNS, "w", "gamma", "data", "source", "flag")
_ROW_SKIP = ("runs", "config", "rank", "tied_with", "series", "family", "sanity", "seeds", "unranked")


def _plain(value):
    """A JSON value: numpy scalars as Python numbers, NaN and None as null."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


# --------------------------------------------------------------------------- the bundle


def _param_value(text: str):
    """A logged param as the value it was (numbers, booleans, null, lists and mappings as YAML reads them)."""
    import yaml

    if text == "None":  # str(None), as flatten() logs it
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, list, dict, type(None))) else text


def _run_record(run_id: str) -> dict:
    """One cell run as a submission shows it: config, code, data, set digest, per-seed values."""
    from ddlib.specs import units
    from ddlib.store.tags import SET_DIGEST_TAG
    from ddlib.store.tags import TAG
    from ddlib.store.tracking import client, in_shown_units, per_seed_key, per_seed_names

    mlflow_client = client()
    run = mlflow_client.get_run(run_id)
    tags = run.data.tags
    per_seed: dict[int, dict] = {}
    shown_units = in_shown_units(run)
    for key in per_seed_names(run):  # in their shown units (ddlib.specs.units): as stored, or converted from a run before
        for m in mlflow_client.get_metric_history(run_id, per_seed_key(run, key)):
            value = m.value if shown_units else units.shown(key, m.value)
            per_seed.setdefault(int(m.step), {"seed": int(m.step)})[key] = _plain(value)
    config: dict = {}
    for key, text in sorted(run.data.params.items()):  # logged flat ("recipe.epochs"): nested again
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[leaf] = _param_value(text)
    return {"run_id": run_id, "protocol": tags.get(TAG["protocol"]), "revision": tags.get(TAG["revision"]),
            "set_digest": tags.get(SET_DIGEST_TAG), "data": tags.get(TAG["data"]),
            "data_source": tags.get(TAG["data_source"]), "device": tags.get(TAG["device_name"]),
            "code": {"version": tags.get(TAG["version"]), "commit": tags.get(TAG["commit"])},
            "config": config, "per_seed": [per_seed[s] for s in sorted(per_seed)]}


def _label_type(preset) -> str:
    """DD-Ranking's split: "hard" (hard labels) or "soft" (a preset's stored or teacher labels)."""
    if preset in (None, "None", "") or (isinstance(preset, float) and math.isnan(preset)):
        return "hard"
    try:
        from ddlib.protocols.presets import load_preset

        return "hard" if load_preset(str(preset)).label_type == "hard" else "soft"
    except Exception:  # noqa: BLE001 - a preset file gone since the run: say what is known
        return f"preset {preset}"


def ddranking_rows(tables: dict[str, pd.DataFrame], w: float = 0.5, gamma: float = 0.5) -> pd.DataFrame:
    """The ``lrs`` and ``ars`` boards (numbers in ddlib's shown units, ``_mean``/``_std``: HLR and IOR in
    points, LRS and ARS 0-100, DD-Ranking's units too) as DD-Ranking's leaderboard rows
    (:data:`DDRANKING_COLUMNS`: its space's data.csv columns first), one per board row; a score's
    columns are empty on the other's rows. ``verified`` is true where the row reproduces its method's published
    value (:func:`ddlib.report.published.with_verified`: within 1.5 points or the seed interval), else false
    (no published value, or not within it; ``flag`` says why a set is no result)."""
    rows = []
    today = datetime.now(timezone.utc).date().isoformat()
    for name, values, weight in (("lrs", LRS_VALUES, ("w", w)), ("ars", ARS_VALUES, ("gamma", gamma))):
        board = tables.get(name, pd.DataFrame())
        for _, row in board.iterrows():
            flag = _flag(row)
            verified = str(row.get("verified")) == "True"  # reproduces its published value (with_verified)
            out = {"method": row.get("method"), "verified": verified, "date": today, "dataset": row.get("dataset"),
                   "ipc": row.get("ipc"), "model": row.get("model"), "label_type": _label_type(row.get("preset")),
                   "num_eval": row.get("seeds"), weight[0]: weight[1], "data": row.get("data"), "source": "ddlib",
                   "flag": flag}
            for key, (column, _) in values.items():
                for stat in ("mean", "std"):
                    value = row.get(f"{column}_{stat}")
                    out[f"{key}_{stat}"] = None if value is None else round(float(value), 6)
            for short, long in PEER_SYNONYMS.items():
                out[short] = out.get(long)
            rows.append(out)
    return pd.DataFrame(rows, columns=list(DDRANKING_COLUMNS))


def _flag(row) -> str:
    """Why a board row is no result (its ``sanity``: the set holds test images, accuracies near chance), or ""."""
    value = row.get("sanity")
    return value if isinstance(value, str) else ""


def write_bundle(folder: str | Path, boards=None, w: float = 0.5, gamma: float = 0.5,
                 methods: list[str] | None = None) -> dict[str, Path]:
    """Write ``bundle.json`` (per row: set digest, data label, config, per-seed values, code, and its
    ``flag`` and ``ranked``: a row whose set holds test images is never ranked), ``ddranking.csv``
    (DD-Ranking's layout, with the flag) and ``leaderboards.csv`` (every board, ddlib's columns), all
    in the units of :mod:`ddlib.specs.units`. ``methods``: only the rows of these sets (methods)."""
    from ddlib.report.export import export_tables, write_export
    from ddlib.store.provenance import code_version, git_commit

    from ddlib.specs.version import VERSION

    tables = {k: v for k, v in export_tables(boards, formatted=False).items() if k != "published"}
    if methods:
        unknown = sorted(set(methods) - {str(m) for t in tables.values() if "method" in t for m in t["method"]})
        if unknown:
            raise ValueError(f"--method {', '.join(unknown)}: no finished cell of that set on any board")
        tables = {k: t[t["method"].astype(str).isin(methods)] for k, t in tables.items() if "method" in t}
        tables = {k: t for k, t in tables.items() if not t.empty}
    if not tables:
        return {}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, table in tables.items():
        if "runs" not in table:
            continue
        for _, row in table.iterrows():
            runs = [_run_record(r) for r in str(row["runs"]).split()]
            key = {c: _plain(row[c]) for c in table.columns
                   if not c.endswith(("_mean", "_std", "_low", "_high", "_per_seed"))
                   and c not in _ROW_SKIP and c not in ("recipe", "epochs", "real_epochs", "data_source", "code")}
            summary = {c: _plain(row[c]) for c in table.columns if c.endswith(("_mean", "_std"))}
            digests = sorted({r["set_digest"] for r in runs if r["set_digest"]})
            entries.append({"board": name, "row": key, "data": _plain(row.get("data")),
                            "set_digest": digests[0] if len(digests) == 1 else digests or None,
                            "seeds": _plain(row.get("seeds")), "flag": _flag(row),
                            "ranked": not (isinstance(row.get("unranked"), str) and row["unranked"]),
                            "summary": summary, "runs": runs})
    bundle = {"format": BUNDLE_FORMAT, "units": UNITS_NOTE, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "ddlib": {"version": VERSION, "commit": git_commit(), "shown": code_version()},
              "weights": {"w": w, "gamma": gamma}, **({"boards_from": reading_from()} if reading_from() else {}),
              "sets": entries}
    paths = {"bundle": folder / "bundle.json", "ddranking": folder / "ddranking.csv",
             "leaderboards": folder / "leaderboards.csv"}
    paths["bundle"].write_text(json.dumps(bundle, indent=1, default=str) + "\n")
    ddranking_rows(tables, w, gamma).to_csv(paths["ddranking"], index=False)
    write_export(paths["leaderboards"], "csv", tables)
    return paths


# --------------------------------------------------------------------------- published rows


def read_ddranking_rows(path: str | Path) -> pd.DataFrame:
    """A CSV of DD-Ranking leaderboard rows (:data:`DDRANKING_COLUMNS`, or its space's data.csv with
    ``hlr``/``ior``; extra columns are kept as they are), checked: a ValueError naming the file, row
    and column otherwise."""
    path = Path(path)
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable CSV ({e.__class__.__name__})") from None
    for short, long in PEER_SYNONYMS.items():  # DD-Ranking's own data.csv names its two values hlr, ior
        if short in table.columns and long not in table.columns:
            table[long] = table[short]
    missing = [c for c in ("method", "dataset", "ipc") if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; a row needs method, dataset, ipc and at "
                         f"least one of {', '.join(VALUE_COLUMNS)}")
    values = [c for c in VALUE_COLUMNS if c in table.columns]
    if not values:
        raise ValueError(f"{path}: no score column; expected at least one of {', '.join(VALUE_COLUMNS)}")
    for i, row in table.iterrows():
        line = i + 2  # the header is line 1
        for column in ("method", "dataset"):
            if not isinstance(row[column], str) or not row[column].strip():
                raise ValueError(f"{path}: line {line}: column {column} is empty")
        ipc = pd.to_numeric(pd.Series([row["ipc"]]), errors="coerce").iloc[0]
        if pd.isna(ipc) or ipc != int(ipc) or ipc < 1:
            raise ValueError(f"{path}: line {line}: ipc must be a positive whole number, got {shown(row['ipc'])}")
        for column in values:
            if not pd.isna(row[column]) and pd.isna(pd.to_numeric(pd.Series([row[column]]), errors="coerce").iloc[0]):
                raise ValueError(f"{path}: line {line}: {column} is not a number: {shown(row[column])}")
        if all(pd.isna(row[c]) for c in values):
            raise ValueError(f"{path}: line {line}: no score value")
    table["ipc"] = table["ipc"].astype(int)
    return table


def import_published(path: str | Path, reference: str | None = None) -> tuple[int, int]:
    """Store the rows of ``path`` (DD-Ranking's layout) as published rows: one run each in the
    ``published`` experiment (tag ``ddlib.kind = published``), its values in ddlib's units. A row
    already imported (same content) is skipped. Returns (added, skipped)."""
    from ddlib.store.hashing import config_hash
    from ddlib.store.tags import TAG
    from ddlib.store.tracking import Tracker

    path = Path(path)
    table = read_ddranking_rows(path)
    tracker = Tracker(PUBLISHED_EXPERIMENT)
    known = {r.data.tags.get(ROW_KEY_TAG) for r in tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{TAG['kind']}` = '{PUBLISHED_KIND}'", max_results=50000)}
    added = skipped = 0
    for _, row in table.iterrows():
        record = {c: _plain(row[c]) for c in table.columns if not pd.isna(row[c])}
        record["reference"] = reference or record.get("reference") or record.get("source") or path.name
        key = config_hash(record, 16)
        if key in known:
            skipped += 1
            continue
        values = {}
        for name, (column, factor) in {**LRS_VALUES, **ARS_VALUES}.items():
            for stat in ("mean", "std"):
                if f"{name}_{stat}" in record:
                    values[f"{column}_{stat}"] = float(record[f"{name}_{stat}"]) / factor
        run_id = tracker.start_run(f"published-{record['method']}-ipc{record['ipc']}",
                                   params={c: v for c, v in record.items() if c not in VALUE_COLUMNS},
                                   tags={TAG["kind"]: PUBLISHED_KIND, ROW_KEY_TAG: key,
                                         "ddlib.published_file": str(path.resolve())})
        tracker.log_metrics(run_id, values)
        tracker.end_run(run_id)
        known.add(key)
        added += 1
    return added, skipped
