"""Model registry in the style of timm: ``create_model(name, channels, num_classes, image_size, **kw)``.

Every model maps normalised images to logits and exposes ``embed(x)`` (the features before
the classifier), which K-Center selection and Distribution Matching use. Each model file registers
its models on import (``register_model``); adding a model is a file and its line below.
"""

from __future__ import annotations

from ddlib.models._registry import MODELS, count_parameters, create_model, list_models, register_model
from ddlib.models import alexnet, convnet, lenet, mlp, nasbench201, resnet, vgg, vit  # noqa: F401  (register them)

__all__ = ["MODELS", "count_parameters", "create_model", "list_models", "register_model"]
