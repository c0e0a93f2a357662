"""The ConvNet of the DC/DSA/DM/MTT codebases: [conv3x3 -> norm -> ReLU -> avgpool2] x depth -> linear.

Matches DC's definition, including its MNIST quirk: for 28x28 grayscale input the first
convolution pads by 3, so MNIST and Fashion-MNIST behave like 32x32 (DC-distilled MNIST sets
were made with this network). Other sizes (8x8 digits, say) pad by 1. Instance norm is
``GroupNorm(C, C)`` with affine parameters, exactly as DC implements it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ddlib.models._pool import AvgPool2x2
from ddlib.models._registry import register_model


def _norm(kind: str, width: int) -> nn.Module:
    if kind == "instance":
        return nn.GroupNorm(width, width, affine=True)
    if kind == "batch":
        return nn.BatchNorm2d(width)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r} (instance, batch, none)")


class ConvNet(nn.Module):
    """DC's ConvNet: ``depth`` blocks of conv3x3 (``width`` channels), ``norm``, ReLU, avgpool2, then one linear layer."""
    def __init__(self, channels, num_classes, image_size, width=128, depth=3, norm="instance"):
        super().__init__()
        layers = []
        h, w = image_size
        in_ch = channels
        for d in range(depth):
            pad = 3 if d == 0 and channels == 1 and tuple(image_size) == (28, 28) else 1
            layers += [nn.Conv2d(in_ch, width, kernel_size=3, padding=pad), _norm(norm, width), nn.ReLU(inplace=True)]
            h, w = h + 2 * pad - 2, w + 2 * pad - 2
            layers.append(AvgPool2x2())
            h, w = h // 2, w // 2
            in_ch = width
        if h < 1 or w < 1:
            raise ValueError(f"image size {image_size} is too small for a depth-{depth} ConvNet")
        self.features = nn.Sequential(*layers)
        self.feature_dim = width * h * w
        self.classifier = nn.Linear(self.feature_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The features the classifier reads (K-Center selection and Distribution Matching use them)."""
        return self.features(x).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


def _variant(name: str, depth: int, norm: str):
    @register_model(name)
    def build(channels, num_classes, image_size, width=128, depth=depth, norm=norm):
        return ConvNet(channels, num_classes, image_size, width=width, depth=depth, norm=norm)

    build.__doc__ = f"ConvNet depth {depth}, width 128, {norm} norm."
    return build


convnet = _variant("convnet", 3, "instance")
convnet_bn = _variant("convnet_bn", 3, "batch")
convnet_nonorm = _variant("convnet_nonorm", 3, "none")
convnet_d4 = _variant("convnet_d4", 4, "instance")  # 64x64 inputs (Tiny ImageNet)
convnet_d4_bn = _variant("convnet_d4_bn", 4, "batch")
