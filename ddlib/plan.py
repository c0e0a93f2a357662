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
import statistics
import sys
from dataclasses import dataclass, field

from ddlib.protocols.cell import cell_tags, run_name
from ddlib.shown import one_line
from ddlib.tracking import TAG, Tracker, client

__all__ = ["CellPlan", "GridPlan", "plan_grid", "print_plan", "SHARED_ROLES"]

# Evaluations that do not depend on the method's set: trained once per setting (and IPC, seed).
SHARED_ROLES = ("rdm", "real", "full", "teacher")
IPC_FREE_ROLES = ("real", "full", "teacher")  # ... and not on the IPC either


@dataclass
class CellPlan:
    name: str
    params: dict
    action: str  # "run" | "skip"
    reuse: list[str] = field(default_factory=list)  # roles (and seeds) expected to come from the store
    train: list[str] = field(default_factory=list)
    minutes: float | None = None  # estimate; None: no earlier run of this recipe
    basis: str = ""  # what the estimate rests on


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


def _cells_with(tracker: Tracker, tag: str, value: str) -> list:
    return tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{tag}` = '{value}' and attributes.status = 'FINISHED' "
                                               f"and tags.`{TAG['kind']}` = 'cell'", max_results=1000)


def _minutes_per_seed(runs) -> list[float]:
    out = []
    for run in runs:
        seeds = len(_seeds(run)) or 1
        if run.info.end_time and run.info.start_time:
            out.append((run.info.end_time - run.info.start_time) / 60000 / seeds)
    return out


def _seeds(run) -> list:
    import json

    try:
        return list(json.loads(run.data.params.get("seeds", "[]")))
    except ValueError:
        return []


def _estimate(tracker: Tracker, tags: dict, params: dict) -> tuple[float | None, str]:
    seeds = len(params.get("seeds") or [0])
    same_ipc = [r for r in _cells_with(tracker, TAG["family"], tags[TAG["family"]])
                if r.data.params.get("ipc") == str(params.get("ipc"))]
    for basis, runs in (("this row", _cells_with(tracker, TAG["group"], tags[TAG["group"]])),
                        ("this setting at this IPC", same_ipc),
                        ("this setting", _cells_with(tracker, TAG["family"], tags[TAG["family"]]))):
        per_seed = _minutes_per_seed(runs)
        if per_seed:
            return statistics.median(per_seed) * seeds, f"{basis}: {len(per_seed)} earlier run(s)"
    return None, "no earlier run of this recipe"


def _family_cells(tracker: Tracker, family: str) -> list:
    """Every cell run of a setting, whatever its status: an interrupted (KILLED) or failed cell's
    FINISHED evaluations are in the store, and a rerun reuses them."""
    return tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{TAG['family']}` = '{family}' and tags.`{TAG['kind']}` = 'cell'",
        max_results=1000)


def _finished_evaluations(tracker: Tracker, cell_run_id: str) -> list:
    return tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{cell_run_id}' and attributes.status = "
                                               f"'FINISHED' and tags.`{TAG['kind']}` = 'eval'", max_results=10000)


def _evaluations(tracker: Tracker, tags: dict, params: dict) -> tuple[list[str], list[str]]:
    """(reused, trained) roles: the FINISHED evaluations of earlier cells of this setting, whether
    those cells finished or not (a grid interrupted after 24 trainings left them). Any role of an
    earlier run of this very cell (the same config: the same set), the shared roles of its siblings
    (the random subset at this IPC, the full data and teachers at any)."""
    found: dict[str, set] = {}
    cells = _family_cells(tracker, tags[TAG["family"]])
    for cell in cells:
        same_cell = cell.data.tags.get(TAG["config"]) == tags[TAG["config"]]
        same_ipc = cell.data.params.get("ipc") == str(params.get("ipc"))
        for child in _finished_evaluations(tracker, cell.info.run_id):
            role = child.data.tags.get(TAG["role"], "")
            if not same_cell and (not role.startswith(SHARED_ROLES) or ("-lr" in role and not same_ipc)
                                  or not (role.startswith(IPC_FREE_ROLES) or same_ipc)):
                continue
            found.setdefault(role, set()).add(child.data.params.get("seed"))
    seeds = {str(s) for s in params.get("seeds") or []}
    reuse = sorted(f"{role} (seeds {', '.join(sorted(got & seeds))})" for role, got in found.items() if got & seeds)
    shared_missing = [r for r, got in found.items() if seeds - got]
    train = ["the set's own models"] + sorted(f"{r} (seeds {', '.join(sorted(seeds - found[r]))})"
                                             for r in shared_missing)
    if not cells:
        train = ["every model (no earlier cell of this setting)"]
    return reuse, train


def plan_grid(path: str | os.PathLike, force: bool = False) -> GridPlan:
    """Validate, check every data root and input file, and plan each cell (see the module docstring)."""
    from ddlib.runner import check_cell_inputs, check_cell_leakage, check_data, expand, load_grid

    spec = load_grid(path)
    cells = expand(spec)
    data = check_data(spec, cells)  # the runner's own checks: every data root, set, preset, checkpoint, ground truth
    notes = check_cell_inputs(spec, cells, run_code=False)  # a dry run unpickles nothing (trusted: true)
    leakage = check_cell_leakage(spec, cells)
    tracker = _read_only_tracker(spec.experiment)
    plans = []
    for params in cells:
        tags = cell_tags(spec.protocol, params)
        name = run_name(spec.protocol, params)
        finished = tracker is not None and not force and _cells_with(tracker, TAG["config"], tags[TAG["config"]])
        plan = CellPlan(name, params, "skip" if finished else "run")
        if tracker is not None and plan.action == "run":
            plan.reuse, plan.train = _evaluations(tracker, tags, params)
            plan.minutes, plan.basis = _estimate(tracker, tags, params)
        elif plan.action == "run":
            plan.train, plan.basis = ["every model (empty store)"], "no earlier run of this recipe"
        plans.append(plan)
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
        print(f"  reuse:  {', '.join(cell.reuse) or 'nothing found in the store'}", file=out)
        print(f"  train:  {', '.join(cell.train)}", file=out)
    todo = sum(c.action == "run" for c in plan.cells)
    total = plan.minutes(workers)
    estimate = f"~{total:.1f} min with {workers} worker(s)" if total is not None else \
        "no time estimate for every cell (no earlier runs of their recipe)"
    print(f"\nwould run {todo}, skip {len(plan.cells) - todo} already finished; {estimate}", file=out)
    return 0

