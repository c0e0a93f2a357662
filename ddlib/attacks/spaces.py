"""Where an attack acts: on pixels in [0, 1] (the default), or BEARD's normalised tensors."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn

from ddlib.engine.test_pass import Normalize

__all__ = ["SPACES", "PixelModel", "attack_space"]

# "pixel" (pixels in [0, 1], ε a pixel-space bound: the default) or "beard_compat" (BEARD's pipeline:
# normalised tensors fed to torchattacks, see ddlib.attacks.run_attack).
SPACES = ("pixel", "beard_compat")


class PixelModel(nn.Module):
    """Wraps a model that takes normalised inputs so that it takes pixels in [0, 1].

    ``forward(x) = model((x - mean) / std)``. Attacks on a ``PixelModel`` perturb pixels, so their ε,
    step sizes and [0, 1] clamping mean what they say.
    """

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.normalize(x))

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """The inverse of the normalisation: model inputs back to pixel units."""
        return x * self.normalize.std + self.normalize.mean


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def attack_space(model: nn.Module, space: str) -> tuple[nn.Module, Callable, Callable]:
    """``(attacked, to_input, to_pixels)``: the network the attack runs on, pixels to its input, and
    its input back to pixels. ``pixel``: ``model`` itself on pixels. ``beard_compat`` (BEARD's
    ``eva_utils.epoch``): a :class:`PixelModel`'s inner network on normalised tensors."""
    if space == "beard_compat":
        return model.model, model.normalize, model.to_pixels
    return model, _same, _same
