"""2x2 average pooling that runs faster on the CPU, with the same bits as ``nn.AvgPool2d(2, 2)``.

On the CPU, PyTorch's contiguous (NCHW) ``avg_pool2d`` kernels are slow, forward and backward
(about 10 ns per output element on one thread, whatever the plane size): in a ConvNet-3 test pass
on CIFAR-shaped images the forward took 45 % of the time under bf16 (as long as the three
convolutions), and in a digits training step the two kernels took about 10 % of it.

* **Forward**: a depthwise 2x2 convolution with weights 1/4 and stride 2 computes the same
  four-term average through oneDNN. Multiplying by 1/4 is exact and the sums run in the same
  order, so the outputs are bit for bit those of ``avg_pool2d`` in fp32 and bf16.
* **Backward** (training; ``avg_pool2d_backward`` spreads ``grad / 4`` over each window): each
  gradient times 1/4 (exact, so the same bits) copied into its 2x2 window by two interleaving
  stacks, and zeros for the row and column an odd size drops, as ``avg_pool2d`` does. The
  convolution's own backward is not used: in bf16 it is slower than ``avg_pool2d``'s.

``tests/test_models.py`` checks both directions bit for bit against ``avg_pool2d`` (fp32, bf16,
odd sizes, under ``vmap``, a gradient of a gradient), and that a ConvNet trains to the same weights.
Measured (``bench/README.md``, a 2-core Zen 4, CPU time of one training): CIFAR-shaped, 100 images,
9 % less on the AVX2 paths in two threads and 20 % under bf16; digits 15 % under bf16 and about 5 %
(the full-data reference) on one AVX2 thread. Small inputs (:data:`MIN_ELEMENTS`), other devices,
channels-last and non-floating inputs keep the ordinary kernel.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


_QUARTERS: dict[tuple, torch.Tensor] = {}


def _quarters(channels: int, dtype: torch.dtype) -> torch.Tensor:
    """The depthwise convolution's weights (every one 1/4), made once per channel count and dtype
    (never as an inference tensor, whichever mode the first pass ran in)."""
    key = (channels, dtype)
    if key not in _QUARTERS:
        with torch.inference_mode(False):
            _QUARTERS[key] = torch.full((channels, 1, 2, 2), 0.25, dtype=dtype)
    return _QUARTERS[key]


class _Pool2x2(torch.autograd.Function):
    """``avg_pool2d(x, 2)`` as a depthwise convolution; its gradient is :class:`_Spread2x2`."""

    generate_vmap_rule = True  # batched mode (ddlib.engine.stacked) runs the models under vmap

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):  # keep the input's dtype, as avg_pool2d does
            return F.conv2d(x, _quarters(x.shape[-3], x.dtype), stride=2, groups=x.shape[-3])

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.size = tuple(inputs[0].shape[-2:])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # create_graph: the gradient is differentiated again
            return _Spread2x2.apply(grad, ctx.size)
        return _Spread2x2.forward(grad, ctx.size)


class _Spread2x2(torch.autograd.Function):
    """``avg_pool2d_backward``: each gradient times 1/4 in its 2x2 window of a ``size`` plane (an
    odd size's last row or column gets zeros). Its own gradient is the pool again, as in PyTorch,
    so a gradient of a gradient keeps avg_pool2d's bits too."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grad: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        quarter = grad * 0.25
        rows = torch.stack((quarter, quarter), dim=-1).flatten(-2)  # each column twice
        spread = torch.stack((rows, rows), dim=-2).flatten(-3, -2)  # each row twice
        height, width = size
        if (height, width) != tuple(spread.shape[-2:]):
            spread = F.pad(spread, (0, width - spread.shape[-1], 0, height - spread.shape[-2]))
        return spread

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _Pool2x2.apply(grad), None


# Below this many input elements the custom function's fixed cost (about 0.1 ms a call, forward and
# backward, one AVX2 thread) outweighs what it saves: measured on a 2-core Zen 4 (bench/README.md),
# 64 x 128 x 8 x 8 gained 0.8 ms, 64 x 128 x 4 x 4 nothing, 64 x 128 x 2 x 2 lost 0.13 ms.
MIN_ELEMENTS = 2**19


class AvgPool2x2(nn.AvgPool2d):
    """``nn.AvgPool2d(kernel_size=2, stride=2)``; on the CPU (NCHW, floating point, at least
    :data:`MIN_ELEMENTS` elements) :class:`_Pool2x2`. Either way the same bits: only the speed differs."""

    def __init__(self):
        super().__init__(kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.device.type != "cpu" or x.dim() != 4 or not x.is_floating_point() or x.numel() < MIN_ELEMENTS
                or not x.is_contiguous()):
            return super().forward(x)
        return _Pool2x2.apply(x)
