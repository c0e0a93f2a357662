"""Reading leaderboards out of MLflow: per-seed values pooled over runs, then mean and std over seeds.

Each FINISHED cell run logs its per-seed values as metric histories (step = seed). A leaderboard
row is one *group* (the cell's params without seeds): runs of the same group are pooled seed by
seed (the newest run wins a seed), so a grid that splits seeds over several runs and a grid that
lists them in one run give the same row. Scores are recomputed from the logged accuracies with the
pure functions of :mod:`ddlib.scores.metrics`, so their weights can be changed at summary time. Every row
carries ``data``, the data source its cells ran on (e.g. "CIFAR-10 (JPEG)"), so that no result on a
re-encoded copy is compared with published numbers unawares.

What else is in every board's row key, whatever the protocol (:func:`per_seed_values`):

* ``precision``: the precisions the cell's trainings ran in as resolved on its device (tag
  ``ddlib.precision``: ``auto`` is bf16 where the device computes it natively, fp32 elsewhere), so
  bf16 seeds from one machine never pool with fp32 seeds from another. It splits the row and the
  rows it is ranked with (``family``). The device kind changes no accuracy beyond what the resolved
  precision says (fp32 on a CPU and on a GPU differ by rounding only, as two seeds do), so it is not
  in the key of accuracy boards; BEARD's boards, which compare times, key the device as well.
* ``set``: the digest of the set the cell obtained (images, labels, soft labels, learned lr; tag
  ``ddlib.set_digest``, written once the set is made or loaded), so cells whose built-in method
  produced another set (a changed K-Center, a DM on another machine) are never pooled into one row.
  It splits the row only: methods' sets differ by nature and are still ranked against each other.
  The column is shown where two rows differ by nothing else.

Which cells a board reads: the FINISHED cell runs of its protocol (tag ``protocol``; one written
by hand without it counts as the protocol's there) in the experiment named after the protocol,
where the runner files them. A grid's ``experiment:`` key files them under another name;
:func:`boards_from` points every board at such an experiment instead (``ddlib summary --experiment
NAME``), each board still reading its own protocol's cells there.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pandas as pd

from ddlib.scores import metrics

from ddlib.scores import stats

from ddlib.specs import units
from ddlib.protocols.cell import CLASSES_TAG, PRECISION_TAG, SET_DIGEST_TAG
from ddlib.protocols.common import FULL_IPC
from ddlib.protocols.leakage import LEAKAGE_TAG
from ddlib.store.tracking import TAG, Tracker, client, computed_history, default_tags, per_seed_key, per_seed_names

__all__ = ["per_seed_values", "boards_from", "reading_from", "source_tags", "experiments_with_cells",
           "unknown_experiment", "nothing_on_the_boards", "cells_elsewhere", "elsewhere_note", "aggregate",
           "leakage_note", "board_score", "row_names", "rank_caption", "format_leaderboard", "log_summary",
           "SCORES", "INTERVALS", "display_format", "shown_board"]

# How every leaderboard's intervals and rank groups are made (stated in captions).
INTERVALS = {"resamples": stats.RESAMPLES, "level": stats.LEVEL, "seed": stats.SEED}

# The scores on 0-100 (every value's unit: ddlib.specs.units)
SCORES = ("lrs", "ars", "rr", "ae", "crei", "rcr", "rrm", "aem", "creim", "rcrm")
# The headline score first (each board's), then its parts, then the accuracies they come from.
VALUE_ORDER = ("lrs", "ars", "crei", "creim", "acc_aug_avg", "acc_transfer", "acc_set", "spearman",
               "hlr", "ior", "ior_aug", "ior_noaug", "rr", "ae", "rcr",
               "acc_syn_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any", "acc_rdm_hard", "acc_syn_aug",
               "acc_rdm_aug", "acc_syn_noaug", "acc_rdm_noaug")
# Class counts of cells logged before they carried the tag (ddlib.num_classes): what chance is.
KNOWN_CLASSES = {"digits": 10, "mnist": 10, "fashionmnist": 10, "cifar10": 10, "svhn": 10, "cifar100": 100,
                 "tinyimagenet": 200}


# Tags in the row key of every board: column -> tag. SPLIT_TAGS also split the rows a row is ranked
# with (family) and pooled over IPCs with (series); SET_TAGS split the row (group) only.
SPLIT_TAGS = {"precision": PRECISION_TAG}
SET_TAGS = {"set": SET_DIGEST_TAG}
KEY_COLUMNS = (*SPLIT_TAGS, *SET_TAGS)  # what aggregate() carries into the board beside the row params


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


FINISHED_CELLS = f"tags.`{TAG['kind']}` = 'cell' and attributes.status = 'FINISHED'"  # what every board reads

_SOURCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("ddlib_board_source", default=None)


@contextlib.contextmanager
def boards_from(experiment: str | None, check: bool = True) -> Iterator[None]:
    """Inside it every board reads the cells of ``experiment`` instead of its protocol's own
    experiment, each board its own protocol's cells there (tag ``protocol``; untagged cells are not
    read): the boards of a grid whose ``experiment:`` key filed its cells under that name. ``None``:
    the protocols' own experiments. ``check``: a name that holds no finished cell of a protocol is
    refused (:func:`unknown_experiment`) before anything is read."""
    if check and experiment is not None and (why := unknown_experiment(experiment)):
        raise ValueError(why)
    token = _SOURCE.set(experiment)
    try:
        yield
    finally:
        _SOURCE.reset(token)


def reading_from() -> str | None:
    """The experiment :func:`boards_from` points the boards at (None: each protocol's own)."""
    return _SOURCE.get()


def source_tags() -> dict[str, str]:
    """The tag a summary or report card run carries where its boards read another experiment."""
    return {TAG["boards_from"]: _SOURCE.get()} if _SOURCE.get() else {}


def _cells_of(experiment: str) -> tuple[str, Callable[[object], bool]]:
    """The experiment a board of ``experiment`` reads and which of its FINISHED cells: a protocol's
    board reads that protocol's cells only (tag ``protocol``), in the protocol's own experiment (where
    a cell without the tag, written by hand, is taken for the protocol's) or in the one
    :func:`boards_from` names (where it is not)."""
    from ddlib.protocols import PROTOCOLS

    if experiment not in PROTOCOLS:  # an experiment named by the caller, read as it is
        return experiment, lambda run: True
    source = _SOURCE.get()
    if source is None:
        return experiment, lambda run: run.data.tags.get(TAG["protocol"], experiment) == experiment
    return source, lambda run: run.data.tags.get(TAG["protocol"]) == experiment


def cells_elsewhere() -> dict[str, int]:
    """Finished cell runs the boards do not read: per experiment, how many of its cells are not its
    protocol's cells in its protocol's own experiment (or in the experiment :func:`boards_from`
    names). A grid's ``experiment:`` key files its cells under another name; every board reads its
    protocol's cells of one experiment only, so such cells are seen in the MLflow UI, not here."""
    from ddlib.protocols import PROTOCOLS

    read = _SOURCE.get()
    found = {}
    for name, cells in _finished_cells().items():
        if name == read:
            continue
        if read is None and name in PROTOCOLS:  # its own protocol's cells are on a board
            _, on_board = _cells_of(name)
            cells = [run for run in cells if not on_board(run)]
        if cells:
            found[name] = len(cells)
    return found


def experiments_with_cells() -> dict[str, int]:
    """Every experiment that holds finished cell runs of a protocol (tag ``protocol``), with how many."""
    from ddlib.protocols import PROTOCOLS

    counts = {name: sum(run.data.tags.get(TAG["protocol"]) in PROTOCOLS for run in cells)
              for name, cells in _finished_cells().items()}
    return {name: n for name, n in counts.items() if n}


def _finished_cells() -> dict[str, list]:
    """Every experiment's FINISHED cell runs, by experiment name."""
    mlflow_client = client()
    return {experiment.name: mlflow_client.search_runs([experiment.experiment_id], FINISHED_CELLS, max_results=10000)
            for experiment in mlflow_client.search_experiments()}


def unknown_experiment(experiment: str) -> str | None:
    """Why the boards cannot be read from ``experiment`` (it holds no finished cell of a protocol),
    as one line naming the experiments that do; None where it can."""
    known = experiments_with_cells()
    if experiment in known:
        return None
    return (f"no finished cells of a protocol in MLflow experiment {experiment!r}; experiments with finished cells: "
            f"{', '.join(repr(k) for k in sorted(known)) or 'none'}")


def nothing_on_the_boards(what: str) -> str:
    """The one line a command prints when its boards are empty: where finished cells are, if anywhere."""
    found = cells_elsewhere()
    if found:
        return elsewhere_note(found, f"{what}: no finished runs on the boards")
    read = _SOURCE.get()
    return (f"{what}: no finished runs yet" + (f" in experiment {read!r}" if read else "")
            + " (python -m ddlib run params/demo.yaml)")


def elsewhere_note(found: dict[str, int], lead: str = "not on these boards") -> str:
    """One line naming the experiments of :func:`cells_elsewhere` ("" where there are none)."""
    if not found:
        return ""
    listed = ", ".join(f"{name!r} ({n} cell{'s' * (n != 1)})" for name, n in sorted(found.items()))
    read = (f"the boards read experiment {_SOURCE.get()!r}" if _SOURCE.get()
            else "the boards read each protocol's cells in its own experiment")
    return (f"{lead}: finished cells in experiment(s) {listed}; {read} (the boards of another: --experiment NAME; "
            "every cell: `python -m ddlib ui`)")


def per_seed_values(experiment: str, keys: Sequence[str] = (), row_params: Sequence[str] = (),
                    match: Callable[[str], bool] | None = None, row_tags: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per (group, seed) of FINISHED cell runs: the newest run's value of each of ``keys``
    (a seed missing one of them is left out) and of every other per-seed metric whose name
    ``match`` accepts (missing ones are NaN), next to the run's ``row_params`` and ``row_tags``
    (column -> tag). Columns ``group``, ``series`` (the group without the IPC) and ``family`` (the
    series without the method: what the methods are compared within) say which cells belong together;
    the ``row_tags`` and :data:`SPLIT_TAGS` values (the resolved precision) are part of all three
    (runs on another device are another row), the :data:`SET_TAGS` value (the set's digest) of
    ``group`` only (see the module docstring)."""
    mlflow_client = client()
    experiment, on_board = _cells_of(experiment)
    found = mlflow_client.get_experiment_by_name(experiment)
    if found is None:
        return pd.DataFrame()
    cells = [run for run in mlflow_client.search_runs([found.experiment_id], filter_string=FINISHED_CELLS,
                                                      order_by=["attributes.start_time ASC"], max_results=50000)
             if on_board(run)]
    wanted = {run.info.run_id: (*keys, *(k for k in per_seed_names(run) if match and match(k) and k not in keys))
              for run in cells}
    _read_histories(mlflow_client, cells, wanted)
    rows: dict[tuple, dict] = {}
    for run in cells:  # oldest first: newer runs overwrite a seed
        tags = run.data.tags
        split = "".join(f"|{tags.get(tag)}" for tag in (*(row_tags or {}).values(), *SPLIT_TAGS.values()))
        group = tags.get(TAG["group"], run.info.run_id) + split + "".join(f"|{tags.get(t)}" for t in SET_TAGS.values())
        history = {k: _history(mlflow_client, run, k) for k in wanted[run.info.run_id]}
        seeds = set().union(*(h.keys() for h in history.values())) if history else set()
        for seed in sorted(seeds):
            if not all(seed in history[k] for k in keys):
                continue
            row = {"group": group, "series": tags.get(TAG["series"], group) + split,
                   "family": tags.get(TAG["family"], group) + split,
                   "seed": seed, "run_id": run.info.run_id, "data": tags.get(TAG["data"]),
                   "classes": _classes(run), "leakage": tags.get(LEAKAGE_TAG), "devices": tags.get(TAG["device_name"]),
                   "quick": QUICK_NOTE if tags.get(TAG["quick"]) else "",
                   "revision": tags.get(TAG["revision"]), "protocol": tags.get(TAG["protocol"], experiment)}
            row.update({p: _param(run, p) for p in row_params})
            row.update({column: tags.get(tag) for column, tag in (row_tags or {}).items()})
            row.update({column: tags.get(tag) for column, tag in {**SPLIT_TAGS, **SET_TAGS}.items()})
            row.update({k: history[k].get(seed, float("nan")) for k in history})
            rows[(group, seed)] = row
    return pd.DataFrame(list(rows.values()))


_HISTORIES: dict[tuple, dict[int, float]] = {}  # (store, run, its end time, key) -> {step: value}


BULK_RUNS = 500  # run ids per query of a bulk history read (SQLite allows 32,766 bound parameters)


def _history_key(mlflow_client, run, key: str) -> tuple:
    return (mlflow_client.tracking_uri, run.info.run_id, run.info.end_time, per_seed_key(run, key))


def _history(mlflow_client, run, key: str) -> dict[int, float]:
    """A FINISHED cell run's per-seed values of ``key`` ({seed: value}, in computed units whichever
    units the run holds: :func:`ddlib.store.tracking.computed_history`), read once per process: a summary
    builds each leaderboard several times (the weight sweeps, stability, plots) from the same runs,
    and a finished run's history does not change (its end time is part of the key, in case it is
    finished again)."""
    cache_key = _history_key(mlflow_client, run, key)
    if cache_key not in _HISTORIES:
        if len(_HISTORIES) > 200_000:
            _HISTORIES.clear()
        _HISTORIES[cache_key] = {m.step: m.value
                                 for m in mlflow_client.get_metric_history(run.info.run_id, per_seed_key(run, key))}
    return computed_history(run, key, _HISTORIES[cache_key])


def _read_histories(mlflow_client, runs, wanted: dict[str, Sequence[str]]) -> None:
    """Read the histories :func:`_history` will ask for (``wanted``: run id -> keys) in one query per
    metric and :data:`BULK_RUNS` runs, where the store is a SQL database (MLflow's
    ``get_metric_history_bulk``, which has no client method): a board of the demo's 10 cells read
    about 430 histories one query each. Values and their order (timestamp, step, value: the last
    value of a step wins) are those of ``get_metric_history``. Other stores (a tracking server's REST
    API, files) are read run by run, as before."""
    store = getattr(getattr(mlflow_client, "_tracking_client", None), "store", None)
    bulk = getattr(store, "get_metric_history_bulk", None)
    if bulk is None:
        return
    by_key: dict[str, list] = {}  # the stored name (per_seed/<key>, or <key> in runs before it) -> its runs
    for run in runs:
        for key in wanted.get(run.info.run_id, ()):
            if _history_key(mlflow_client, run, key) not in _HISTORIES:
                by_key.setdefault(per_seed_key(run, key), []).append(run)
    if sum(map(len, by_key.values())) + len(_HISTORIES) > 200_000:
        _HISTORIES.clear()
    for key, key_runs in by_key.items():
        for start in range(0, len(key_runs), BULK_RUNS):
            chunk = key_runs[start:start + BULK_RUNS]
            found: dict[str, dict[int, float]] = {run.info.run_id: {} for run in chunk}
            for entry in bulk(list(found), key, max_results=2**31 - 1):
                found[entry.run_id][entry.step] = entry.value
            for run in chunk:
                _HISTORIES[(mlflow_client.tracking_uri, run.info.run_id, run.info.end_time, key)] = found[run.info.run_id]


def _classes(run) -> float:
    """The cell's class count (its tag, else the dataset's known count, else NaN: no sanity flag)."""
    value = run.data.tags.get(CLASSES_TAG) or KNOWN_CLASSES.get(run.data.params.get("dataset", ""))
    return float(value) if value else float("nan")


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
    from ddlib.protocols.spec import ProtocolLoadError, get_spec

    try:
        current = get_spec(str(sub["protocol"].iloc[0])).revision
        revisions = {int(r) for r in sub["revision"] if r is not None and not (isinstance(r, float) and math.isnan(r))}
    except (KeyError, ValueError, TypeError, ImportError, ProtocolLoadError):  # not installed here; a hand-written tag
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


def board_score(name: str) -> str | None:
    """The value a board ranks by: its protocol spec says (:class:`ddlib.protocols.spec.Board`), so the
    ranking, the report card's headline and rank stability use one and the same."""
    from ddlib.protocols.spec import board_specs

    return board_specs()[name][1].score


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
HIDDEN = ("seeds", "series", "family", "runs", "rank", "tied_with", "sanity", "leakage", "unranked")
# A row pooling a quick cell (ddlib score --quick: one seed, few epochs) says so in its sanity column.
QUICK_NOTE = "quick look (ddlib score --quick): not a result"
# What a board's rank says of a row left out of the ranking: its set holds test (or validation) images.
UNRANKED_LEAK = "not ranked: the set holds test images"
UNRANKED_STALE = "not ranked: computed under revision {revision} (the protocol is at {current}): rerun the cell"
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
