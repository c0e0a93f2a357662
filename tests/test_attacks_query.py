"""Query attacks (issue 26.2): Square and SPSA called as BEARD calls them, and their query counts.

The counts are checked against what torchattacks 3.5.1's code makes them, worked out by hand: SPSA
evaluates ``x + delta v`` and ``x - delta v`` for each of ``nb_sample`` directions in each of
``nb_iter`` iterations (2 x nb_sample x nb_iter per image, in batches of ``max_batch_size``
directions); Square, on an image it never fools, makes one forward to see whether it is classified
correctly, one at its initial stripes, one per query, and one on its result per restart (an image
classified wrongly gets only the first)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torchattacks

from ddlib.attacks import PixelModel, create_attack, get_entry, parse_attack, run_attack, supports_targeted
from ddlib.models import create_model

C = 4


class Constant(nn.Module):
    """Logits that ignore the input: class 0 always wins by a margin of 1 (never fooled)."""

    def __init__(self):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor([1.0, 0.0, 0.0, 0.0]))

    def forward(self, x):
        return self.logits.expand(len(x), C) + 0 * x.flatten(1).sum(1, keepdim=True)


def _data(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), torch.arange(n) % C


def test_square_queries_on_a_model_it_never_fools():
    x, y = _data(6)  # labels 0,1,2,3,0,1: two images of class 0 (correct, attacked), four wrong (not attacked)
    out = run_attack({"square": {"n_queries": 7}}, Constant(), x, y, num_classes=C, device="cpu")
    assert out.robust_acc == pytest.approx(2 / 6)
    assert out.queries == pytest.approx((2 * (1 + 1 + 7 + 1) + 4 * 1) / 6)  # 4.0
    two = run_attack({"square": {"n_queries": 7, "n_restarts": 2}}, Constant(), x, y, num_classes=C, device="cpu")
    assert two.queries == pytest.approx((2 * (1 + 2 * (1 + 7 + 1)) + 4 * 1) / 6)


@pytest.mark.parametrize("batch_size", [6, 4])
def test_spsa_queries_are_two_per_direction_and_iteration(batch_size):
    x, y = _data(6)
    spec = {"spsa": {"nb_sample": 5, "max_batch_size": 2, "nb_iter": 3}}
    out = run_attack(spec, Constant(), x, y, num_classes=C, device="cpu", batch_size=batch_size)
    assert out.queries == pytest.approx(2 * 5 * 3)  # 30 per image, whatever the attack batches
    assert out.robust_acc == pytest.approx(2 / 6)  # a constant model keeps its clean accuracy


def test_gradient_attacks_count_their_forwards_too():
    x, y = _data(6)
    assert run_attack({"pgd": {"steps": 3}}, Constant(), x, y, num_classes=C, device="cpu").queries == 3
    assert run_attack("fgsm", Constant(), x, y, num_classes=C, device="cpu").queries == 1


def test_defaults_are_beards_calls():
    """``Code/eva_utils.py``: ``Square(net, norm='Linf', eps=8/255, n_queries=5000, n_restarts=1,
    p_init=.8, seed=0, verbose=False, loss='margin', resc_schedule=True)``, ``SPSA(net, eps=8/255)``."""
    net = nn.Linear(1, 10)
    ours = create_attack("square", net, 10, seed=0)
    beard = torchattacks.Square(net, norm="Linf", eps=8 / 255, n_queries=5000, n_restarts=1, p_init=.8, seed=0,
                                verbose=False, loss="margin", resc_schedule=True)
    keys = ("norm", "eps", "n_queries", "n_restarts", "p_init", "seed", "loss", "rescale_schedule")
    assert {k: getattr(ours, k) for k in keys} == {k: getattr(beard, k) for k in keys}
    ours, beard = create_attack("spsa", net, 10), torchattacks.SPSA(net, eps=8 / 255)
    keys = ("eps", "delta", "lr", "nb_iter", "nb_sample", "max_batch_size")
    assert {k: getattr(ours, k) for k in keys} == {k: getattr(beard, k) for k in keys}
    assert parse_attack("spsa").norm == "Linf" and parse_attack({"square": {"norm": "L2"}}).norm == "L2"
    assert supports_targeted("square") and supports_targeted("spsa")
    assert get_entry("square").defaults["n_queries"] == 5000


def test_square_loss_choices_are_its_own():
    with pytest.raises(ValueError, match="'loss' must be one of \\('ce', 'margin'\\)"):
        parse_attack({"square": {"loss": "dlr"}})
    with pytest.raises(ValueError, match="'p_init'"):
        parse_attack({"square": {"p_init": 0}})


def test_square_adversarial_images_are_torchattacks_own_with_the_seed():
    """The same images as torchattacks' Square called directly (BEARD's way, its seed 0), in both modes."""
    torch.manual_seed(0)
    model = PixelModel(create_model("convnet", 1, C, 8, width=4, depth=1), [0.5], [0.25]).eval()
    x, y = _data(8, seed=1)
    for targeted in (False, True):
        out = run_attack({"square": {"n_queries": 30}}, model, x, y, num_classes=C, device="cpu", batch_size=8,
                         return_adv=True, targeted=targeted, seed=0)
        atk = torchattacks.Square(model, eps=8 / 255, n_queries=30, seed=0, verbose=False)
        goal = y
        if targeted:
            atk.set_mode_targeted_by_label(quiet=True)
            goal = (y + 1) % C
        assert torch.equal(out.adv, atk(x, goal))


def _small_convnet():
    torch.manual_seed(0)
    return PixelModel(create_model("convnet", 1, C, 8, width=8, depth=1), [0.5], [0.25]).eval()


def test_spsa_at_beards_settings_reaches_nb_iter_times_lr_not_its_eps():
    """BEARD's SPSA (torchattacks' defaults: one Adam step of lr 0.01) moves a pixel by at most
    nb_iter x lr: 0.01 = 2.55/255 of its 8/255 budget (Adam's first step is lr x sign of the gradient
    estimate); three steps reach about 0.03 (Adam's later steps are lr to within a fraction of a percent
    here), within the 8/255 = 0.031 bound."""
    model = _small_convnet()
    x, y = _data(6)
    x = 0.25 + 0.5 * x  # away from 0 and 1, so the [0, 1] clamp never shortens a step
    beard = run_attack("spsa", model, x, y, num_classes=C, device="cpu", return_adv=True)
    assert parse_attack("spsa").params["nb_iter"] * parse_attack("spsa").params["lr"] == 0.01
    assert beard.max_linf == pytest.approx(0.01, abs=1e-6) and beard.max_linf * 255 == pytest.approx(2.55, abs=1e-4)
    three = run_attack({"spsa": {"nb_iter": 3}}, model, x, y, num_classes=C, device="cpu")
    assert three.max_linf == pytest.approx(0.03, rel=0.005) and three.max_linf <= 8 / 255


@pytest.mark.parametrize("targeted", [False, True])
def test_spsa_images_are_torchattacks_own_on_the_same_inputs_and_seed(targeted):
    """run_attack seeds a batch with batch_seed(seed, b) inside fork_rng: torchattacks' SPSA called
    by hand under that seed, on the same pixels and model, makes the same images."""
    from ddlib.attacks import batch_seed

    model = _small_convnet()
    x, y = _data(6)
    ours = run_attack({"spsa": {"nb_sample": 16}}, model, x, y, num_classes=C, targeted=targeted, device="cpu",
                      seed=5, batch_size=6, return_adv=True)
    atk = torchattacks.SPSA(model, eps=8 / 255, nb_sample=16)
    if targeted:
        atk.set_mode_targeted_by_label(quiet=True)
    torch.manual_seed(batch_seed(5, 0))
    theirs = atk(x, (y + 1) % C if targeted else y)
    assert torch.equal(ours.adv, theirs)
    assert not torch.equal(theirs, x)
