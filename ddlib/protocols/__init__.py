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
  :class:`ddlib.protocols.preset_eval.Setting` for DD-Ranking's sides, :class:`ddlib.protocols.dcbench.Setting`
  for one DC-Bench column.
* **cell**, **row**, **family**: one notebook execution (an MLflow run); the leaderboard row it
  belongs to (its seeds pooled); the rows compared with each other (one setting, every method).
"""

from __future__ import annotations

from collections.abc import Mapping

from ddlib.protocols.spec import _declared, get_spec, protocol_module, protocol_names

__all__ = ["PROTOCOLS", "protocol_module", "protocol_revision", "protocol_names", "get_spec"]


class _Table(Mapping):
    """protocol name -> (notebook file under notebooks/, module), read from the specs' declarations."""

    def __getitem__(self, name: str) -> tuple[str, str]:
        return f"{name}.ipynb", _declared()[name]["module"]

    def __iter__(self):
        return iter(protocol_names())

    def __len__(self) -> int:
        return len(_declared())


PROTOCOLS = _Table()


def protocol_revision(name: str) -> int:
    """The protocol's revision (its spec's): part of every cell's config, group, series and family key,
    and, with the engine's (:func:`ddlib.specs.keys.definition`), of every model, lr-search, teacher and result key."""
    return int(get_spec(name).revision)
