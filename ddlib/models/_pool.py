"""2x2 average pooling that tests faster on the CPU, with the same bits as ``nn.AvgPool2d(2, 2)``.

On the CPU, PyTorch's contiguous (NCHW) ``avg_pool2d`` kernel is slow: in a ConvNet-3 test pass
on CIFAR-shaped images it took 45 % of the time under bf16 (as long as the three convolutions).
A depthwise 2x2 convolution with weights 1/4 and stride 2 computes the same four-term average
through oneDNN about three times faster. Multiplying by 1/4 is exact and the sums run in the
same order, so the outputs are bit for bit those of ``avg_pool2d`` in fp32 and bf16
(``tests/test_models.py`` checks it on model activations and on training).

Only passes without autograd (test passes, teacher forwards) take the convolution: its bf16
backward is slower than ``avg_pool2d``'s, so training keeps the ordinary kernel. Other devices
keep the ordinary kernel too.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class AvgPool2x2(nn.AvgPool2d):
    """``nn.AvgPool2d(kernel_size=2, stride=2)``; on the CPU without autograd, a depthwise convolution."""

    def __init__(self):
        super().__init__(kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or torch.is_grad_enabled() or x.dim() != 4 or not x.is_floating_point():
            return super().forward(x)
        channels = x.shape[1]
        weight = torch.full((channels, 1, 2, 2), 0.25, dtype=x.dtype)
        with torch.autocast("cpu", enabled=False):  # keep the input's dtype, as avg_pool2d does
            return F.conv2d(x, weight, stride=2, groups=channels)
