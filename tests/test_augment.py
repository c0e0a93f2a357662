"""ddlib.engine.augment: the registry, DSA against the original's math, mixing ops, crops, ZCA against kornia."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ddlib.engine.augment import (
    DSAParams,
    ZCA,
    Augment,
    create_augment,
    dsa,
    dsa_op,
    fit_zca,
    list_ops,
    register_op,
)
from ddlib.engine.augment.geometric import _rrc_boxes, _resized_crop  # noqa: PLC2701 (box sampling is tested on its own)

MEAN, STD, NC = (0.49, 0.48, 0.45), (0.2, 0.2, 0.2), 10
TV = [{"ColorJitter": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.2}},
      {"RandomCrop": {"size": 32, "padding": 4}}]

SPECS = {
    "dsa_one": "dsa",
    "dsa_all": {"dsa": {"mode": "all"}},
    "mixup": "mixup",
    "cutmix": "cutmix",
    "random_resized_crop": "random_resized_crop",
    "flip": "flip",
    "patch_shuffle": "patch_shuffle",
    "torchvision": {"torchvision": TV},
    "pipeline": ["dsa", "flip", {"cutmix": {"alpha": 1.0}}],
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make(spec) -> Augment:
    return create_augment(spec, mean=MEAN, std=STD, num_classes=NC)


def batch(n=8, c=3, h=32, w=32, seed=0):
    g = gen(1000 + seed)
    return torch.randn(n, c, h, w, generator=g), torch.randint(0, NC, (n,), generator=g)


# --------------------------------------------------------------------------- every op


@pytest.mark.parametrize("key", list(SPECS))
def test_every_op_is_seeded_shape_preserving_and_leaves_global_rng_alone(key):
    aug = make(SPECS[key])
    x, y = batch()
    torch.manual_seed(1)
    state = torch.get_rng_state()
    a, ta = aug(x, y, gen(0))
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    torch.manual_seed(2)  # ...and not read: other global state, same output
    b, tb = aug(x, y, gen(0))
    c, tc = aug(x, y, gen(1))
    assert a.shape == x.shape and a.dtype == x.dtype and a.device == x.device
    assert torch.equal(a, b) and torch.equal(ta, tb)
    assert not torch.equal(a, c)
    assert len(ta) == len(y)
    assert torch.equal(x, batch()[0])  # input not modified in place


def test_registry_lists_all_ops():
    assert {"dsa", "mixup", "cutmix", "random_resized_crop", "flip", "patch_shuffle", "torchvision", "none"} <= set(
        list_ops()
    )


@pytest.mark.parametrize("token", ["color", "crop", "cutout", "flip", "scale", "rotate"])
def test_dsa_ops_preserve_float64(token):
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    assert dsa_op(x, token, gen(0)).dtype == torch.float64


# --------------------------------------------------------------------------- DSA, against the original's math


def test_brightness_shifts_each_sample_by_one_amount_within_half():
    x, _ = batch(16)
    d = dsa_op(x, "brightness", gen(0)) - x
    per = d.flatten(1)
    assert torch.allclose(per.amax(1), per.amin(1), atol=1e-5)
    assert per.abs().max() <= 0.5 + 1e-6 and per[:, 0].std() > 0.05


def test_saturation_keeps_the_per_pixel_channel_mean():
    x, _ = batch(16)
    out = dsa_op(x, "saturation", gen(0))
    assert torch.allclose(out.mean(1), x.mean(1), atol=1e-5)
    factor = (out - out.mean(1, keepdim=True)) / (x - x.mean(1, keepdim=True))
    f = factor.flatten(1).median(1).values
    assert ((f >= 0) & (f <= 2)).all() and f.std() > 0.1


def test_contrast_keeps_the_image_mean_and_scales_by_half_to_one_and_a_half():
    x, _ = batch(16)
    out = dsa_op(x, "contrast", gen(0))
    m = x.mean((1, 2, 3), keepdim=True)
    assert torch.allclose(out.mean((1, 2, 3)), x.mean((1, 2, 3)), atol=1e-5)
    f = ((out - m) / (x - m)).flatten(1).median(1).values
    assert ((f >= 0.5) & (f <= 1.5)).all()


def test_color_is_brightness_then_saturation_then_contrast():
    x, _ = batch()
    g1, g2 = gen(3), gen(3)
    expected = dsa_op(dsa_op(dsa_op(x, "brightness", g2), "saturation", g2), "contrast", g2)
    assert torch.equal(dsa_op(x, "color", g1), expected)


def test_flip_is_exact_per_sample():
    x, _ = batch(32)
    out = dsa_op(x, "flip", gen(0))
    flipped = [bool(torch.equal(o, xi.flip(2))) for o, xi in zip(out, x)]
    kept = [bool(torch.equal(o, xi)) for o, xi in zip(out, x)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert 0 < sum(flipped) < 32


def _shift(img, dx, dy):
    """img moved so that out[i, j] = img[i + dx, j + dy], zero where that falls outside."""
    out = torch.zeros_like(img)
    h, w = img.shape[-2:]
    out[:, max(0, -dx) : min(h, h - dx), max(0, -dy) : min(w, w - dy)] = img[
        :, max(0, dx) : min(h, h + dx), max(0, dy) : min(w, w + dy)
    ]
    return out


def test_crop_translates_by_at_most_4_pixels_with_zero_fill():
    x, _ = batch(16)
    out = dsa_op(x, "crop", gen(0))
    shifts = []
    for o, xi in zip(out, x):
        found = [(dx, dy) for dx in range(-4, 5) for dy in range(-4, 5) if torch.equal(o, _shift(xi, dx, dy))]
        assert len(found) == 1
        shifts.append(found[0])
    assert len(set(shifts)) > 3


def test_cutout_zeroes_one_square_of_at_most_16_and_keeps_the_rest():
    x = torch.rand(64, 3, 32, 32, generator=gen(5)) + 1.0  # no zeros in the input
    out = dsa_op(x, "cutout", gen(0))
    zero = out == 0
    assert torch.equal(zero, zero[:, :1].expand_as(zero))  # same square in every channel
    assert torch.equal(out[~zero], x[~zero])
    full = 0
    for m in zero[:, 0]:
        rows, cols = m.any(1), m.any(0)
        assert torch.equal(m, rows[:, None] & cols[None, :])  # a rectangle
        r, c = int(rows.sum()), int(cols.sum())
        assert 8 <= r <= 16 and 8 <= c <= 16  # the centre is inside [0, 32]
        full += r == c == 16
    assert full > 0  # most squares lie fully inside


@pytest.mark.parametrize("token,params", [("scale", DSAParams(ratio_scale=1.0)), ("rotate", DSAParams(ratio_rotate=0.0))])
def test_scale_and_rotate_with_identity_parameters_return_the_input(token, params):
    x, _ = batch()
    assert torch.allclose(dsa_op(x, token, gen(0), params), x, atol=1e-5)
    assert not torch.allclose(dsa_op(x, token, gen(0)), x, atol=1e-3)


def test_rotate_matches_the_original_affine_matrix():
    x, _ = batch(4)
    out = dsa_op(x, "rotate", gen(0))
    a = (torch.rand(4, generator=gen(0)) - 0.5) * 2 * 15 / 180 * math.pi
    theta = torch.stack([torch.stack([a.cos(), -a.sin(), 0 * a], 1), torch.stack([a.sin(), a.cos(), 0 * a], 1)], 1)
    expected = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)
    assert torch.allclose(out, expected, atol=1e-6)


def test_scale_matches_the_original_affine_matrix():
    x, _ = batch(4)
    out = dsa_op(x, "scale", gen(0))
    g = gen(0)
    sx, sy = (torch.rand(4, generator=g) * (1.2 - 1 / 1.2) + 1 / 1.2 for _ in range(2))
    theta = torch.zeros(4, 2, 3)
    theta[:, 0, 0], theta[:, 1, 1] = sx, sy
    expected = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False), align_corners=False)
    assert torch.allclose(out, expected, atol=1e-6)


STRATEGY = "color_crop_cutout_flip_scale_rotate"


def test_one_mode_applies_exactly_one_op_drawn_per_batch():
    x, _ = batch()
    tokens = STRATEGY.split("_")
    chosen = set()
    for seed in range(12):
        out = dsa(x, gen(seed), STRATEGY, "one")
        g = gen(seed)
        k = int(torch.randint(0, len(tokens), (1,), generator=g).item())
        chosen.add(tokens[k])
        assert torch.equal(out, dsa_op(x, tokens[k], g))
    assert len(chosen) >= 3


def test_all_mode_applies_every_op_in_order():
    x, _ = batch()
    g = gen(0)
    expected = x
    for token in STRATEGY.split("_"):
        expected = dsa_op(expected, token, g)
    assert torch.equal(dsa(x, gen(0), STRATEGY, "all"), expected)
    aug = make({"dsa": {"mode": "all"}})
    assert torch.equal(aug(x, torch.zeros(8, dtype=torch.long), gen(0))[0], expected)


@pytest.mark.parametrize("token", ["color", "crop", "cutout", "flip", "scale", "rotate"])
def test_gradient_flows_through_dsa(token):
    x = batch()[0].requires_grad_(True)
    (dsa_op(x, token, gen(0)) ** 2).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_gradient_flows_through_the_whole_pipeline():
    x = batch()[0].requires_grad_(True)
    out, _ = make([{"dsa": {"mode": "all"}}, "random_resized_crop", "patch_shuffle", "mixup", "cutmix"])(
        x, torch.arange(8), gen(0)
    )
    out.sum().backward()
    assert x.grad.abs().sum() > 0


# --------------------------------------------------------------------------- mixup / cutmix


def test_mixup_mixes_images_and_one_hot_targets_with_one_lambda():
    x, y = batch()
    out, t = make({"mixup": {"alpha": 0.8}})(x, y, gen(0))
    assert t.dtype == x.dtype and t.shape == (8, NC)
    assert torch.allclose(t.sum(1), torch.ones(8))
    # recover lambda from the images: out = lam * x + (1 - lam) * x.flip(0)
    d = (x - x.flip(0)).flatten()
    lam = float(((out - x.flip(0)).flatten() @ d) / (d @ d))
    assert torch.allclose(out, lam * x + (1 - lam) * x.flip(0), atol=1e-5)
    one_hot = F.one_hot(y, NC).float()
    assert torch.allclose(t, lam * one_hot + (1 - lam) * one_hot.flip(0), atol=1e-5)


def test_mixup_mixes_soft_target_rows_and_p0_is_identity():
    x, y = batch()
    soft = torch.softmax(torch.randn(8, NC, generator=gen(9)), 1)
    _, t = make("mixup")(x, soft, gen(0))
    assert torch.allclose(t.sum(1), torch.ones(8), atol=1e-6)
    out, t = make({"mixup": {"p": 0}})(x, y, gen(0))
    assert torch.equal(out, x) and torch.equal(t, F.one_hot(y, NC).float())


def test_cutmix_pastes_the_partners_box_and_lambda_is_the_kept_area():
    n = 4
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 32, 32).contiguous()
    y = torch.tensor([0, 1, 2, 3])
    aug = make("cutmix")
    areas = set()
    for seed in range(10):
        out, t = aug(x, y, gen(seed))
        pasted = out != x
        assert torch.equal(pasted, pasted[:1].expand_as(pasted))  # one box for the whole batch
        box = pasted[0, 0]
        rows, cols = box.any(1), box.any(0)
        assert torch.equal(box, rows[:, None] & cols[None, :])
        assert torch.equal(out[0][pasted[0]], x[3][pasted[0]])  # partner of 0 is the last sample
        area = box.float().mean().item()
        assert torch.allclose(t.sum(1), torch.ones(n))
        assert t[0, 0].item() == pytest.approx(1 - area, abs=1e-6)
        assert t[0, 3].item() == pytest.approx(area, abs=1e-6)
        areas.add(round(area, 4))
    assert len(areas) > 3


# --------------------------------------------------------------------------- random_resized_crop, flip, patch_shuffle


def test_random_resized_crop_with_full_scale_and_unit_ratio_is_the_identity():
    x, y = batch()
    out, t = make({"random_resized_crop": {"scale": [1, 1], "ratio": [1, 1]}})(x, y, gen(0))
    assert torch.allclose(out, x, atol=1e-5) and torch.equal(t, y)


def test_random_resized_crop_boxes_respect_scale_and_ratio():
    top, left, h, w = _rrc_boxes(2000, 32, 32, (0.25, 0.5), (3 / 4, 4 / 3), gen(0), "cpu")
    frac = (h * w).double() / 1024
    assert frac.min() >= 0.25 - 0.04 and frac.max() <= 0.5 + 0.04
    ratio = w.double() / h.double()
    assert ratio.min() >= 0.75 - 0.1 and ratio.max() <= 4 / 3 + 0.1
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 32).all() and (left + w <= 32).all()
    assert top.unique().numel() > 5 and left.unique().numel() > 5
    # no attempt can fit: torchvision's centre-crop fallback (whole image when the ratio allows it)
    top, left, h, w = _rrc_boxes(5, 32, 32, (2.0, 3.0), (1.0, 1.0), gen(0), "cpu")
    assert (h == 32).all() and (w == 32).all() and (top == 0).all() and (left == 0).all()


def test_random_resized_crop_matches_torchvision_resized_crop_for_the_same_boxes():
    from torchvision.transforms.v2 import functional as TF

    x, _ = batch(6)
    boxes = _rrc_boxes(6, 32, 32, (0.08, 1.0), (3 / 4, 4 / 3), gen(0), "cpu")
    out = _resized_crop(x, *boxes)
    for i in range(6):
        top, left, h, w = (int(b[i]) for b in boxes)
        ref = TF.resized_crop(x[i], top, left, h, w, [32, 32], antialias=True)
        assert torch.allclose(out[i], ref, atol=1e-4), i


def test_flip_op_flips_about_half():
    x, y = batch(64)
    out, _ = make({"flip": {"p": 0.5}})(x, y, gen(0))
    flipped = torch.tensor([torch.equal(o, xi.flip(2)) for o, xi in zip(out, x)])
    kept = torch.tensor([torch.equal(o, xi) for o, xi in zip(out, x)])
    assert (flipped | kept).all() and 16 < flipped.sum() < 48
    assert torch.equal(make({"flip": {"p": 1}})(x, y, gen(0))[0], x.flip(3))


def test_patch_shuffle_permutes_row_and_column_strips_per_sample():
    x, y = batch(64)
    out, t = make({"patch_shuffle": {"factor": 2}})(x, y, gen(0))
    assert torch.equal(t, y)
    assert torch.equal(out.flatten(1).sort(1).values, x.flatten(1).sort(1).values)  # same pixels
    layouts = set()
    for o, xi in zip(out, x):
        match = [(r, c) for r in (0, 1) for c in (0, 1)
                 if torch.equal(o, xi.roll((16 * r, 16 * c), (1, 2)))]  # factor 2: strip swaps are rolls
        assert len(match) == 1
        layouts.add(match[0])
    assert len(layouts) == 4


def test_patch_shuffle_with_a_remainder_keeps_every_pixel():
    x, y = batch(8, h=30, w=31)
    out, _ = make({"patch_shuffle": {"factor": 3}})(x, y, gen(0))
    assert out.shape == x.shape
    assert torch.equal(out.flatten(1).sort(1).values, x.flatten(1).sort(1).values)


# --------------------------------------------------------------------------- torchvision


def test_torchvision_list_in_pixel_space():
    x, y = batch()
    out, _ = make({"torchvision": ["RandomHorizontalFlip"]})(x, y, gen(0))  # p = 0.5 per image
    assert all(torch.allclose(o, xi, atol=1e-5) or torch.allclose(o, xi.flip(2), atol=1e-5) for o, xi in zip(out, x))
    # pixel space: a 4 px padded crop shows zero *pixels*, i.e. -mean/std after re-normalisation
    out, _ = make({"torchvision": {"transforms": [{"RandomCrop": {"size": 32, "padding": 4}}]}})(x, y, gen(0))
    border = -torch.tensor(MEAN) / torch.tensor(STD)
    padded = torch.isclose(out, border.view(1, 3, 1, 1).expand_as(out), atol=1e-5).all(1)
    assert padded.any()


def test_torchvision_errors_name_the_transform():
    with pytest.raises(ValueError, match="NoSuchTransform"):
        make({"torchvision": ["NoSuchTransform"]})
    with pytest.raises(ValueError, match="bogus"):
        make({"torchvision": [{"ColorJitter": {"bogus": 1}}]})
    with pytest.raises(ValueError, match="MixUp"):
        make({"torchvision": ["MixUp"]})


# --------------------------------------------------------------------------- spec parsing


@pytest.mark.parametrize("spec", [None, "none", [], ["none"], [{"none": None}]])
def test_no_augmentation_specs_give_none(spec):
    assert make(spec) is None


def test_describe_spells_out_every_param():
    aug = make([{"dsa": {"strategy": "color_crop"}}, {"cutmix": {"alpha": 1}}])
    assert aug.describe() == aug.name == "dsa(strategy=color_crop, mode=one) + cutmix(alpha=1.0, p=1.0, box=clovaai)"
    assert make({"random_resized_crop": {"ratio": ["3/4", "4/3"]}}).name.startswith(
        "random_resized_crop(scale=[0.08, 1.0], ratio=[0.75, 1.33"
    )


@pytest.mark.parametrize(
    "spec,words",
    [
        ("nosuchop", ["nosuchop"]),
        ({"dsa": {"strenght": "color"}}, ["dsa", "strenght"]),
        ({"dsa": {"strategy": "color_blur"}}, ["dsa", "strategy", "blur"]),
        ({"dsa": {"mode": "some"}}, ["dsa", "mode"]),
        ({"mixup": {"alpha": -1}}, ["mixup", "alpha"]),
        ({"mixup": {"alpha": "lots"}}, ["mixup", "alpha"]),
        ({"cutmix": {"p": 1.5}}, ["cutmix", "'p'"]),
        ({"random_resized_crop": {"scale": [0.5]}}, ["random_resized_crop", "scale"]),
        ({"random_resized_crop": {"scale": [0.9, 0.1]}}, ["random_resized_crop", "scale"]),
        ({"patch_shuffle": {"factor": 0}}, ["patch_shuffle", "factor"]),
        ({"flip": [0.5]}, ["flip"]),
        ([{"dsa": {}, "flip": {}}], ["single-key"]),
        (42, ["42"]),
    ],
)
def test_spec_errors_name_the_op_and_the_key(spec, words):
    with pytest.raises(ValueError) as info:
        make(spec)
    for word in words:
        assert word in str(info.value)


def test_register_op_adds_a_custom_op():
    @register_op("test_negate")
    def _negate(ctx, *, scale: float = 1.0):
        return lambda x, targets, g: (-scale * x, targets)

    try:
        x, y = batch()
        aug = make({"test_negate": {"scale": 2}})
        assert torch.equal(aug(x, y, gen(0))[0], -2 * x) and aug.name == "test_negate(scale=2)"
        with pytest.raises(ValueError, match="already registered"):
            register_op("test_negate")(_negate)
    finally:
        from ddlib.engine.augment import OPS

        OPS.remove("test_negate")


# --------------------------------------------------------------------------- ZCA


def _correlated(n=400, seed=0):
    g = gen(seed)
    z = torch.randn(n, 12, generator=g)
    mix = torch.randn(12, 12, generator=g)
    return (z @ mix).view(n, 3, 2, 2) + 0.3


def test_zca_is_kornias_zca_and_the_chunked_fit_matches_it():
    import kornia

    x = _correlated()
    ref = kornia.enhance.ZCAWhitening(eps=0.1, compute_inv=True).fit(x)
    zca = ZCA().fit(x)
    assert torch.equal(zca(x), ref(x))
    chunked = ZCA(eps=0.1).fit(x, batch=64)
    assert torch.allclose(chunked.whitening.mean_vector, ref.mean_vector, atol=1e-5)
    assert torch.allclose(chunked.whitening.transform_matrix, ref.transform_matrix, atol=1e-4)
    assert torch.allclose(chunked(x), ref(x), atol=1e-4)
    assert torch.allclose(chunked.inverse(chunked(x)), x, atol=1e-3)


def test_whitened_features_have_near_identity_covariance():
    x = _correlated(n=2000)
    w = ZCA(eps=1e-6).fit(x, batch=500)(x).flatten(1)
    cov = torch.cov(w.t())
    assert torch.allclose(cov, torch.eye(12), atol=1e-3)
    assert torch.allclose(w.mean(0), torch.zeros(12), atol=1e-4)


def test_fit_zca_fits_pixels_as_they_are():
    # MTT utils.py / DD-Ranking utils/data.py get_dataset(use_zca): ToTensor() pixels in [0, 1], no
    # Normalize, then kornia.enhance.ZCAWhitening(eps=0.1, compute_inv=True).fit(images). ddlib's
    # ZCA used to fit on mean/std-normalised images (a ~25x smaller effective eps on CIFAR-10).
    import kornia

    pixels = torch.randint(0, 256, (300, 3, 4, 4), dtype=torch.uint8, generator=gen(0))
    x = pixels.float() / 255
    ref = kornia.enhance.ZCAWhitening(eps=0.1, compute_inv=True).fit(x)
    z = fit_zca(pixels, eps=0.1, batch=128)
    assert torch.allclose(z(x), ref(x), atol=1e-4)
    assert torch.allclose(fit_zca(x, batch=1000)(x), ref(x), atol=1e-4)
    assert torch.allclose(z.inverse(ref(x)), x, atol=1e-4)  # back to [0, 1] pixels, no de-normalisation


# --------------------------------------------------------------------------- the training loop's hook


def test_augment_plugs_into_the_training_loop_deterministically():
    from ddlib.engine.train import Recipe, train_and_test

    g = gen(0)
    images = torch.rand(40, 3, 8, 8, generator=g)
    labels = torch.arange(40) % 4
    aug = create_augment(["dsa", "cutmix"], mean=(0.5,) * 3, std=(0.25,) * 3, num_classes=4)

    def run():
        return train_and_test("mlp", images, labels, images, labels, num_classes=4, mean=(0.5,) * 3,
                                  std=(0.25,) * 3, recipe=Recipe(epochs=2, batch_size=16), seeds=[0],
                                  augment=aug, device="cpu")[0].epoch_losses

    assert run() == run()
