"""The pixel-space round trip shared by the ops that work on pixels (``torchvision`` and DC-Bench's
``autoaugment``, ``randaugment``, ``imagenet_aug``)."""

from __future__ import annotations

import torch

from ddlib.engine.augment.pipeline import AugmentContext


class _PixelSpace:
    """The round trip every pixel-space op shares: de-normalise with the dataset mean/std, apply,
    re-normalise. The mean/std tensors are cached per (device, dtype); a batch whose channel count
    does not match them is refused, naming the op."""

    def __init__(self, ctx: AugmentContext, op: str):
        self.op, self._mean, self._std = op, ctx.mean, ctx.std
        self._cache: dict = {}

    def stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (x.device, x.dtype)
        if key not in self._cache:
            self._cache[key] = tuple(
                torch.tensor(v, dtype=x.dtype, device=x.device).view(1, -1, 1, 1) for v in (self._mean, self._std)
            )
        mean, std = self._cache[key]
        if x.shape[1] != mean.shape[1]:
            raise ValueError(f"{self.op} op: images have {x.shape[1]} channels but mean/std {mean.shape[1]}")
        return mean, std

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.stats(x)
        return x * std + mean

    def to_normalized(self, pixels: torch.Tensor) -> torch.Tensor:
        mean, std = self.stats(pixels)
        return (pixels - mean) / std

    def to_uint8(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised batch -> uint8 pixels: de-normalise, clamp to [0, 1], x 255, round to nearest."""
        return self.to_pixels(x).clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8)

    def from_uint8(self, pixels_u8: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """uint8 pixels -> normalised batch with ``like``'s dtype (``/ 255``, then mean/std)."""
        return self.to_normalized(pixels_u8.to(like.dtype) / 255.0)
