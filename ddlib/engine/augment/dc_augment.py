"""DC's own evaluation augmentation: the ``dc_augment`` op.

Dataset Condensation (Zhao, Mopuri & Bilen, ICLR 2021; VICO-UoE/DatasetCondensation ``utils.py``,
``augment`` and ``get_daparam``) evaluates its sets with an augmentation of its own, not DSA: per
image, one operation of ``strategy`` is drawn uniformly and applied, with these magnitudes:

  crop    pad ``crop`` = 4 px on every side with the batch's per-channel mean, then cut the image
          size at an offset drawn from {0, ..., 2 * crop - 1} per axis (a shift of -4 .. +3 px)
  scale   resize (nearest) to int(U(1 - scale, 1 + scale) * H) x int(U(1 - scale, 1 + scale) * H),
          scale = 0.2, centred on a zero canvas (zero = the dataset mean after normalisation),
          centre crop back to H x W
  rotate  ``scipy.ndimage.rotate`` by an integer angle drawn from {-rotate, ..., rotate - 1},
          rotate = 45 degrees (cubic spline, grown canvas filled with the mean of the channel
          means), centre crop back to H x W
  noise   add ``noise`` = 0.001 x N(0, 1) per pixel

DC uses ``crop_scale_rotate`` on MNIST (its recorded MNIST accuracies are with it) and
``crop_noise`` for BatchNorm ConvNets (``ConvNetBN``); other settings train without augmentation.
The means are taken over the batch before any image changes, as in DC. Images are normalised
(as everywhere in the training loop), which is what DC augments too.

Differences from DC's code: the draws come from the op's generator (DC: NumPy's and PyTorch's
global RNGs), so the same seed does not give DC's draws; crop and noise run batched on the device
(DC loops over images); the scale of the width uses W where DC uses H (the same on square images).
The rotation runs image by image through SciPy on the CPU, as in DC: the op is not
differentiable and a CUDA batch makes a round trip per rotated image.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ddlib.engine.augment.pipeline import AugmentContext, register_op
from ddlib.engine.augment._params import _int_param, _number

__all__ = ["DC_TOKENS", "DC_DEFAULTS", "dc_augment"]

DC_TOKENS = ("crop", "scale", "rotate", "noise")
# DC's get_daparam magnitudes
DC_DEFAULTS = {"strategy": "crop_scale_rotate", "crop": 4, "scale": 0.2, "rotate": 45, "noise": 0.001}


def _crop(x, mean, g, crop):
    """Pad by ``crop`` px with the channel means, cut H x W at offsets in [0, 2 * crop - 1]."""
    n, c, h, w = x.shape
    padded = mean.view(1, c, 1, 1).expand(n, c, h + 2 * crop, w + 2 * crop).clone()
    padded[:, :, crop:crop + h, crop:crop + w] = x
    top = torch.randint(0, 2 * crop, (n,), generator=g, device=x.device)
    left = torch.randint(0, 2 * crop, (n,), generator=g, device=x.device)
    rows = (top[:, None] + torch.arange(h, device=x.device))[:, :, None]
    cols = (left[:, None] + torch.arange(w, device=x.device))[:, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None]
    return padded[batch, :, rows, cols].permute(0, 3, 1, 2)


def _scale(x, mean, g, scale):
    """Nearest resize by U(1 - scale, 1 + scale) per axis, centred on a zero canvas, centre crop."""
    n, c, h, w = x.shape
    factors = (1 - scale + 2 * scale * torch.rand(n, 2, generator=g, device=x.device, dtype=torch.float64)).tolist()
    out = torch.empty_like(x)
    for i, (fh, fw) in enumerate(factors):
        hh, ww = int(fh * h), int(fw * w)
        resized = F.interpolate(x[i:i + 1], [hh, ww])[0]
        side = max(hh, ww, h, w)
        canvas = x.new_zeros(c, side, side)
        r, q = int((side - hh) / 2), int((side - ww) / 2)
        canvas[:, r:r + hh, q:q + ww] = resized
        r, q = int((side - h) / 2), int((side - w) / 2)
        out[i] = canvas[:, r:r + h, q:q + w]
    return out


def _rotate(x, mean, g, rotate):
    """SciPy's rotate (order 3, grown canvas, fill = the mean of the channel means), centre crop."""
    from scipy.ndimage import rotate as scipy_rotate

    n, c, h, w = x.shape
    angles = torch.randint(-rotate, rotate, (n,), generator=g, device=x.device).tolist()
    fill = float(mean.mean())
    images = x.detach().cpu().numpy()
    out = []
    for image, angle in zip(images, angles):
        turned = scipy_rotate(image, angle=angle, axes=(-2, -1), cval=fill)
        r, q = int((turned.shape[-2] - h) / 2), int((turned.shape[-1] - w) / 2)
        out.append(np.ascontiguousarray(turned[:, r:r + h, q:q + w]))
    return torch.from_numpy(np.stack(out)).to(device=x.device, dtype=x.dtype)


def _noise(x, mean, g, noise):
    return x + noise * torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)


_OPS = {"crop": _crop, "scale": _scale, "rotate": _rotate, "noise": _noise}


def dc_augment(x: torch.Tensor, generator: torch.Generator, strategy: str = DC_DEFAULTS["strategy"],
               crop: int = DC_DEFAULTS["crop"], scale: float = DC_DEFAULTS["scale"],
               rotate: int = DC_DEFAULTS["rotate"], noise: float = DC_DEFAULTS["noise"]) -> torch.Tensor:
    """DC's ``augment(images, dc_aug_param)`` on a normalised batch: one token of ``strategy`` per
    image, drawn uniformly (a token listed twice is drawn twice as often, as in DC)."""
    tokens = strategy.split("_")
    magnitude = {"crop": crop, "scale": scale, "rotate": rotate, "noise": noise}
    mean = x.detach().mean(dim=(0, 2, 3))
    choice = torch.randint(0, len(tokens), (x.shape[0],), generator=generator, device=x.device)
    out = x.clone()
    for token in dict.fromkeys(tokens):
        picked = [k for k, t in enumerate(tokens) if t == token]
        idx = torch.nonzero(torch.isin(choice, torch.tensor(picked, device=x.device))).flatten()
        if idx.numel():
            out[idx] = _OPS[token](x[idx], mean, generator, magnitude[token])
    return out


@register_op("dc_augment")
def _dc_augment_factory(ctx: AugmentContext, *, strategy: str = DC_DEFAULTS["strategy"], crop: int = DC_DEFAULTS["crop"],
                        scale: float = DC_DEFAULTS["scale"], rotate: int = DC_DEFAULTS["rotate"],
                        noise: float = DC_DEFAULTS["noise"]):
    """DC's evaluation augmentation (``utils.augment``): per image one of ``strategy``'s operations
    (``crop_scale_rotate``: DC on MNIST; ``crop_noise``: DC for BatchNorm ConvNets; any ``_``-joined
    subset of crop, scale, rotate, noise) with DC's magnitudes as defaults: crop 4 px, scale ±20 %,
    rotate ±45 degrees, noise 0.001. See the module docstring for the exact definitions."""
    if not isinstance(strategy, str) or not strategy:
        raise ValueError(f"augmentation op 'dc_augment': 'strategy' must be a non-empty string, got {strategy!r}")
    bad = [t for t in strategy.split("_") if t not in DC_TOKENS]
    if bad:
        raise ValueError(f"augmentation op 'dc_augment': 'strategy' has unknown token(s) {bad}; known: {list(DC_TOKENS)}")
    crop = _int_param("dc_augment", "crop", crop, 1)
    rotate = _int_param("dc_augment", "rotate", rotate, 1, 180)
    scale = _number("dc_augment", "scale", scale, lo=0.0, hi=1.0, lo_open=False)
    if scale >= 1.0:
        raise ValueError(f"augmentation op 'dc_augment': 'scale' must be below 1 (a factor 1 - scale > 0), got {scale}")
    noise = _number("dc_augment", "noise", noise, lo=0.0)
    params = {"strategy": strategy, "crop": crop, "scale": scale, "rotate": rotate, "noise": noise}

    def fn(x, targets, g):
        return dc_augment(x, g, **params), targets

    return fn, params

