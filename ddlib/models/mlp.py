"""DC's MLP baseline: flatten -> 128 -> ReLU -> 128 -> ReLU -> classes (3 linear layers)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ddlib.models._registry import register_model


class MLP(nn.Module):
    """DC's MLP baseline: two hidden layers of ``width`` units; ``embed`` is the second's output."""
    def __init__(self, channels, num_classes, image_size, width=128):
        super().__init__()
        in_dim = channels * math.prod(image_size)
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(in_dim, width), nn.ReLU(inplace=True), nn.Linear(width, width), nn.ReLU(inplace=True)
        )
        self.feature_dim = width
        self.classifier = nn.Linear(width, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The features the classifier reads (K-Center selection and Distribution Matching use them)."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


@register_model("mlp")
def mlp(channels, num_classes, image_size, width=128):
    """The ``mlp`` entry of the model registry (:class:`MLP`)."""
    return MLP(channels, num_classes, image_size, width=width)
