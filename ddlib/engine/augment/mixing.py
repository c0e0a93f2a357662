"""Label-mixing ops, ``mixup`` and ``cutmix``, as timm's ``Mixup`` in batch mode
(``timm/data/mixup.py``): lambda ~ Beta(alpha, alpha) drawn from the op's generator, targets mixed
as rows. CutMix's box is the CutMix authors' ``rand_bbox`` (DD-Ranking's, SRe2L's, RDED's), not
timm's; ``tests/test_conformance_ddranking.py`` checks both ops against DD-Ranking's for forced draws."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ddlib.engine.augment.pipeline import AugmentContext, register_op
from ddlib.engine.augment._params import _number


def _target_rows(targets: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """Int labels become one-hot rows (as timm's ``mixup_target``, without label smoothing);
    target rows pass through, so soft labels are mixed as they are."""
    if targets.dim() == 1 and not targets.is_floating_point():
        return F.one_hot(targets.long(), num_classes).to(dtype)
    if targets.dim() == 2 and targets.shape[1] == num_classes:
        return targets.to(dtype)
    raise ValueError(f"targets must be int labels (N,) or rows (N, {num_classes}), got {tuple(targets.shape)}")


def _sample_beta(alpha: float, g: torch.Generator, device) -> torch.Tensor:
    """lambda ~ Beta(alpha, alpha) from ``g``, as a 0-d float64 tensor on the device (no host sync).

    ``torch.distributions.Beta`` takes no generator; it samples through ``torch._sample_dirichlet``
    on ``[alpha, alpha]``, which does take one, so this is torch's own Beta sampler seeded by ``g``
    (a private torch function: if it ever goes, use two ``torch._standard_gamma`` draws).
    """
    conc = torch.full((2,), float(alpha), dtype=torch.float64, device=device)
    return torch._sample_dirichlet(conc, generator=g)[0]


def _mix_prob(lam: torch.Tensor, p: float, g: torch.Generator) -> torch.Tensor:
    """timm's ``mix_prob``: with probability 1 - p the batch is left unmixed (lambda = 1)."""
    if p >= 1.0:
        return lam
    u = torch.rand((), generator=g, device=lam.device, dtype=torch.float64)
    return torch.where(u < p, lam, torch.ones_like(lam))


@register_op("mixup")
def _mixup_factory(ctx: AugmentContext, *, alpha: float = 0.8, p: float = 1.0):
    """Mixup (Zhang et al., ICLR 2018) as timm's ``Mixup`` in batch mode: one lambda ~ Beta(alpha, alpha)
    per batch, partner = the batch in reverse order (``x.flip(0)``), targets mixed with the same
    lambda. Unlike timm's default, no label smoothing; timm asserts an even batch, this does not
    (the middle sample of an odd batch is its own partner)."""
    alpha = _number("mixup", "alpha", alpha, lo=0.0, lo_open=True)
    p = _number("mixup", "p", p, lo=0.0, hi=1.0)

    def fn(x, targets, g):
        lam = _mix_prob(_sample_beta(alpha, g, x.device), p, g)
        lam_x = lam.to(x.dtype)
        rows = _target_rows(targets, ctx.num_classes, x.dtype)
        return x * lam_x + x.flip(0) * (1 - lam_x), rows * lam_x + rows.flip(0) * (1 - lam_x)

    return fn, {"alpha": alpha, "p": p}


def _cutmix_box(lam: torch.Tensor, h: int, w: int, g: torch.Generator):
    """The CutMix authors' ``rand_bbox`` (clovaai/CutMix-PyTorch, as DD-Ranking's
    ``ddranking/aug/cutmix.py``, SRe2L and RDED use it): ``cut = int(size * sqrt(1 - lam))`` per
    side, a uniform centre c, rows/columns ``c - cut // 2`` to ``c + cut // 2`` clipped to the image
    (so an odd cut loses a pixel; timm's ``rand_bbox`` keeps it); lambda is then set to
    1 - (box area / image area), as timm's ``correct_lam``. All on the device."""
    ratio = torch.sqrt(1.0 - lam)
    cut_h, cut_w = torch.floor(h * ratio).long(), torch.floor(w * ratio).long()
    cy = torch.randint(0, h, (), generator=g, device=lam.device)
    cx = torch.randint(0, w, (), generator=g, device=lam.device)
    yl, yh = (cy - cut_h // 2).clamp(0, h), (cy + cut_h // 2).clamp(0, h)
    xl, xh = (cx - cut_w // 2).clamp(0, w), (cx + cut_w // 2).clamp(0, w)
    rows, cols = torch.arange(h, device=lam.device), torch.arange(w, device=lam.device)
    mask = ((rows >= yl) & (rows < yh))[:, None] & ((cols >= xl) & (cols < xh))[None, :]
    lam = 1.0 - ((yh - yl) * (xh - xl)).double() / float(h * w)
    return mask, lam


@register_op("cutmix")
def _cutmix_factory(ctx: AugmentContext, *, alpha: float = 1.0, p: float = 1.0):
    """CutMix (Yun et al., ICCV 2019) in batch mode: one box per batch from lambda ~ Beta(alpha,
    alpha) (the CutMix authors' ``rand_bbox``, :func:`_cutmix_box`), the reversed batch's box pasted
    in, lambda corrected to the pasted area, targets mixed by area. DD-Ranking, SRe2L and RDED paste
    from a random permutation (the same in law on a shuffled batch) and relabel the mixed image with
    a teacher, leaving the targets unmixed; every CutMix preset relabels, and its protocols train with
    :func:`ddlib.engine.labels.teacher_augment`, which keeps the targets unmixed too (``mse_ce``'s CE
    term reads them)."""
    alpha = _number("cutmix", "alpha", alpha, lo=0.0, lo_open=True)
    p = _number("cutmix", "p", p, lo=0.0, hi=1.0)

    def fn(x, targets, g):
        lam = _mix_prob(_sample_beta(alpha, g, x.device), p, g)
        mask, lam = _cutmix_box(lam, x.shape[2], x.shape[3], g)
        lam_x = lam.to(x.dtype)
        rows = _target_rows(targets, ctx.num_classes, x.dtype)
        return torch.where(mask, x.flip(0), x), rows * lam_x + rows.flip(0) * (1 - lam_x)

    return fn, {"alpha": alpha, "p": p, "box": "clovaai"}  # box: in the name, so runs with timm's box are not reused
