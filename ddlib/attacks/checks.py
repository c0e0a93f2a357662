"""The argument checks of the measuring loop (:mod:`ddlib.attacks.run`): each raises a one-line
``ValueError`` naming the argument, before anything runs."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from ddlib.attacks.spaces import SPACES, PixelModel

__all__ = ["check_seed", "check_num_classes", "check_batch_size", "check_data", "check_inputs", "check_targets",
           "check_space"]


def check_seed(seed: int) -> int:
    """The attack seed as an ``int``, refused when negative or not an integer (a bool included)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_num_classes(num_classes: int) -> int:
    """``num_classes`` refused before anything runs unless an integer >= 2 (targeted attacks draw other classes)."""
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return num_classes


def check_batch_size(batch_size: int) -> int:
    """``batch_size`` refused before anything runs unless a positive integer (a bool is not one)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


def check_data(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Images (N, C, H, W) as pixels (uint8, or float in [0, 1]); their labels as an int64 CPU tensor."""
    if images.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    labels = torch.as_tensor(labels).long().cpu()
    if labels.shape != (len(images),):
        raise ValueError(f"{len(images)} images but labels of shape {tuple(labels.shape)}")
    if images.dtype != torch.uint8:
        if not images.is_floating_point():
            raise ValueError(f"images must be uint8 or float pixels, got {images.dtype}")
        if images.numel() and (float(images.min()) < 0.0 or float(images.max()) > 1.0):
            raise ValueError("float images must be pixels in [0, 1] (not normalised: wrap the model in PixelModel)")
    return labels


def check_inputs(images, labels, num_classes, batch_size, seed) -> tuple[torch.Tensor, int, int]:
    """``(labels, batch_size, seed)`` checked: see :func:`check_data`; labels in [0, num_classes)."""
    labels = check_data(images, labels)
    batch_size, seed = check_batch_size(batch_size), check_seed(seed)
    check_num_classes(num_classes)
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    return labels, batch_size, seed


def check_targets(targets: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Targets as an int64 CPU tensor: one per image, in [0, num_classes), never the true label."""
    targets = torch.as_tensor(targets).long().cpu()
    if targets.shape != labels.shape:
        raise ValueError(f"targets must have shape {tuple(labels.shape)}, got {tuple(targets.shape)}")
    if len(targets) and (int(targets.min()) < 0 or int(targets.max()) >= num_classes):
        raise ValueError(f"targets must lie in [0, {num_classes})")
    if bool((targets == labels).any()):
        raise ValueError("a target equals the true label; targets must be other classes")
    return targets


def check_space(space: str, model: nn.Module, spec, images: torch.Tensor) -> None:
    """The space is known, ``beard_compat`` has a :class:`PixelModel`, and the images have the
    channels the attack needs (its entry's ``channels``: TIFGSM's kernel has 3 groups)."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    if space == "beard_compat" and not isinstance(model, PixelModel):
        raise ValueError("space 'beard_compat' needs a PixelModel (it attacks the inner model on normalised inputs)")
    channels = spec.entry.meta.get("channels")
    if channels is not None and images.shape[1] != channels:
        raise ValueError(f"attack {spec.name!r} needs {channels}-channel images, got {images.shape[1]}")
