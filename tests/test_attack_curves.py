"""Robustness curves (issue 26.3): the area under robust accuracy against epsilon, AutoAttack's
components as torchattacks' AutoAttack builds them, curves of several attacks in one cell, and
their plots."""

import math

import pytest
import torch
import torch.nn as nn
import torchattacks

from ddlib import report
from ddlib.attacks import create_attack
from ddlib.attacks.curves import curve_aucs, parse_curve
from ddlib.scores.robustness import curve_auc
from ddlib.protocols import adversarial
from ddlib.protocols.beard_boards import eps_curve_figures

# eps (x 1/255) 0, 2, 4, 8 with accuracies 0.9, 0.6, 0.4, 0.1, by hand: trapezoids
# (0.9 + 0.6) / 2 * 2 = 1.5, (0.6 + 0.4) / 2 * 2 = 1.0, (0.4 + 0.1) / 2 * 4 = 1.0; area 3.5 over the
# range 8: 0.4375 (the plain mean of the points is 0.5, the unnormalised area 3.5 / 255 = 0.0137).
EPS = [0, 2 / 255, 4 / 255, 8 / 255]
ACCS = [0.9, 0.6, 0.4, 0.1]


def test_curve_auc_is_the_normalised_trapezoid():
    assert curve_auc(EPS, ACCS) == pytest.approx(0.4375, abs=1e-12)
    assert curve_auc(EPS[::-1], ACCS[::-1]) == pytest.approx(0.4375, abs=1e-12)  # sorted by eps first
    # a flat curve is its accuracy whatever the range; two points are one trapezoid
    assert curve_auc([1 / 255, 16 / 255], [0.3, 0.3]) == pytest.approx(0.3)
    assert curve_auc([0.1, 0.3], [0.8, 0.2]) == pytest.approx(0.5)
    assert math.isnan(curve_auc([8 / 255], [0.2])) and math.isnan(curve_auc([0, 0.1], [0.5, float("nan")]))
    with pytest.raises(ValueError, match="appears twice"):
        curve_auc([0.1, 0.1], [0.5, 0.4])
    with pytest.raises(ValueError, match="2 epsilons but 1 accuracies"):
        curve_auc([0.1, 0.2], [0.5])
    # from a per-seed row's metric names (eps written to 6 decimals)
    row = {f"curve.pgd.{e:.6f}": a for e, a in zip(EPS, ACCS)} | {"clean_acc": 0.9, "curve.fgsm.0.100000": 0.2}
    aucs = curve_aucs(row)
    assert aucs["curve_auc.pgd"] == pytest.approx(0.4375, abs=1e-4) and math.isnan(aucs["curve_auc.fgsm"])


def test_curve_specs_are_checked():
    points = parse_curve({"attacks": ["fgsm", {"aa_apgd_t": {"steps": 3}}], "eps": ["8/255", 0, "2/255"]})
    assert [(p.attack, round(p.eps * 255)) for p in points] == [("fgsm", 0), ("fgsm", 2), ("fgsm", 8),
                                                                 ("aa_apgd_t", 0), ("aa_apgd_t", 2), ("aa_apgd_t", 8)]
    assert points[0].spec is None and points[4].spec.params["steps"] == 3  # eps 0: the clean accuracy, no attack
    assert [p.key for p in parse_curve({"attack": "pgd", "eps": [0.01]})] == ["curve.pgd.0.010000"]
    for bad, message in (({"attacks": ["pgd", {"pgd": {"steps": 3}}], "eps": [0.1]}, "listed twice"),
                         ({"attacks": "pgd", "eps": [0.1]}, "non-empty list"),
                         ({"attacks": ["pgd"], "eps": [0.1, 0.1000001]}, "two epsilons give one point"),
                         ({"attacks": ["deepfool"], "eps": [0.1]}, "has no epsilon")):
        with pytest.raises(ValueError, match=message):
            parse_curve(bad)
    with pytest.raises(ValueError, match="aa_fab_t: it supports \\['default'\\] only"):
        parse_curve({"attacks": ["aa_square", "aa_fab_t"], "eps": [0.1]}, targeted=True)
    with pytest.raises(ValueError, match="eps_curve: attack 'cw' has no epsilon"):
        adversarial.validate({"dataset": "digits", "eps_curve": {"attacks": ["pgd", "cw"], "eps": [0.1]}})


def _tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    x = torch.rand(12, 1, 4, 4)
    with torch.no_grad():
        y = model(x).argmax(1)  # all clean-correct, so every component attacks every image
    return model, x, y


STEPS, QUERIES = 3, 40
COMPONENTS = {"aa_apgd_ce": {"steps": STEPS}, "aa_apgd_t": {"steps": STEPS}, "aa_fab_t": {"steps": STEPS},
              "aa_square": {"n_queries": QUERIES}}


def _reference(model, eps=8 / 255):
    """torchattacks' own AutoAttack with the iterations ddlib's ``autoattack`` entry sets."""
    atk = torchattacks.AutoAttack(model, norm="Linf", eps=eps, version="standard", n_classes=10, seed=3)
    for part in atk._autoattack.attacks:
        if isinstance(part, torchattacks.Square):
            part.n_queries = QUERIES
        else:
            part.steps = STEPS
    return atk


def _settings(atk) -> dict:
    return {k: v for k, v in vars(atk).items() if isinstance(v, (bool, int, float, str)) and k != "attack"}


def test_autoattack_components_are_torchattacks_autoattacks_own():
    model, x, y = _tiny()
    reference = _reference(model, eps=4 / 255)
    ours = [create_attack({name: {**params, "eps": 4 / 255}}, model, 10, seed=3) for name, params in COMPONENTS.items()]
    for mine, theirs in zip(ours, reference._autoattack.attacks):
        assert type(mine) is type(theirs) and _settings(mine) == _settings(theirs)
        assert torch.equal(mine(x, y), theirs(x, y)), type(theirs).__name__
    # in AutoAttack's order, MultiAttack over the four is torchattacks' AutoAttack and ddlib's autoattack
    composed = torchattacks.MultiAttack(ours)(x, y)
    assert torch.equal(composed, reference(x, y))
    assert torch.equal(composed, create_attack({"autoattack": {"eps": 4 / 255, "steps": STEPS, "n_queries": QUERIES}},
                                               model, 10, seed=3)(x, y))
    with pytest.raises(ValueError, match="at least 4 classes"):
        create_attack("aa_apgd_t", model, 3)


def test_a_cell_draws_curves_of_several_attacks_with_their_areas(mlflow_store):
    params = {"dataset": "digits", "seeds": [0], "device": "cpu", "method": "random", "ipc": 5,
              "recipe": {"epochs": 15, "batch_size": 64}, "attacks": ["fgsm", "pgd"], "attack_size": 40,
              "attack_batch_size": 40,
              "eps_curve": {"attacks": ["fgsm", {"aa_apgd_ce": {"steps": 3}}, {"aa_square": {"n_queries": 20}}],
                            "eps": [0, "4/255", "16/255"]}}
    cell = adversarial.open_cell(**params)
    result = adversarial.evaluate(cell, adversarial.obtain(cell))
    cell.close()
    row = result.per_seed.iloc[0]
    for attack in ("fgsm", "aa_apgd_ce", "aa_square"):
        assert row[f"curve.{attack}.0.000000"] == row["clean_acc"]  # eps 0: no attack
        points = [row[f"curve.{attack}.{e:.6f}"] for e in (0, 4 / 255, 16 / 255)]
        assert points[2] <= points[0]
        # by hand: trapezoids over [0, 4] and [4, 16] (x 1/255), over the range 16
        want = ((points[0] + points[1]) / 2 * 4 + (points[1] + points[2]) / 2 * 12) / 16
        assert row[f"curve_auc.{attack}"] == pytest.approx(want, abs=1e-4)
    board = report.robustness_leaderboard().iloc[0]
    assert 100 * board["curve_auc.aa_apgd_ce_mean"] == pytest.approx(row["curve_auc.aa_apgd_ce"])  # a result shows %
    assert board["crei_rome_mean"] == pytest.approx(row["crei_rome"])
    curves = report.eps_curves()
    assert set(curves["attack"]) == {"fgsm", "aa_apgd_ce", "aa_square"}
    figures = eps_curve_figures(curves)
    assert list(figures) == ["eps_row_0"]  # one row, one method: no comparison figure
    assert len(figures["eps_row_0"].axes[0].lines) >= 3
    other = curves.assign(group="other", method="dc")
    assert {"eps_row_0", "eps_row_1", "eps_methods_0", "eps_methods_1", "eps_methods_2"} <= set(
        eps_curve_figures(other.__class__(list(curves.to_dict("records")) + list(other.to_dict("records")))))


def test_a_missing_point_gives_no_area_on_the_board_not_a_shorter_curves():
    """A per-seed row holds every cell's curve columns: another cell's curve (all NaN here) is left
    out, and this row's curve with a missing point has no area (the protocol's own rule), where the
    area of its two other points (0.7) would be a wrong number."""
    import pandas as pd

    from ddlib.attacks.curves import curve_aucs
    from ddlib.protocols.beard_boards import _own_curves

    row = pd.Series({"curve.pgd.0.000000": 0.9, "curve.pgd.0.007843": 0.5, "curve.pgd.0.031373": float("nan"),
                     "curve.fgsm.0.000000": float("nan"), "curve.fgsm.0.031373": float("nan"), "clean_acc": 0.9})
    aucs = curve_aucs(_own_curves(row))
    assert list(aucs) == ["curve_auc.pgd"] and aucs["curve_auc.pgd"] != aucs["curve_auc.pgd"]  # NaN


def test_cells_with_other_curves_are_other_rows():
    """Curve areas are row values: cells whose curves differ (ε list, an attack's settings) are other
    rows; a cell without a curve keeps the row key it had before curves existed."""
    from ddlib.protocols import adversarial
    from ddlib.protocols.placement import cell_tags

    base = {"dataset": "digits", "method": "dm", "ipc": 1, "seeds": [0], "attacks": ["fgsm"]}
    def group(**extra):
        return cell_tags("adversarial", adversarial.validate({**base, **extra}))["ddlib.group_key"]
    plain = group()
    short = group(eps_curve={"attacks": ["pgd"], "eps": [0, 0.01]})
    long = group(eps_curve={"attacks": ["pgd"], "eps": [0, 0.01, 0.03]})
    stronger = group(eps_curve={"attacks": [{"pgd": {"steps": 20}}], "eps": [0, 0.01]})
    assert len({plain, short, long, stronger}) == 4
    assert adversarial.group_identity(adversarial.validate(base)).keys() == \
        adversarial.group_identity(adversarial.validate({**base, "eps_curve": None})).keys()


def test_beard_compat_runs_the_attack_at_eps_0_as_beards_pipeline_does(mlflow_store):
    """BEARD's pipeline clamps the normalised tensor to [0, 1] whatever the budget: at ε = 0 its
    accuracy is not the clean one (BACON IPC 50: 65.5 % clean, 49.25 % at ε = 0). In beard_compat space
    the point is BEARD's pipeline written out (torchattacks' FGSM at ε = 0 on normalised tensors, the
    network classifying the result); in pixel space it stays the clean accuracy (no attack runs)."""
    from ddlib.engine.test_pass import as_pixels

    assert parse_curve({"attack": "fgsm", "eps": [0, 0.01]})[0].spec is None
    compat = parse_curve({"attack": "fgsm", "eps": [0, 0.01]}, space="beard_compat")
    assert compat[0].spec is not None and compat[0].spec.eps == 0
    params = {"dataset": "digits", "seeds": [0], "device": "cpu", "method": "random", "ipc": 5,
              "recipe": {"epochs": 15, "batch_size": 64}, "attacks": ["fgsm", "pgd"], "attack_size": 40,
              "attack_batch_size": 40, "space": "beard_compat", "eps_curve": {"attack": "fgsm", "eps": [0, "4/255"]}}
    cell = adversarial.open_cell(**params)
    models = adversarial.train_models(cell, adversarial.obtain(cell))
    row = adversarial.evaluate(cell, None, models).per_seed.iloc[0]
    x, y = adversarial.attack_subset(cell)
    ds = cell.dataset
    cell.close()
    mean, std = torch.tensor(ds.mean).view(1, -1, 1, 1), torch.tensor(ds.std).view(1, -1, 1, 1)
    net = models[0].model.cpu().eval()
    adv = torchattacks.FGSM(net, eps=0.0)((as_pixels(x) - mean) / std, y)
    with torch.no_grad():
        beard = 100 * float((net(adv).argmax(1) == y).float().mean())
    assert row["curve.fgsm.0.000000"] == pytest.approx(beard)
    assert row["curve.fgsm.0.000000"] < row["clean_acc"] - 2  # the clamp alone costs accuracy (30 % to 25 % here)
