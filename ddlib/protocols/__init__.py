"""TrainedModel protocols: one module per protocol, and what they share.

Each protocol module declares ``SPEC`` (:class:`ddlib.protocols.spec.ProtocolSpec`: name, revision,
typed parameters with help, notebook, leaderboards, headline score) and the steps its notebook calls
(``validate``, ``open_cell``, ``obtain``, ``evaluate(cell, distilled) -> Result``); protocols are
found from their specs (:mod:`ddlib.protocols.spec`). Shared pieces: ``cell`` (a grid cell's MLflow
run and cached evaluations), ``common`` (parameters every protocol takes), ``presets`` and
``preset_eval`` (a method's own evaluation), ``teachers`` (teacher training and caching),
``nas_space`` (NAS-Bench-201 ground truth and sampling), ``dcbench`` (what the DC-Bench protocols
share). The attacks the adversarial protocol runs are a package of their own, :mod:`ddlib.attacks`.

One vocabulary, in the code, the docs and MLflow:

* **evaluate**: a protocol's step on one set, ``evaluate(cell, distilled) -> Result``; nothing else
  is called that. The engine **trains and tests** models (:func:`ddlib.engine.train.train_and_test`);
  a **test pass** (:mod:`ddlib.engine.test_pass`: ``model_accuracy``, ``model_confusion``) scores a
  model on a test or validation split.
* **trained model** (:class:`ddlib.protocols.cell.TrainedModel`): one model a cell trained or found
  in the store, with its role, seed, accuracy and run.
* **role**: what a trained model is for in its cell (the run's ``ddlib.role`` tag: ``syn_hard``,
  ``rdm_any``, ``real_hard``, ``model``, ``nas``, ...).
* **side**: the set a DD-Ranking role trains on: ``syn`` (the distilled set), ``rdm`` (a random subset
  of its size), ``real`` (the full training data); :class:`ddlib.protocols.preset_eval.SideTrainer`
  trains them.
* **setting**: how a set is trained (model, recipe, labels and loss, augmentation, preprocessing):
  :class:`ddlib.protocols.side_plan.SideSetting` for DD-Ranking's sides, :class:`ddlib.protocols.dcbench.TrainingCondition`
  for one DC-Bench column.
* **cell**, **row**, **family**: one notebook execution (an MLflow run); the leaderboard row it
  belongs to (its seeds pooled); the rows compared with each other (one setting, every method).
"""

from __future__ import annotations

from ddlib.protocols.spec import PROTOCOLS, get_spec, protocol_module
from ddlib.specs import keys

__all__ = ["PROTOCOLS", "protocol_module", "protocol_revision", "definition", "get_spec"]


def protocol_revision(name: str) -> int:
    """The protocol's revision (its spec's): part of every cell's config, group, series and family key,
    and, with the engine's (:func:`definition`), of every model, lr-search, teacher and result key."""
    return int(get_spec(name).revision)


def definition(protocol: str | None) -> dict:
    """The definition revision every reuse key of ``protocol``'s results holds: the rule of
    :func:`ddlib.specs.keys.definition`, handed the revisions of the protocols ddlib knows (0 for one
    it does not)."""
    return keys.definition(protocol, lambda name: protocol_revision(name) if name in PROTOCOLS else 0)
