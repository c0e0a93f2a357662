"""Evaluation protocols: one module per protocol, and what they share.

Each protocol module declares ``SPEC`` (:class:`ddlib.protocols.spec.ProtocolSpec`: name, revision,
typed parameters with help, notebook, leaderboards, headline score) and the steps its notebook calls
(``validate``, ``open_cell``, ``obtain``, ``evaluate(cell, distilled) -> Result``); protocols are
found from their specs (:mod:`ddlib.protocols.spec`). Shared pieces: ``cell`` (a grid cell's MLflow
run and cached evaluations), ``common`` (parameters every protocol takes), ``presets`` and
``preset_eval`` (a method's own evaluation), ``teachers`` (teacher training and caching),
``nas_space`` (NAS-Bench-201 ground truth and sampling), ``dcbench`` (what the DC-Bench protocols
share). The attacks the adversarial protocol runs are a package of their own, :mod:`ddlib.attacks`."""

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
    """The protocol's revision (its spec's): part of every cell's config, group, series and family key."""
    return int(get_spec(name).revision)
