"""Geometric ops on the normalised batch, per sample, batched and differentiable:
``random_resized_crop`` (torchvision's sampling), ``flip`` and ``patch_shuffle`` (RDED's
``ShufflePatches``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ddlib.engine.augment.pipeline import AugmentContext, register_op
from ddlib.engine.augment._params import _number, _pair


def _rrc_boxes(n: int, h: int, w: int, scale, ratio, g: torch.Generator, device):
    """torchvision ``RandomResizedCrop.make_params`` for ``n`` images at once: 10 attempts of
    (area fraction ~ U[scale], log aspect ~ U[log ratio]), the first that fits wins, else the
    centre-crop fallback. Same distribution as torchvision; the draws differ (all 10 attempts are
    drawn for every sample, and the position is ``floor(U * (size - crop + 1))``).
    Returns int64 tensors (top, left, height, width), each (n,)."""
    area = h * w
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    u_area = torch.rand(n, 10, generator=g, device=device, dtype=torch.float64)
    u_ratio = torch.rand(n, 10, generator=g, device=device, dtype=torch.float64)
    target_area = area * (scale[0] + (scale[1] - scale[0]) * u_area)
    aspect = torch.exp(lr0 + (lr1 - lr0) * u_ratio)
    cw = torch.round(torch.sqrt(target_area * aspect))  # half to even, as Python's round()
    ch = torch.round(torch.sqrt(target_area / aspect))
    ok = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
    first = ok.to(torch.uint8).argmax(1, keepdim=True)  # first fitting attempt (0 when none fits)
    found = ok.any(1)
    in_ratio = w / h
    if in_ratio < min(ratio):
        fw, fh = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        fh, fw = h, int(round(h * max(ratio)))
    else:
        fw, fh = w, h
    cw = torch.where(found, cw.gather(1, first).squeeze(1), torch.full_like(cw[:, 0], fw)).long()
    ch = torch.where(found, ch.gather(1, first).squeeze(1), torch.full_like(ch[:, 0], fh)).long()
    u_i = torch.rand(n, generator=g, device=device, dtype=torch.float64)
    u_j = torch.rand(n, generator=g, device=device, dtype=torch.float64)
    top = torch.minimum(torch.floor(u_i * (h - ch + 1)).long(), h - ch)
    left = torch.minimum(torch.floor(u_j * (w - cw + 1)).long(), w - cw)
    top = torch.where(found, top, (h - ch) // 2)
    left = torch.where(found, left, (w - cw) // 2)
    return top, left, ch, cw


def _resized_crop(x: torch.Tensor, top, left, height, width) -> torch.Tensor:
    """Crop box (top, left, height, width) of each sample resized to the input size: bilinear,
    align_corners=False, source index clamped to the box, i.e. what ``F.interpolate`` does on the
    cropped image (and torchvision's ``resized_crop``: its antialias only acts when shrinking, and
    a crop never is larger than the output here). One batched ``grid_sample``, differentiable."""
    n, _, h, w = x.shape
    dt = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32

    def src(size, start, length):
        k = torch.arange(size, device=x.device, dtype=dt)
        length = length.to(dt)[:, None]
        s = ((k + 0.5) * length / size - 0.5).clamp(min=0.0)
        s = torch.minimum(s, length - 1) + start.to(dt)[:, None]
        return (2 * s + 1) / size - 1  # grid_sample's normalised coordinate (align_corners=False)

    gy, gx = src(h, top, height), src(w, left, width)
    grid = torch.stack([gx[:, None, :].expand(n, h, w), gy[:, :, None].expand(n, h, w)], dim=-1)
    return F.grid_sample(x, grid.to(x.dtype), mode="bilinear", padding_mode="border", align_corners=False)


@register_op("random_resized_crop")
def _rrc_factory(ctx: AugmentContext, *, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision ``RandomResizedCrop(size=input size, scale, ratio)``, per sample, batched."""
    scale = _pair("random_resized_crop", "scale", scale, lo_open=True)
    ratio = _pair("random_resized_crop", "ratio", ratio, lo_open=True)
    if scale[1] > 1.0:
        raise ValueError(f"augmentation op 'random_resized_crop': 'scale' must be within (0, 1], got {list(scale)}")

    def fn(x, targets, g):
        boxes = _rrc_boxes(x.shape[0], x.shape[2], x.shape[3], scale, ratio, g, x.device)
        return _resized_crop(x, *boxes), targets

    return fn, {"scale": list(scale), "ratio": list(ratio)}


@register_op("flip")
def _flip_factory(ctx: AugmentContext, *, p: float = 0.5):
    """Horizontal flip with probability ``p`` per sample."""
    p = _number("flip", "p", p, lo=0.0, hi=1.0)

    def fn(x, targets, g):
        u = torch.rand(x.shape[0], 1, 1, 1, generator=g, device=x.device)
        return torch.where(u < p, x.flip(3), x), targets

    return fn, {"p": p}


# --------------------------------------------------------------------------- patch_shuffle (RDED)


def _strip_source_index(n: int, size: int, factor: int, g: torch.Generator, device) -> torch.Tensor:
    """For each sample, a random order of ``factor`` strips along one axis; returns (n, size): the
    source index of every output position. Strips are ``size // factor`` wide, the last one takes
    the remainder (RDED's ``shuffle_weight`` intends that in its ``else`` branch; for sizes
    divisible by ``factor``, as in all RDED configs, the two agree)."""
    base = size // factor
    widths = torch.full((factor,), base, device=device, dtype=torch.long)
    widths[-1] = size - base * (factor - 1)
    starts = torch.arange(factor, device=device) * base
    perm = torch.rand(n, factor, generator=g, device=device).argsort(1)
    w_perm = widths[perm]
    ends_out = w_perm.cumsum(1)
    starts_out = ends_out - w_perm
    pos = torch.arange(size, device=device).expand(n, size).contiguous()
    k = torch.searchsorted(ends_out, pos, right=True)
    return starts[perm.gather(1, k)] + pos - starts_out.gather(1, k)


@register_op("patch_shuffle")
def _patch_shuffle_factory(ctx: AugmentContext, *, factor: int = 2):
    """RDED's ``ShufflePatches(factor)`` (LINs-lab/RDED ``validation/utils.py``), per sample: shuffle
    the ``factor`` column strips, then (independently) the ``factor`` row strips. RDED's distilled
    images are mosaics of ``factor x factor`` patches and it uses ``factor=2`` by default, so that is
    the default here. Note what this is: a row permutation times a column permutation of the
    patch grid (``factor!**2`` layouts, 4 for factor 2), not every permutation of the patches;
    kept as RDED has it."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ValueError(f"augmentation op 'patch_shuffle': 'factor' must be a positive integer, got {factor!r}")

    def fn(x, targets, g):
        n, c, h, w = x.shape
        if h < factor or w < factor:
            raise ValueError(f"patch_shuffle: factor {factor} is larger than the image ({h}x{w})")
        cols = _strip_source_index(n, w, factor, g, x.device)
        x = x.gather(3, cols[:, None, None, :].expand(n, c, h, w))
        rows = _strip_source_index(n, h, factor, g, x.device)
        return x.gather(2, rows[:, None, :, None].expand(n, c, h, w)), targets

    return fn, {"factor": factor}
