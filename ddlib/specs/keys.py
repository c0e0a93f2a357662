"""Reuse keys, kept valid as ddlib grows: every rule that keeps a key made before a change equal to
the key made after it lives here, in one place.

A key is a hash of what a result depends on (:func:`ddlib.store.hashing.config_hash`). When a field or a
parameter joins later, the keys of results computed before it existed must not change where the new
field sits at the default that reproduces the old behaviour, or every stored result would be
recomputed (or, worse, pooled with results of another definition). So:

* :data:`LATER_RECIPE_DEFAULTS`: recipe fields that joined later are keyed only away from these
  defaults (:meth:`ddlib.engine.recipe.Recipe.to_dict`);
* :data:`LATER_PARAM_DEFAULTS`: protocol parameters likewise (a cell's config, row, series and family);
* a hook that joined later (an adversarial-training objective) is keyed only when it is used
  (:meth:`ddlib.protocols.cell.Cell.train_eval`).

What changes a number never goes through these rules: it changes a *definition revision*, which
every key holds (:func:`definition`), so nothing computed before is reused or pooled:

* :data:`ENGINE_REVISION`: bumped when the training engine's numbers change (the loop, a hook, a model,
  the data's layout or decoding): in every key of a trained model, an lr search, a teacher, a cached
  result, a cell and a per-machine cache (:func:`ddlib.methods.select.kernel_identity`);
* the protocol's revision (its spec's ``revision``): in every key its cells compute, together with
  the revisions of the protocols that share those results with it (:data:`SHARED_DEFINITIONS`), which
  the protocols package hands in (:func:`ddlib.protocols.definition`: nothing here imports a protocol).

The package's version is in no key (it has been 0.2.0 since the first commit): a release that changes
no number reuses everything, one that changes a number bumps a revision. A change that only adds a
board or a column computed from values already logged changes no number and needs no bump (a bump of
one protocol of a shared group recomputes the whole group).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

__all__ = ["LATER_RECIPE_DEFAULTS", "LATER_PARAM_DEFAULTS", "without_later_defaults", "ENGINE_REVISION",
           "ENGINE_HISTORY", "SHARED_DEFINITIONS", "definition"]

LATER_RECIPE_DEFAULTS = {"lr_min": 0.0, "grad_clip": None, "precision": "fp32", "channels_last": False,
                         "compile": False}
LATER_PARAM_DEFAULTS = {"lr_search": "full", "epochs": None}


def without_later_defaults(values: Mapping[str, Any], later: Mapping[str, Any]) -> dict:
    """``values`` without the entries that sit at the default their field joined with."""
    return {k: v for k, v in values.items() if not (k in later and v == later[k])}


# The training engine's revision: raise it (with a line in ENGINE_HISTORY) whenever a training loop,
# test pass, hook, model or the data's decoding or layout gives other numbers than before.
ENGINE_REVISION = 1
ENGINE_HISTORY = ("1: the first revision held by the keys (issue 54): results stored before it carried no definition "
                  "and are not reused",)

# Protocols whose cells reuse each other's trained models, lr searches, teachers or cached results: a
# key made in any of them holds the revisions of all, so that sharing survives and a bump of any one
# recomputes them all. Every other protocol is a family of its own.
SHARED_DEFINITIONS: tuple[tuple[str, ...], ...] = (
    ("label_robust", "augmentation_robust"),  # one SideTrainer: sides, lr searches, teachers (ARS reuses LRS's)
    ("adversarial", "blackbox"),  # one model pool: blackbox's surrogates and targets are adversarial's models
    ("augmentation", "compression", "transfer"),  # DC-Bench's one train_settings: identical conditions shared
)


def definition(protocol: str | None, revision: Callable[[str], int]) -> dict:
    """The definition revision a reuse key of ``protocol``'s results holds: the engine's revision and
    the revision of every protocol of its family (:data:`SHARED_DEFINITIONS`), as ``revision(name)``
    gives it (:func:`ddlib.protocols.definition` hands in the protocols' own: 0 for one ddlib does not
    know). None, a computation outside any protocol, holds the engine's alone."""
    if protocol is None:
        return {"engine": ENGINE_REVISION}
    family = next((f for f in SHARED_DEFINITIONS if protocol in f), (protocol,))
    return {"engine": ENGINE_REVISION, "protocols": {p: revision(p) for p in sorted(family)}}
