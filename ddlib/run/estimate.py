"""Per cell of a grid: whether it runs, what it reuses and trains (models, image-epochs) and its
minutes, from the model of its work (:mod:`ddlib.run.work`) and what the store holds (see :mod:`ddlib.run.plan`
for the rules). The runner tags each cell with its estimate (:func:`estimates`); the dry run
(:mod:`ddlib.run.plan`) prints them. Reads the store, writes nothing to it (the machine's calibration
goes to the ddlib cache); imports nothing of the runner."""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field, replace

from ddlib.protocols.cell import TRAININGS_TAG, cell_tags, role_stem, run_name
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker

__all__ = ["CellPlan", "Count", "Machine", "FIRST_RUN", "plan_cell", "estimates", "Store", "SHARED_ROLES", "IPC_FREE_ROLES"]

# Evaluations that do not depend on the method's set: trained once per setting (and IPC, seed).
SHARED_ROLES = ("rdm", "real", "full", "teacher")
FIRST_RUN = "no earlier run of this recipe: from its work at this machine's measured rates"  # a first run's basis
IPC_FREE_ROLES = ("real", "full", "teacher")  # ... and not on the IPC either


@dataclass
class CellPlan:
    """One cell of a grid as the dry run sees it: whether it runs, what it reuses and trains, its minutes."""

    name: str
    params: dict
    action: str  # "run" | "skip"
    reuse: list[str] = field(default_factory=list)  # roles (and seeds) expected to come from the store
    train: list[str] = field(default_factory=list)
    minutes: float | None = None  # estimate; None: neither an earlier run of this recipe nor a model of its work
    basis: str = ""  # what the estimate rests on
    count: Count | None = None  # models needed, trained, image-epochs; None: not known
    work_seconds: float | None = None  # the model of its work, at this machine's rates (whatever the basis)


class Store:
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


def _references(store: Store, tags: dict, params: dict) -> tuple[str, list]:
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


def _found(store: Store, tags: dict, params: dict) -> tuple[dict[str, set], bool]:
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
    """The models a cell needs, and how many of them (and image-epochs) it trains, per role stem.
    ``tested``: models that are tested only (an lr search trained them); ``outside``: stems kept outside
    the store (selection networks in this machine's cache, teachers in experiment ``teachers``: trained
    unless an earlier cell made them)."""

    models: dict[str, int]
    trained: dict[str, int]
    image_epochs: dict[str, float]  # of the trained models
    tested: dict[str, int] = field(default_factory=dict)
    outside: dict[str, str] = field(default_factory=dict)  # stem -> where it is kept

    @property
    def total_trained(self) -> int:
        return sum(self.trained.values())

    @property
    def total_image_epochs(self) -> float:
        """Of the evaluations a cell records (``ddlib.trainings``): what earlier cells' minutes are fitted on."""
        return sum(v for s, v in self.image_epochs.items() if s not in self.outside)

    def line(self) -> str:
        from ddlib.run.work import shown_stem

        def grouped(values: dict[str, int]) -> str:
            out: dict[str, int] = {}
            for stem, n in sorted(values.items()):
                if n:
                    shown = shown_stem(stem) + (f" ({self.outside[stem]})" if stem in self.outside else "")
                    out[shown] = out.get(shown, 0) + n
            return ", ".join(f"{s} {n}" for s, n in out.items())

        reused = {s: self.models[s] - self.trained[s] - self.tested.get(s, 0) for s in self.models}
        trains, tests, reuses = grouped(self.trained), grouped(self.tested), grouped(reused)
        every = sum(self.image_epochs.values())
        return (f"{sum(self.models.values())} models; trains {self.total_trained}" + (f" ({trains})" if trains else "")
                + f" = {_amount(every)} image-epochs"
                + (f"; tests {sum(self.tested.values())} an lr search trained ({tests})" if tests else "")
                + f"; reuses {sum(reused.values())}" + (f" ({reuses})" if reuses else ""))


def _amount(value: float) -> str:
    for size, unit in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def _count(needs: dict[str, tuple[float, float]], found: dict[str, set], params: dict) -> Count:
    seeds = {str(s) for s in params.get("seeds") or []}
    available = _available(found, seeds)
    models, trained, image_epochs = {}, {}, {}
    for stem, (n, per_model) in needs.items():
        models[stem] = round(n)
        trained[stem] = max(0, models[stem] - available.get(stem, 0))
        image_epochs[stem] = trained[stem] * per_model
    return Count(models, trained, image_epochs)


def _available(found: dict[str, set], seeds: set[str]) -> dict[str, int]:
    available: dict[str, int] = {}
    for role, got in found.items():
        stem = role_stem(role)
        available[stem] = available.get(stem, 0) + len(got & seeds)
    return available


def _count_work(work: list, found: dict[str, set], params: dict) -> tuple[Count, dict[int, int]]:
    """The count of :func:`ddlib.run.work.cell_work`'s models, less those the store holds (by role stem, as
    :func:`_count`), and how many models of each training entry are made here (trained, or tested)."""
    from ddlib.run.work import Training

    available = _available(found, {str(s) for s in params.get("seeds") or []})
    count, trains = Count({}, {}, {}), {}
    for i, item in enumerate(work):
        if not isinstance(item, Training):
            continue
        stem = item.stem
        count.models[stem] = count.models.get(stem, 0) + item.models
        if item.kept != "store":
            count.outside[stem] = "cached on this machine" if item.kept == "cache" else "kept in experiment teachers"
        left = available.get(stem, 0) if item.kept == "store" else 0
        trains[i] = max(0, item.models - left)  # trained (or, for a tested-only entry, tested) here
        if item.kept == "store":
            available[stem] = max(0, left - item.models)
        if not item.trained:
            count.tested[stem] = count.tested.get(stem, 0) + trains[i]
            continue
        count.trained[stem] = count.trained.get(stem, 0) + trains[i]
        count.image_epochs[stem] = count.image_epochs.get(stem, 0) + trains[i] * item.images * item.epochs
    for stem in count.models:
        count.trained.setdefault(stem, 0)
        count.image_epochs.setdefault(stem, 0)
    return count, trains


class Machine:
    """This machine's rates for a cell's work (:mod:`ddlib.run.calibrate`): the device the cells resolve,
    the threads each gets, and the pace now against each probe's calibration."""

    def __init__(self, device=None, threads: int | None = None, budget: float = 120.0):
        import torch

        from ddlib.run.calibrate import pace
        from ddlib.engine.device import resolve_device, usable_cores

        self.device = resolve_device(device or "auto") if not isinstance(device, torch.device) else device
        env = os.environ.get("DDLIB_NUM_THREADS")
        self.threads = threads or (int(env) if env else usable_cores())
        self.budget = budget  # seconds this pass may spend calibrating probes not calibrated yet
        self.pace = pace(self.device, self.threads)
        self.pace_one = pace(self.device, 1) if self.threads != 1 else self.pace  # what single-threaded overheads go at
        self.load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        self.calibrated: list[str] = []  # probes measured by this planning pass
        self.slowest = 1.0  # the largest now/then pace ratio a rate was scaled by
        self._rates: dict = {}

    def rates(self, probe):
        from ddlib.run.calibrate import describe, rates

        if probe not in self._rates:
            found = rates(probe, self.device, self.threads, measure_missing=False)
            if found is None:
                if self.budget <= 0:
                    raise LookupError(f"{describe(probe)}: not calibrated here yet")
                started = time.perf_counter()
                self.calibrated.append(describe(probe))
                found = rates(probe, self.device, self.threads)
                self.budget -= time.perf_counter() - started
            ratio = self.pace / found.reference if found.reference > 0 else 1.0
            self.slowest = max(self.slowest, ratio)
            self._rates[probe] = replace(found, step=found.step * ratio, image=found.image * ratio,
                                         test_image=found.test_image * ratio, call=found.call * ratio,
                                         reference=self.pace)
        return self._rates[probe]

    def overhead_scale(self) -> float:
        """Single-threaded overheads (a kernel's start, the store's writes) here against the reference machine's."""
        from ddlib.run.calibrate import REFERENCE_PACE

        return max(0.25, self.pace_one / REFERENCE_PACE)

    def start_seconds(self) -> float:
        """A cell's start here (:data:`ddlib.run.calibrate.CELL_SECONDS`)."""
        from ddlib.run.calibrate import CELL_FIXED_SECONDS, CELL_SECONDS

        return CELL_FIXED_SECONDS + CELL_SECONDS * self.overhead_scale()

    def seconds(self, work: list, trained: dict[int, int] | None = None, cell: bool = True) -> float:
        """A cell's seconds: its work at these rates, and its start (:meth:`start_seconds`)."""
        from ddlib.run.calibrate import RECORD_SECONDS
        from ddlib.run.timing import seconds

        total = seconds(work, self.rates, RECORD_SECONDS * self.overhead_scale(), trained)
        return total + (self.start_seconds() if cell else 0.0)

    def describe(self) -> str:
        from ddlib.engine.device import _cpu_model

        where = _cpu_model() or "this CPU" if self.device.type == "cpu" else str(self.device)
        return (f"{where}, {self.threads} thread(s), load {self.load:.1f}"
                + (f", running {self.slowest:.1f}x slower than when calibrated" if self.slowest >= 1.15 else ""))


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


def _work(protocol: str, params: dict):
    """The model of the cell's work, or None where it cannot be built (a protocol it does not know)."""
    from ddlib.run.work import cell_work

    try:
        return cell_work(protocol, params)
    except Exception:  # noqa: BLE001 - an estimate is advice: the plan stands without it
        return None


def plan_cell(store: Store | None, protocol: str, params: dict, force: bool = False,
              machine: Machine | None = None) -> CellPlan:
    """One cell's plan: run or skip, what it reuses and trains (models, image-epochs), its minutes:
    from earlier FINISHED cells of its recipe where there are some, else from the model of its work
    (:mod:`ddlib.run.work`) at ``machine``'s rates (none given: no first-run estimate)."""
    tags = cell_tags(protocol, params)
    name = run_name(protocol, params)
    if store is not None and not force and store.finished(tags[TAG["family"]], TAG["config"], tags[TAG["config"]]):
        return CellPlan(name, params, "skip")
    plan = CellPlan(name, params, "run")
    if store is None:
        found, any_cell = {}, False
        plan.train = ["every model (empty store)"]
        basis, runs = "", []
    else:
        found, any_cell = _found(store, tags, params)
        plan.reuse, plan.train = _evaluations(found, any_cell, params)
        basis, runs = _references(store, tags, params)
    work = _work(protocol, params)
    trains = None
    if work is not None:
        plan.count, trains = _count_work(work, found, params)
    elif runs:
        needs = _needs(runs[0], params)
        plan.count = _count(needs, found, params) if needs is not None else None
    if work is not None and machine is not None:
        try:
            plan.work_seconds = machine.seconds(work, trains)
        except LookupError:
            plan.work_seconds = None
    plan.minutes = _estimate(runs, plan.count, params) if runs else None
    if plan.minutes is not None:
        how = "image-epochs" if plan.count is not None and _trained_image_epochs(runs[0]) else "minutes per seed"
        plan.basis = f"{basis}: {len(runs)} earlier run(s), by {how}{_last_time(runs)}"
    elif plan.work_seconds is not None:
        plan.minutes = plan.work_seconds / 60
        plan.basis = FIRST_RUN
    else:
        plan.basis = "no earlier run of this recipe"
    return plan


RUNNER_CALIBRATION_SECONDS = 10.0  # what the runner may spend calibrating before a grid (a dry run: more)


def estimates(tracker: Tracker, protocol: str, cells: list[dict], machine: Machine | None = None,
              threads: int | None = None) -> dict[str, float]:
    """The runner's estimate of each cell's minutes (tagged on its run when it starts, so that the
    next dry run can say how good it was): from earlier runs of its recipe, else from its work on
    this machine (calibrating what is not calibrated yet for up to :data:`RUNNER_CALIBRATION_SECONDS`,
    once per machine; a dry run calibrates the rest). ``threads``: what each cell gets (the runner's
    cores shared out between its workers)."""
    store = Store(tracker)
    out = {}
    for params in cells:
        try:
            machine = machine or Machine(params.get("device", "auto"), threads=threads, budget=RUNNER_CALIBRATION_SECONDS)
        except Exception:  # noqa: BLE001 - no device to time here (a grid for other machines): earlier runs only
            machine = None
        plan = plan_cell(store, protocol, params, force=True, machine=machine)
        if plan.minutes is not None:
            out[plan.name] = plan.minutes
    return out
