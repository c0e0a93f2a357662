"""The model registry (:data:`MODELS`, on :class:`ddlib.specs.registry.Registry`; kept apart from the
model files, as timm keeps ``_registry.py``): every model file imports ``register_model`` from here."""

from __future__ import annotations

import inspect
from typing import Callable

import torch.nn as nn

from ddlib.specs.registry import Registry

__all__ = ["MODELS", "register_model", "list_models", "create_model", "count_parameters"]

# name -> factory(channels, num_classes, image_size, **options) -> nn.Module
MODELS: Registry = Registry("model")


def register_model(name: str):
    """Decorator: register ``factory(channels, num_classes, image_size, **options)`` as model ``name``
    (its options with defaults are the entry's ``defaults``); a name registered twice is refused."""

    def decorator(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        options = list(inspect.signature(fn).parameters.values())[3:]
        MODELS.add(name, fn, defaults={p.name: p.default for p in options if p.default is not inspect.Parameter.empty})
        return fn

    return decorator


def list_models() -> list[str]:
    """The registered models' names, sorted: what ``create_model`` and a params file's ``model:`` take."""
    return MODELS.names()


def create_model(name: str, channels: int, num_classes: int, image_size, **kwargs) -> nn.Module:
    """Build a registered model by name, freshly initialised.

    Every protocol builds its networks here, so a model named in a params file, on the command line
    or in a reuse key is always the same architecture: its options default to the registered ones
    (``MODELS.entry(name).defaults``). The model maps normalised images to logits and has ``embed(x)``.

    Args:
        name: a registered model (:func:`list_models`: ``convnet``, ``resnet18``, ``vit``, ...).
        channels: the input's colour channels (1 for grayscale, 3 for RGB).
        num_classes: the number of logits the model outputs.
        image_size: the input's height and width, an int for a square image or ``(H, W)``.
        **kwargs: the model's own options (``width``, ``depth``, ``norm`` for ``convnet``, ...).

    Returns:
        The model, an ``nn.Module`` in training mode on the CPU.

    Raises:
        ValueError: ``name`` is not registered (the message lists the known ones).

    Example:
        >>> import torch
        >>> from ddlib.models import create_model
        >>> model = create_model("convnet", channels=3, num_classes=10, image_size=32)
        >>> model(torch.rand(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """
    factory = MODELS.entry(name).factory  # an unknown name: ValueError naming it and the known ones
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    return factory(channels=channels, num_classes=num_classes, image_size=tuple(image_size), **kwargs)


def count_parameters(model: nn.Module) -> int:
    """Every parameter's element count (trainable or not), as the models' docstrings count them by hand."""
    return sum(p.numel() for p in model.parameters())
