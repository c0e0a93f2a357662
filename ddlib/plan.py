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

import json
import os
import statistics
import sys
from dataclasses import dataclass, field

from ddlib.protocols.cell import TRAININGS_TAG, cell_tags, role_stem, run_name
from ddlib.shown import one_line
from ddlib.tracking import TAG, Tracker, client

__all__ = ["CellPlan", "GridPlan", "Count", "plan_grid", "plan_cell", "estimates", "print_plan", "SHARED_ROLES"]

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
    count: Count | None = None  # models needed, trained, image-epochs; None: no earlier cell recorded its trainings


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


class _Store:
    """One planning pass's reads of the store, each made once: the cell runs of a setting (any
    status, newest first) and the FINISHED evaluations of a cell run."""

    def __init__(self, tracker: Tracker):
        self.tracker, self._cells, self._children = tracker, {}, {}

    def cells(self, family: str) -> list:
        if family not in self._cells:
            self._cells[family] = self.tracker.client.search_runs(
                [self.tracker.experiment_id],
                filter_string=f"tags.`{TAG['family']}` = '{family}' and tags.`{TAG['kind']}` = 'cell'",
                order_by=["attributes.start_time DESC"], max_results=1000)
        return self._cells[family]

    def finished(self, family: str, tag: str | None = None, value: str | None = None) -> list:
        return [r for r in self.cells(family) if r.info.status == "FINISHED" and (tag is None or r.data.tags.get(tag) == value)]

    def evaluations(self, cell_run_id: str) -> list:
        if cell_run_id not in self._children:
            self._children[cell_run_id] = self.tracker.client.search_runs(
                [self.tracker.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{cell_run_id}' and "
                                                            f"attributes.status = 'FINISHED' and tags.`{TAG['kind']}` = 'eval'",
                max_results=10000)
        return self._children[cell_run_id]


def _minutes(run) -> float | None:
    if run.info.end_time and run.info.start_time:
        return (run.info.end_time - run.info.start_time) / 60000
    return None


def _seeds(run) -> list:
    try:
        return list(json.loads(run.data.params.get("seeds", "[]")))
    except ValueError:
        return []


def _trainings(run) -> dict | None:
    """What a finished cell trained and reused per role (``ddlib.trainings``; cells before it: None)."""
    try:
        value = json.loads(run.data.tags.get(TRAININGS_TAG, ""))
    except ValueError:
        return None
    return value if isinstance(value, dict) and value else None


def _references(store: _Store, tags: dict, params: dict) -> tuple[str, list]:
    """The earlier FINISHED cells of this recipe, the closest first found: this row (every param but
    the seeds), else this setting at this IPC, else this setting (newest first)."""
    family = store.finished(tags[TAG["family"]])
    same_ipc = [r for r in family if r.data.params.get("ipc") == str(params.get("ipc"))]
    for basis, runs in (("this row", [r for r in family if r.data.tags.get(TAG["group"]) == tags[TAG["group"]]]),
                        ("this setting at this IPC", same_ipc), ("this setting", family)):
        runs = [r for r in runs if _minutes(r) is not None]
        if runs:
            return basis, runs
    return "", []


def _needs(reference, params: dict) -> dict[str, tuple[float, float]] | None:
    """Per role stem, the models this cell needs and the image-epochs of one, from what ``reference``
    recorded: scaled to this cell's seeds, and to its IPC for the roles that train on a set."""
    trainings = _trainings(reference)
    if trainings is None:
        return None
    seeds = len(params.get("seeds") or [0]) / (len(_seeds(reference)) or 1)
    ipc, ref_ipc = params.get("ipc"), _int(reference.data.params.get("ipc"))
    out = {}
    for stem, t in trainings.items():
        per_model = t["image_epochs"] / max(1, t["models"])
        if not stem.startswith(IPC_FREE_ROLES) and ipc and ref_ipc:
            per_model *= ipc / ref_ipc
        out[stem] = (t["models"] * seeds, per_model)
    return out


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _found(store: _Store, tags: dict, params: dict) -> tuple[dict[str, set], bool]:
    """The FINISHED evaluations a rerun of this cell would find, by role: those of earlier cells of
    this setting whether the cells finished or not (a grid interrupted after 24 trainings left
    them). Any role of an earlier run of this very cell (the same config: the same set), the shared
    roles of its siblings (the random subset at this IPC, the full data and teachers at any).
    Also whether the setting has any cell at all."""
    found: dict[str, set] = {}
    cells = store.cells(tags[TAG["family"]])
    for cell in cells:
        same_cell = cell.data.tags.get(TAG["config"]) == tags[TAG["config"]]
        same_ipc = cell.data.params.get("ipc") == str(params.get("ipc"))
        for child in store.evaluations(cell.info.run_id):
            role = child.data.tags.get(TAG["role"], "")
            if not same_cell and (not role.startswith(SHARED_ROLES) or ("-lr" in role and not same_ipc)
                                  or not (role.startswith(IPC_FREE_ROLES) or same_ipc)):
                continue
            found.setdefault(role, set()).add(child.data.params.get("seed"))
    return found, bool(cells)


def _evaluations(found: dict[str, set], any_cell: bool, params: dict) -> tuple[list[str], list[str]]:
    """(reused, trained) roles, as lines."""
    seeds = {str(s) for s in params.get("seeds") or []}
    reuse = sorted(f"{role} (seeds {', '.join(sorted(got & seeds))})" for role, got in found.items() if got & seeds)
    shared_missing = [r for r, got in found.items() if seeds - got]
    train = ["the set's own models"] + sorted(f"{r} (seeds {', '.join(sorted(seeds - found[r]))})"
                                             for r in shared_missing)
    if not any_cell:
        train = ["every model (no earlier cell of this setting)"]
    return reuse, train


@dataclass
class Count:
    """The models a cell needs, and how many of them (and image-epochs) it trains, per role stem."""

    models: dict[str, int]
    trained: dict[str, int]
    image_epochs: dict[str, float]  # of the trained models

    @property
    def total_trained(self) -> int:
        return sum(self.trained.values())

    @property
    def total_image_epochs(self) -> float:
        return sum(self.image_epochs.values())

    def line(self) -> str:
        trains = ", ".join(f"{s} {n}" for s, n in sorted(self.trained.items()) if n)
        reused = {s: self.models[s] - self.trained[s] for s in self.models}
        reuses = ", ".join(f"{s} {n}" for s, n in sorted(reused.items()) if n)
        return (f"{sum(self.models.values())} models; trains {self.total_trained}" + (f" ({trains})" if trains else "")
                + f" = {_amount(self.total_image_epochs)} image-epochs; reuses {sum(reused.values())}"
                + (f" ({reuses})" if reuses else ""))


def _amount(value: float) -> str:
    for size, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def _count(needs: dict[str, tuple[float, float]], found: dict[str, set], params: dict) -> Count:
    seeds = {str(s) for s in params.get("seeds") or []}
    available: dict[str, int] = {}
    for role, got in found.items():
        stem = role_stem(role)
        available[stem] = available.get(stem, 0) + len(got & seeds)
    models, trained, image_epochs = {}, {}, {}
    for stem, (n, per_model) in needs.items():
        models[stem] = round(n)
        trained[stem] = max(0, models[stem] - available.get(stem, 0))
        image_epochs[stem] = trained[stem] * per_model
    return Count(models, trained, image_epochs)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """minutes = a + b x image-epochs trained, least squares over earlier cells (a, b >= 0); through
    the origin with one point (or image-epochs that do not vary)."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if len(points) >= 2 and max(xs) > min(xs):
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        if b > 0 and my - b * mx >= 0:
            return my - b * mx, b
    total = sum(xs)
    return 0.0, (sum(ys) / total if total else 0.0)


def _estimate(runs: list, count: Count | None, params: dict) -> float | None:
    """Minutes, calibrated on ``runs`` (earlier FINISHED cells of this recipe): against the image-epochs
    they trained where they recorded them and this cell's count is known; else their minutes per
    seed (median) times this cell's seeds."""
    points = [(_trained_image_epochs(r), _minutes(r)) for r in runs]
    points = [(x, y) for x, y in points if x is not None]
    if count is not None and points and any(x > 0 for x, _ in points):
        a, b = _fit(points)
        return a + b * count.total_image_epochs
    per_seed = [_minutes(r) / (len(_seeds(r)) or 1) for r in runs]
    return statistics.median(per_seed) * len(params.get("seeds") or [0]) if per_seed else None


def _trained_image_epochs(run) -> float | None:
    trainings = _trainings(run)
    return None if trainings is None else float(sum(t.get("trained_image_epochs", 0) for t in trainings.values()))


def _last_time(runs: list) -> str:
    """How good the estimate was for the newest earlier cell that recorded one."""
    for run in runs:
        estimate = run.data.tags.get(TAG["estimate"])
        if estimate:
            return f"; last time ({run.info.run_name}) estimated {float(estimate):.1f} min, took {_minutes(run):.1f}"
    return ""


def plan_cell(store: _Store | None, protocol: str, params: dict, force: bool = False) -> CellPlan:
    """One cell's plan: run or skip, what it reuses and trains (models, image-epochs), its minutes."""
    tags = cell_tags(protocol, params)
    name = run_name(protocol, params)
    if store is None:
        return CellPlan(name, params, "run", train=["every model (empty store)"], basis="no earlier run of this recipe")
    finished = not force and store.finished(tags[TAG["family"]], TAG["config"], tags[TAG["config"]])
    plan = CellPlan(name, params, "skip" if finished else "run")
    if plan.action == "skip":
        return plan
    found, any_cell = _found(store, tags, params)
    plan.reuse, plan.train = _evaluations(found, any_cell, params)
    basis, runs = _references(store, tags, params)
    needs = _needs(runs[0], params) if runs else None
    plan.count = _count(needs, found, params) if needs is not None else None
    plan.minutes = _estimate(runs, plan.count, params)
    if plan.minutes is None:
        plan.basis = "no earlier run of this recipe"
    else:
        how = "image-epochs" if plan.count is not None and _trained_image_epochs(runs[0]) else "minutes per seed"
        plan.basis = f"{basis}: {len(runs)} earlier run(s), by {how}{_last_time(runs)}"
    return plan


def estimates(tracker: Tracker, protocol: str, cells: list[dict]) -> dict[str, float]:
    """The runner's estimate of each cell's minutes (tagged on its run when it starts, so that the
    next dry run can say how good it was)."""
    store = _Store(tracker)
    out = {}
    for params in cells:
        plan = plan_cell(store, protocol, params, force=True)
        if plan.minutes is not None:
            out[plan.name] = plan.minutes
    return out


def plan_grid(path: str | os.PathLike, force: bool = False) -> GridPlan:
    """Validate, check every data root and input file, and plan each cell (see the module docstring)."""
    from ddlib.runner import check_cell_inputs, check_cell_leakage, check_data, expand, load_grid

    spec = load_grid(path)
    cells = expand(spec)
    data = check_data(spec, cells)  # the runner's own checks: every data root, set, preset, checkpoint, ground truth
    notes = check_cell_inputs(spec, cells, run_code=False)  # a dry run unpickles nothing (trusted: true)
    leakage = check_cell_leakage(spec, cells)
    tracker = _read_only_tracker(spec.experiment)
    store = _Store(tracker) if tracker is not None else None
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

