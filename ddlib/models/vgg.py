"""DC's VGG-11 (``networks.py`` of VICO-UoE/DatasetCondensation: ``VGG11`` / ``VGG11BN``; DC-Bench's
``networks/vgg.py`` is the same), the CIFAR VGG of the cross-architecture tables.

Configuration ``[64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M]``: 3x3 convolutions
(padding 1; 3 for the first conv on 28x28 grayscale, DC's MNIST padding, which makes the map
32x32) each followed by a norm and ReLU, 2x2 max-pools, then one linear layer. ``vgg11`` uses DC's
instance norm (``GroupNorm(C, C, affine=True)``), ``vgg11_bn`` ``BatchNorm2d``. DC ends the
features with ``AvgPool2d(kernel_size=1, stride=1)``, the identity, which we leave out (it has no
parameters and comes last, so layer indices and DC state dicts still match). DC hard-codes
``nn.Linear(512, num_classes)`` (a 1x1 map at 32x32); we compute ``512 * h * w`` from the image
size, so 64x64 gives 512*2*2 features instead of a shape error. Five pools need 32x32 inputs.

Parameters on CIFAR-10 (3x32x32, 10 classes), by hand from DC's definition (each conv weights +
bias, each norm 2C affine parameters, for GroupNorm(C, C) and BatchNorm2d alike):
    conv 3->64       3*64*9 + 64     =     1,792     norm   128
    conv 64->128     64*128*9 + 128  =    73,856     norm   256
    conv 128->256    128*256*9 + 256 =   295,168     norm   512
    conv 256->256    256*256*9 + 256 =   590,080     norm   512
    conv 256->512    256*512*9 + 512 = 1,180,160     norm 1,024
    conv 512->512 x3 512*512*9 + 512 = 2,359,808 x3  norm 1,024 x3
    convs 9,220,480 + norms 5,504 + linear 512*10 + 10 = 5,130  ->  9,231,114 (both variants)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ddlib.models._registry import register_model
from ddlib.models._dc import check_map, first_padding
from ddlib.models.resnet import instance_norm

VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
_NORMS = {"instance": instance_norm, "batch": nn.BatchNorm2d}


class VGG(nn.Module):
    """DC's VGG (``vgg11``, ``vgg11_bn``): ``cfg`` conv widths and ``"M"`` max-pools, then one linear layer."""
    def __init__(self, channels, num_classes, image_size, cfg=VGG11, norm="instance", name="vgg11"):
        super().__init__()
        if norm not in _NORMS:
            raise ValueError(f"unknown norm {norm!r} (instance, batch)")
        layers = []
        h, w = image_size
        in_ch = channels
        for i, x in enumerate(cfg):
            if x == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                h, w = h // 2, w // 2
                check_map(name, image_size, h, w, f"after max-pool (layer {i})")
            else:
                pad = first_padding(channels, image_size, default=1, mnist=3) if i == 0 else 1
                layers += [nn.Conv2d(in_ch, x, kernel_size=3, padding=pad), _NORMS[norm](x), nn.ReLU(inplace=True)]
                h, w = h + 2 * pad - 2, w + 2 * pad - 2
                in_ch = x
        self.features = nn.Sequential(*layers)
        self.feature_dim = in_ch * h * w
        self.classifier = nn.Linear(self.feature_dim, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The features the classifier reads (K-Center selection and Distribution Matching use them)."""
        return self.features(x).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


@register_model("vgg11")
def vgg11(channels, num_classes, image_size):
    """DC's VGG11: instance norm."""
    return VGG(channels, num_classes, image_size, norm="instance", name="vgg11")


@register_model("vgg11_bn")
def vgg11_bn(channels, num_classes, image_size):
    """DC's VGG11BN: BatchNorm2d."""
    return VGG(channels, num_classes, image_size, norm="batch", name="vgg11_bn")
