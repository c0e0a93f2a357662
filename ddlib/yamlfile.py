"""Reading the suite's YAML files (params grids, method presets) strictly: UTF-8 text only, and a key
given twice in one mapping is an error (PyYAML keeps the last one silently, so a grid would run
something else than its file seems to say)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlFileError", "load_yaml"]


class YamlFileError(ValueError):
    """A YAML file is unreadable, not UTF-8, not YAML, or gives a key twice; names the file."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (merge keys ``<<`` excepted: overriding them is their point)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: SafeLoader reports it itself
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given on line {first + 1}); YAML would keep only the last",
                key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml(path: str | os.PathLike) -> Any:
    """The document in ``path``; :class:`YamlFileError` naming the file and the problem otherwise."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise YamlFileError(f"{path}: cannot read ({error.strerror or error})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise YamlFileError(f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); "
                            "save it as UTF-8") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        raise YamlFileError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from None
