"""The model registry (kept apart from the model files, as timm keeps ``_registry.py``): every model
file imports ``register_model`` from here, and the package's ``__init__`` imports the files."""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str):
    def decorator(fn):
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = fn
        return fn

    return decorator


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def create_model(name: str, channels: int, num_classes: int, image_size, **kwargs) -> nn.Module:
    """Build a registered model. ``image_size`` is an int or (H, W)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(list_models())}")
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    return _REGISTRY[name](channels=channels, num_classes=num_classes, image_size=tuple(image_size), **kwargs)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
