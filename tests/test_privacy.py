"""Membership inference (issue 27.3, ddlib.protocols.privacy): the two attacks on models whose membership
is known by construction, TPR at 1 % FPR on a hand-worked score list, and the protocol end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]


def test_tpr_at_one_percent_fpr_and_auc_on_a_hand_worked_score_list():
    from ddlib.protocols.privacy import membership_auc, tpr_at_fpr

    # 100 non-members: one scores 0.95, 99 score 0.0; 10 members: 3 at 0.99, 4 at 0.9, 3 at 0.5.
    nonmembers = [0.95] + [0.0] * 99
    members = [0.99] * 3 + [0.9] * 4 + [0.5] * 3
    # ROC operating points (threshold: FPR, TPR): 0.99: (0, 0.3); 0.95: (0.01, 0.3); 0.9: (0.01, 0.7);
    # 0.5: (0.01, 1.0); 0.0: (1, 1). Below 1 % FPR (strictly, as LiRA's code) only FPR 0 qualifies: TPR 0.3
    # (reading "at most 1 %" would give 1.0; interpolating to FPR 0.01 is ambiguous on the vertical).
    assert tpr_at_fpr(members, nonmembers) == pytest.approx(0.3)
    # AUC = P(member > non-member): 3 x 100 + 4 x 99 + 3 x 99 pairs won of 10 x 100.
    assert membership_auc(members, nonmembers) == pytest.approx(993 / 1000)
    assert tpr_at_fpr([0.5, 0.6], [0.1, 0.2]) == 1.0 and membership_auc([0.1], [0.2]) == 0.0


def test_members_and_non_members_are_balanced_disjoint_and_seeded():
    from ddlib.protocols.privacy import split_members

    a, b = split_members(100, 40, 500, seed=3), split_members(100, 40, 500, seed=3)
    assert len(a.members) == len(a.nonmembers) == 20  # capped at half of the smaller split
    assert torch.equal(a.members, b.members) and torch.equal(a.nonmembers, b.nonmembers)
    assert not set(a.members.tolist()) & set(a.shadow_pool.tolist())
    assert sorted(a.nonmembers.tolist() + a.shadow_out.tolist()) == list(range(40))
    assert not torch.equal(split_members(100, 40, 500, seed=4).members, a.members)


def _train(ds, idx, seeds, epochs):
    from ddlib.engine.recipe import Recipe
    from ddlib.engine.train import train_and_test

    recipe = Recipe(epochs=epochs, batch_size=len(idx), lr=0.05, momentum=0.9, weight_decay=0.0, precision="fp32")
    return [r.model.eval() for r in train_and_test(
        "convnet", ds.train_images[idx], ds.train_labels[idx], ds.test_images[:50], ds.test_labels[:50],
        num_classes=ds.num_classes, mean=ds.mean, std=ds.std, recipe=recipe, seeds=seeds, device="cpu",
        keep_models=True)]


@pytest.fixture(scope="module")
def digits():
    from ddlib.data.datasets import load_dataset

    return load_dataset("digits")


def _losses(model, ds, images, labels):
    from ddlib.protocols.privacy import model_outputs

    return model_outputs(model, images, labels, ds.mean, ds.std)


def test_a_model_that_never_saw_either_group_gives_auc_near_one_half(digits):
    from ddlib.protocols.privacy import membership_auc

    ds = digits
    perm = torch.randperm(len(ds.train_labels), generator=torch.Generator().manual_seed(0))
    (model,) = _train(ds, perm[:100], [0], epochs=30)
    n = 200  # unseen training images ("members" of nothing) against as many test images
    _, loss_train = _losses(model, ds, ds.train_images[perm[100:100 + n]], ds.train_labels[perm[100:100 + n]])
    _, loss_test = _losses(model, ds, ds.test_images[:n], ds.test_labels[:n])
    # Under no membership signal the AUC (Mann-Whitney) has sd sqrt((n + m + 1) / (12 n m)) = 0.029 at
    # n = m = 200: 0.5 +- 0.1 is 3.5 sd (the digits' train and test splits are one random split).
    assert abs(membership_auc(-loss_train, -loss_test) - 0.5) < 0.1


def test_a_model_that_memorised_its_members_is_caught_by_both_attacks(digits):
    from ddlib.protocols.privacy import attack_features, fit_shadow_attack, membership_auc

    ds = digits
    perm = torch.randperm(len(ds.train_labels), generator=torch.Generator().manual_seed(1))
    members, shadow_in = perm[:20], perm[20:40]
    target, shadow = _train(ds, members, [0], 300)[0], _train(ds, shadow_in, [1], 300)[0]
    nonmembers, shadow_out = slice(0, 200), slice(200, 400)

    def feats(model, images, labels):
        return attack_features(*_losses(model, ds, images, labels))

    _, loss_in = _losses(target, ds, ds.train_images[members], ds.train_labels[members])
    _, loss_out = _losses(target, ds, ds.test_images[nonmembers], ds.test_labels[nonmembers])
    assert membership_auc(-loss_in, -loss_out) > 0.9
    attack = fit_shadow_attack(feats(shadow, ds.train_images[shadow_in], ds.train_labels[shadow_in]),
                               feats(shadow, ds.test_images[shadow_out], ds.test_labels[shadow_out]))
    score_in = attack.predict_proba(feats(target, ds.train_images[members], ds.train_labels[members]))[:, 1]
    score_out = attack.predict_proba(feats(target, ds.test_images[nonmembers], ds.test_labels[nonmembers]))[:, 1]
    assert membership_auc(score_in, score_out) > 0.9


def test_bad_parameters_name_their_key():
    from ddlib.protocols.privacy import validate

    for key, value in (("members", 1), ("attack_seed", -1), ("full_data", "yes")):
        with pytest.raises(ValueError, match=key):
            validate({key: value})


@pytest.mark.slow
def test_the_privacy_protocol_runs_end_to_end_and_fills_its_board(mlflow_store, monkeypatch):
    """`params/privacy_demo.yaml` through the CLI fills the privacy board and the report card, and trains
    nothing twice. Why it takes about 20 s: a real grid of 2 cells and 2 seeds, whose twelve trainings
    (the two sets', the random subset's, the shadows' and the full-data model's) are what the test counts."""
    from ddlib.cli import main as cli_main
    from ddlib.report import card as cards
    from ddlib.report.boards import load_boards

    monkeypatch.chdir(ROOT)
    assert cli_main(["run", str(ROOT / "params" / "privacy_demo.yaml")]) == 0
    board = load_boards()["privacy"]
    assert sorted(board["method"]) == ["kcenter", "random"] and set(board["seeds"]) == {2}
    for side in ("set", "random", "full"):
        for value in ("loss_auc", "loss_tpr", "shadow_auc", "shadow_tpr"):
            assert board[f"{value}_{side}_mean"].between(0, 1).all(), (value, side)
    card = cards.build_card("kcenter", "digits", 2, boards=load_boards())
    block = next(b for b in card.blocks if b.protocol == "privacy")
    assert block.ran and block.title == "Privacy: membership inference (AUC; 0.5: no leak)"
    assert block.title in set(card.headline["protocol"])
    # Nothing trained twice: per seed the two sets (syn), and once for both cells the random subset (rdm),
    # the ipc-sized shadow (shared by the set and the random subset), the full-data model and its shadow.
    from ddlib import tracking

    cells = tracking.runs("privacy", kind="cell")
    assert cells["metrics.models_trained"].sum() == 2 * (2 + 4) and cells["metrics.models_reused"].sum() == 4 * 2
    evals = tracking.runs("privacy", kind="eval")
    assert evals["tags.ddlib.role"].value_counts().to_dict() == {"syn": 4, "rdm": 2, "shadow_ipc": 2, "real": 2,
                                                                 "shadow_full": 2}
