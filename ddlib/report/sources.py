"""Where the boards read their cells, for the commands that read them: ``--experiment NAME`` checked
(:func:`boards_from`), and the finished cells no board reads, named in one line. Imports boards/, protocols/."""

from __future__ import annotations

import contextlib
from typing import Iterator

from ddlib.boards.read import FINISHED_CELLS, cells_of, reading, reading_from
from ddlib.protocols import PROTOCOLS
from ddlib.store.tags import TAG
from ddlib.store.tracking import client

__all__ = ["boards_from", "cells_elsewhere", "experiments_with_cells", "unknown_experiment", "nothing_on_the_boards",
           "elsewhere_note"]


@contextlib.contextmanager
def boards_from(experiment: str | None, check: bool = True) -> Iterator[None]:
    """Inside it every board reads the cells of ``experiment`` instead of its protocol's own
    experiment, each board its own protocol's cells there (tag ``protocol``; untagged cells are not
    read): the boards of a grid whose ``experiment:`` key filed its cells under that name. ``None``:
    the protocols' own experiments. ``check``: a name that holds no finished cell of a protocol is
    refused (:func:`unknown_experiment`) before anything is read."""
    if check and experiment is not None and (why := unknown_experiment(experiment)):
        raise ValueError(why)
    with reading(experiment):
        yield


def cells_elsewhere() -> dict[str, int]:
    """Finished cell runs the boards do not read: per experiment, how many of its cells are not its
    protocol's cells in its protocol's own experiment (or in the experiment :func:`boards_from`
    names). A grid's ``experiment:`` key files its cells under another name; every board reads its
    protocol's cells of one experiment only, so such cells are seen in the MLflow UI, not here."""
    read = reading_from()
    found = {}
    for name, cells in _finished_cells().items():
        if name == read:
            continue
        if read is None and name in PROTOCOLS:  # its own protocol's cells are on a board
            _, on_board = cells_of(name)
            cells = [run for run in cells if not on_board(run)]
        if cells:
            found[name] = len(cells)
    return found


def experiments_with_cells() -> dict[str, int]:
    """Every experiment that holds finished cell runs of a protocol (tag ``protocol``), with how many."""
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
    read = reading_from()
    return (f"{what}: no finished runs yet" + (f" in experiment {read!r}" if read else "")
            + " (python -m ddlib run params/demo.yaml)")


def elsewhere_note(found: dict[str, int], lead: str = "not on these boards") -> str:
    """One line naming the experiments of :func:`cells_elsewhere` ("" where there are none)."""
    if not found:
        return ""
    listed = ", ".join(f"{name!r} ({n} cell{'s' * (n != 1)})" for name, n in sorted(found.items()))
    read = (f"the boards read experiment {reading_from()!r}" if reading_from()
            else "the boards read each protocol's cells in its own experiment")
    return (f"{lead}: finished cells in experiment(s) {listed}; {read} (the boards of another: --experiment NAME; "
            "every cell: `python -m ddlib ui`)")
