import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ddlib.engine.adversarial_training import PixelSpace, adversarial_batch, create_objective
from ddlib.data.datasets import load_dataset
from ddlib.engine.device import generator
from ddlib.models import create_model
from ddlib.methods.select import random_subset
from ddlib.engine.train import Recipe, train_and_test

EPS, ALPHA = 8 / 255, 2 / 255


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _batch(ds, n=32, dtype=torch.float32):
    """The first ``n`` digits: pixels p in [0, 1], normalised x, labels y."""
    p = ds.pixels("train")[:n].to(dtype)
    mean, std = (torch.tensor(v, dtype=dtype).view(1, -1, 1, 1) for v in (ds.mean, ds.std))
    return p, (p - mean) / std, ds.train_labels[:n]


def _model(name="convnet", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return create_model(name, 1, 10, (8, 8), width=8).to(dtype).train()


def _objective(ds, spec):
    return create_objective(spec, mean=ds.mean, std=ds.std, num_classes=10)[0]


# --------------------------------------------------------------------------- references: the official code, transcribed
# Pixel-space models (the official code feeds [0, 1] pixels), the random start drawn from the same
# generator as ours. Madry's TF loop is numpy (np.random.uniform, clip to [0, 255]); here in [0, 1].


def _madry_reference(model, x_nat, y, g, epsilon=EPS, step_size=ALPHA, num_steps=10):
    x = x_nat + torch.empty_like(x_nat).uniform_(-epsilon, epsilon, generator=g)  # random_start
    for _ in range(num_steps):  # model stays in train mode (Model(mode='train'))
        x.requires_grad_()
        grad = torch.autograd.grad(F.cross_entropy(model(x), y, reduction="sum"), [x])[0]  # model.xent
        x = x.detach() + step_size * torch.sign(grad)
        x = torch.clamp(x, x_nat - epsilon, x_nat + epsilon)
        x = torch.clamp(x, 0, 1)
    return x, F.cross_entropy(model(x), y)  # model.mean_xent


def _trades_reference(model, x_natural, y, g, step_size=ALPHA, epsilon=EPS, perturb_steps=10, beta=6.0):
    criterion_kl = nn.KLDivLoss(reduction="sum")  # size_average=False
    model.eval()
    batch_size = len(x_natural)
    x_adv = x_natural.detach() + 0.001 * torch.randn(x_natural.shape, generator=g, dtype=x_natural.dtype).detach()
    for _ in range(perturb_steps):
        x_adv.requires_grad_()
        with torch.enable_grad():
            loss_kl = criterion_kl(F.log_softmax(model(x_adv), dim=1), F.softmax(model(x_natural), dim=1))
        grad = torch.autograd.grad(loss_kl, [x_adv])[0]
        x_adv = x_adv.detach() + step_size * torch.sign(grad.detach())
        x_adv = torch.min(torch.max(x_adv, x_natural - epsilon), x_natural + epsilon)
        x_adv = torch.clamp(x_adv, 0.0, 1.0)
    model.train()
    x_adv = torch.clamp(x_adv, 0.0, 1.0).detach()
    logits = model(x_natural)
    loss_natural = F.cross_entropy(logits, y)
    loss_robust = (1.0 / batch_size) * criterion_kl(F.log_softmax(model(x_adv), dim=1),
                                                    F.softmax(model(x_natural), dim=1))
    return x_adv, loss_natural + beta * loss_robust


def _mart_reference(model, x_natural, y, g, step_size=ALPHA, epsilon=EPS, perturb_steps=10, beta=6.0):
    kl = nn.KLDivLoss(reduction="none")
    model.eval()
    batch_size = len(x_natural)
    x_adv = x_natural.detach() + 0.001 * torch.randn(x_natural.shape, generator=g, dtype=x_natural.dtype).detach()
    for _ in range(perturb_steps):
        x_adv.requires_grad_()
        with torch.enable_grad():
            loss_ce = F.cross_entropy(model(x_adv), y)
        grad = torch.autograd.grad(loss_ce, [x_adv])[0]
        x_adv = x_adv.detach() + step_size * torch.sign(grad.detach())
        x_adv = torch.min(torch.max(x_adv, x_natural - epsilon), x_natural + epsilon)
        x_adv = torch.clamp(x_adv, 0.0, 1.0)
    model.train()
    x_adv = torch.clamp(x_adv, 0.0, 1.0).detach()
    logits = model(x_natural)
    logits_adv = model(x_adv)
    adv_probs = F.softmax(logits_adv, dim=1)
    tmp1 = torch.argsort(adv_probs, dim=1)[:, -2:]
    new_y = torch.where(tmp1[:, -1] == y, tmp1[:, -2], tmp1[:, -1])
    loss_adv = F.cross_entropy(logits_adv, y) + F.nll_loss(torch.log(1.0001 - adv_probs + 1e-12), new_y)
    nat_probs = F.softmax(logits, dim=1)
    true_probs = torch.gather(nat_probs, 1, (y.unsqueeze(1)).long()).squeeze()
    loss_robust = (1.0 / batch_size) * torch.sum(
        torch.sum(kl(torch.log(adv_probs + 1e-12), nat_probs), dim=1) * (1.0000001 - true_probs))
    return x_adv, loss_adv + float(beta) * loss_robust


REFERENCES = {"pgd_at": _madry_reference, "trades": _trades_reference, "mart": _mart_reference}


@pytest.mark.parametrize("name", list(REFERENCES))
def test_matches_the_official_code(digits, name):
    """Same loss and adversarial pixels as the official code, in float64 on a BatchNorm ConvNet
    (so crafting in the wrong mode, eval vs train, would show)."""
    p, x, y = _batch(digits, dtype=torch.float64)
    mean, std = (torch.tensor(v, dtype=torch.float64).view(1, -1, 1, 1) for v in (digits.mean, digits.std))
    ours, theirs = _model("convnet_bn", torch.float64), _model("convnet_bn", torch.float64)
    pixel_model = lambda q: theirs((q - mean) / std)  # noqa: E731
    pixel_model.train, pixel_model.eval = theirs.train, theirs.eval
    p_ref, loss_ref = REFERENCES[name](pixel_model, p, y, generator(5))

    loss = _objective(digits, name)(ours, x, y, generator(5))
    assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-10)
    # the adversarial batch itself: rebuild it with the exposed function from the same draws
    crafter = _model("convnet_bn", torch.float64)
    inner = {"pgd_at": lambda lg: F.cross_entropy(lg, y), "mart": lambda lg: F.cross_entropy(lg, y)}
    if name == "trades":
        crafter.eval()
        with torch.no_grad():
            target = F.softmax(crafter(x), 1)
        inner["trades"] = lambda lg: F.kl_div(F.log_softmax(lg, 1), target, reduction="sum")
    elif name == "mart":
        crafter.eval()
    x_adv = adversarial_batch(crafter, x, inner[name], pixels=PixelSpace(digits.mean, digits.std), eps=EPS,
                              alpha=ALPHA, steps=10, start="uniform" if name == "pgd_at" else "normal",
                              generator=generator(5))
    torch.testing.assert_close(x_adv * std + mean, p_ref, rtol=0, atol=1e-12)


def test_eps_zero_pgd_at_and_beta_zero_trades_are_cross_entropy(digits):
    _, x, y = _batch(digits)
    model = _model()
    ce = F.cross_entropy(model(x), y)
    for spec in ({"pgd_at": {"eps": 0}}, {"pgd_at": {"eps": "0", "random_start": False}}, {"trades": {"beta": 0}}):
        assert torch.equal(_objective(digits, spec)(model, x, y, generator(0)), ce), spec


def test_perturbation_respects_eps_and_the_pixel_box(digits):
    p, x, y = _batch(digits)
    model, pixels = _model(), PixelSpace(digits.mean, digits.std)
    mean, std = pixels.on(x)
    x_adv = adversarial_batch(model, x, lambda lg: F.cross_entropy(lg, y), pixels=pixels, eps=EPS, alpha=ALPHA,
                              steps=10, start="uniform", generator=generator(0))
    p_adv = x_adv * std + mean
    assert (p_adv - p).abs().max() <= EPS + 1e-6
    assert (p_adv - p).abs().max() > EPS / 2  # it did move
    assert p_adv.min() >= -1e-6 and p_adv.max() <= 1 + 1e-6  # real pixels stay in [0, 1]


@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_box_is_min_x_0_to_max_x_1(digits, direction):
    """A loss whose gradient pushes every pixel up (or down) drives each to the edge of its box."""
    p = torch.tensor([0.0, 0.01, 0.5, 0.99, 1.0, 1.3, -0.2]).view(1, 1, 1, 7)
    pixels = PixelSpace([0.3], [0.4])
    x = (p - 0.3) / 0.4
    x_adv = adversarial_batch(nn.Flatten(), x, lambda out: direction * out.sum(), pixels=pixels, eps=EPS,
                              alpha=ALPHA, steps=10, start="uniform", generator=generator(0))
    p_adv = x_adv * 0.4 + 0.3
    if direction > 0:  # up to min(p + eps, max(p, 1)): 1.3 stays reachable, a real pixel stops at 1
        expected = torch.minimum(p + EPS, torch.maximum(p, torch.ones_like(p)))
    else:  # down to max(p - eps, min(p, 0)): -0.2 stays, a real pixel stops at 0
        expected = torch.maximum(p - EPS, torch.minimum(p, torch.zeros_like(p)))
    torch.testing.assert_close(p_adv, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["pgd_at", "trades", "mart"])
def test_deterministic_private_rng_and_train_mode(digits, name):
    _, x, y = _batch(digits)
    model, objective = _model(), _objective(digits, name)
    modes = []
    hook = model.register_forward_pre_hook(lambda m, inp: modes.append(m.training))
    rng = torch.get_rng_state()
    a = objective(model, x, y, generator(3))
    hook.remove()
    crafting = {"pgd_at": [True] * 10, "trades": [False] * 11, "mart": [False] * 10}[name]  # Madry: train mode
    assert modes == crafting + [True] * (1 if name == "pgd_at" else 2)  # then the training forward passes
    assert all(m.training for m in model.modules())
    b, c = objective(model, x, y, generator(3)), objective(model, x, y, generator(4))
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is never drawn from
    assert torch.equal(a, b) and not torch.equal(a, c)

    pixels, start = PixelSpace(digits.mean, digits.std), "uniform" if name == "pgd_at" else "normal"

    def craft(seed):
        return adversarial_batch(model, x, lambda lg: F.cross_entropy(lg, y), pixels=pixels, eps=EPS, alpha=ALPHA,
                                 steps=3, start=start, generator=generator(seed))

    assert torch.equal(craft(3), craft(3)) and not torch.equal(craft(3), craft(4))
    assert torch.equal(torch.get_rng_state(), rng)


def test_soft_targets_are_refused(digits):
    _, x, y = _batch(digits, n=4)
    with pytest.raises(ValueError, match="int class labels"):
        _objective(digits, "trades")(_model(), x, F.one_hot(y, 10).float(), generator(0))


def test_specs_names_and_errors(digits):
    kw = dict(mean=digits.mean, std=digits.std, num_classes=10)
    assert create_objective(None, **kw) == (None, "standard")
    assert create_objective("standard", **kw) == (None, "standard")
    assert create_objective("pgd_at", **kw)[1] == "pgd_at(eps=8/255, alpha=2/255, steps=10, random_start=True)"
    assert create_objective({"trades": None}, **kw)[1] == "trades(beta=6, eps=8/255, alpha=2/255, steps=10)"
    assert create_objective({"mart": {"eps": "0.031", "alpha": 0.007, "beta": "5", "steps": 7}}, **kw)[1] == (
        "mart(beta=5, eps=0.031, alpha=0.007, steps=7)")
    bad = {
        "fgsm": r"unknown adversarial objective 'fgsm'",
        ("trades", "epsilon"): r"unknown parameter.*'epsilon'.*'trades'",
        ("pgd_at", "eps", "8/0"): r"'pgd_at': eps must be a non-negative number, got '8/0'",
        ("mart", "beta", "-1"): r"beta must be a non-negative",
        ("trades", "steps", 2.5): r"steps must be a non-negative integer",
        ("pgd_at", "random_start", "yes"): r"random_start must be true or false",
    }
    for spec, message in bad.items():
        if isinstance(spec, tuple):
            spec = {spec[0]: {spec[1]: spec[2] if len(spec) > 2 else 1}}
        with pytest.raises(ValueError, match=message):
            create_objective(spec, **kw)
    with pytest.raises(ValueError, match="one name"):
        create_objective({"trades": {}, "mart": {}}, **kw)
    with pytest.raises(ValueError, match="'standard' takes no parameters"):
        create_objective({"standard": {"eps": 1}}, **kw)


@pytest.mark.parametrize("name", ["pgd_at", "trades", "mart"])
def test_train_and_evaluate_with_each_objective(digits, name):
    subset = random_subset(digits, 5, seed=0)
    objective, _ = create_objective({name: {"steps": 3}}, mean=digits.mean, std=digits.std, num_classes=10)

    def run():
        return train_and_test("convnet", subset.images, subset.labels, digits.test_images, digits.test_labels,
                                  num_classes=10, mean=digits.mean, std=digits.std,
                                  recipe=Recipe(epochs=3, batch_size=25), seeds=[0], objective=objective,
                                  device="cpu", model_kwargs={"width": 16})[0]

    a, b = run(), run()
    assert len(a.epoch_losses) == 3 and all(math.isfinite(v) for v in a.epoch_losses)
    assert a.epoch_losses == b.epoch_losses  # bit for bit on the CPU
    assert 0.0 <= a.test_accuracy <= 1.0


@pytest.mark.parametrize("targeted", [False, True], ids=["untargeted", "targeted"])
def test_beard_at_is_beards_training_attack(digits, targeted):
    """BEARD's eva_utils.epoch with train_attack='PGD', written out: torchattacks.PGD(net, eps=8/255,
    alpha=2/225, steps=10, random_start=False) on the normalised batch (targets (lab + 1) % 10 when
    targeted), then criterion(net(img), lab) in train mode. ``beard_at`` gives the same loss and
    gradients (BatchNorm ConvNet: crafting in train mode would show)."""
    import torchattacks

    _, x, y = _batch(digits)
    ours, theirs = _model("convnet_bn"), _model("convnet_bn")
    atk = torchattacks.PGD(theirs, eps=8 / 255, alpha=2 / 225, steps=10, random_start=False)
    if targeted:
        atk.set_mode_targeted_by_label(quiet=True)
    img = atk(x, (y + 1) % 10 if targeted else y)
    assert theirs.training
    loss_ref = nn.CrossEntropyLoss()(theirs(img), y)
    loss_ref.backward()
    objective, name = create_objective({"beard_at": {"targeted": targeted}}, mean=digits.mean, std=digits.std,
                                       num_classes=10)
    rng = torch.get_rng_state()
    loss = objective(ours, x, y, generator(0))
    loss.backward()
    assert loss.item() == pytest.approx(loss_ref.item(), rel=1e-6) and ours.training
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert torch.equal(torch.get_rng_state(), rng)  # no random start: nothing drawn
    assert name == f"beard_at(eps=8/255, alpha={2 / 225!r}, steps=10, targeted={targeted})"
    with pytest.raises(ValueError, match="needs at least 10 classes, got 4"):
        create_objective({"beard_at": {"targeted": True}}, mean=digits.mean, std=digits.std, num_classes=4)


def test_an_objective_is_one_registered_function_and_its_hook_carries_its_name(digits):
    from ddlib.engine.adversarial_training import OBJECTIVES

    @OBJECTIVES.register("toy_ce")
    def toy_ce(model, x, y, generator, pixels, *, weight: float = 1.0):
        return weight * F.cross_entropy(model(x), y)

    kw = dict(mean=digits.mean, std=digits.std, num_classes=10)
    try:
        objective, name = create_objective({"toy_ce": {"weight": "1/2"}}, **kw)
        assert name == objective.name == objective.describe() == "toy_ce(weight=0.5)"
        _, x, y = _batch(digits, n=4)
        model = _model()
        assert objective(model, x, y, generator(0)).item() == pytest.approx(0.5 * nn.CrossEntropyLoss()(model(x), y).item())
        pgd, pgd_name = create_objective("pgd_at", **kw)
        assert pgd.name == pgd_name == "pgd_at(eps=8/255, alpha=2/255, steps=10, random_start=True)"
        with pytest.raises(ValueError, match="'toy_ce': weight must be a non-negative number"):
            create_objective({"toy_ce": {"weight": "-1/2"}}, **kw)
    finally:
        OBJECTIVES.remove("toy_ce")
