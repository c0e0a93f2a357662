"""Device copies of dataset tensors, kept for the life of the process: the cells a warm kernel runs one
after another (``ddlib.run.kernels``) train on the GPU copy its first cell made. Imports ``data.digest``.

A cell's real training set (a teacher's, a full-data reference's, DM's real images) went to the GPU
once per training; the CPU tensors are cached per process already (:func:`ddlib.data.datasets.load_dataset`).
A copy is keyed by the content of what it copies (:func:`ddlib.data.digest.tensor_digest`, once per
tensor object), its dtype, shape, strides and device, so a reduced or split dataset rebuilt by the next
cell finds the copy its twin left. Nothing writes into dataset tensors (:class:`~ddlib.data.datasets.Dataset`);
a copy whose in-place version counter moved anyway is dropped and made again. On the CPU nothing is copied
or kept: ``t.to("cpu")`` is ``t``."""

from __future__ import annotations

from collections import OrderedDict

import torch

from ddlib.data.digest import MEMO_MIN_BYTES, tensor_digest

__all__ = ["on_device", "forget_device_copies", "KEPT_COPIES"]

KEPT_COPIES = 4  # device copies kept, most recently used first (a cell uses one or two training sets)
_COPIES: "OrderedDict[tuple, tuple[torch.Tensor, int]]" = OrderedDict()  # key -> (copy, its version when made)


def on_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t.to(device)``, bit for bit; a CPU tensor of at least :data:`~ddlib.data.digest.MEMO_MIN_BYTES`
    going to another device is copied once per content and kept (treat the result as read-only, as the
    dataset it came from). Smaller tensors (a distilled set, the digits) are copied as before: their copy
    costs less than their digest."""
    device = torch.device(device)
    if (not isinstance(t, torch.Tensor) or device.type == "cpu" or t.device.type != "cpu" or t.requires_grad
            or t.numel() * t.element_size() < MEMO_MIN_BYTES):
        return t.to(device)
    key = (tensor_digest(t), str(t.dtype), tuple(t.shape), t.stride(), str(device))
    entry = _COPIES.get(key)
    if entry is not None and entry[0]._version == entry[1]:
        _COPIES.move_to_end(key)
        return entry[0]
    _COPIES.pop(key, None)
    copy = t.to(device)
    _COPIES[key] = (copy, copy._version)
    while len(_COPIES) > KEPT_COPIES:
        _COPIES.popitem(last=False)
    return copy


def forget_device_copies() -> None:
    """Drop every kept copy (their memory returns to the device's caching allocator)."""
    _COPIES.clear()
