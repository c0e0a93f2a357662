"""Reading a board's cells out of MLflow: per-seed values pooled over runs (imports store/ and specs/ only;
the protocols, above, tell it their names: :mod:`.known`).

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
:func:`reading` points every board at such an experiment instead (``ddlib summary --experiment
NAME``: :func:`ddlib.report.sources.boards_from`), each board still reading its own protocol's cells there.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from typing import Callable, Iterator, Sequence

import pandas as pd

from ddlib.boards import known
from ddlib.store.paths import tracking_uri
from ddlib.store.tags import CLASSES_TAG, CONSTRUCTION_TAG, LEAKAGE_TAG, PRECISION_TAG, SET_DIGEST_TAG, TAG
from ddlib.store.tracking import client, computed_history, per_seed_key, per_seed_names

__all__ = ["per_seed_values", "reading", "reading_from", "one_read", "read_once", "source_tags", "cells_of", "param",
           "FINISHED_CELLS", "KEY_COLUMNS", "SPLIT_TAGS", "SET_TAGS", "QUICK_NOTE", "construction_of",
           "CONSTRUCTION_VALUES"]

# A row pooling a quick cell (ddlib score --quick: one seed, few epochs) says so in its sanity column.
QUICK_NOTE = "quick look (ddlib score --quick): not a result"
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


def param(run, name):
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
def reading(experiment: str | None) -> Iterator[None]:
    """Inside it every board reads the cells of ``experiment`` (each board its own protocol's cells
    there) instead of its protocol's own experiment; ``None``: the protocols' own. The checked form,
    which refuses a name without finished cells: :func:`ddlib.report.sources.boards_from`."""
    token = _SOURCE.set(experiment)
    try:
        yield
    finally:
        _SOURCE.reset(token)


_BUILT: dict | None = None  # inside one_read(): (board, weights, store, experiment read) -> the board as built


@contextlib.contextmanager
def one_read() -> Iterator[None]:
    """Inside it, each board is built once per score weight: a summary builds the LRS board at the five
    sweep weights for its sweep table, again for the rank stability table, and at w = 0.5 for the board
    itself (each build reads MLflow and bootstraps the ranks). A board built after the block is read
    from MLflow afresh."""
    global _BUILT
    outer = _BUILT
    _BUILT = {} if outer is None else outer
    try:
        yield
    finally:
        _BUILT = outer


def read_once(board: str, weights: dict, build: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """``build()``, the board ``board`` at ``weights``: inside :func:`one_read` built once per store and
    experiment read, each caller getting its own copy (callers add columns to what they get)."""
    if _BUILT is None:
        return build()
    key = (board, tuple(weights.items()), tracking_uri(), reading_from())
    if key not in _BUILT:
        _BUILT[key] = build()
    return _BUILT[key].copy()


def reading_from() -> str | None:
    """The experiment :func:`reading` points the boards at (None: each protocol's own)."""
    return _SOURCE.get()


def source_tags() -> dict[str, str]:
    """The tag a summary or report card run carries where its boards read another experiment."""
    return {TAG["boards_from"]: _SOURCE.get()} if _SOURCE.get() else {}


def cells_of(experiment: str) -> tuple[str, Callable[[object], bool]]:
    """The experiment a board of ``experiment`` reads and which of its FINISHED cells: a protocol's
    board reads that protocol's cells only (tag ``protocol``), in the protocol's own experiment (where
    a cell without the tag, written by hand, is taken for the protocol's) or in the one
    :func:`reading` names (where it is not)."""
    if experiment not in known.protocols():  # an experiment named by the caller, read as it is
        return experiment, lambda run: True
    source = _SOURCE.get()
    if source is None:
        return experiment, lambda run: run.data.tags.get(TAG["protocol"], experiment) == experiment
    return source, lambda run: run.data.tags.get(TAG["protocol"]) == experiment


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
    experiment, on_board = cells_of(experiment)
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
            row.update({p: param(run, p) for p in row_params})
            row.update({column: tags.get(tag) for column, tag in (row_tags or {}).items()})
            row.update({column: tags.get(tag) for column, tag in {**SPLIT_TAGS, **SET_TAGS}.items()})
            row.update(construction_of(run))
            row.update({k: history[k].get(seed, float("nan")) for k in history})
            rows[(group, seed)] = row
    return pd.DataFrame(list(rows.values()))


CONSTRUCTION_VALUES = ("construction_seconds", "construction_flops", "construction_gpu_hours")


def construction_of(run) -> dict:
    """What the cell's set cost to make, as its run says (``ddlib.protocols.common.log_construction``): the
    numbers (:data:`CONSTRUCTION_VALUES`) and one readable ``construction`` column; {} where nothing was logged
    (a set from a file that declares nothing, or a cell run before costs were recorded)."""
    how = run.data.tags.get(CONSTRUCTION_TAG)
    if not how:
        return {}
    values = {k: run.data.metrics[k] for k in CONSTRUCTION_VALUES if k in run.data.metrics}
    device = run.data.tags.get(f"{CONSTRUCTION_TAG}.device", "")
    if how == "declared":
        text = f"{values.get('construction_gpu_hours', float('nan')):.3g} GPU h" + (f" on {device}" if device else "")
        text += " (declared)"
    else:
        text = (f"{values.get('construction_seconds', float('nan')):.1f} s, "
                f"{values.get('construction_flops', float('nan')):.3g} FLOPs" + (f" ({device})" if device else ""))
        if run.data.tags.get(f"{CONSTRUCTION_TAG}.unknown_parts"):
            text += " (at least: some cached work was not timed)"
    return {**values, "construction": text}


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


