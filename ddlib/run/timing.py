"""A cell's work in seconds: :func:`seconds` adds up :func:`ddlib.run.work.cell_work` at this machine's rates
(:mod:`ddlib.run.calibrate`) for the dry run's estimate, and :func:`hand_plan` gives a cell's kernel its running
plan for its progress line. Imports ``run.work`` and ``run.calibrate``; the kernel's part also ``protocols``."""

from __future__ import annotations

import json

from ddlib.run.calibrate import RECORD_SECONDS, REFERENCE_PACE, cached_rates, passes_seconds, training_seconds
from ddlib.run.work import Passes, cell_work, data_of

__all__ = ["seconds", "running_plan", "hand_plan"]


def seconds(work: list, rates_of, record: float = RECORD_SECONDS,
            trained: dict[int, int] | None = None) -> float:
    """Seconds of ``work`` at the rates ``rates_of(probe)`` gives (scaled to the machine's pace now):
    every model of a training (or ``trained[i]`` of entry ``i``, made here: trained, or tested; the
    others found in the store, which cost a record's read), every pass, and ``record`` seconds per
    evaluation or cached result written.
    The cell's own start (:data:`CELL_SECONDS`) is not in it."""
    total = 0.0
    for i, item in enumerate(work):
        r = rates_of(item.probe)
        if isinstance(item, Passes):
            total += passes_seconds(item, r) + item.recorded * record
            continue
        n = item.models if trained is None else trained.get(i, item.models)
        each = training_seconds(item, r, [rates_of(t) for t in item.teachers])
        total += n * (each + (record if item.recorded else 0.0)) + (item.models - n) * record
    return total


def running_plan(protocol: str, params: dict, device) -> float | None:
    """A running cell's work in reference units (:func:`ddlib.run.calibrate.cached_rates`), for its progress line; None
    where it is not known here (a protocol without a model of its work, a probe never calibrated)."""
    try:
        return seconds(cell_work(protocol, params, data_of(params), device), cached_rates(device),
                       RECORD_SECONDS / REFERENCE_PACE)
    except Exception:  # noqa: BLE001 - progress is advice
        return None


def hand_plan(protocol: str, params_json: str) -> None:
    """Run in a cell's kernel before its notebook (the worker's ``kernel_for(setup=...)``): the cell's running plan and the
    calibrated rates of its trainings into :data:`ddlib.protocols.pace.PLAN_ENV`, which the cell's progress
    line reads (protocols never import the runner). Never raises: progress is advice."""
    import os

    from ddlib.protocols.pace import PLAN_ENV, rates_key

    os.environ.pop(PLAN_ENV, None)  # a kept kernel's previous cell's plan
    try:
        from ddlib.engine.device import configure_threads, resolve_device
        from ddlib.protocols import protocol_module

        configure_threads()  # the thread count the cell trains (and was calibrated) at
        params = protocol_module(protocol).validate(json.loads(params_json))
        device = resolve_device(params.get("device", "auto"))
        rates_of = cached_rates(device)
        work, table = cell_work(protocol, params, data_of(params), device), {}
        for item in work:
            for probe in (item.probe, *getattr(item, "teachers", ())):
                try:
                    r = rates_of(probe)
                except LookupError:
                    continue
                table[rates_key(probe.model, probe.shape, probe.classes, probe.precision, probe.augment,
                                probe.model_kwargs)] = [r.step, r.image]
        try:
            total = seconds(work, rates_of, RECORD_SECONDS / REFERENCE_PACE)
        except Exception:  # noqa: BLE001 - a probe never calibrated here: no cell estimate
            total = None
        os.environ[PLAN_ENV] = json.dumps({"total": total, "rates": table})
    except Exception:  # noqa: BLE001 - progress is advice
        pass
