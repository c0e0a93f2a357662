"""Reading the suite's YAML (params grids, method presets, ``--param`` values) strictly: a regular file
of at most :data:`MAX_BYTES`, UTF-8 text without control characters, no alias bomb, and a key given
twice in one mapping is an error (PyYAML keeps the last one silently, so a grid would run something
else than its file seems to say). :func:`read_text` is the one place a params file is read."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlFileError", "load_yaml", "parse_yaml", "read_text", "MAX_BYTES", "MAX_VALUES"]


# More values than any params file or preset holds (the shipped ones: a few hundred): a document that
# expands beyond this through its aliases is refused before it is built.
MAX_VALUES = 100_000
# More bytes than any params file or preset holds (the shipped ones: under 4 KiB): a larger file, or one
# that never ends (/dev/zero), is refused instead of read into memory.
MAX_BYTES = 4 * 2**20
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


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


def read_text(path: str | os.PathLike) -> str:
    """The text of the params file (or preset) at ``path``: a regular file of at most :data:`MAX_BYTES`,
    UTF-8; :class:`YamlFileError` naming the file and the problem otherwise (a device such as /dev/zero
    or a pipe is refused before it is opened, so nothing is read without bound)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        kind = next((name for test, name in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a file")
        if kind is not None:
            raise YamlFileError(f"{path}: not a regular file ({kind})")
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as error:
        raise YamlFileError(f"{path}: cannot read ({error.strerror or error})") from None
    if len(data) > MAX_BYTES:
        raise YamlFileError(f"{path}: larger than {MAX_BYTES // 2**20} MiB, more than a params file holds "
                            "(ddlib.specs.yamlfile.MAX_BYTES); is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise YamlFileError(f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); "
                            "save it as UTF-8") from None


def load_yaml(path: str | os.PathLike) -> Any:
    """The document in the file ``path`` (:func:`read_text`, :func:`parse_yaml`); :class:`YamlFileError`
    naming the file and the problem otherwise."""
    return parse_yaml(read_text(path), str(path))


def parse_yaml(text: str, where: str) -> Any:
    """The YAML document ``text`` with the checks a params file gets (no control characters, no alias
    bomb, no recursive alias, no key twice); :class:`YamlFileError` starting with ``where`` (the file,
    or ``--param KEY``) otherwise."""
    control = yaml.reader.Reader.NON_PRINTABLE.search(text)
    if control:  # the reader refuses them too, but from its constructor, with a traceback
        char = control.group()
        line = text.count("\n", 0, control.start()) + 1
        column = control.start() - (text.rfind("\n", 0, control.start()) + 1) + 1
        name = f"control character 0x{ord(char):02x}" if ord(char) < 0x100 else f"character U+{ord(char):04X}"
        raise YamlFileError(f"{where}: {name} on line {line}, column {column}; YAML text holds none (is it a "
                            "binary file?)")
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {}, set())
        if size > MAX_VALUES:
            raise YamlFileError(f"{where}: the document expands to {'over ' if size >= 10 * MAX_VALUES else ''}"
                                f"{size:,} values through its aliases (*name), more than a params file holds "
                                f"({MAX_VALUES:,}); is it an alias bomb?")
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise YamlFileError(f"{where}: not valid YAML ({_short(' '.join(str(error).split()))})") from None
    except RecursionError:
        raise YamlFileError(f"{where}: nested too deeply to read") from None
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
