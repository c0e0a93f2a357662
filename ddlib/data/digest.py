"""Content digests: identical tensors give identical keys, wherever a layer needs to say "the same data".

Every tensor that enters a number is in a reuse key by its content (training, validation and test
images and labels, a fitted ZCA): cheap because a large tensor's digest is computed once per tensor
object and kept while it lives and is not modified in place (its version counter), and a dataset's
once per :class:`~ddlib.data.datasets.Dataset` object (:func:`data_identity`)."""

from __future__ import annotations

import hashlib
import os
import weakref
from pathlib import Path
from typing import Any

import torch

__all__ = ["tensor_digest", "file_digest", "data_identity"]

MEMO_MIN_BYTES = 1 << 20  # tensors from this size on are digested once per object (a test set, a training set)
_MEMO: dict[tuple, str] = {}  # (id, version, ...) of each tensor of a call -> its digest
_MEMO_OF: dict[int, set] = {}  # a tensor's id -> the memo entries it is part of (dropped when it dies)


def _memo_key(tensors: tuple) -> tuple | None:
    """What identifies one call's tensors while they live: their ids and in-place version counters (a
    write through ``.numpy()`` or ``.data`` escapes the counter: datasets are read-only, see Dataset)."""
    if not all(t is None or isinstance(t, torch.Tensor) for t in tensors):
        return None
    if sum(t.numel() * t.element_size() for t in tensors if t is not None) < MEMO_MIN_BYTES:
        return None
    return tuple(None if t is None else (id(t), t._version, t.data_ptr(), tuple(t.shape), str(t.dtype))
                 for t in tensors)


def _forget(ident: int) -> None:
    for key in _MEMO_OF.pop(ident, ()):
        _MEMO.pop(key, None)


def _remember(tensors: tuple, key: tuple, digest: str) -> None:
    _MEMO[key] = digest
    for t in tensors:
        if t is None:
            continue
        if id(t) not in _MEMO_OF:
            _MEMO_OF[id(t)] = set()
            weakref.finalize(t, _forget, id(t))
        _MEMO_OF[id(t)].add(key)


def tensor_digest(*tensors: torch.Tensor | None) -> str:
    """SHA-256 of tensors' bytes, shapes and dtypes: identical training data, identical key. Large
    tensors are hashed once per object and version (about 0.3 s for CIFAR-10's test set otherwise)."""
    key = _memo_key(tensors)
    if key is not None and key in _MEMO:
        return _MEMO[key]
    digest = _digest(tensors)
    if key is not None:
        _remember(tensors, key, digest)
    return digest


def _digest(tensors: tuple) -> str:
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        if hasattr(t, "content_digest"):  # images read from files on demand (ddlib.data.streaming)
            h.update(f"files:{t.content_digest()}".encode())
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()[:24]


_FILE_DIGESTS: dict[tuple, str] = {}


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, or of a directory tree (relative paths and bytes of every file, in
    sorted order): the identity of an input such as a distilled set, a checkpoint or a CSV, so that
    a file replaced at the same path is a different input. Memoised per (path, size, mtime)."""
    path = Path(path).expanduser()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    if not files:
        return "missing"
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if stamp not in _FILE_DIGESTS:
        h = hashlib.sha256()
        for f in files:
            if f != path:
                h.update(f"{f.relative_to(path).as_posix()}\0".encode())
            with open(f, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    h.update(block)
        _FILE_DIGESTS[stamp] = h.hexdigest()[:24]
    return _FILE_DIGESTS[stamp]


_DATA: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def data_identity(dataset: Any) -> dict:
    """What a dataset contributes to every number computed on it: its name, normalisation, class
    count and the content of its training and test images and labels (not its ``source``, a path:
    the same data on two machines is one identity; other data at the same path is another). Once
    per Dataset object."""
    if dataset not in _DATA:
        _DATA[dataset] = {"name": dataset.name, "mean": [float(v) for v in dataset.mean],
                          "std": [float(v) for v in dataset.std], "classes": int(dataset.num_classes),
                          "train": tensor_digest(dataset.train_images, dataset.train_labels),
                          "test": tensor_digest(dataset.test_images, dataset.test_labels)}
    return dict(_DATA[dataset])
