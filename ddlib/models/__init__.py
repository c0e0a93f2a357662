"""Model registry in the style of timm: ``create_model(name, channels, num_classes, image_size, **kw)``.

Every model maps normalised images to logits and exposes ``embed(x)`` (the features before
the classifier), which K-Center selection and Distribution Matching use.
"""

from __future__ import annotations

from ddlib.models._registry import count_parameters, create_model, list_models, register_model

__all__ = ["count_parameters", "create_model", "list_models", "register_model"]


def _register_all() -> None:
    """Import every module of this package: each registers its models on import, so adding a
    model is adding a file (``convnet.py``, ``resnet.py``, ...), with no list to keep in step."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_register_all()
