"""Content digests: identical tensors give identical keys, wherever a layer needs to say "the same data"."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["tensor_digest"]


def tensor_digest(*tensors: torch.Tensor | None) -> str:
    """SHA-256 of tensors' bytes, shapes and dtypes: identical training data, identical key."""
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()[:24]
