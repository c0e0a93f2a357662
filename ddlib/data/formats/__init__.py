"""Set formats: one reader per file, registered in :data:`FORMATS` (see :mod:`.base`).

Built in: ``mtt`` (:mod:`.mtt`), ``dc`` (:mod:`.dc`), ``pt`` (:mod:`.plain_pt`), ``npz`` (:mod:`.npz`) and
``imagefolder`` (:mod:`.imagefolder`), imported below. Adding a format is one file that registers a reader
(and its name in that import line, or an import of your own)::

    from ddlib.data.formats import SetPath, set_format

    @set_format("toy", detects="a .toy text file", detect=lambda src: src.path.suffix == ".toy")
    def read(src: SetPath) -> dict:
        ...  # {"images": ..., "labels": ..., "default_normalized": False, "stem": src.path.stem}

and :func:`ddlib.data.distilled.load` reads it (``provenance["format"] == "toy"``).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from ddlib.data.formats import dc, imagefolder, mtt, npz, plain_pt  # noqa: F401  (register the built-in formats)
from ddlib.data.formats.base import (FORMATS, NUMPY_SAFE_GLOBALS, DistilledSetError, SetPath, formats, set_format,
                                     torch_load)

__all__ = ["FORMATS", "SetPath", "set_format", "formats", "read", "needs_unpickling", "DistilledSetError",
           "NUMPY_SAFE_GLOBALS", "torch_load"]


def read(src: SetPath) -> dict:
    """The raw set at ``src.path`` as the first format whose ``detect`` accepts it reads it, with
    ``format`` (the format's name) added; a one-line error listing the formats when none does."""
    for entry in formats():
        if entry.meta["detect"](src):
            return {**entry.factory(src), "format": entry.name}
    what = ": a directory no format reads" if src.path.is_dir() else f" {src.suffix or '(no extension)'!r}"
    known = [entry.meta["detects"] for entry in formats()]
    raise DistilledSetError(f"{src.path}: unknown format{what}; expected "
                            + (", ".join(known[:-1]) + " or " + known[-1] if len(known) > 1 else known[0]))


def needs_unpickling(path: str | os.PathLike) -> bool:
    """Whether only full unpickling reads the set at ``path`` (``trusted=True``): the safe loader
    refuses one of its ``.pt`` files. Runs none of the files' code (a dry run asks this)."""
    path = Path(path)
    files = next((fs for entry in formats() if entry.meta["files"] and (fs := entry.meta["files"](path))), [path])
    for file in files:
        if file.is_file() and file.suffix.lower() in (".pt", ".pth"):
            try:
                with torch.serialization.safe_globals(NUMPY_SAFE_GLOBALS):
                    torch.load(file, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError:
                return True
            except Exception:  # noqa: BLE001 - unreadable: the real load says why
                return False
    return False
