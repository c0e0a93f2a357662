"""DC's AlexNet and AlexNetBN (``networks.py`` of VICO-UoE/DatasetCondensation; DC-Bench's
``networks/alexnet.py`` is the same AlexNet), the CIFAR-sized AlexNet of the cross-architecture tables.

Five 5x5/3x3 convolutions (128, 192, 256, 192, 192 channels) with ReLU, a 2x2 max-pool after the
first, second and fifth, then one linear layer; ``alexnet_bn`` puts a ``BatchNorm2d`` after every
convolution. The first conv pads by 2, or by 4 for 28x28 grayscale (DC's MNIST padding: the map is
then 32x32, as for CIFAR). DC hard-codes ``nn.Linear(192 * 4 * 4, num_classes)``; we compute the
flattened size from the image size (the same 192*4*4 at 32x32 and 28x28, 192*8*8 at 64x64).
Layer order and names (``features.<i>``, ``fc``) are DC's, so DC state dicts load as they are.

Parameters on CIFAR-10 (3x32x32, 10 classes), by hand from DC's definition:
    conv1  3*128*5*5 + 128     =     9,728
    conv2  128*192*5*5 + 192   =   614,592
    conv3  192*256*3*3 + 256   =   442,624
    conv4  256*192*3*3 + 192   =   442,560
    conv5  192*192*3*3 + 192   =   331,968
    fc     (192*4*4)*10 + 10   =    30,730
    alexnet                        1,872,202
    alexnet_bn: + 2*(128+192+256+192+192) = + 1,920  ->  1,874,122
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ddlib.models._registry import register_model
from ddlib.models._dc import check_map, first_padding

# (out channels, kernel, padding, max-pool after), as in DC's ``AlexNet.features``.
_LAYERS = ((128, 5, 2, True), (192, 5, 2, True), (256, 3, 1, False), (192, 3, 1, False), (192, 3, 1, True))


class AlexNet(nn.Module):
    """DC's AlexNet (``alexnet``, ``alexnet_bn`` with ``norm="batch"``), its layer names kept so DC state dicts load."""
    def __init__(self, channels, num_classes, image_size, norm="none"):
        super().__init__()
        if norm not in ("none", "batch"):
            raise ValueError(f"unknown norm {norm!r} (none, batch)")
        name = "alexnet" if norm == "none" else "alexnet_bn"
        layers = []
        h, w = image_size
        in_ch = channels
        for i, (out, kernel, pad, pool) in enumerate(_LAYERS):
            if i == 0:
                pad = first_padding(channels, image_size, default=pad, mnist=4)
            layers.append(nn.Conv2d(in_ch, out, kernel_size=kernel, padding=pad))
            if norm == "batch":
                layers.append(nn.BatchNorm2d(out))
            layers.append(nn.ReLU(inplace=True))
            h, w = h + 2 * pad - kernel + 1, w + 2 * pad - kernel + 1
            if pool:
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                h, w = h // 2, w // 2
            check_map(name, image_size, h, w, f"after conv{i + 1}")
            in_ch = out
        self.features = nn.Sequential(*layers)
        self.feature_dim = in_ch * h * w
        self.fc = nn.Linear(self.feature_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The features the classifier reads (K-Center selection and Distribution Matching use them)."""
        return self.features(x).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(x))


@register_model("alexnet")
def alexnet(channels, num_classes, image_size):
    """DC's AlexNet: no normalisation."""
    return AlexNet(channels, num_classes, image_size, norm="none")


@register_model("alexnet_bn")
def alexnet_bn(channels, num_classes, image_size):
    """DC's AlexNetBN: BatchNorm2d after every convolution."""
    return AlexNet(channels, num_classes, image_size, norm="batch")
