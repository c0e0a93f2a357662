"""What a set cost to make: measured for the built-in methods (wall seconds, FLOPs, the machine), declared
by the user for the others (``construction: {gpu_hours: 12.5, device: A100}``). Imports torch, the engine,
the models and :mod:`ddlib.scores.beyond_accuracy` (the FLOP counter every cost column uses).

Seconds are those of the work the set needed, wherever it ran: work read from a cache (a feature network,
a score run, DM's real means or set) counts the seconds it took when it was computed (stored with it), so
a set costs the same whether its cell trained the network or found it cached. Work cached before ddlib
recorded times has no time: the record then says how many such parts it left out (``seconds`` is a
lower bound). FLOPs are counted, not timed: the networks' forward and backward passes (backward = 2 x
forward, :data:`~ddlib.scores.beyond_accuracy.TRAIN_FLOPS_PER_FORWARD`), by ``torch.utils.flop_counter``
on one image; the selection arithmetic itself (k-means, herding, sorting, strata) is not counted.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

from ddlib.scores.beyond_accuracy import TRAIN_FLOPS_PER_FORWARD, flops_per_image
from ddlib.specs.shown import shown

__all__ = ["Watch", "watch", "reused", "stored", "timed", "device_label", "forward_flops", "training_flops", "record",
           "validate_declared", "DECLARED_KEYS", "TRAIN_FLOPS_PER_FORWARD"]

DECLARED_KEYS = {"gpu_hours": "a non-negative number", "device": "a name (e.g. A100)", "note": "text (optional)"}

_local = threading.local()  # the watches open in this thread (cells of one process may run in threads)


@dataclass
class Watch:
    """Wall seconds since it started, plus the seconds of cached work read meanwhile."""

    start: float = field(default_factory=time.perf_counter)
    reused: float = 0.0
    unknown: int = 0  # cached parts read meanwhile whose time was never recorded
    stopped: float | None = None

    @property
    def seconds(self) -> float:
        return (self.stopped if self.stopped is not None else time.perf_counter()) - self.start + self.reused


def _open() -> list[Watch]:
    if not hasattr(_local, "watches"):
        _local.watches = []
    return _local.watches


@contextmanager
def watch() -> Iterator[Watch]:
    """Time a block; cached work read inside it (:func:`reused`) adds the seconds it took when computed."""
    w = Watch()
    _open().append(w)
    try:
        yield w
    finally:
        w.stopped = time.perf_counter()
        _open().remove(w)


def reused(seconds: float | None, unknown: int = 0) -> None:
    """Work read from a cache took ``seconds`` when it was computed (None: not recorded), ``unknown`` of
    its own parts untimed: every open watch counts it."""
    for w in _open():
        if seconds is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            w.unknown += 1
        else:
            w.reused += float(seconds)
            w.unknown += int(unknown)


def stored(w: Watch) -> dict:
    """What a cache entry keeps of the work that computed it (read back by :func:`timed`)."""
    return {"seconds": w.seconds, "unknown_parts": w.unknown}


def timed(payload: dict) -> dict:
    """A cached payload just read: count its recorded seconds (:func:`reused`), and return it."""
    reused(payload.get("seconds"), payload.get("unknown_parts", 0))
    return payload


def device_label(device: torch.device) -> str:
    """The machine a set was made on: the GPU's name, or the CPU's model and intra-op thread count."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    from ddlib.engine.device import machine_identity

    return f"cpu: {machine_identity()['cpu'] or 'unknown model'} x{torch.get_num_threads()} threads"


def forward_flops(model: str, dataset) -> float:
    """FLOPs of one forward of ``model`` on one image of ``dataset`` (NaN where the meta device cannot run it)."""
    from ddlib.models import create_model

    return flops_per_image(lambda: create_model(model, dataset.channels, dataset.num_classes, dataset.image_size),
                           dataset.image_shape)


def training_flops(model: str, dataset, epochs: int, models: int = 1) -> float:
    """``models`` networks trained ``epochs`` on the whole training set and tested once (what
    :func:`ddlib.engine.train.train_and_test` does): 3 x forward per training image seen + 1 per test image."""
    fwd = forward_flops(model, dataset)
    return models * fwd * (TRAIN_FLOPS_PER_FORWARD * len(dataset.train_labels) * epochs + len(dataset.test_labels))


def record(w: Watch, flops: float, device: torch.device) -> dict:
    """A built set's ``construction`` record (its provenance): seconds, FLOPs, the machine."""
    out = {"seconds": round(w.seconds, 3), "flops": float(flops), "device": device_label(device), "measured": True}
    if w.unknown:
        out["seconds_unknown_parts"] = w.unknown  # cached before times were recorded: seconds is a lower bound
    return out


def validate_declared(method: str, value) -> dict:
    """A declared construction cost, ``{gpu_hours: 12.5, device: A100}`` (``note`` optional), checked and
    returned unchanged; one-line errors naming the key."""
    where = f"method {method!r}: construction"
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping such as {{gpu_hours: 12.5, device: A100}}, got {shown(value)}")
    for key in value:
        if key not in DECLARED_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; allowed: {sorted(DECLARED_KEYS)}")
    for key in ("gpu_hours", "device"):
        if key not in value:
            raise ValueError(f"{where} needs {key!r} ({DECLARED_KEYS[key]})")
    hours = value["gpu_hours"]
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not math.isfinite(hours) or hours < 0:
        raise ValueError(f"{where}.gpu_hours must be a non-negative number, got {shown(hours)}")
    for key in ("device", "note"):
        if key in value and (not isinstance(value[key], str) or not value[key].strip()):
            raise ValueError(f"{where}.{key} must be non-empty text, got {shown(value[key])}")
    return value
