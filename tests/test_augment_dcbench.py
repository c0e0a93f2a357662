"""ddlib.engine.augment: DC-Bench's autoaugment, randaugment and imagenet_aug (per batch, DC-Bench's default, or per image,
seeded, uint8 pixel space), and DC's own evaluation augmentation ``dc_augment``.

Faithfulness is checked against torchvision itself: the grouped, batched application of the drawn
parameters must equal torchvision's kernels applied image by image with the same parameters, bit for bit.
``dc_augment``'s outputs are checked against every outcome DC's ``utils.augment`` can draw.

Neither peer installs from a package index, so these tests are hand-derived from the peers' code
(read, not copied), each section naming its source:

* DC-Bench (github.com/justincui03/dc_benchmark) ``evaluator/evaluator_utils.py``,
  ``SideTrainer.custom_aug``: de-normalise, clamp to [0, 1], x 255, ``.to(torch.uint8)``, one
  torchvision call on the whole batch (``AutoAugment`` with the ``IMAGENET`` policy for
  tinyimagenet and ``CIFAR10`` otherwise; ``RandAugment(num_ops=1)``; ``imagenet_aug`` =
  ``RandomCrop(size, padding=4)``, ``RandomHorizontalFlip()``, ``ColorJitter(0.4, 0.4, 0.4, 0.2)``),
  / 255, re-normalise. The per-batch draw is ``draw: batch``; ddlib rounds where it truncates (named
  in ``ddlib/engine/augment/policies.py``).
* DC (github.com/VICO-UoE/DatasetCondensation) ``utils.py::augment`` with its inner ``cropfun``,
  ``scalefun``, ``rotatefun`` and ``noisefun`` (DC-Bench's copy: ``evaluator/evaluator_utils.py``
  ``SideTrainer.augment``), and ``get_daparam`` for the defaults. The outcome sets below enumerate what
  that code can produce for each of its draws (crop offsets, scaled sizes, integer angles), built
  with torch/scipy kernels, not with ddlib's code, so an implementation copied into both places
  cannot pass by construction.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddlib.engine.augment import policies as A
from ddlib.engine.augment import create_augment

RGB = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))  # CIFAR-10 (DC-Bench's constants)
GRAY = ((0.1307,), (0.3081,))  # MNIST
OPS = ["autoaugment", "randaugment", "imagenet_aug"]
SHAPES = [(256, 3, 32, 32), (16, 1, 28, 28), (16, 1, 8, 8)]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def stats(c: int):
    return RGB if c == 3 else GRAY


def make(spec, c: int = 3):
    mean, std = stats(c)
    return create_augment(spec, mean=mean, std=std, num_classes=10)


def normalize(pixels: torch.Tensor) -> torch.Tensor:
    mean, std = stats(pixels.shape[1])
    return (pixels - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def to_u8(x: torch.Tensor) -> torch.Tensor:
    """Normalised batch -> uint8 pixels (round to nearest), to compare outputs exactly."""
    mean, std = stats(x.shape[1])
    pixels = x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)
    return pixels.clamp(0, 1).mul(255).round().to(torch.uint8)


def u8_batch(shape, seed=0) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=gen(seed), dtype=torch.uint8)


def batch(shape, seed=0):
    """A normalised batch of real-looking images (on the uint8 grid) and int labels."""
    x = normalize(u8_batch(shape, seed).float() / 255)
    return x, torch.randint(0, 10, (shape[0],), generator=gen(100 + seed))


# --------------------------------------------------------------------------- contract of every op


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", OPS)
def test_op_keeps_shape_and_targets_is_seeded_and_leaves_global_rng_alone(op, shape):
    aug = make(op, shape[1])
    x, y = batch(shape)
    x_before = x.clone()
    torch.manual_seed(1)
    state = torch.get_rng_state()
    a, ta = aug(x, y, gen(0))
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    torch.manual_seed(2)  # ...and not read
    b, tb = aug(x, y, gen(0))
    c, _ = aug(x, y, gen(1))
    assert a.shape == x.shape and a.dtype == x.dtype and a.device == x.device
    assert torch.equal(ta, y) and ta.dtype == y.dtype and torch.equal(tb, y)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(x, x_before)  # input not modified in place


@pytest.mark.parametrize("op", OPS)
def test_float64_stays_float64(op):
    x, y = batch((8, 3, 32, 32))
    out, _ = make(op)(x.double(), y, gen(0))
    assert out.dtype == torch.float64


@pytest.mark.parametrize("op,min_distinct", [("autoaugment", 10), ("randaugment", 10), ("imagenet_aug", 60)])
def test_identical_images_in_one_batch_get_different_transforms_under_per_image_draws(op, min_distinct):
    x, y = batch((1, 3, 32, 32))
    out, _ = make({op: {"draw": "image"}})(x.expand(64, -1, -1, -1).contiguous(), y.expand(64), gen(0))
    distinct = {to_u8(o[None]).numpy().tobytes() for o in out}
    assert len(distinct) >= min_distinct


def test_describe_spells_out_every_param():
    # the default draw is DC-Bench's, once per batch (evaluator_utils.py ``custom_aug``: one torchvision
    # call on the whole N x C x H x W batch), so the bare op name means what DC-Bench's table means
    assert make("autoaugment").name == "autoaugment(policy=auto, draw=batch)"
    assert make("randaugment").name == "randaugment(num_ops=1, magnitude=9, num_magnitude_bins=31, draw=batch)"
    assert make("imagenet_aug").name == (
        "imagenet_aug(padding=4, flip=0.5, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.2, draw=batch)"
    )
    assert make({"autoaugment": {"policy": "SVHN", "draw": "image"}}).name == "autoaugment(policy=svhn, draw=image)"
    assert make("dc_augment", 1).name == "dc_augment(strategy=crop_scale_rotate, crop=4, scale=0.2, rotate=45, noise=0.001)"


# --------------------------------------------------------------------------- draw: batch (DC-Bench's per-batch draws)
# Derived from DC-Bench evaluator/evaluator_utils.py SideTrainer.custom_aug: data_transforms(normalized_d.to(torch.uint8))
# is one call on the N x C x H x W batch, so torchvision draws once and every image gets the same transform.


@pytest.mark.parametrize("op", OPS)
def test_batch_draw_gives_every_image_of_a_batch_the_same_transform(op):
    """``draw: batch`` is DC-Bench's one torchvision call on the whole batch: each image comes out as
    it would alone under the same draw (identical images come out identical); ``draw: image`` does
    not, and successive batches draw anew."""
    x, y = batch((12, 3, 32, 32), seed=4)
    shared = make({op: {"draw": "batch"}})
    out, _ = shared(x, y, gen(3))
    alone = torch.cat([shared(x[i:i + 1], y[i:i + 1], gen(3))[0] for i in range(len(x))])
    assert torch.equal(to_u8(out), to_u8(alone))
    per_image = make({op: {"draw": "image"}})(x, y, gen(3))[0]
    assert not torch.equal(to_u8(per_image), to_u8(torch.cat([make({op: {"draw": "image"}})(x[i:i + 1], y[i:i + 1], gen(3))[0]
                                                              for i in range(len(x))])))
    same = x[:1].expand(32, -1, -1, -1).contiguous()
    g = gen(5)
    outs = [to_u8(shared(same, y.new_zeros(32), g)[0]) for _ in range(6)]
    assert all(len({o[None].numpy().tobytes() for o in b}) == 1 for b in outs)  # one transform per batch
    assert len({b[0].numpy().tobytes() for b in outs}) > 1  # ... drawn anew for every batch


def test_batch_draw_crop_shifts_the_whole_batch_alike():
    img = _known_image()
    x = normalize(torch.stack([img, img.flip(2)]).float() / 255)
    spec = {"imagenet_aug": {"draw": "batch", "flip": 0.0, "brightness": 0, "contrast": 0, "saturation": 0, "hue": 0}}
    seen = set()
    for seed in range(8):
        out = to_u8(make(spec)(x, torch.zeros(2), gen(seed))[0])
        (a,), (b,) = (_match(*_candidates(im, 4, flips=(0,)), o[None]) for im, o in zip((img, img.flip(2)), out))
        assert a == b  # both images shifted alike
        seen.add(a)
    assert len(seen) > 1


def test_draw_is_validated():
    with pytest.raises(ValueError, match="'draw'"):
        make({"randaugment": {"draw": "epoch"}})


# --------------------------------------------------------------------------- autoaugment policy
# Derived from DC-Bench SideTrainer.custom_aug: AutoAugmentPolicy.IMAGENET for tinyimagenet (64 x 64),
# AutoAugmentPolicy.CIFAR10 for every other dataset (32 x 32 and the 28 x 28 MNIST family).


def test_auto_policy_is_cifar10_up_to_32_and_imagenet_above():
    from torchvision.transforms.v2 import AutoAugmentPolicy as P

    assert A._autoaugment_policy("auto", 32, 32) is P.CIFAR10
    assert A._autoaugment_policy("auto", 28, 28) is P.CIFAR10
    assert A._autoaugment_policy("auto", 8, 8) is P.CIFAR10
    assert A._autoaugment_policy("auto", 64, 64) is P.IMAGENET
    assert A._autoaugment_policy("auto", 32, 64) is P.IMAGENET
    assert A._autoaugment_policy("svhn", 64, 64) is P.SVHN


@pytest.mark.parametrize("size,policy,other", [(32, "cifar10", "imagenet"), (64, "imagenet", "cifar10")])
def test_auto_policy_output_equals_the_named_policy(size, policy, other):
    x, y = batch((32, 3, size, size))
    auto, _ = make("autoaugment")(x, y, gen(0))
    assert torch.equal(auto, make({"autoaugment": {"policy": policy}})(x, y, gen(0))[0])
    assert not torch.equal(auto, make({"autoaugment": {"policy": other}})(x, y, gen(0))[0])


# --------------------------------------------------------------------------- faithful to torchvision


def _reference_plan(tv, images: torch.Tensor, plan) -> torch.Tensor:
    """torchvision's own kernel, image by image, with the drawn (op, magnitude) of each step."""
    out = []
    for i, img in enumerate(images):
        for row in plan:
            if row[i] is not None:
                img = tv._apply_image_or_video_transform(img, row[i][0], row[i][1],
                                                         interpolation=tv.interpolation, fill=tv._fill)
        out.append(img)
    return torch.stack(out)


@pytest.mark.parametrize("shape", [(64, 3, 32, 32), (16, 3, 64, 64), (16, 1, 28, 28), (16, 1, 8, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["autoaugment", "randaugment", "autoaugment_svhn", "randaugment_2ops"])
def test_grouped_plan_equals_torchvision_image_by_image(kind, shape):
    from torchvision.transforms import v2

    n, _, h, w = shape
    images = u8_batch(shape)
    if kind.startswith("autoaugment"):
        tv = v2.AutoAugment(A._autoaugment_policy("svhn" if kind.endswith("svhn") else "auto", h, w))
        plan = A._autoaugment_plan(tv, n, h, w, gen(1), "cpu")
    else:
        tv = v2.RandAugment(num_ops=2 if kind.endswith("2ops") else 1, magnitude=9)
        plan = A._randaugment_plan(tv, n, h, w, gen(1), "cpu")
    out = A._apply_plan(tv, images.clone(), plan)
    assert torch.equal(out, _reference_plan(tv, images, plan))
    assert (out != images).any()


@pytest.mark.parametrize("shape", [(64, 3, 32, 32), (16, 1, 8, 8)], ids=lambda s: "x".join(map(str, s)))
def test_batched_jitter_equals_torchvision_color_jitter_image_by_image(shape):
    from torchvision.transforms.v2 import functional as TF

    images = u8_batch(shape)
    order, factors = A._jitter_plan(shape[0], A._jitter_ranges(0.4, 0.4, 0.4, 0.2), gen(2), "cpu")
    out = A._jitter_apply(images.clone(), order, factors)
    kernels = [TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue]  # fn_idx order
    ref = []
    for i, img in enumerate(images):
        for k in order[i].tolist():
            img = kernels[k](img, float(factors[k][i]))
        ref.append(img)
    assert torch.equal(out, torch.stack(ref))


def test_autoaugment_draws_follow_torchvisions_policy_table():
    from torchvision.transforms import v2

    tv = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    n = 20000
    plan = A._autoaugment_plan(tv, n, 32, 32, gen(0), "cpu")
    for step in (0, 1):
        expected = sum(p[step][1] for p in tv._policies) / len(tv._policies)  # uniform sub-policy, U <= prob
        applied = sum(item is not None for item in plan[step]) / n
        assert applied == pytest.approx(expected, abs=0.015)
    table = {}
    for name, _, index in (op for p in tv._policies for op in p):
        fn, signed = tv._AUGMENTATION_SPACE[name]
        mags = fn(10, 32, 32)
        table.setdefault(name, set()).add(float(mags[index]) if mags is not None else 0.0)
    signed_items = [item for row in plan for item in row if item and tv._AUGMENTATION_SPACE[item[0]][1] and item[1]]
    assert all(abs(m) in table[name] for row in plan for item in row if item for name, m in [item])
    assert sum(m < 0 for _, m in signed_items) / len(signed_items) == pytest.approx(0.5, abs=0.02)


def test_randaugment_draws_ops_uniformly_at_magnitude_9_with_random_sign():
    from torchvision.transforms import v2

    tv = v2.RandAugment(num_ops=1, magnitude=9)
    n = 14000
    (row,) = A._randaugment_plan(tv, n, 32, 32, gen(0), "cpu")
    names = [name for name, _ in row]
    for name in tv._AUGMENTATION_SPACE:
        assert names.count(name) / n == pytest.approx(1 / 14, abs=0.012)
    rotations = [m for name, m in row if name == "Rotate"]
    assert set(rotations) == {9.0, -9.0}  # linspace(0, 30, 31)[9]
    assert sum(m < 0 for m in rotations) / len(rotations) == pytest.approx(0.5, abs=0.06)


def test_jitter_draws_a_random_order_and_factors_in_range():
    order, (b, c, s, h) = A._jitter_plan(5000, A._jitter_ranges(0.4, 0.4, 0.4, 0.2), gen(0), "cpu")
    assert torch.equal(order.sort(1).values, torch.arange(4).expand(5000, 4))
    assert len({tuple(o) for o in order.tolist()}) == 24
    for f, lo, hi in ((b, 0.6, 1.4), (c, 0.6, 1.4), (s, 0.6, 1.4), (h, -0.2, 0.2)):
        assert f.dtype == torch.float32 and f.min() >= lo and f.max() <= hi
        assert f.mean().item() == pytest.approx((lo + hi) / 2, abs=0.02)
    assert A._jitter_ranges(1.5, 0, 0.4, 0) == [(0.0, 2.5), None, (0.6, 1.4), None]


# --------------------------------------------------------------------------- imagenet_aug geometry
# Derived from DC-Bench SideTrainer.custom_aug's 'imagenet_aug': RandomCrop(size, padding=4) (zero fill),
# RandomHorizontalFlip(), ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.2).


def _known_image(c=3, h=32, w=32) -> torch.Tensor:
    """Distinct-valued pixels on the uint8 grid (no zeros, so a zero-filled border is unambiguous)."""
    v = (torch.arange(c * h * w).view(c, h, w) * 37) % 255 + 1
    return v.to(torch.uint8)


def _shifted(img: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """out[:, i, j] = img[:, i + dy, j + dx], 0 outside."""
    out = torch.zeros_like(img)
    h, w = img.shape[-2:]
    out[:, max(0, -dy):min(h, h - dy), max(0, -dx):min(w, w - dx)] = \
        img[:, max(0, dy):min(h, h + dy), max(0, dx):min(w, w + dx)]
    return out


CROP_FLIP_ONLY = {"imagenet_aug": {"brightness": 0, "contrast": 0, "saturation": 0, "hue": 0, "draw": "image"}}


def _candidates(img: torch.Tensor, pad: int, flips=(0, 1)):
    """Every (flip, dy, dx) with |dy|, |dx| <= pad and the image it gives, stacked."""
    keys = [(f, dy, dx) for f in flips for dy in range(-pad, pad + 1) for dx in range(-pad, pad + 1)]
    return keys, torch.stack([_shifted(img.flip(-1) if f else img, dy, dx) for f, dy, dx in keys])


def _match(keys, cands, out_u8) -> list:
    hits = (cands[None] == out_u8[:, None]).flatten(2).all(2)  # (batch, candidates)
    assert (hits.sum(1) == 1).all()  # every output is exactly one of them
    return [keys[i] for i in hits.int().argmax(1).tolist()]


def test_crop_flip_only_is_an_exact_translation_or_flip_with_black_fill():
    img = _known_image()
    x = normalize(img.float()[None] / 255).expand(64, -1, -1, -1).contiguous()
    out, _ = make(CROP_FLIP_ONLY)(x, torch.zeros(64, dtype=torch.long), gen(0))
    keys, cands = _candidates(img, 4)
    found = _match(keys, cands, to_u8(out))
    expected = torch.stack([cands[keys.index(k)] for k in found])
    assert torch.allclose(out, normalize(expected.float() / 255), atol=1e-5)  # exact, in normalised space
    assert {f for f, _, _ in found} == {0, 1} and len(set(found)) > 20


def test_no_crop_and_certain_flip_is_exactly_the_mirror_image():
    x, y = batch((8, 3, 32, 32))
    spec = {"imagenet_aug": {**CROP_FLIP_ONLY["imagenet_aug"], "padding": 0, "flip": 1}}
    assert torch.allclose(make(spec)(x, y, gen(0))[0], x.flip(3), atol=1e-5)
    spec["imagenet_aug"]["flip"] = 0
    assert torch.allclose(make(spec)(x, y, gen(0))[0], x, atol=1e-5)


def test_padding_is_a_parameter():
    img = _known_image(1, 8, 8)
    x = normalize(img.float()[None] / 255).expand(64, -1, -1, -1).contiguous()
    spec = {"imagenet_aug": {**CROP_FLIP_ONLY["imagenet_aug"], "padding": 1, "flip": 0}}  # per image
    out, _ = make(spec, 1)(x, torch.zeros(64, dtype=torch.long), gen(0))
    keys, cands = _candidates(img, 1, flips=(0,))
    assert len(set(_match(keys, cands, to_u8(out)))) == 9


def test_saturation_and_hue_are_no_ops_on_grayscale():
    x, y = batch((16, 1, 28, 28))
    spec = {"imagenet_aug": {"padding": 0, "flip": 0, "brightness": 0, "contrast": 0, "saturation": 0.4, "hue": 0.2}}
    assert torch.allclose(make(spec, 1)(x, y, gen(0))[0], x, atol=1e-5)
    spec["imagenet_aug"]["contrast"] = 0.4
    assert not torch.allclose(make(spec, 1)(x, y, gen(0))[0], x, atol=1e-3)


# --------------------------------------------------------------------------- uint8 quantisation
# Derived from DC-Bench SideTrainer.custom_aug: clamp to [0, 1], * 255, .to(torch.uint8) (truncation;
# ddlib rounds to nearest, a named deviation), then / 255.


def test_quantisation_rounds_clamps_and_keeps_real_images():
    identity = {"randaugment": {"num_ops": 0}}  # nothing but the uint8 round trip
    x, y = batch((8, 3, 32, 32))
    assert torch.allclose(make(identity)(x, y, gen(0))[0], x, atol=1e-5)  # on the uint8 grid: unchanged
    pixels = torch.rand(8, 3, 32, 32, generator=gen(3)) * 1.6 - 0.3  # distilled: off-grid, outside [0, 1]
    out, _ = make(identity)(normalize(pixels), y, gen(0))
    expected = normalize(pixels.clamp(0, 1).mul(255).round() / 255)
    assert torch.allclose(out, expected, atol=1e-5)
    assert to_u8(out).min() == 0 and to_u8(out).max() == 255


# --------------------------------------------------------------------------- dc_augment (DC's utils.augment)
# Derived from DC utils.py::augment (VICO-UoE/DatasetCondensation; DC-Bench's copy SideTrainer.augment):
# cropfun pads by crop with the batch's per-channel mean and cuts at np.random.permutation(2 * crop)[0]
# per axis; scalefun resizes to int((1 + U(-scale, scale)) * size) per axis (F.interpolate, nearest)
# and centre-crops or zero-pads; rotatefun is scipy.ndimage.rotate by np.random.randint(-rotate,
# rotate) degrees with cval = the batch mean; noisefun adds noise * randn; one op per image,
# np.random.permutation(strategy ops)[0]; defaults from get_daparam (crop 4, scale 0.2, rotate 45, noise 0.001).


def _mnist_like(n, seed=0):
    x, _ = batch((n, 1, 28, 28), seed)
    return x


def _dc_crop_outcomes(img, mean, crop=4):
    """DC's cropfun for every offset it can draw: pad with the channel means, cut at r, c in [0, 2 crop)."""
    c, h, w = img.shape
    padded = mean.view(c, 1, 1).expand(c, h + 2 * crop, w + 2 * crop).clone()
    padded[:, crop:crop + h, crop:crop + w] = img
    return {("crop", r, q): padded[:, r:r + h, q:q + w] for r in range(2 * crop) for q in range(2 * crop)}


def _dc_scale_outcomes(img, scale=0.2):
    """DC's scalefun for every size it can draw (int(U(0.8, 1.2) * 28): 22 .. 33 per axis)."""
    c, h, w = img.shape
    out = {}
    for hh in range(int((1 - scale) * h), int((1 + scale) * h) + 1):
        for ww in range(int((1 - scale) * w), int((1 + scale) * w) + 1):
            tmp = F.interpolate(img[None], [hh, ww])[0]
            side = max(hh, ww, h, w)
            canvas = torch.zeros(c, side, side)
            canvas[:, (side - hh) // 2:(side - hh) // 2 + hh, (side - ww) // 2:(side - ww) // 2 + ww] = tmp
            out[("scale", hh, ww)] = canvas[:, (side - h) // 2:(side - h) // 2 + h, (side - w) // 2:(side - w) // 2 + w]
    return out


def _dc_rotate_outcomes(img, mean, rotate=45):
    """DC's rotatefun for every angle it can draw (np.random.randint(-45, 45): -45 .. 44 degrees)."""
    from scipy.ndimage import rotate as scipy_rotate

    out = {}
    for angle in range(-rotate, rotate):
        turned = scipy_rotate(img.numpy(), angle=angle, axes=(-2, -1), cval=float(mean.mean()))
        r, q = (turned.shape[-2] - img.shape[-2]) // 2, (turned.shape[-1] - img.shape[-1]) // 2
        out[("rotate", angle)] = torch.from_numpy(turned[:, r:r + img.shape[-2], q:q + img.shape[-1]].copy())
    return out


def _which(outcomes: dict, out: torch.Tensor) -> list:
    return [key for key, candidate in outcomes.items() if torch.allclose(candidate, out, atol=1e-5)]


def test_dc_augment_each_image_gets_one_of_dcs_outcomes_and_every_operation_is_drawn():
    x = _mnist_like(60)
    mean = x.mean(dim=(0, 2, 3))  # DC: per channel over the batch, before any image changes
    out, _ = make("dc_augment", 1)(x, torch.zeros(60), gen(0))
    used = set()
    for img, o in zip(x, out):
        found = (_which(_dc_crop_outcomes(img, mean), o) or _which(_dc_scale_outcomes(img), o)
                 or _which(_dc_rotate_outcomes(img, mean), o))
        assert found, "an output DC's augment cannot produce"
        used.add(found[0][0])
    assert used == {"crop", "scale", "rotate"}


def test_dc_augment_crop_offsets_span_dcs_range_and_pad_with_the_batch_mean():
    x = _mnist_like(200, seed=1)
    mean = x.mean(dim=(0, 2, 3))
    out, _ = make({"dc_augment": {"strategy": "crop"}}, 1)(x, torch.zeros(200), gen(1))
    offsets = set()
    for img, o in zip(x, out):
        found = _which(_dc_crop_outcomes(img, mean), o)
        assert found
        offsets |= {k[1] for k in found}
    assert offsets == set(range(8))  # r in 0 .. 7: a shift of -4 .. +3 px, never +4


def test_dc_augment_noise_and_crop_noise():
    x = _mnist_like(64, seed=2)
    out, _ = make({"dc_augment": {"strategy": "noise"}}, 1)(x, torch.zeros(64), gen(2))
    diff = out - x
    assert 0.0009 < float(diff.std()) < 0.0011 and abs(float(diff.mean())) < 1e-4
    mixed, _ = make({"dc_augment": {"strategy": "crop_noise"}}, 1)(x, torch.zeros(64), gen(2))
    mean = x.mean(dim=(0, 2, 3))
    kinds = ["crop" if _which(_dc_crop_outcomes(img, mean), o) and not torch.allclose(o, img, atol=1e-2) else "noise"
             for img, o in zip(x, mixed)]
    noisy = [o - img for img, o, k in zip(x, mixed, kinds) if k == "noise"]
    assert 10 < kinds.count("noise") < 54 and all(float(d.abs().max()) < 0.01 for d in noisy)


def test_dc_augment_is_seeded_and_leaves_its_input_alone():
    x = _mnist_like(16, seed=3)
    before = x.clone()
    aug = make("dc_augment", 1)
    a, _ = aug(x, torch.zeros(16), gen(0))
    assert torch.equal(a, aug(x, torch.zeros(16), gen(0))[0]) and not torch.equal(a, aug(x, torch.zeros(16), gen(1))[0])
    assert torch.equal(x, before)


@pytest.mark.parametrize("params,key", [({"strategy": "crop_flip"}, "strategy"), ({"strategy": ""}, "strategy"),
                                        ({"crop": 0}, "crop"), ({"rotate": 0}, "rotate"), ({"scale": 1.0}, "scale"),
                                        ({"noise": -1}, "noise")])
def test_dc_augment_bad_values_are_refused(params, key):
    with pytest.raises(ValueError) as info:
        make({"dc_augment": params}, 1)
    assert "dc_augment" in str(info.value) and key in str(info.value)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("op", OPS)
def test_unknown_params_are_refused_naming_op_and_key(op):
    with pytest.raises(ValueError) as info:
        make({op: {"bogus_key": 1}})
    assert op in str(info.value) and "bogus_key" in str(info.value)


@pytest.mark.parametrize(
    "op,params,key",
    [
        ("autoaugment", {"policy": "cifar100"}, "policy"),
        ("autoaugment", {"policy": 3}, "policy"),
        ("randaugment", {"magnitude": 31}, "magnitude"),
        ("randaugment", {"magnitude": 2.5}, "magnitude"),
        ("randaugment", {"num_ops": -1}, "num_ops"),
        ("randaugment", {"num_magnitude_bins": 1}, "num_magnitude_bins"),
        ("imagenet_aug", {"padding": -1}, "padding"),
        ("imagenet_aug", {"padding": 1.5}, "padding"),
        ("imagenet_aug", {"flip": 2}, "flip"),
        ("imagenet_aug", {"brightness": -0.1}, "brightness"),
        ("imagenet_aug", {"hue": 0.6}, "hue"),
    ],
)
def test_bad_values_are_refused_naming_op_and_key(op, params, key):
    with pytest.raises(ValueError) as info:
        make({op: params})
    assert op in str(info.value) and key in str(info.value)


@pytest.mark.parametrize("op", OPS)
def test_channel_mismatch_is_refused(op):
    with pytest.raises(ValueError, match=op):
        create_augment(op, mean=(0.5,) * 4, std=(0.2,) * 4, num_classes=10)  # 4 channels: no torchvision colour ops
    x, y = batch((4, 1, 8, 8))
    with pytest.raises(ValueError, match="channels"):
        make(op, 3)(x, y, gen(0))


# --------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("op", OPS)
def test_runs_on_cuda_seeded(op):
    x, y = batch((64, 3, 32, 32))
    x, y = x.cuda(), y.cuda()
    aug = make(op)
    g = lambda s: torch.Generator(device="cuda").manual_seed(s)  # noqa: E731
    a, ta = aug(x, y, g(0))
    assert a.device == x.device and torch.equal(ta, y)
    assert torch.equal(a, aug(x, y, g(0))[0]) and not torch.equal(a, aug(x, y, g(1))[0])
