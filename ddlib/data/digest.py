"""Content digests: identical tensors give identical keys, wherever a layer needs to say "the same data"."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

__all__ = ["tensor_digest", "file_digest"]


def tensor_digest(*tensors: torch.Tensor | None) -> str:
    """SHA-256 of tensors' bytes, shapes and dtypes: identical training data, identical key."""
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
