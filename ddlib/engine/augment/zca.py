"""ZCA whitening, a preprocessing module rather than a random op: :class:`ZCA` and :func:`fit_zca`.

As MTT, DATM and DD-Ranking do it (mtt-distillation ``utils.py::get_dataset``, DD-Ranking
``ddranking/utils/data.py::get_dataset`` with ``use_zca``): ``kornia.enhance.ZCAWhitening(eps=0.1,
compute_inv=True)`` fitted on the whole real training set as ``ToTensor()`` gives it, pixels in
[0, 1] with no mean/std normalisation, then applied to every training and test image in place of
the normalisation. A set those methods save with ``--zca`` holds such whitened values.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

ZCA_NAME = "zca(eps=0.1, fitted on [0, 1] pixels of the whole training set)"  # the preprocess name runs are keyed by
FIT_BATCH = 5000  # images per chunk of the mean and covariance sums (their float order: part of a cached fit's key)
FIT_REVISION = 1  # raise when the fit's arithmetic changes: cached fits of older code are then not reused


class ZCA(nn.Module):
    """ZCA whitening (``kornia.enhance.ZCAWhitening(eps=0.1, compute_inv=True)``): ``forward`` maps
    [0, 1] pixels to the model's input (it replaces the mean/std normalisation), ``inverse`` maps a
    whitened batch back to pixels. The fitted transform is kornia's module (so ``forward`` /
    ``inverse`` are kornia's math); :meth:`fit` with ``batch`` computes the same mean and covariance
    in chunks (float64 accumulation) so CIFAR-sized sets fit in little memory.
    """

    def __init__(self, eps: float = 0.1):
        super().__init__()
        import kornia

        self.eps = float(eps)
        self.whitening = kornia.enhance.ZCAWhitening(eps=self.eps, compute_inv=True)

    @property
    def name(self) -> str:
        """What runs whitened with it are keyed by (:data:`ZCA_NAME` at the peers' eps 0.1)."""
        return f"zca(eps={self.eps:g}, fitted on [0, 1] pixels of the whole training set)"

    @property
    def fitted(self) -> bool:
        """Whether :meth:`fit` (or :meth:`from_state`) has set the whitening matrix."""
        return bool(self.whitening.fitted)

    @torch.no_grad()
    def fit(self, images: torch.Tensor, batch: int | None = None) -> "ZCA":
        """Fit on float images (N x C x H x W). ``batch=None`` calls kornia's ``fit`` as it is."""
        if batch is None:
            self.whitening.fit(images)
            return self
        n = len(images)
        return self._fit_chunks(lambda i: images[i : i + batch], n, batch, images.device)

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

    def state(self) -> dict:
        """The fitted transform as CPU tensors (what :meth:`from_state` restores bit for bit)."""
        w = self.whitening
        return {"eps": self.eps, "mean_vector": w.mean_vector.cpu(), "transform_matrix": w.transform_matrix.cpu(),
                "transform_inv": w.transform_inv.cpu()}

    @classmethod
    def from_state(cls, state: dict, device=None) -> "ZCA":
        """A fitted :class:`ZCA` from :meth:`state`, on ``device``: no refit (an SVD of the
        C*H*W x C*H*W covariance, 12.9 s for CIFAR-10 on a 2-core Zen 5 EPYC)."""
        zca = cls(state["eps"])
        w = zca.whitening
        w.mean_vector, w.transform_matrix, w.transform_inv = (
            state[k].to(device) for k in ("mean_vector", "transform_matrix", "transform_inv"))
        w.fitted = True
        return zca

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.whitening(x)

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        """Back to [0, 1] pixels (MTT's ``inverse_transform`` of its saved images)."""
        return self.whitening.inverse_transform(x)


@torch.no_grad()
def fit_zca(images_pixels: torch.Tensor, eps: float = 0.1, batch: int = FIT_BATCH,
            device: str | torch.device | None = None) -> ZCA:
    """Fit a :class:`ZCA` on pixel images (uint8, or float in [0, 1]) as they are, with no
    normalisation (``ToTensor()`` then kornia's fit, as MTT/DATM/DD-Ranking), ``batch`` images at a
    time, on ``device`` (default the images' device)."""
    dev = torch.device(device) if device is not None else images_pixels.device

    def chunk(i):
        x = images_pixels[i : i + batch].to(dev)
        return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()

    return ZCA(eps)._fit_chunks(chunk, len(images_pixels), batch, dev)


@torch.no_grad()
def zca_to_pixels(whitened: torch.Tensor, zca: ZCA) -> torch.Tensor:
    """Pixels of a set stored ZCA-whitened (MTT/DATM with ``--zca``): ``zca``'s inverse. ``zca`` must
    be the whitening the set was made with (:func:`fit_zca` on the real training set); the result is
    float32 on ``whitened``'s device, not clamped (``zca(pixels)`` gives the stored values back)."""
    if not zca.fitted:
        raise ValueError("zca_to_pixels needs a fitted ZCA (fit_zca on the real training set)")
    dev = zca.whitening.transform_inv.device
    return zca.inverse(whitened.to(dev).float()).to(whitened.device)
