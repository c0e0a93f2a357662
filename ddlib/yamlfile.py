"""Reading the suite's YAML files (params grids, method presets) strictly: UTF-8 text only, and a key
given twice in one mapping is an error (PyYAML keeps the last one silently, so a grid would run
something else than its file seems to say)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlFileError", "load_yaml"]


# More values than any params file or preset holds (the shipped ones: a few hundred): a document that
# expands beyond this through its aliases is refused before it is built.
MAX_VALUES = 100_000


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
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {}, set())
        if size > MAX_VALUES:
            raise YamlFileError(f"{path}: the document expands to {'over ' if size >= 10 * MAX_VALUES else ''}{size:,} values "
                                "through its aliases (*name), more "
                                f"than a params file holds ({MAX_VALUES:,}); is it an alias bomb?")
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise YamlFileError(f"{path}: not valid YAML ({_short(' '.join(str(error).split()))})") from None
    except RecursionError:
        raise YamlFileError(f"{path}: nested too deeply to read") from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values the node becomes once every alias is expanded (an alias is the same node
    object as its anchor, so this is counted once per node, in time linear in the file)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise yaml.YAMLError("an alias refers to a node that contains it (a recursive document)")
    open_.add(key)
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, sizes, open_) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, sizes, open_) + _expanded_size(v, sizes, open_) for k, v in node.value)
    else:
        size = 1
    open_.discard(key)
    sizes[key] = min(size, 10 * MAX_VALUES)  # capped, so the sums stay small numbers
    return sizes[key]


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
