"""How fast this machine trains and tests, and so what a cell's work (:mod:`ddlib.run.work`) costs here:
the rates, measured in a few seconds and cached, and what one training or pass costs at them
(:func:`ddlib.run.timing.seconds` adds up a cell), and the
arithmetic peak ``bench/roofline.py`` reports.

A **probe** is what a rate depends on besides the machine: the architecture, the input shape, the
classes, the augmentation and the precision. Its :class:`Rates` come from timing the one training
loop (:func:`ddlib.engine.train.train_and_test`) on random images at a small and a large batch
(``seconds per step = step + batch x image``, the line through the two), a test pass's seconds per
image, and what one call costs beyond its steps (building the model, preparing the test set).
Measured once per machine (CPU model and flags, torch's version, kernel-path caps, GPUs:
:func:`ddlib.engine.device.machine_identity`), device, thread count and probe, cached in
``$DDLIB_CACHE/calibration.json``; a probe costs 0.3-3 s the first time.

**Pace**: the machine's load changes, and a rate measured on a quiet machine would promise too much
on a busy one (two threads each on two cores shared with six other processes ran 7x slower, not
4x). Every rate is stored with the time a fixed reference workload (:func:`pace`: ConvNet steps on
8x8 images for a second) took when it was measured; an estimate times that reference again and
scales the rates by now / then. The load average is recorded beside them.

**Costs** (:func:`seconds`): per model ``epochs x (steps x step + images x image) + scored images x
test image + call``, per pass its images' gradient and forward passes, per record written
:data:`RECORD_SECONDS`, and a cell's start (:data:`CELL_FIXED_SECONDS`, :data:`CELL_SECONDS`). A
running cell measures its own pace against the same arithmetic (:func:`ddlib.run.timing.running_plan`,
:func:`epoch_unit`, :mod:`ddlib.store.progress`).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

__all__ = ["Probe", "Rates", "rates", "pace", "peak", "best_seconds", "calibration_key", "forward_flops", "describe",
           "training_seconds", "passes_seconds", "cached_rates", "epoch_unit", "CELL_FIXED_SECONDS",
           "CELL_SECONDS", "RECORD_SECONDS", "REFERENCE_PACE", "CALIBRATION_FILE",
           "REVISION"]

REVISION = 2  # of what a probe measures: bump when the measurement changes, so stale rates are not read
CALIBRATION_FILE = "calibration.json"
TARGET_STEP_FLOPS = 2e10  # the large batch of a probe: about this much arithmetic per step (a fraction of a second)
TARGET_SECONDS = 0.3  # each timed run of a probe lasts about this long


# --------------------------------------------------------------------------- the peak (bench/roofline.py)

CONV_SHAPES = ((3, 32), (128, 16), (128, 8))  # ConvNet-3 on 32x32 images: (input channels, side) per layer


def best_seconds(fn, repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` after one warm-up (primitive creation, allocator)."""
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def peak(dtype: torch.dtype, batch: int = 1024) -> dict:
    """GFLOP/s of 3x3 convolutions at ConvNet-3's layer shapes (forward, no autograd) and of a
    2048x2048 matrix product in ``dtype`` at the current thread count, and their best: a favourable
    peak (the roofline's bound)."""
    rows = {}
    with torch.no_grad():
        for cin, side in CONV_SHAPES:
            x = torch.randn(batch, cin, side, side).to(dtype)
            w = torch.randn(128, cin, 3, 3).to(dtype)
            flops = 2 * batch * 128 * side * side * cin * 9
            rows[f"conv {cin}->128 at {side}x{side}"] = flops / best_seconds(
                lambda: torch.nn.functional.conv2d(x, w, padding=1)) / 1e9
        a, b = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
        rows["matmul 2048"] = 2 * 2048 ** 3 / best_seconds(lambda: a @ b) / 1e9
    return {"gflops": {k: round(v, 1) for k, v in rows.items()}, "best_gflops": round(max(rows.values()), 1)}


# --------------------------------------------------------------------------- probes and their rates


@dataclass(frozen=True)
class Probe:
    """What a training's speed depends on besides the machine. ``augment`` is the augmentation's
    canonical name (``hook.name``, what a cell's hook carries), ``spec`` the spec it is built from
    (JSON; what a measurement needs: a cell only looks rates up)."""

    model: str
    shape: tuple[int, int, int]  # channels, height, width
    classes: int
    precision: str = "fp32"  # resolved (never "auto")
    augment: str = "none"
    model_kwargs: str = "{}"  # JSON
    spec: str | None = field(default=None, compare=False)

    def key(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "spec"}, sort_keys=True)


@dataclass
class Rates:
    """Seconds, as measured: per optimisation step beyond its images (``step``), per training image
    (``image``), per test image (``test_image``) and per call (``call``: model, optimizer, test set);
    ``reference``: what :func:`pace` took at the time, ``load``: the 1-minute load average."""

    step: float
    image: float
    test_image: float
    call: float
    reference: float
    load: float = 0.0
    measured: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))


def calibration_key(device: torch.device, threads: int) -> str:
    """The machine, device and thread count a rate belongs to (a home folder may be shared by machines)."""
    from ddlib.engine.device import machine_identity

    return json.dumps({"revision": REVISION, **machine_identity(), "device": str(device), "threads": threads},
                      sort_keys=True)


def _cache_file() -> Path:
    from ddlib.store.cache import cache_dir

    return cache_dir() / CALIBRATION_FILE


_READ: dict = {}  # per process: the cache file's content, by its path and modification time


def _read() -> dict:
    path = _cache_file()
    try:
        stamp = (str(path), path.stat().st_mtime_ns)
        if _READ.get("stamp") != stamp:
            data = json.loads(path.read_text())
            _READ.update(stamp=stamp, data=data if isinstance(data, dict) else {})
        return _READ["data"]
    except (OSError, ValueError):
        return {}


def _write(machine: str, probe: Probe, rates: Rates) -> None:
    """Add one probe's rates to the cache file (atomically: parallel processes never read half a file)."""
    data = json.loads(json.dumps(_read()))  # a copy: the per-process one stays as read
    data.setdefault(machine, {})[probe.key()] = {k: v for k, v in asdict(rates).items()}
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:  # an estimate is advice: an unwritable cache measures again next time
        pass


class _Threads:
    """Run at ``threads`` torch threads, then restore the process's count."""

    def __init__(self, threads: int):
        self.threads, self.before = threads, torch.get_num_threads()

    def __enter__(self):
        torch.set_num_threads(self.threads)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


_PACE: dict[tuple[str, int], float] = {}  # per process: the reference, timed once


PACE_SECONDS = 1.0  # how long the reference workload is timed for


def pace(device: torch.device, threads: int, fresh: bool = False) -> float:
    """Seconds of the reference workload now: ten SGD steps of the 8x8 ConvNet on 32 images at
    ``threads`` threads, the mean of steps timed for about :data:`PACE_SECONDS` (at least 3, at most
    200: a busy machine is timed in a few seconds too; the mean, not the median, counts the stalls a
    busy machine deals out). Timed once per process (``fresh``: again)."""
    key = (str(device), threads)
    if fresh or key not in _PACE:
        from ddlib.models import create_model

        with _Threads(threads):
            net = create_model("convnet", 1, 10, (8, 8)).to(device)
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            x, y = torch.randn(32, 1, 8, 8, device=device), torch.arange(32, device=device) % 10

            def step():
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)

            step()
            steps, began = 0, time.perf_counter()
            while steps < 200 and (steps < 3 or time.perf_counter() - began < PACE_SECONDS):
                step()
                steps += 1
        _PACE[key] = 10 * (time.perf_counter() - began) / steps
    return _PACE[key]


def forward_flops(probe: Probe) -> float:
    """Forward FLOPs per image of a probe's model (:func:`ddlib.scores.beyond_accuracy.flops_per_image`; NaN where the
    meta device cannot run it)."""
    from ddlib.scores.beyond_accuracy import flops_per_image
    from ddlib.models import create_model

    kwargs = json.loads(probe.model_kwargs)
    c, h, w = probe.shape
    return flops_per_image(lambda: create_model(probe.model, c, probe.classes, (h, w), **kwargs), probe.shape)


def describe(probe: Probe) -> str:
    """A probe in a few words: ``convnet 1x8x8`` (``+ dsa`` with an augmentation)."""
    return f"{probe.model} {'x'.join(map(str, probe.shape))}" + (
        f" + {probe.augment.split('(')[0]}" if probe.augment != "none" else "")


def _time_call(probe: Probe, device: torch.device, n: int, batch: int, epochs: int, test: int) -> tuple[float, float, float]:
    """(train seconds, test seconds, whole call seconds) of one ``train_and_test`` on random images."""
    from ddlib.engine.augment import create_augment
    from ddlib.engine.recipe import Recipe
    from ddlib.engine.train import train_and_test

    g = torch.Generator().manual_seed(0)
    x = torch.rand((n, *probe.shape), generator=g)
    y = torch.arange(n) % probe.classes
    tx = torch.rand((test, *probe.shape), generator=g)
    ty = torch.arange(test) % probe.classes
    c = probe.shape[0]
    mean, std = [0.5] * c, [0.25] * c
    if probe.augment != "none" and probe.spec is None:
        raise ValueError(f"probe {probe.key()}: measuring it needs its augmentation's spec")
    augment = create_augment(json.loads(probe.spec), mean=mean, std=std, num_classes=probe.classes) \
        if probe.augment != "none" else None
    recipe = Recipe(epochs=epochs, batch_size=batch, precision=probe.precision, scheduler="none",
                    eval_batch_size=max(1, test))
    start = time.perf_counter()
    (result,) = train_and_test(probe.model, x, y, tx, ty, num_classes=probe.classes, mean=mean, std=std, recipe=recipe,
                               seeds=[0], augment=augment, device=device, model_kwargs=json.loads(probe.model_kwargs),
                               batched="sequential")
    return result.train_seconds, result.eval_seconds, time.perf_counter() - start


def measure(probe: Probe, device: torch.device, threads: int) -> Rates:
    """Time ``probe`` here: steps at a small and a large batch (the large one about
    :data:`TARGET_STEP_FLOPS` of arithmetic), each run long enough to last about :data:`TARGET_SECONDS`."""
    forward = forward_flops(probe)
    forward = forward if forward == forward and forward > 0 else 1e8  # the meta device cannot run it: a middling guess
    large = int(min(256, max(8, TARGET_STEP_FLOPS / (3 * forward))))
    small = max(1, min(8, large // 4))
    test = int(min(1024, max(16, TARGET_STEP_FLOPS / forward)))
    with _Threads(threads):
        reference = pace(device, threads, fresh=True)
        per_step = {}
        for batch in (small, large):
            train, _, _ = _time_call(probe, device, batch, batch, 2, 16)  # warm-up, and how long a step takes
            epochs = int(min(200, max(2, TARGET_SECONDS / max(train / 2, 1e-6))))
            train, test_seconds, call = _time_call(probe, device, batch, batch, epochs, test)
            per_step[batch] = train / epochs
        image = max(0.0, (per_step[large] - per_step[small]) / (large - small))
        step = max(0.0, per_step[small] - small * image)
    return Rates(step=step, image=image, test_image=test_seconds / test, call=max(0.0, call - train - test_seconds),
                 reference=reference, load=os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)


def rates(probe: Probe, device: torch.device, threads: int, measure_missing: bool = True) -> Rates | None:
    """The probe's rates on this machine at ``threads`` threads: from the cache, else measured now
    (and cached), else None (``measure_missing=False``)."""
    machine = calibration_key(device, threads)
    stored = _read().get(machine, {}).get(probe.key())
    if stored is not None:
        try:
            return Rates(**stored)
        except TypeError:  # an older layout: measure again
            pass
    if not measure_missing:
        return None
    found = measure(probe, device, threads)
    _write(machine, probe, found)
    return found


# Seconds beyond the models: a one-cell ``ddlib run``'s start (its imports and checks, the kernel's start
# and imports, the cell's run, its set's logging and store writes) is CELL_FIXED_SECONDS plus
# CELL_SECONDS scaled by pace() here at one thread against REFERENCE_PACE; one evaluation's record (an
# MLflow run with its metrics, series and confusion matrix) or cached result is RECORD_SECONDS, scaled
# the same. Fitted on the cells of bench/estimate_accuracy.py on a 2-core Zen 3 EPYC shared with other
# work (load 1.5-3.5: 31-44 s beyond the models; load 5-7: 60-75 s).
CELL_FIXED_SECONDS = 20.0
CELL_SECONDS = 18.0
RECORD_SECONDS = 0.2
REFERENCE_PACE = 0.25


# --------------------------------------------------------------------------- what work costs (ddlib.run.work)


def training_seconds(t, r: Rates, teacher_rates: list[Rates] = ()) -> float:
    """One model of a :class:`ddlib.run.work.Training`: its training (if it trains), its test pass and what a
    call costs; ``teacher_rates``: of the teachers relabelling its batches online."""
    test = t.scored_on * r.test_image * t.scale + r.call
    if not t.trained:
        return test
    steps = math.ceil(t.images / max(1, t.batch_size))
    per_epoch = (steps * r.step + t.images * r.image * t.scale) * t.gradient_passes
    per_epoch += sum(t.images * tr.test_image for tr in teacher_rates)
    return t.epochs * per_epoch + test


def passes_seconds(p, r: Rates) -> float:
    """One :class:`ddlib.run.work.Passes`: its images' gradient and forward passes, and its steps."""
    return p.images * (p.gradients * r.image + p.forwards * r.test_image) + p.steps * r.step


# --------------------------------------------------------------------------- a running cell (ddlib.store.progress)


def cached_rates(device):
    """Rates as calibrated here, in units of the reference workload's time then (so that rates
    measured under different loads add up); LookupError for a probe never calibrated here."""
    threads = torch.get_num_threads()

    def rates_of(probe: Probe) -> Rates:
        found = rates(probe, device, threads, measure_missing=False)
        if found is None or found.reference <= 0:
            raise LookupError(probe.key())
        k = 1 / found.reference
        return replace(found, step=found.step * k, image=found.image * k, test_image=found.test_image * k,
                       call=found.call * k, reference=1.0)

    return rates_of


def epoch_unit(model: str, shape, classes: int, images: int, recipe, augment_name: str, model_kwargs: dict | None,
               objective_name: str, device) -> float | None:
    """One model-epoch of a training call, in the units of :func:`ddlib.run.timing.running_plan` (None: not calibrated here)."""
    found = re.search(r"steps=(\d+)", objective_name or "")
    try:
        probe = Probe(model, tuple(shape), classes, recipe.precision, augment_name or "none",
                      json.dumps(model_kwargs or {}, sort_keys=True))
        r = cached_rates(device)(probe)
    except Exception:  # noqa: BLE001 - progress is advice: never a reason for a training to fail
        return None
    passes = 1 + (int(found.group(1)) if found and objective_name != "standard" else 0)
    return (math.ceil(images / max(1, recipe.batch_size)) * r.step + images * r.image) * passes
