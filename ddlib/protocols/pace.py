"""What the runner hands a running cell for its progress line: the cell's predicted work and the
calibrated rates of its trainings, as JSON in :data:`PLAN_ENV` (written in the cell's kernel by
:func:`ddlib.run.timing.hand_plan` before the notebook runs). The cell only reads it: protocols never
import the runner's arithmetic. Imports nothing of ddlib."""

from __future__ import annotations

import json
import math
import os
import re
from functools import lru_cache

__all__ = ["PLAN_ENV", "rates_key", "planned_seconds", "epoch_unit"]

PLAN_ENV = "DDLIB_PROGRESS_PLAN"  # {"total": seconds or null, "rates": {rates_key: [step, image]}}


def rates_key(model: str, shape, classes: int, precision: str, augment: str, model_kwargs: str) -> str:
    """What a training's rates are looked up by (the fields of :class:`ddlib.run.calibrate.Probe`)."""
    return json.dumps({"model": model, "shape": [int(v) for v in shape], "classes": int(classes),
                       "precision": precision, "augment": augment or "none", "model_kwargs": model_kwargs},
                      sort_keys=True)


@lru_cache(maxsize=4)
def _parse(text: str) -> dict:
    try:
        plan = json.loads(text)
    except ValueError:
        return {}
    return plan if isinstance(plan, dict) else {}


def _plan() -> dict:
    return _parse(os.environ.get(PLAN_ENV, ""))


def planned_seconds() -> float | None:
    """The cell's work in reference units (None: not known here)."""
    total = _plan().get("total")
    return float(total) if isinstance(total, (int, float)) else None


def epoch_unit(model: str, shape, classes: int, images: int, recipe, augment_name: str, model_kwargs: dict | None,
               objective_name: str) -> float | None:
    """One model-epoch of a training call, in the plan's units (None: its rates are not in the plan)."""
    try:
        key = rates_key(model, tuple(shape), classes, recipe.precision, augment_name,
                        json.dumps(model_kwargs or {}, sort_keys=True))
        step, image = _plan().get("rates", {})[key]
    except Exception:  # noqa: BLE001 - progress is advice: never a reason for a training to fail
        return None
    found = re.search(r"steps=(\d+)", objective_name or "")
    passes = 1 + (int(found.group(1)) if found and objective_name != "standard" else 0)
    return (math.ceil(images / max(1, recipe.batch_size)) * step + images * image) * passes
