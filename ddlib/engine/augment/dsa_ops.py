"""DSA, Differentiable Siamese Augmentation (Zhao & Bilen, ICML 2021), ported from
VICO-UoE/DatasetCondensation ``utils.py``: the ``dsa`` op, :class:`DSAParams`, ``DSA_OPS``,
:func:`dsa_op` and :func:`dsa` (``DiffAugment``). Differentiable w.r.t. the batch (it runs inside
distillation)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ddlib.engine.augment.pipeline import AugmentContext, register_op


@dataclass(frozen=True)
class DSAParams:
    """The original ``ParamDiffAug`` constants (DatasetCondensation ``utils.py``); the defaults are
    what DC/DSA/DM/MTT use. Tests override them to force identity transforms."""

    prob_flip: float = 0.5
    ratio_scale: float = 1.2
    ratio_rotate: float = 15.0
    ratio_crop_pad: float = 0.125
    ratio_cutout: float = 0.5
    brightness: float = 1.0
    saturation: float = 2.0
    contrast: float = 0.5
    # scale/rotate resampling: DC/DSA/DM call affine_grid/grid_sample with torch's default (False);
    # MTT, DATM and DD-Ranking's ``ddranking/aug/dsa.py`` pass align_corners=True.
    align_corners: bool = False


def _rand(x: torch.Tensor, g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=g, device=x.device, dtype=x.dtype)


def _dsa_scale(x, g, p: DSAParams):
    """``rand_scale``: x and y scaled independently per sample by U[1/ratio, ratio] (affine_grid +
    grid_sample, bilinear, zero padding; ``align_corners`` as :class:`DSAParams` says)."""
    n, r = x.shape[0], p.ratio_scale
    sx = _rand(x, g, n) * (r - 1.0 / r) + 1.0 / r
    sy = _rand(x, g, n) * (r - 1.0 / r) + 1.0 / r
    theta = torch.zeros(n, 2, 3, dtype=x.dtype, device=x.device)
    theta[:, 0, 0], theta[:, 1, 1] = sx, sy
    grid = F.affine_grid(theta, list(x.shape), align_corners=p.align_corners)
    return F.grid_sample(x, grid, align_corners=p.align_corners)


def _dsa_rotate(x, g, p: DSAParams):
    """``rand_rotate``: angle ``(U - 0.5) * 2 * ratio / 180 * pi`` per sample (+-15 degrees)."""
    n = x.shape[0]
    a = (_rand(x, g, n) - 0.5) * 2 * p.ratio_rotate / 180 * math.pi
    cos, sin = torch.cos(a), torch.sin(a)
    zero = torch.zeros_like(a)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=p.align_corners)
    return F.grid_sample(x, grid, align_corners=p.align_corners)


def _dsa_flip(x, g, p: DSAParams):
    """``rand_flip``: horizontal flip where U < prob_flip, per sample."""
    return torch.where(_rand(x, g, x.shape[0], 1, 1, 1) < p.prob_flip, x.flip(3), x)


def _dsa_brightness(x, g, p: DSAParams):
    """``rand_brightness``: ``x + (U - 0.5) * brightness``, one shift per sample."""
    return x + (_rand(x, g, x.shape[0], 1, 1, 1) - 0.5) * p.brightness


def _dsa_saturation(x, g, p: DSAParams):
    """``rand_saturation``: scale the deviation from the per-pixel channel mean by ``U * saturation``."""
    x_mean = x.mean(dim=1, keepdim=True)
    return (x - x_mean) * (_rand(x, g, x.shape[0], 1, 1, 1) * p.saturation) + x_mean


def _dsa_contrast(x, g, p: DSAParams):
    """``rand_contrast``: scale the deviation from the image mean (over C, H, W) by ``U + contrast``."""
    x_mean = x.mean(dim=[1, 2, 3], keepdim=True)
    return (x - x_mean) * (_rand(x, g, x.shape[0], 1, 1, 1) + p.contrast) + x_mean


def _dsa_crop(x, g, p: DSAParams):
    """``rand_crop``: integer translation in [-shift, shift] per axis (shift = round(0.125 * size),
    4 px on 32x32), zero fill. Ported as in the original: pad by one zero pixel, clamp the shifted
    indices into the pad, gather (so it stays differentiable)."""
    n, _, h, w = x.shape
    shift_x, shift_y = int(h * p.ratio_crop_pad + 0.5), int(w * p.ratio_crop_pad + 0.5)
    tx = torch.randint(-shift_x, shift_x + 1, size=[n, 1, 1], generator=g, device=x.device)
    ty = torch.randint(-shift_y, shift_y + 1, size=[n, 1, 1], generator=g, device=x.device)
    gb, gx, gy = torch.meshgrid(
        torch.arange(n, device=x.device),
        torch.arange(h, device=x.device),
        torch.arange(w, device=x.device),
        indexing="ij",
    )
    gx = torch.clamp(gx + tx + 1, 0, h + 1)
    gy = torch.clamp(gy + ty + 1, 0, w + 1)
    x_pad = F.pad(x, [1, 1, 1, 1, 0, 0, 0, 0])
    return x_pad.permute(0, 2, 3, 1).contiguous()[gb, gx, gy].permute(0, 3, 1, 2)


def _dsa_cutout(x, g, p: DSAParams):
    """``rand_cutout``: zero one square of round(0.5 * size) per sample (16x16 on 32x32) centred at
    a uniform position in [0, size] (even sizes), so it may hang over the border."""
    n, _, h, w = x.shape
    cs = int(h * p.ratio_cutout + 0.5), int(w * p.ratio_cutout + 0.5)
    ox = torch.randint(0, h + (1 - cs[0] % 2), size=[n, 1, 1], generator=g, device=x.device)
    oy = torch.randint(0, w + (1 - cs[1] % 2), size=[n, 1, 1], generator=g, device=x.device)
    gb, gx, gy = torch.meshgrid(
        torch.arange(n, device=x.device),
        torch.arange(cs[0], device=x.device),
        torch.arange(cs[1], device=x.device),
        indexing="ij",
    )
    gx = torch.clamp(gx + ox - cs[0] // 2, min=0, max=h - 1)
    gy = torch.clamp(gy + oy - cs[1] // 2, min=0, max=w - 1)
    mask = torch.ones(n, h, w, dtype=x.dtype, device=x.device)
    mask[gb, gx, gy] = 0
    return x * mask.unsqueeze(1)


#: strategy token -> functions, as the original ``AUGMENT_FNS`` (``color`` = brightness, saturation,
#: contrast); the three colour parts are also accepted on their own.
DSA_OPS: dict[str, tuple[Callable, ...]] = {
    "color": (_dsa_brightness, _dsa_saturation, _dsa_contrast),
    "crop": (_dsa_crop,),
    "cutout": (_dsa_cutout,),
    "flip": (_dsa_flip,),
    "scale": (_dsa_scale,),
    "rotate": (_dsa_rotate,),
    "brightness": (_dsa_brightness,),
    "saturation": (_dsa_saturation,),
    "contrast": (_dsa_contrast,),
}
DSA_DEFAULT_STRATEGY = "color_crop_cutout_flip_scale_rotate"


def dsa_op(x: torch.Tensor, op_name: str, generator: torch.Generator, params: DSAParams | None = None) -> torch.Tensor:
    """Apply one DSA strategy token (``color``, ``crop``, ``cutout``, ``flip``, ``scale``,
    ``rotate``, or a colour part) to a normalised batch with per-sample draws from ``generator``."""
    if op_name not in DSA_OPS:
        raise ValueError(f"unknown DSA op {op_name!r}; known: {sorted(DSA_OPS)}")
    p = params or DSAParams()
    for fn in DSA_OPS[op_name]:
        x = fn(x, generator, p)
    return x


def dsa(x: torch.Tensor, generator: torch.Generator, strategy: str = DSA_DEFAULT_STRATEGY, mode: str = "one",
        params: DSAParams | None = None) -> torch.Tensor:
    """``DiffAugment(x, strategy, seed=-1, param)``: ``mode="one"`` is ``aug_mode='S'`` (one token
    of the strategy drawn per call, the default in DC/DSA/DM training and evaluation), ``"all"`` is
    ``aug_mode='M'`` (every token in order). The "one" draw reads one integer back to the host
    (``.item()``, as the original does), a sync per batch on CUDA."""
    tokens = strategy.split("_")
    if mode == "one":
        k = int(torch.randint(0, len(tokens), size=(1,), generator=generator, device=x.device).item())
        tokens = [tokens[k]]
    for token in tokens:
        x = dsa_op(x, token, generator, params)
    return x.contiguous()


@register_op("dsa")
def _dsa_factory(ctx: AugmentContext, *, strategy: str = DSA_DEFAULT_STRATEGY, mode: str = "one",
                 align_corners: bool = False):
    """Differentiable Siamese Augmentation on the normalised batch (Zhao & Bilen, ICML 2021). The
    Siamese variant (one draw shared by real and synthetic batches) is not offered here.
    ``align_corners`` (scale, rotate): false as DC/DSA/DM's code, true as MTT's, DATM's and
    DD-Ranking's (the DD-Ranking presets say true)."""
    if not isinstance(strategy, str) or not strategy:
        raise ValueError(f"augmentation op 'dsa': 'strategy' must be a non-empty string, got {strategy!r}")
    bad = [t for t in strategy.split("_") if t not in DSA_OPS]
    if bad:
        raise ValueError(f"augmentation op 'dsa': 'strategy' has unknown token(s) {bad}; known: {sorted(DSA_OPS)}")
    if mode not in ("one", "all"):
        raise ValueError(f"augmentation op 'dsa': 'mode' must be 'one' or 'all', got {mode!r}")

    if not isinstance(align_corners, bool):
        raise ValueError(f"augmentation op 'dsa': 'align_corners' must be true or false, got {align_corners!r}")
    params = DSAParams(align_corners=align_corners)

    def fn(x, targets, g):
        return dsa(x, g, strategy, mode, params), targets

    described = {"strategy": strategy, "mode": mode}
    if align_corners:  # only when set, so the name (and the keys) of DC's DSA stay as they were
        described["align_corners"] = True
    return fn, described
