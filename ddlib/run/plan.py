"""``--dry-run``: what a grid would do, checked before anything runs.

:func:`plan_grid` validates the params file, loads every data root each cell names (a missing or
unreadable dataset fails here) and every input file (a set, a preset, teachers, a ground-truth
CSV: the runner's own :func:`ddlib.run.grid.check_cell_inputs`), then reads the store and says, per cell:

* ``run`` or ``skip`` (a FINISHED run of the same config exists);
* the evaluations it will **reuse** and those it will **train**: the random-subset and full-data
  (and teacher) models of one setting are the same for every method, so those that an earlier
  cell of the same setting (family key) trained at the same IPC (the random subset) or any IPC
  (the full data) with these seeds are reused, and every model an earlier, unfinished run of this
  cell trained (an interrupted grid). Trained means a FINISHED evaluation, whatever became of its
  cell. The store decides, not this list (an evaluation's key also holds the exact training
  tensors): read it as the expected split;
* the models it needs and trains, from the model of its work (:mod:`ddlib.run.work`): every model,
  the set's selection networks, each lr search's candidates, teachers, the full-data reference and
  shadow models included, less those the store holds;
* the time, estimated from earlier FINISHED cells of the same recipe where there are some: the same
  row (every param but the seeds), else the same setting and IPC, else the same setting (fitted on
  the image-epochs they trained, else their minutes per seed times this cell's seeds); a first run
  of a recipe from its work at this machine's rates (:mod:`ddlib.run.calibrate`: measured once per
  machine in a few seconds, scaled to its load now).

It also checks that the store can be written and that each cell's device exists here. Nothing is
written to the store and nothing is trained (a first calibration writes to the ddlib cache).
"""


from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ddlib.run.estimate import (FIRST_RUN, SHARED_ROLES, CellPlan, Count, Machine, Store, estimates,  # noqa: F401 (re-exported)
                            plan_cell)
from ddlib.specs.shown import one_line
from ddlib.store.tracking import Tracker, client

__all__ = ["CellPlan", "GridPlan", "Count", "plan_grid", "plan_cell", "estimates", "print_plan", "SHARED_ROLES"]


@dataclass
class GridPlan:
    """What ``--dry-run`` found for one params file: its cells and the data roots it checked."""

    path: str
    protocol: str
    experiment: str
    cells: list[CellPlan]
    data: list[str]  # the data roots checked, with what they hold
    notes: list[str] = field(default_factory=list)  # input files a dry run did not load, and why
    leakage: list[str] = field(default_factory=list)  # file sets that hold test images (protocols.leakage)
    machines: list[Machine] = field(default_factory=list)  # what the first-run estimates were timed on

    def minutes(self, workers: int = 1) -> float | None:
        todo = [c for c in self.cells if c.action == "run"]
        if not todo or any(c.minutes is None for c in todo):
            return None
        return sum(c.minutes for c in todo) / max(1, min(workers, len(todo)))


def plan_grid(path: str | os.PathLike, force: bool = False, workers: int = 1) -> GridPlan:
    """Validate, check every data root, input file, device and the store, and plan each cell (see
    the module docstring); first runs are timed at the threads each of ``workers`` gets."""
    from ddlib.engine.device import usable_cores
    from ddlib.run.grid import GridError, check_cell_inputs, check_cell_leakage, check_data, expand, load_grid
    from ddlib.store.errors import StoreError, check_store_writable

    spec = load_grid(path)
    cells = expand(spec)
    data = check_data(spec, cells)  # the runner's own checks: every data root, set, preset, checkpoint, ground truth
    notes = check_cell_inputs(spec, cells, run_code=False)  # a dry run unpickles nothing (trusted: true)
    leakage = check_cell_leakage(spec, cells)
    for params in cells:
        try:
            check_device_here(params.get("device", "auto"))
        except ValueError as e:
            from ddlib.protocols.cell import run_name

            raise GridError(f"{path}: cell {run_name(spec.protocol, params)}: {e}") from None
    try:
        check_store_writable()
    except StoreError as e:
        raise GridError(str(e)) from None
    tracker = _read_only_tracker(spec.experiment)
    store = Store(tracker) if tracker is not None else None
    threads = int(os.environ.get("DDLIB_NUM_THREADS") or 0) or max(1, usable_cores() // max(1, workers))
    machines: dict[str, Machine] = {}
    plans = []
    for params in cells:
        device = params.get("device", "auto")
        if device not in machines:
            machines[device] = Machine(device, threads)
        plans.append(plan_cell(store, spec.protocol, params, force=force, machine=machines[device]))
    return GridPlan(str(path), spec.protocol, spec.experiment, plans, data, notes, leakage, list(machines.values()))


def check_device_here(device: str) -> None:
    """A ValueError naming ``device`` where this machine has no such device (a dry run plans this
    machine's run: a grid for another machine's GPUs is dry-run there)."""
    import torch

    if device in (None, "auto", "cpu"):
        return
    if device == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device 'mps': this machine has no MPS device")
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        have = f"CUDA devices 0-{count - 1}" if count > 1 else ("CUDA device 0" if count else "no CUDA device")
        raise ValueError(f"device {device!r}: this machine has {have}")


class _Reader(Tracker):
    """A tracker on an existing experiment that never creates one (a dry run writes nothing)."""

    def __init__(self, experiment: str, experiment_id: str):
        self.experiment, self.client, self.experiment_id = experiment, client(), experiment_id


def _read_only_tracker(experiment: str) -> Tracker | None:
    from pathlib import Path

    from ddlib.store.paths import tracking_uri

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
    from ddlib.run.grid import GridError

    out = out or sys.stdout
    try:
        plan = plan_grid(path, force=force, workers=workers)
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
        if cell.minutes is not None and cell.work_seconds is not None and not cell.basis.startswith(FIRST_RUN):
            when += f"; its work at this machine's rates: ~{cell.work_seconds / 60:.1f} min"
        print(f"\n[run]  {cell.name}: {when}", file=out)
        print(f"  params: {_compact(cell.params)}", file=out)
        unknown = "not known: no earlier cell of this setting recorded its trainings"
        print(f"  models: {cell.count.line() if cell.count is not None else unknown}", file=out)
        print(f"  reuse:  {', '.join(cell.reuse) or 'nothing found in the store'}", file=out)
        print(f"  train:  {', '.join(cell.train)}", file=out)
    todo = sum(c.action == "run" for c in plan.cells)
    total = plan.minutes(workers)
    estimate = f"~{total:.1f} min with {workers} worker(s)" if total is not None else \
        "no time estimate for every cell (no earlier runs of their recipe, no model of their work)"
    print(f"\nwould run {todo}, skip {len(plan.cells) - todo} already finished; {estimate}", file=out)
    for machine in plan.machines:
        if machine.calibrated:
            print(f"calibrated this machine for {', '.join(machine.calibrated)} (once per machine; ddlib cache)", file=out)
        if any(c.basis.startswith(FIRST_RUN) for c in plan.cells if c.action == "run"):
            print(f"first runs timed on {machine.describe()}; the running cell's line updates its time from its own "
                  "epochs", file=out)
    return 0
