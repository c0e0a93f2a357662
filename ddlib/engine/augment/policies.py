"""DC-Bench's augmentations: ``autoaugment``, ``randaugment`` and ``imagenet_aug``, torchvision's
kernels on uint8 pixels, seeded, batched (not differentiable); one draw for the whole batch by
default (``draw: batch``), as DC-Bench does, or one per image (``draw: image``). How they differ
from DC-Bench is in
``_DCBENCH_NOTE``, appended to each op's docstring."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from ddlib.engine.augment.pipeline import AugmentContext, register_op
from ddlib.engine.augment._params import _int_param, _number
from ddlib.engine.augment._pixels import _PixelSpace

_DCBENCH_NOTE = """
DC-Bench and these ops
----------------------

DC-Bench (Cui et al., NeurIPS 2022; justincui03/dc_benchmark, ``EvaluatorUtils.custom_aug`` in
``evaluator/evaluator_utils.py``, commit 071901d) evaluates a distilled set under ``--aug autoaug |
randaug | imagenet_aug`` by: de-normalising the batch (only with ``--normalize_data``, with mean/std
hard-coded for CIFAR-10/100 and Tiny ImageNet, 3 channels), clamping to [0, 1], ``* 255``,
``.to(torch.uint8)``, calling one torchvision (0.12, ``torchvision.transforms``) transform on the
whole N x C x H x W uint8 batch, ``/ 255`` and re-normalising:

  autoaug       AutoAugment(IMAGENET policy for tinyimagenet, CIFAR10 policy otherwise)
  randaug       RandAugment(num_ops=1)                      (magnitude 9, 31 bins: the defaults)
  imagenet_aug  RandomCrop(32 or 64 (tinyimagenet), padding=4), RandomHorizontalFlip(),
                ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.2)

(all other arguments at torchvision's defaults: nearest interpolation, fill 0 = black pixels,
constant zero padding, flip p = 0.5). The three ops (``autoaugment``, ``randaugment``,
``imagenet_aug``) do the same, with these differences, common to all three:

1. One draw per batch, as DC-Bench. A torchvision transform called on a 4-D batch draws once,
   so in DC-Bench the whole batch gets the same sub-policy / op, magnitude, sign, crop offset,
   flip and jitter factors (only the data-dependent parts, equalize/autocontrast histograms and
   the contrast mean, are per image); at IPC 1 to 10 (at most 100 images, batch 256) the whole set
   is one batch, so every image of an epoch shares one draw. The default, ``draw: batch``, draws
   once per batch and applies it to every image, which is DC-Bench's behaviour, so the op's name
   means what DC-Bench's table means everywhere (protocol default, notebook, ``ddlib score``,
   params files); ``draw: image`` gives every image its own draw (a named option; the
   augmentation protocol reports it as ``acc_<op>_per_image``). Until augmentation REVISION 4 the
   default was ``image``; the draw is in every evaluation's key, so no result mixes the two.
2. Randomness from the op's generator (never the global RNG), with our own sampling code that
   draws from torchvision's distributions (same tables, probabilities, ranges), so the same seed
   does not give torchvision's draws.
3. Quantisation rounds to nearest: ``round(clamp(pixels, 0, 1) * 255)``; DC-Bench truncates
   (``.to(torch.uint8)``), which turns a pixel that float error leaves at 28.99998 into 28, so real
   images (which lie on the uint8 grid) lose one level on ~19 % of their pixels (CIFAR-10 mean/std,
   measured); rounding gives them back unchanged. The two differ by at most 1/255. Why uint8 at
   all: the policies are only exact there (torchvision documents uint8 tensors for them); on floats
   v2 posterizes with ``floor(x * 2**bits) / 2**bits`` (4 bits: white -> 0.9375, not 240/255),
   equalize converts to uint8 internally anyway and wraps values outside [0, 1] around (-0.2 comes
   back as 0.80), and DC-Bench itself ran them on uint8. As in DC-Bench, every image comes back
   quantised to 1/255 steps and clamped to [0, 1] (pixel space) even when its draw applies nothing:
   distilled values outside [0, 1] are clipped (DC-Bench does the same), and the op is not
   differentiable (do not use it inside distillation).
4. Mean/std are the dataset's (any 1- or 3-channel dataset; other channel counts are refused at
   create time); DC-Bench de-normalises only 3-channel CIFAR/Tiny ImageNet and only when
   ``--normalize_data`` is set.
5. torchvision 0.29 (``transforms.v2`` kernels, pinned) instead of 0.12. On uint8 we checked the two
   kernel sets against each other: affine/shear/translate/rotate (nearest, fill 0), posterize,
   solarize, equalize, invert, brightness and contrast are identical (crop and flip trivially);
   hue (~30 % of pixels), sharpness (~4 %), saturation (< 3 %) and autocontrast (rare) differ by at
   most one level (0.29 rounds or scales by 255.999 where 0.12 truncates).
6. Batched, not looped: the images that drew the same op and magnitude go through torchvision's
   own kernel together (autoaugment, randaugment), and ColorJitter runs torchvision's colour math
   with one factor per image; the tests check both against torchvision applied image by image with
   the same draws (bit-identical on the CPU).

Why not kornia (``kornia.augmentation.auto.AutoAugment`` / ``RandAugment``)? Not faithful: one
sub-policy (AutoAugment) or one op set (RandAugment) per *batch*, magnitudes sampled inside an
interval around each bin on its own scales (shear x 180 degrees; RandAugment ``m / 30`` over a
different op list: invert and solarize_add in, identity out, translate +-0.1), float ops without
torchvision's uint8 semantics, draws from the global RNG. Nor much faster: on a 256 x 3 x 32 x 32
CPU batch (one thread, shared 2-core machine at load ~2.7, medians) kornia ran AutoAugment at
~15,000 img/s, RandAugment ~39,000, RandomCrop + flip + ColorJitter ~8,600; these ops ~12,000 /
~19,000 / ~6,400; torchvision image by image (the ``torchvision`` op's loop, AutoAugment) ~3,800.
With the cores oversubscribed (load 8-10 on 2 cores, two threads) everything drops ~10x, the
image-by-image loop worst (~250 img/s: thousands of tiny parallel regions).
"""


_AUTOAUGMENT_POLICIES = ("auto", "cifar10", "imagenet", "svhn")
DRAWS = ("image", "batch")


def _check_draw(op: str, draw) -> str:
    if draw not in DRAWS:
        raise ValueError(f"augmentation op {op!r}: 'draw' must be one of {list(DRAWS)}, got {draw!r}")
    return draw


def _draw(make_plan, tv, n: int, height: int, width: int, g: torch.Generator, device, draw: str) -> list[list]:
    """``make_plan``'s draws, one per image, or (``draw: batch``) one for the whole batch."""
    if draw == "batch":
        return [row * n for row in make_plan(tv, 1, height, width, g, device)]
    return make_plan(tv, n, height, width, g, device)


def _autoaugment_policy(policy: str, height: int, width: int):
    """The torchvision ``AutoAugmentPolicy`` an ``autoaugment`` op uses on H x W images: ``auto`` is
    CIFAR10 for images up to 32 x 32 (CIFAR, SVHN, MNIST, digits) and IMAGENET for anything larger
    (DC-Bench: IMAGENET for Tiny ImageNet (64 x 64), CIFAR10 otherwise)."""
    from torchvision.transforms.v2 import AutoAugmentPolicy

    if policy == "auto":
        return AutoAugmentPolicy.CIFAR10 if height <= 32 and width <= 32 else AutoAugmentPolicy.IMAGENET
    return AutoAugmentPolicy(policy)


def _check_rgb_or_gray(op: str, ctx: AugmentContext) -> None:
    if len(ctx.mean) not in (1, 3):
        raise ValueError(f"augmentation op {op!r} works on 1- or 3-channel images, the dataset has {len(ctx.mean)}")


def _magnitude(tv, name: str, num_bins: int, index: int, height: int, width: int, cache: dict):
    """(magnitude, signed) of torchvision's ``_AUGMENTATION_SPACE[name]`` at ``index`` (0.0 for ops
    without one), as ``AutoAugment.forward`` / ``RandAugment.forward`` compute it."""
    key = (name, index)
    if key not in cache:
        magnitudes_fn, signed = tv._AUGMENTATION_SPACE[name]
        magnitudes = magnitudes_fn(num_bins, height, width)
        cache[key] = (float(magnitudes[index]) if magnitudes is not None else 0.0, signed)
    return cache[key]


def _autoaugment_plan(tv, n: int, height: int, width: int, g: torch.Generator, device) -> list[list]:
    """Per-sample draws of torchvision ``AutoAugment.forward``: a sub-policy uniformly, then for each of
    its two steps "apply" with U <= probability and, for signed ops, a negative magnitude with
    U <= 0.5. Returns one list per step of ``(op name, signed magnitude)`` or ``None`` (not applied)."""
    policies = tv._policies
    k = torch.randint(0, len(policies), (n,), generator=g, device=device).tolist()
    u = torch.rand(n, 2, 2, generator=g, device=device).tolist()  # [sample][step][apply, sign]
    cache: dict = {}
    plan = []
    for step in range(2):
        row = []
        for i in range(n):
            name, probability, index = policies[k[i]][step]
            if not u[i][step][0] <= probability:
                row.append(None)
                continue
            magnitude, signed = _magnitude(tv, name, 10, index or 0, height, width, cache)
            if signed and u[i][step][1] <= 0.5:
                magnitude = -magnitude
            row.append((name, magnitude))
        plan.append(row)
    return plan


def _randaugment_plan(tv, n: int, height: int, width: int, g: torch.Generator, device) -> list[list]:
    """Per-sample draws of torchvision ``RandAugment.forward``: ``num_ops`` times an op uniformly from
    its 14 (Identity included), magnitude ``magnitudes[magnitude]`` of ``num_magnitude_bins``,
    negative with U <= 0.5 for signed ops. Same format as :func:`_autoaugment_plan`."""
    names = list(tv._AUGMENTATION_SPACE)
    ops = torch.randint(0, len(names), (n, tv.num_ops), generator=g, device=device).tolist()
    u = torch.rand(n, tv.num_ops, generator=g, device=device).tolist()
    cache: dict = {}
    plan = []
    for step in range(tv.num_ops):
        row = []
        for i in range(n):
            name = names[ops[i][step]]
            magnitude, signed = _magnitude(tv, name, tv.num_magnitude_bins, tv.magnitude, height, width, cache)
            if signed and u[i][step] <= 0.5:
                magnitude = -magnitude
            row.append((name, magnitude))
        plan.append(row)
    return plan


def _apply_plan(tv, pixels_u8: torch.Tensor, plan: list[list]) -> torch.Tensor:
    """Apply a plan step by step, in place on the uint8 batch: the images that drew the same
    ``(op, magnitude)`` go through torchvision's ``_apply_image_or_video_transform`` together. Every
    kernel it calls treats a batch as independent images (geometric ops with one matrix; contrast
    mean, autocontrast, equalize and sharpness per image), so this equals torchvision image by image."""
    for row in plan:
        groups: dict = {}
        for i, item in enumerate(row):
            if item is not None and item[0] != "Identity":
                groups.setdefault(item, []).append(i)
        for (name, magnitude), idx in groups.items():
            sel = torch.tensor(idx, device=pixels_u8.device)
            pixels_u8[sel] = tv._apply_image_or_video_transform(
                pixels_u8[sel], name, magnitude, interpolation=tv.interpolation, fill=tv._fill
            )
    return pixels_u8


@register_op("autoaugment")
def _autoaugment_factory(ctx: AugmentContext, *, policy: str = "auto", draw: str = "batch"):
    """DC-Bench's ``autoaug``: torchvision ``AutoAugment(policy)`` on uint8 pixels.

    ``policy``: ``auto`` (CIFAR10 for images up to 32 x 32, IMAGENET above, decided per batch from its
    size: :func:`_autoaugment_policy`), ``cifar10``, ``imagenet`` or ``svhn``. Nearest interpolation,
    fill 0 (black pixels), torchvision's tables (25 sub-policies of two ops, magnitude bins of 10,
    translations of up to 150/331 of the image side: at most 3 px on 8 x 8). ``draw``: ``batch``
    (one for the whole batch, DC-Bench; the default) or ``image`` (each image its own sub-policy and signs).

    Differences from DC-Bench: the common ones in the note below (generator,
    rounding instead of truncation, dataset mean/std, torchvision 0.29 kernels, grouped batching);
    the ``auto`` policy looks at the image size, DC-Bench at the dataset name (the two agree on
    CIFAR-10/100 and Tiny ImageNet). Grayscale images work (torchvision's ``Color`` op leaves a
    1-channel image unchanged, as PIL does)."""
    if not isinstance(policy, str) or policy.lower() not in _AUTOAUGMENT_POLICIES:
        raise ValueError(
            f"augmentation op 'autoaugment': 'policy' must be one of {list(_AUTOAUGMENT_POLICIES)}, got {policy!r}"
        )
    policy = policy.lower()
    draw = _check_draw("autoaugment", draw)
    _check_rgb_or_gray("autoaugment", ctx)
    from torchvision.transforms import v2

    space = _PixelSpace(ctx, "autoaugment")
    transforms: dict = {}

    def fn(x, targets, g):
        n, _, h, w = x.shape
        chosen = _autoaugment_policy(policy, h, w)
        if chosen not in transforms:
            transforms[chosen] = v2.AutoAugment(chosen)
        tv = transforms[chosen]
        pixels = space.to_uint8(x)
        plan = _draw(_autoaugment_plan, tv, n, h, w, g, x.device, draw)
        return space.from_uint8(_apply_plan(tv, pixels, plan), x), targets

    return fn, {"policy": policy, "draw": draw}


@register_op("randaugment")
def _randaugment_factory(ctx: AugmentContext, *, num_ops: int = 1, magnitude: int = 9, num_magnitude_bins: int = 31,
                         draw: str = "batch"):
    """DC-Bench's ``randaug``: torchvision ``RandAugment(num_ops=1)`` (magnitude 9 of 31 bins, nearest,
    fill 0) on uint8 pixels: each image (or, by default, the batch) draws ``num_ops`` ops uniformly from torchvision's
    14 (Identity, ShearX/Y, TranslateX/Y, Rotate, Brightness, Color, Contrast, Sharpness, Posterize,
    Solarize, AutoContrast, Equalize), each with a random sign where signed. ``magnitude`` must be in
    [0, num_magnitude_bins - 1] (torchvision would fail on the first draw otherwise). ``draw``:
    ``batch`` (one draw for the batch, DC-Bench; the default) or ``image`` (each image its own ops and signs).

    Differences from DC-Bench: the common ones in the note below (generator,
    rounding instead of truncation, dataset mean/std, torchvision 0.29 kernels, grouped batching).
    Grayscale images work (``Color`` leaves 1 channel unchanged, as PIL does)."""
    num_ops = _int_param("randaugment", "num_ops", num_ops, 0)
    num_magnitude_bins = _int_param("randaugment", "num_magnitude_bins", num_magnitude_bins, 2)
    magnitude = _int_param("randaugment", "magnitude", magnitude, 0, num_magnitude_bins - 1)
    draw = _check_draw("randaugment", draw)
    _check_rgb_or_gray("randaugment", ctx)
    from torchvision.transforms import v2

    tv = v2.RandAugment(num_ops=num_ops, magnitude=magnitude, num_magnitude_bins=num_magnitude_bins)
    space = _PixelSpace(ctx, "randaugment")

    def fn(x, targets, g):
        n, _, h, w = x.shape
        pixels = space.to_uint8(x)
        plan = _draw(_randaugment_plan, tv, n, h, w, g, x.device, draw)
        return space.from_uint8(_apply_plan(tv, pixels, plan), x), targets

    return fn, {"num_ops": num_ops, "magnitude": magnitude, "num_magnitude_bins": num_magnitude_bins, "draw": draw}


# ColorJitter on uint8 with one factor per image: torchvision 0.29's kernels
# (``torchvision/transforms/v2/functional/_color.py``) with the scalar factor replaced by a per-image
# column; ``_blend``'s ``mul(r).add_(other, alpha=1 - r)`` becomes ``addcmul`` (same rounding on the CPU).


def _factor(f: torch.Tensor) -> torch.Tensor:
    return f.to(torch.float32).view(-1, 1, 1, 1)


def _blend_u8(img: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    alpha = (1.0 - f.double()).to(torch.float32).view(-1, 1, 1, 1)  # torchvision: float(1.0 - ratio)
    return torch.addcmul(img.to(torch.float32) * _factor(f), other, alpha).clamp_(0, 255).to(torch.uint8)


def _gray_u8(img: torch.Tensor) -> torch.Tensor:
    from torchvision.transforms.v2.functional._color import _rgb_to_grayscale_image

    return _rgb_to_grayscale_image(img, num_output_channels=1, preserve_dtype=False).floor_()


def _brightness_u8(img, f):
    return img.to(torch.float32).mul(_factor(f)).clamp_(0, 255).to(torch.uint8)


def _contrast_u8(img, f):
    gray = _gray_u8(img) if img.shape[1] == 3 else img.to(torch.float32)
    return _blend_u8(img, gray.mean(dim=(-3, -2, -1), keepdim=True), f)


def _saturation_u8(img, f):
    if img.shape[1] == 1:  # torchvision (matching PIL): no-op on 1 channel
        return img
    return _blend_u8(img, _gray_u8(img), f)


def _hue_u8(img, f):
    from torchvision.transforms.v2.functional import to_dtype
    from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

    if img.shape[1] == 1:  # torchvision (matching PIL): no-op on 1 channel
        return img
    h, s, v = _rgb_to_hsv(to_dtype(img, torch.float32, scale=True)).unbind(dim=-3)
    h = h.add(f.to(torch.float32).view(-1, 1, 1)).remainder_(1.0)
    return to_dtype(_hsv_to_rgb(torch.stack((h, s, v), dim=-3)), torch.uint8, scale=True)


_JITTER_KERNELS = (_brightness_u8, _contrast_u8, _saturation_u8, _hue_u8)  # torchvision's fn_idx order


def _jitter_ranges(brightness: float, contrast: float, saturation: float, hue: float) -> list:
    """ColorJitter's ``_check_input`` for single numbers: [max(0, 1 - v), 1 + v] (hue: [-v, v]),
    ``None`` (op off) for 0."""
    ranges = [None if v == 0 else (max(0.0, 1.0 - v), 1.0 + v) for v in (brightness, contrast, saturation)]
    return ranges + [None if hue == 0 else (-hue, hue)]


def _jitter_plan(n: int, ranges: list, g: torch.Generator, device):
    """Per-sample ColorJitter draws: a random order of the four ops (``randperm(4)``) and one uniform
    factor per enabled op. Returns (order (n, 4) long, [factor (n,) float32 or None] * 4)."""
    order = torch.rand(n, 4, generator=g, device=device).argsort(dim=1)
    factors = [
        None if r is None else r[0] + (r[1] - r[0]) * torch.rand(n, generator=g, device=device) for r in ranges
    ]
    return order, factors


def _jitter_apply(pixels_u8: torch.Tensor, order: torch.Tensor, factors: list) -> torch.Tensor:
    """ColorJitter with per-sample order and factors, in place on the uint8 batch."""
    for position in range(4):
        for op_id, f in enumerate(factors):
            if f is None:
                continue
            sel = (order[:, position] == op_id).nonzero().squeeze(1)
            if sel.numel():
                pixels_u8[sel] = _JITTER_KERNELS[op_id](pixels_u8[sel], f[sel])
    return pixels_u8


def _crop_u8(pixels_u8: torch.Tensor, padding: int, g: torch.Generator, shared: bool = False) -> torch.Tensor:
    """``RandomCrop(size=input size, padding)`` per sample (``shared``: one offset for the batch):
    zero-pad by ``padding`` on every side and cut the input size at a uniform offset in
    [0, 2 * padding] per axis, i.e. shift by [-padding, padding] px with black (0) fill."""
    n, _, h, w = pixels_u8.shape
    dev = pixels_u8.device
    draws = 1 if shared else n
    top = torch.randint(0, 2 * padding + 1, (draws,), generator=g, device=dev).expand(n)
    left = torch.randint(0, 2 * padding + 1, (draws,), generator=g, device=dev).expand(n)
    padded = F.pad(pixels_u8, [padding] * 4)
    rows = (top[:, None] + torch.arange(h, device=dev))[:, :, None]
    cols = (left[:, None] + torch.arange(w, device=dev))[:, None, :]
    batch = torch.arange(n, device=dev)[:, None, None]
    return padded[batch, :, rows, cols].permute(0, 3, 1, 2).contiguous()


@register_op("imagenet_aug")
def _imagenet_aug_factory(ctx: AugmentContext, *, padding: int = 4, flip: float = 0.5, brightness: float = 0.4,
                          contrast: float = 0.4, saturation: float = 0.4, hue: float = 0.2, draw: str = "batch"):
    """DC-Bench's ``imagenet_aug``: ``RandomCrop(size, padding=4)``, ``RandomHorizontalFlip()``,
    ``ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.2)``, in that order, on uint8
    pixels. Crop: shift by [-padding, padding] px per axis with black fill. Flip with
    probability ``flip``. Jitter: the four colour ops in a random order per draw, factors uniform
    in [max(0, 1 - v), 1 + v] (hue in [-v, v]); 0 turns an op off (all four 0 and ``padding: 0``,
    ``flip: 0`` leave only the quantisation). ``draw``: ``batch`` (one draw for the batch, DC-Bench; the
    default) or ``image`` (each image its own offset, flip, order and factors).

    Differences from DC-Bench: the common ones in the note below (generator,
    rounding instead of truncation, dataset mean/std, torchvision 0.29 kernels, batched jitter);
    the crop size is the input size (DC-Bench: 32, or 64 for Tiny ImageNet, whatever the input, so a
    28 x 28 batch would come out 32 x 32); ``flip`` is a parameter (DC-Bench: 0.5). Padding stays 4 px
    by default at every size, a large shift on 8 x 8 digits (set ``padding`` for those). On 1-channel
    images saturation and hue are no-ops (torchvision matches PIL there); their factors are still drawn."""
    padding = _int_param("imagenet_aug", "padding", padding, 0)
    flip = _number("imagenet_aug", "flip", flip, lo=0.0, hi=1.0)
    brightness, contrast, saturation = (
        _number("imagenet_aug", k, v, lo=0.0) for k, v in (("brightness", brightness), ("contrast", contrast),
                                                           ("saturation", saturation))
    )
    hue = _number("imagenet_aug", "hue", hue, lo=0.0, hi=0.5)
    draw = _check_draw("imagenet_aug", draw)
    _check_rgb_or_gray("imagenet_aug", ctx)
    ranges = _jitter_ranges(brightness, contrast, saturation, hue)
    space = _PixelSpace(ctx, "imagenet_aug")

    shared = draw == "batch"

    def fn(x, targets, g):
        n = x.shape[0]
        draws = 1 if shared else n
        pixels = space.to_uint8(x)
        if padding:
            pixels = _crop_u8(pixels, padding, g, shared)
        u = torch.rand(draws, 1, 1, 1, generator=g, device=x.device)
        pixels = torch.where(u < flip, pixels.flip(3), pixels)
        if any(r is not None for r in ranges):
            order, factors = _jitter_plan(draws, ranges, g, x.device)
            if shared:
                order, factors = order.expand(n, -1), [None if f is None else f.expand(n) for f in factors]
            pixels = _jitter_apply(pixels, order, factors)
        return space.from_uint8(pixels, x), targets

    resolved = {"padding": padding, "flip": flip, "brightness": brightness, "contrast": contrast,
                "saturation": saturation, "hue": hue, "draw": draw}
    return fn, resolved


for _factory in (_autoaugment_factory, _randaugment_factory, _imagenet_aug_factory):
    if _factory.__doc__:  # None under python -OO
        _factory.__doc__ += "\n" + textwrap.indent(_DCBENCH_NOTE, "    ")
del _factory
