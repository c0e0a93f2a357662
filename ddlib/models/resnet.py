"""The ResNets of the DC/DSA/DM/MTT codebases (``networks.py``), built from timm's blocks.

DC's CIFAR ResNet-18 (the one DC-Bench, DATM and DD-Ranking evaluate on) differs from the
ImageNet ResNet only in its stem: one 3x3 stride-1 convolution, no max-pool, so a 32x32 image
leaves ``layer4`` as a 4x4 map, which a global average pool reduces to 512 features before the
linear head. Instance norm is ``GroupNorm(C, C, affine=True)``, exactly as DC implements it;
``*_bn`` variants use ``BatchNorm2d``. Both have 11,173,962 parameters on CIFAR-10 (GroupNorm(C, C)
and BatchNorm2d each carry 2C affine parameters; BN's running statistics are buffers).

DC-Bench's ResNet-152 is DC's ``ResNet152`` (``ResNet(Bottleneck, [3, 8, 36, 3])``), the same CIFAR
stem and no max-pool, with Bottleneck blocks (1x1 -> 3x3 with the stride -> 1x1 at 4x width; a 1x1
strided conv + norm shortcut where the shape changes, including the first block of ``layer1``);
2048 features, 58,156,618 parameters on CIFAR-10 for both norms.

We take timm's ``ResNet`` with ``BasicBlock``/``Bottleneck`` (its residual blocks and 1x1-conv
shortcuts are DC's), swap the 7x7 stride-2 stem and max-pool for DC's stem, and re-initialise
convolutions with PyTorch's default (DC never calls a custom init; timm's Kaiming fan-out init
and zero-initialised last norms would change what "ResNet-18 trained on a distilled set" means).

DC pools with ``F.avg_pool2d(out, 4)``, which equals a global pool at 32x32 (and 28x28: the map
is 4x4 there too); at 64x64 DC's layer breaks, a global pool keeps 512 features at any size.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn as nn

from ddlib.models._registry import register_model

__all__ = ["ResNet", "instance_norm", "BasicBlock", "Bottleneck"]  # noqa: F822 - built on first use (__getattr__)


def instance_norm(num_channels: int, **kwargs) -> nn.Module:
    """DC's "instancenorm": ``GroupNorm`` with one channel per group and affine parameters."""
    return nn.GroupNorm(num_channels, num_channels, affine=True, **kwargs)


_NORMS = {"instance": instance_norm, "batch": nn.BatchNorm2d}


@functools.cache
def _timm():
    """timm's ResNet parts and our subclass, built on first use: importing timm costs every process
    (each notebook kernel of a grid) over a second, and most cells never build a ResNet."""
    from timm.models.resnet import BasicBlock, Bottleneck
    from timm.models.resnet import ResNet as TimmResNet

    class ResNet(TimmResNet):
        """timm's ResNet with DC's CIFAR stem; ``embed(x)`` gives the pooled features."""

        def __init__(self, channels: int, num_classes: int, image_size: Sequence[int], layers: Sequence[int],
                     block: type[nn.Module] | None = None, norm: str = "instance"):
            if norm not in _NORMS:
                raise ValueError(f"unknown norm {norm!r} (instance, batch)")
            final = [-(-int(side) // 8) for side in image_size]  # three stride-2 stages: ceil(side / 8)
            if norm == "instance" and min(final) < 2:
                # GroupNorm(C, C) over a 1x1 map outputs its bias whatever the input: the net would be constant.
                raise ValueError(f"image size {tuple(image_size)} is too small for an instance-norm ResNet: the last "
                                 f"stage's map would be {final[0]}x{final[1]} (needs at least 9x9 inputs; use the _bn variant)")
            super().__init__(block=block or BasicBlock, layers=tuple(layers), num_classes=num_classes, in_chans=channels,
                             norm_layer=_NORMS[norm], zero_init_last=False)
            # DC's stem: conv3x3 stride 1 -> norm -> ReLU, no max-pool (bn1/act1 are timm's, sized 64).
            self.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
            for info in self.feature_info:  # the stem no longer downsamples by 4
                info["reduction"] = max(1, info["reduction"] // (2 if info["module"] == "act1" else 4))
            for m in self.modules():  # PyTorch's default init, as in DC (timm uses Kaiming fan-out)
                if isinstance(m, nn.Conv2d):
                    m.reset_parameters()
            self.image_size = tuple(image_size)
            self.feature_dim = self.num_features

        def embed(self, x: torch.Tensor) -> torch.Tensor:
            return self.forward_head(self.forward_features(x), pre_logits=True)

    return {"ResNet": ResNet, "BasicBlock": BasicBlock, "Bottleneck": Bottleneck}


def __getattr__(name: str):
    if name in ("ResNet", "BasicBlock", "Bottleneck"):
        return _timm()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _variant(name: str, layers: Sequence[int], block: str, norm: str):
    """Register one layout; a ResNet-152 is ``_variant("resnet152", (3, 8, 36, 3), "Bottleneck", ...)``."""

    @register_model(name)
    def build(channels, num_classes, image_size, norm=norm):
        parts = _timm()
        return parts["ResNet"](channels, num_classes, image_size, layers=layers, block=parts[block], norm=norm)

    build.__doc__ = f"DC-style ResNet {tuple(layers)} of {block}, {norm} norm, 3x3 stem, no max-pool."
    return build


resnet18 = _variant("resnet18", (2, 2, 2, 2), "BasicBlock", "instance")
resnet18_bn = _variant("resnet18_bn", (2, 2, 2, 2), "BasicBlock", "batch")
resnet152 = _variant("resnet152", (3, 8, 36, 3), "Bottleneck", "instance")
resnet152_bn = _variant("resnet152_bn", (3, 8, 36, 3), "Bottleneck", "batch")
