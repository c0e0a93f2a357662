"""Hashes and flat params: the stable hash every reuse key is made of (:func:`config_hash`), and nested
params as MLflow's flat ones. Imports nothing of ddlib."""

from __future__ import annotations

import hashlib
import json

def config_hash(config: dict, length: int = 16) -> str:
    """A stable hash of a JSON-able config (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def flatten(values: dict, prefix: str = "") -> dict[str, str]:
    """Nested params as MLflow params: ``{"recipe": {"lr": 0.01}}`` -> ``{"recipe.lr": "0.01"}``."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, prefix=f"{name}."))
        elif isinstance(value, (list, tuple, dict)):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = str(value)
    return flat
