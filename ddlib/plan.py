"""``--dry-run``: what a grid would do, checked before anything runs.

:func:`plan_grid` validates the params file, loads every data root each cell names (a missing or
unreadable dataset fails here) and every input file (a set, a preset, teachers, a ground-truth
CSV: the runner's own :func:`ddlib.runner.check_cell_inputs`), then reads the store and says, per cell:

* ``run`` or ``skip`` (a FINISHED run of the same config exists);
* the evaluations it will **reuse** and those it will **train**: the random-subset and full-data
  (and teacher) models of one setting are the same for every method, so those that an earlier
  cell of the same setting (family key) trained at the same IPC (the random subset) or any IPC
  (the full data) with these seeds are reused, and every model an earlier, unfinished run of this
  cell trained (an interrupted grid). Trained means a FINISHED evaluation, whatever became of its
  cell. The store decides, not this list (an evaluation's key also holds the exact training
  tensors): read it as the expected split;
* the time, estimated from earlier FINISHED cells of the same recipe: the same row (every param
  but the seeds), else the same setting and IPC, else the same setting: their minutes per seed,
  times this cell's seeds. Cells with no earlier run of their recipe say "no estimate".

Nothing is written to the store and nothing is trained.
"""


from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ddlib.estimate import SHARED_ROLES, CellPlan, Count, Store, estimates, plan_cell  # noqa: F401 (re-exported)
from ddlib.shown import one_line
from ddlib.tracking import Tracker, client

__all__ = ["CellPlan", "GridPlan", "Count", "plan_grid", "plan_cell", "estimates", "print_plan", "SHARED_ROLES"]


@dataclass
class GridPlan:
    path: str
    protocol: str
    experiment: str
    cells: list[CellPlan]
    data: list[str]  # the data roots checked, with what they hold
    notes: list[str] = field(default_factory=list)  # input files a dry run did not load, and why
    leakage: list[str] = field(default_factory=list)  # file sets that hold test images (protocols.leakage)

    def minutes(self, workers: int = 1) -> float | None:
        todo = [c for c in self.cells if c.action == "run"]
        if not todo or any(c.minutes is None for c in todo):
            return None
        return sum(c.minutes for c in todo) / max(1, min(workers, len(todo)))


def plan_grid(path: str | os.PathLike, force: bool = False) -> GridPlan:
    """Validate, check every data root and input file, and plan each cell (see the module docstring)."""
    from ddlib.runner import check_cell_inputs, check_cell_leakage, check_data, expand, load_grid

    spec = load_grid(path)
    cells = expand(spec)
    data = check_data(spec, cells)  # the runner's own checks: every data root, set, preset, checkpoint, ground truth
    notes = check_cell_inputs(spec, cells, run_code=False)  # a dry run unpickles nothing (trusted: true)
    leakage = check_cell_leakage(spec, cells)
    tracker = _read_only_tracker(spec.experiment)
    store = Store(tracker) if tracker is not None else None
    plans = [plan_cell(store, spec.protocol, params, force=force) for params in cells]
    return GridPlan(str(path), spec.protocol, spec.experiment, plans, data, notes, leakage)


class _Reader(Tracker):
    """A tracker on an existing experiment that never creates one (a dry run writes nothing)."""

    def __init__(self, experiment: str, experiment_id: str):
        self.experiment, self.client, self.experiment_id = experiment, client(), experiment_id


def _read_only_tracker(experiment: str) -> Tracker | None:
    from pathlib import Path

    from ddlib.tracking import tracking_uri

    uri = tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return None  # no store yet: nothing ran, nothing to reuse (and none is created)
    found = client().get_experiment_by_name(experiment)
    return _Reader(experiment, found.experiment_id) if found is not None else None


def _compact(params: dict) -> str:
    import json

    shown = {k: v for k, v in params.items() if v not in (None, {}, []) and k not in ("run_id",)}
    return json.dumps(shown, default=str, separators=(", ", ": "))


def print_plan(path: str | os.PathLike, workers: int = 1, force: bool = False, out=None) -> int:
    """Print :func:`plan_grid`'s plan; exit status 0, or 2 with the error (nothing ran)."""
    from ddlib.runner import GridError

    out = out or sys.stdout
    try:
        plan = plan_grid(path, force=force)
    except GridError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        print("dry run: stopped before anything ran", file=sys.stderr)
        return 2
    from ddlib.protocols.spec import get_spec

    spec = get_spec(plan.protocol)
    print(f"dry run of {plan.path}: protocol {plan.protocol} ({spec.title}, revision {spec.revision}: "
          f"{spec.summary}), experiment {plan.experiment!r}, {len(plan.cells)} cell(s); nothing runs", file=out)
    for line in plan.data:
        print(f"data ok: {line}", file=out)
    for note in plan.notes:
        print(f"input file {note}", file=out)
    print("input files ok (every set, preset, checkpoint and ground truth loaded"
          + (", but those above)" if plan.notes else ")"), file=out)
    for line in plan.leakage:
        print(f"warning: test images in a set: {line}; the run flags it, --strict refuses it", file=out)
    for cell in plan.cells:
        if cell.action == "skip":
            print(f"\n[skip] {cell.name}: already FINISHED (--force reruns it)", file=out)
            continue
        when = f"~{cell.minutes:.1f} min ({cell.basis})" if cell.minutes is not None else cell.basis
        print(f"\n[run]  {cell.name}: {when}", file=out)
        print(f"  params: {_compact(cell.params)}", file=out)
        unknown = "not known: no earlier cell of this setting recorded its trainings"
        print(f"  models: {cell.count.line() if cell.count is not None else unknown}", file=out)
        print(f"  reuse:  {', '.join(cell.reuse) or 'nothing found in the store'}", file=out)
        print(f"  train:  {', '.join(cell.train)}", file=out)
    todo = sum(c.action == "run" for c in plan.cells)
    total = plan.minutes(workers)
    estimate = f"~{total:.1f} min with {workers} worker(s)" if total is not None else \
        "no time estimate for every cell (no earlier runs of their recipe)"
    print(f"\nwould run {todo}, skip {len(plan.cells) - todo} already finished; {estimate}", file=out)
    return 0

