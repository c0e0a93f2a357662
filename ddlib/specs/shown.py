"""Values quoted in error messages, at a readable size: a 300-byte YAML alias bomb must not print
a 32 MB message, nor a list of a million seeds a screen of numbers. :mod:`reprlib` cuts long and
deep containers while it formats them, so even a huge value costs little to show."""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["shown", "one_line", "MAX_SHOWN", "MAX_MESSAGE"]

MAX_SHOWN = 80

_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
for _name, _value in dict(maxlevel=3, maxlist=8, maxtuple=8, maxdict=6, maxset=6, maxstring=60, maxother=60,
                          maxlong=40).items():
    setattr(_REPR, _name, _value)


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """A short ``repr`` of ``value``: containers cut after a few items and levels, the whole cut to
    ``limit`` characters."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


MAX_MESSAGE = 600


def one_line(error: BaseException | str, limit: int = MAX_MESSAGE) -> str:
    """An error as the one line the command line prints: whitespace collapsed, cut to ``limit``
    characters (a message is for reading; its quoted values are already :func:`shown`)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else f"{text[:limit - 3]}..."
