"""Reuse keys, kept valid as ddlib grows: every rule that keeps a key made before a change equal to
the key made after it lives here, in one place.

A key is a hash of what a result depends on (:func:`ddlib.tracking.config_hash`). When a field or a
parameter joins later, the keys of results computed before it existed must not change where the new
field sits at the default that reproduces the old behaviour, or every stored result would be
recomputed (or, worse, pooled with results of another definition). So:

* :data:`LATER_RECIPE_DEFAULTS`: recipe fields that joined later are keyed only away from these
  defaults (:meth:`ddlib.engine.recipe.Recipe.to_dict`);
* :data:`LATER_PARAM_DEFAULTS`: protocol parameters likewise (a cell's config, row, series and family);
* a hook that joined later (an adversarial-training objective) is keyed only when it is used
  (:meth:`ddlib.protocols.cell.Cell.train_eval`).

What changes a number never goes through these rules: it changes the protocol's revision (its
spec's ``revision``, part of every key), so nothing computed before is reused or pooled.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["LATER_RECIPE_DEFAULTS", "LATER_PARAM_DEFAULTS", "without_later_defaults"]

LATER_RECIPE_DEFAULTS = {"lr_min": 0.0, "grad_clip": None, "precision": "fp32", "channels_last": False,
                         "compile": False}
LATER_PARAM_DEFAULTS = {"lr_search": "full", "epochs": None}


def without_later_defaults(values: Mapping[str, Any], later: Mapping[str, Any]) -> dict:
    """``values`` without the entries that sit at the default their field joined with."""
    return {k: v for k, v in values.items() if not (k in later and v == later[k])}
