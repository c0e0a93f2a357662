"""ZCA whitening, a preprocessing module rather than a random op: :class:`ZCA` and :func:`fit_zca`."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn


class ZCA(nn.Module):
    """ZCA whitening, fitted once on the normalised real training set, as MTT/DATM/FTD do
    (``kornia.enhance.ZCAWhitening(eps=0.1, compute_inv=True)``). The fitted transform is kornia's
    module (so ``forward`` / ``inverse`` are kornia's math); :meth:`fit` with ``batch`` computes the
    same mean and covariance in chunks (float64 accumulation) so CIFAR-sized sets fit in little memory.
    """

    def __init__(self, eps: float = 0.1):
        super().__init__()
        import kornia

        self.eps = float(eps)
        self.whitening = kornia.enhance.ZCAWhitening(eps=self.eps, compute_inv=True)

    @property
    def fitted(self) -> bool:
        return bool(self.whitening.fitted)

    @torch.no_grad()
    def fit(self, images_normalized: torch.Tensor, batch: int | None = None) -> "ZCA":
        """Fit on normalised images (N x C x H x W). ``batch=None`` calls kornia's ``fit`` as it is."""
        if batch is None:
            self.whitening.fit(images_normalized)
            return self
        n = len(images_normalized)
        return self._fit_chunks(lambda i: images_normalized[i : i + batch], n, batch, images_normalized.device)

    def _fit_chunks(self, chunk: Callable[[int], torch.Tensor], n: int, batch: int, device) -> "ZCA":
        """kornia's ``zca_mean`` (unbiased covariance, SVD in float64, T = U diag((S + eps)^-1/2) U^T,
        T_inv = U diag((S + eps)^1/2) U^T) with the mean and covariance accumulated in chunks."""
        if n < 2:
            raise ValueError(f"ZCA needs at least two images, got {n}")
        total = None
        for i in range(0, n, batch):
            flat = chunk(i).to(device).flatten(1).float()
            s = flat.sum(0, dtype=torch.float64)
            total = s if total is None else total + s
        mean = (total / n).float()[None, :]
        cov = torch.zeros(mean.shape[1], mean.shape[1], dtype=torch.float64, device=device)
        for i in range(0, n, batch):
            centered = chunk(i).to(device).flatten(1).float() - mean
            cov += (centered.t() @ centered).double()
        cov = (cov / (n - 1)).float()
        u, s, _ = torch.linalg.svd(cov.double())  # kornia's _torch_svd_cast: float32 -> float64 SVD -> float32
        u, s = u.float(), s.float().reshape(-1, 1)
        w = self.whitening
        w.mean_vector = mean
        w.transform_matrix = u.mm(torch.rsqrt(s + self.eps) * u.t())
        w.transform_inv = u.mm(torch.sqrt(s + self.eps) * u.t())
        w.fitted = True
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.whitening(x)

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        """Back to normalised space (for viewing whitened synthetic images, as MTT does)."""
        return self.whitening.inverse_transform(x)


@torch.no_grad()
def fit_zca(images_pixels: torch.Tensor, mean: Sequence[float], std: Sequence[float], eps: float = 0.1,
            batch: int = 5000, device: str | torch.device | None = None) -> ZCA:
    """Normalise pixel images (uint8 or float in [0, 1]) with the dataset mean/std and fit a :class:`ZCA`,
    ``batch`` images at a time (on ``device``, default the images' device)."""
    dev = torch.device(device) if device is not None else images_pixels.device
    m = torch.tensor(mean, dtype=torch.float32, device=dev).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=dev).view(1, -1, 1, 1)

    def chunk(i):
        x = images_pixels[i : i + batch].to(dev)
        x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
        return (x - m) / s

    return ZCA(eps)._fit_chunks(chunk, len(images_pixels), batch, dev)


@torch.no_grad()
def zca_to_pixels(whitened: torch.Tensor, zca: ZCA, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Pixels of a set stored ZCA-whitened (MTT/DATM with ``--zca``): ``zca``'s inverse (back to
    normalised images), then de-normalisation with the dataset's mean/std. ``zca`` must be fitted on
    the real data the set was whitened with; the result is float32 on ``whitened``'s device."""
    if not zca.fitted:
        raise ValueError("zca_to_pixels needs a fitted ZCA (fit_zca on the real training set)")
    dev = zca.whitening.transform_inv.device
    x = zca.inverse(whitened.to(dev).float())
    m = torch.tensor(mean, dtype=torch.float32, device=dev).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=dev).view(1, -1, 1, 1)
    return (x * s + m).to(whitened.device)
