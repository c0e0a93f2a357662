"""The params files ddlib ships (``params/*.yaml``: read in place in a checkout, carried by a wheel as
``ddlib/_files/grids``), found by name: ``ddlib run demo`` and ``ddlib score --like demo`` work from
any folder and after a ``pip install``, where no ``params/`` folder is at hand."""

from __future__ import annotations

import os
from pathlib import Path

from ddlib.store.paths import project_folder
from ddlib.specs.yamlfile import YamlFileError

__all__ = ["shipped_grids", "grid_file"]


def shipped_grids() -> dict[str, Path]:
    """Name (``demo``) -> the shipped params file."""
    return {path.stem: path for path in sorted(project_folder("params").glob("*.yaml"))}


def grid_file(name: str | os.PathLike) -> Path:
    """The params file ``name`` names: the file itself where one exists (a path from the current
    folder wins), else the shipped grid of that name (``demo``, ``demo.yaml`` or ``params/demo.yaml``,
    as the docs write it). A name that is neither: :class:`YamlFileError`, one line listing the
    shipped names; any other path is returned as it is, for its reader to say what is wrong."""
    path = Path(name)
    if path.exists() or path.is_symlink() or path.parent not in (Path("."), Path("params")) \
            or path.suffix not in ("", ".yaml"):
        return path
    shipped = shipped_grids()
    if path.stem in shipped:
        return shipped[path.stem]
    raise YamlFileError(f"{name}: no such file, and ddlib ships no grid of that name; shipped grids: "
                        f"{', '.join(shipped) or 'none found'}")
