"""What the boards know of the protocols, which stand above them and tell it (:mod:`ddlib.protocols.spec`
calls :func:`tell` on import): the protocols' names and each one's revision now. Imports nothing."""

from __future__ import annotations

from typing import Callable, Collection

__all__ = ["tell", "protocols", "revision"]

_TOLD: dict[str, Callable] = {}  # "names", "revision": what ddlib.protocols.spec gave (nothing before it is imported)


def tell(names: Callable[[], Collection[str]], revision: Callable[[str], int | None]) -> None:
    """Say where the protocols' names and current revisions are read (None: a protocol not installed here)."""
    _TOLD.update(names=names, revision=revision)


def protocols() -> Collection[str]:
    """Every protocol's name: each one's cells are filed in the experiment of that name."""
    return _told("names")()


def revision(name: str) -> int | None:
    """The protocol's revision now (None where it is unknown here)."""
    return _told("revision")(name)


def _told(what: str) -> Callable:
    if what not in _TOLD:  # never read the boards without knowing which experiments are protocols'
        raise RuntimeError("ddlib.boards: the protocols have not told their names yet (import ddlib.protocols first)")
    return _TOLD[what]
