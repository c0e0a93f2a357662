"""One memory layout for every image tensor: row-major (NCHW strides as ``torch.empty`` gives them).

PyTorch picks a CPU convolution kernel, and so the float rounding of every model trained or tested,
from the input's strides, and a 1-channel tensor is "contiguous" with stride 1 or H*W on its channel
axis alike. On stride 1 (what NumPy's indexing gives a N x 1 x H x W array, and so what the digits
loader held until ``label_robust`` revision 5) the convolutions' outputs come out channels-last and
``GroupNorm(C, C)`` takes its slow channels-last path: fp32 digits trainings were 24-40 % and DM
distillations 34-43 % slower (one thread on a 2-core Zen 4 EPYC's AVX2 paths), oneDNN's bf16
convolution 4x (docs/performance.md). So datasets hold row-major tensors, and the training loop, the
test pass and DM put any other input into that layout first: the numbers no longer depend on how a
loader or a file laid its tensors out.
"""

from __future__ import annotations

import torch

__all__ = ["standard_layout"]


def standard_layout(t):
    """``t`` with the row-major strides of its shape: a copy only where they differ (then bit for bit
    the same values). Images that are not a tensor (read from files on demand) pass through."""
    if not isinstance(t, torch.Tensor):
        return t
    expected, step = [], 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= max(size, 1)
    if t.stride() == tuple(reversed(expected)):
        return t
    return t.clone(memory_format=torch.contiguous_format)  # row-major strides, whatever t's were
