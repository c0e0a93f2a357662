"""Evaluation protocols: one module per protocol, and what they share.

Each protocol module defines ``PARAMS`` (the notebook's parameters and their defaults),
``validate(params)`` and the steps its notebook calls; ``PROTOCOLS`` maps a protocol name to its
notebook and module for the batch runner. Shared pieces: ``cell`` (a grid cell's MLflow run and
cached evaluations), ``common`` (parameters every protocol takes), ``presets`` and ``preset_eval``
(a method's own evaluation), ``teachers`` (teacher training and caching), ``nas_space`` (NAS-Bench-201 ground truth and sampling), ``dcbench`` (what the
DC-Bench protocols share). The attacks the adversarial protocol runs are a package of their own,
:mod:`ddlib.attacks`."""

from __future__ import annotations

import importlib
from types import ModuleType

# protocol name -> (notebook file under notebooks/, module)
PROTOCOLS = {
    "label_robust": ("label_robust.ipynb", "ddlib.protocols.label_robust"),
    "augmentation_robust": ("augmentation_robust.ipynb", "ddlib.protocols.augmentation_robust"),
    "augmentation": ("augmentation.ipynb", "ddlib.protocols.augmentation"),
    "compression": ("compression.ipynb", "ddlib.protocols.compression"),
    "transfer": ("transfer.ipynb", "ddlib.protocols.transfer"),
    "nas": ("nas.ipynb", "ddlib.protocols.nas"),
    "adversarial": ("adversarial.ipynb", "ddlib.protocols.adversarial"),
}


def protocol_module(name: str) -> ModuleType:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; known: {sorted(PROTOCOLS)}")
    return importlib.import_module(PROTOCOLS[name][1])


def protocol_revision(name: str) -> int:
    """The protocol module's ``REVISION``: part of every cell's config, group, series and family key."""
    return int(getattr(protocol_module(name), "REVISION"))
