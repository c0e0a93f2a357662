"""The test-set leakage check (issue 24.10): every set a cell obtains is compared with the test and
validation splits (exact copies, near-duplicates), the overlap is logged and flagged on the run and
on every leaderboard, and refused in strict mode (``--strict``, ``strict=True``, ``DDLIB_STRICT=1``)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

import ddlib
from ddlib.store import tracking
from ddlib.cli import main as cli_main
from ddlib.data.datasets import load_dataset
from ddlib.data.overlap import find_overlap
from ddlib.protocols import label_robust, protocol_module
from ddlib.protocols.cell import SANITY_TAG, cell_tags
from ddlib.protocols.leakage import LEAKAGE_TAG, LeakageRefused
from ddlib.store.tracking import TAG, Tracker, default_tags

# a cheap cell: the scores are near chance (flagged as such); what is tested is the leakage check
CHEAP = {"seeds": [0], "recipe": {"epochs": 2, "batch_size": 64}, "real_recipe": {"epochs": 1}, "lr_policy": "fixed"}
CHEAP_ARGS = ["--seeds", "0", "--param", "recipe={epochs: 2, batch_size: 64}", "--param", "real_recipe={epochs: 1}",
              "--param", "lr_policy=fixed", "--quiet"]
LEAKED = [3, 7]  # the set's images that are test images


def use_store(monkeypatch, store: Path) -> Path:
    monkeypatch.setenv("DDLIB_MLRUNS", str(store))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    return store


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def leaky_set(ds, noise: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Ten digits a user picked: one training image per class, but those of classes 3 and 7 are the
    first test images of their class, the second (with ``noise``) a copy with Gaussian pixel noise."""
    train_labels, test_labels = ds.train_labels.numpy(), ds.test_labels.numpy()
    images = ds.train_images[[int(np.flatnonzero(train_labels == c)[5]) for c in range(10)]].clone()
    picked = [int(np.flatnonzero(test_labels == c)[0]) for c in LEAKED]
    for c, j in zip(LEAKED, picked):
        images[c] = ds.test_images[j]
    if noise:
        g = torch.Generator().manual_seed(0)
        images[LEAKED[1]] = (images[LEAKED[1]] + noise * torch.randn(images[LEAKED[1]].shape, generator=g)).clamp(0, 1)
    return images, torch.arange(10), picked


# --------------------------------------------------------------------------- the check itself


def test_test_images_in_a_set_are_found_exact_and_near(digits):
    images, _, picked = leaky_set(digits)
    found = find_overlap(images, digits.test_images, "test", digits.train_images)
    assert [(m.index, m.split_index, m.exact) for m in found.leaked] == [(3, picked[0], True), (7, picked[1], True)]
    noisy, _, _ = leaky_set(digits, noise=0.02)
    found = find_overlap(noisy, digits.test_images, "test", digits.train_images)
    assert [(m.index, m.split_index, m.exact) for m in found.leaked] == [(3, picked[0], True), (7, picked[1], False)]
    assert found.summary() == "2 of 10 images are test images (1 exact, 1 near-duplicate)"
    # a float round trip through a normalised file quantises back to the same pixels: still exact
    mean, std = 0.3, 0.45
    round_trip = ((images - mean) / std).float() * std + mean
    assert [m.exact for m in find_overlap(round_trip, digits.test_images).leaked] == [True, True]


def test_the_digits_training_split_holds_no_test_image(digits):
    """Built-in sets (random, kcenter, ...) are drawn from the training split: on digits none of its
    1,347 images is a test image or near one, so none of them can match the test split."""
    assert find_overlap(digits.train_images, digits.test_images).matches == ()


def test_training_images_that_the_dataset_holds_in_its_test_split_are_no_leakage():
    """A set image that is a training image is the data a set may use: its exact match in the test
    split is the dataset's own duplicate (counted apart), never the set's leakage."""
    train = torch.rand(20, 3, 8, 8)
    test = torch.cat([torch.rand(5, 3, 8, 8), train[:1]])  # the dataset's own duplicate: train 0 = test 5
    found = find_overlap(train[[0, 4]], test, "test", train)
    assert found.leaked == [] and [(m.index, m.split_index) for m in found.dataset] == [(0, 5)]


# --------------------------------------------------------------------------- a cell: logged, flagged, refused


@pytest.mark.filterwarnings("ignore:sanity.*near chance")
def test_a_set_with_test_images_is_flagged_on_its_run_and_leaderboard_and_refused_when_strict(
        digits, tmp_path, monkeypatch, capsys):
    use_store(monkeypatch, tmp_path / "mlruns")
    images, labels, picked = leaky_set(digits, noise=0.02)
    with pytest.warns(UserWarning, match=r"leakage: 2 of 10 images are test images \(1 exact, 1 near-duplicate\)"):
        result = ddlib.score(images, labels, dataset="digits", method="picked", **CHEAP)
    run = tracking.client().get_run(result.run_id)
    tags = run.data.tags
    assert (tags["ddlib.leakage_test_exact"], tags["ddlib.leakage_test_near"]) == ("1", "1")
    assert tags["ddlib.leakage_test_pairs"] == f"3={picked[0]},7~{picked[1]}"
    assert tags[LEAKAGE_TAG] == "leakage: 2 of 10 images are test images (1 exact, 1 near-duplicate)"
    assert tags[SANITY_TAG].startswith("leakage: 2 of 10 images are test images")
    artifacts = {a.path for a in tracking.client().list_artifacts(result.run_id, "leakage")}
    assert artifacts == {"leakage/leakage.json", "leakage/test_pairs.png"}

    from ddlib.report.boards import build_board
    from ddlib.boards.table import format_leaderboard

    shown = format_leaderboard(build_board("lrs"))
    assert shown["sanity"].iloc[0].startswith("leakage: 2 of 10 images are test images (1 exact, 1 near-duplicate)")

    # strict: refused before anything trains, the cell FAILED with one line
    with pytest.raises(LeakageRefused, match=r"^strict: the set holds test images of digits: 2 of 10 images"):
        ddlib.score(images, labels, dataset="digits", method="picked", strict=True, **CHEAP)
    tracker = Tracker("label_robust")
    failed = tracker.client.search_runs([tracker.experiment_id], "attributes.status = 'FAILED'")
    assert len(failed) == 1 and failed[0].data.tags[TAG["error"]].startswith("LeakageRefused: strict:")
    children = tracker.client.search_runs([tracker.experiment_id],
                                          f"tags.mlflow.parentRunId = '{failed[0].info.run_id}'")
    assert children == []  # nothing trained

    # the finished, flagged cell is not reused under --strict: the CLI refuses it
    path = ddlib.scoring.save_arrays(images, labels)
    capsys.readouterr()
    assert cli_main(["score", str(path), "--dataset", "digits", "--method", "picked", "--strict", *CHEAP_ARGS]) == 1
    assert "strict: it finished earlier with 2 test image(s) in its set" in capsys.readouterr().err
    # the dry run says so before anything runs
    assert cli_main(["score", str(path), "--dataset", "digits", "--method", "picked", "--dry-run"]) == 0
    assert "warning: test images in a set: " in capsys.readouterr().out


def test_built_in_random_and_kcenter_sets_are_checked_and_clean(tmp_path, monkeypatch):
    use_store(monkeypatch, tmp_path / "mlruns")
    for method, source in (("random", None), ("kcenter", {"kind": "kcenter", "epochs": 1})):
        cell = label_robust.open_cell(dataset="digits", method=method, source=source, ipc=10, seeds=[0])
        label_robust.obtain(cell)
        cell.close()
        tags = tracking.client().get_run(cell.run_id).data.tags
        counts = {k: tags[f"ddlib.leakage_{k}"] for k in ("test_exact", "test_near", "test_dataset", "val_exact",
                                                            "val_near")}
        assert set(counts.values()) == {"0"}, (method, counts)
        assert LEAKAGE_TAG not in tags and SANITY_TAG not in tags


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:sanity.*near chance")
def test_strict_reaches_the_notebook_kernel(digits, tmp_path, monkeypatch, capsys):
    """``ddlib score --strict`` runs the cell in a papermill kernel (the runner hands it DDLIB_STRICT=1):
    the cell FAILS with the one-line refusal; a clean set scores as usual. Why it takes about 20 s: two
    `ddlib score` runs, each in its own papermill kernel, the second scoring for real."""
    use_store(monkeypatch, tmp_path / "mlruns")
    images, labels, _ = leaky_set(digits)
    path = tmp_path / "picked.npz"
    np.savez(path, images=images.numpy(), labels=labels.numpy())
    assert cli_main(["score", str(path), "--dataset", "digits", "--strict", *CHEAP_ARGS]) == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and "LeakageRefused: strict: the set holds test images of digits: 2 of 10 images" in err
    clean = tmp_path / "clean.npz"
    train_labels = digits.train_labels.numpy()
    idx = [int(np.flatnonzero(train_labels == c)[0]) for c in range(10)]
    np.savez(clean, images=digits.train_images[idx].numpy(), labels=train_labels[idx])
    assert cli_main(["score", str(clean), "--dataset", "digits", "--strict", *CHEAP_ARGS]) == 0


# --------------------------------------------------------------------------- every leaderboard shows it


BOARD_VALUES = {  # the values each protocol's boards read, per seed
    "label_robust": {"acc_syn_hard": 0.5, "acc_real_hard": 0.9, "acc_syn_any": 0.5, "acc_rdm_any": 0.3},
    "augmentation_robust": {"acc_syn_aug": 0.5, "acc_rdm_aug": 0.3, "acc_syn_noaug": 0.4, "acc_rdm_noaug": 0.3},
    "adversarial": {"clean_acc": 0.5, "clean_seconds": 1.0, "fgsm.robust_acc": 0.2, "fgsm.attack_seconds": 2.0},
    "augmentation": {"acc_noaug": 0.5, "acc_aug_avg": 0.6, "acc_crop": 0.6},
    "transfer": {"acc_reference": 0.5, "acc_transfer": 0.4, "acc_others_avg": 0.4, "acc_mlp": 0.4},
    "compression": {"acc_set": 0.5, "acc_full": 0.9, "relative": 0.55},
    "nas": {"proxy.a": 0.5, "proxy.b": 0.4, "proxy.c": 0.3, "gt.a": 90.0, "gt.b": 80.0, "gt.c": 85.0},
    "privacy": {"loss_auc_set": 0.6, "shadow_auc_set": 0.6, "acc_set": 0.5},
    "blackbox": {"clean_acc": 0.5, "clean.random": 0.4, "transfer.fgsm.random": 0.2},  # the set's images attack random's
    "label_regimes": {"acc_syn_hl": 0.5, "acc_rdm_hl": 0.4, "gap_hl": 0.1},
}


def test_every_leaderboard_shows_a_sets_leakage_in_its_sanity_column(tmp_path, monkeypatch):
    from ddlib.protocols.spec import board_specs
    from ddlib.report.boards import build_board
    from ddlib.boards.table import format_leaderboard

    use_store(monkeypatch, tmp_path / "mlruns")
    tracking.init_store()
    note = "leakage: 2 of 10 images are test images (2 exact, 0 near-duplicates)"
    ground_truth = tmp_path / "gt.csv"
    ground_truth.write_text("unused\n")
    extra = {"adversarial": {"attacks": ["fgsm"]}, "nas": {"ground_truth": str(ground_truth), "gt_column": "acc"}}
    for protocol, values in BOARD_VALUES.items():
        params = protocol_module(protocol).validate({"dataset": "digits", "method": "dm", "ipc": 1, "seeds": [0, 1],
                                                     **extra.get(protocol, {})})
        tracker = Tracker(protocol)
        run_id = tracker.start_run("cell", params=params, tags={**default_tags(protocol), **cell_tags(protocol, params),
                                                               LEAKAGE_TAG: note})
        for seed in (0, 1):
            tracker.log_per_seed(run_id, [{"seed": seed, **{k: v + 0.01 * seed for k, v in values.items()}}])
        tracker.end_run(run_id)
    boards = board_specs()
    assert set(boards) == {"lrs", "ars", "beard", "beard_unified", "augmentation", "transfer", "compression", "nas",
                           "privacy", "blackbox", "blackbox_irr", "label_regimes"}
    for name in boards:
        shown = format_leaderboard(build_board(name))
        assert list(shown["sanity"]) == [note], name


def test_pairs_grid_shows_each_leaked_image_beside_its_test_image(digits, tmp_path):
    from PIL import Image

    from ddlib.protocols.leakage import pairs_grid

    images, _, _ = leaky_set(digits)
    found = find_overlap(images, digits.test_images)
    path = pairs_grid(images, digits.test_images, found, tmp_path / "pairs.png")
    grid = np.asarray(Image.open(io.BytesIO(path.read_bytes())).convert("L"), dtype=float) / 255
    tile = 32 + 2  # 8 x 8 digits enlarged 4x, 2 pixels of padding
    assert grid.shape == (2 + tile, 2 + 4 * tile)  # one row: two pairs
    tiles = [grid[2:2 + 32, 2 + k * tile: 2 + k * tile + 32] for k in range(4)]
    for own, test_image in (tiles[0:2], tiles[2:4]):  # set image, its test image: each pair identical
        assert np.abs(own - test_image).max() < 1e-6


# --------------------------------------------------------------------------- the threshold on real data


def test_the_near_threshold_on_cifar10_jpeg(cifar10_jpeg_root, shared_data):
    """Measured with bench/leakage_threshold.py: JPEG re-encodings (quality 30) and pixel noise (std
    0.05) of test images match their original; among distinct test images only four pairs fall within
    the threshold, each the same photo (looked at: CIFAR-10's own duplicates); DC's distilled IPC 10 set
    matches nothing."""
    from PIL import Image

    from ddlib.data.overlap import NEAR_THRESHOLD, fingerprints

    ds = load_dataset("cifar10", cifar10_jpeg_root)
    assert ds.label == "CIFAR-10 (JPEG)"
    g = torch.Generator().manual_seed(0)
    picked = torch.randperm(len(ds.test_labels), generator=g)[:200]
    originals = ds.test_images[picked]
    reencoded = []
    for image in originals:
        buffer = io.BytesIO()
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, "JPEG", quality=30)
        reencoded.append(torch.from_numpy(np.array(Image.open(buffer))).permute(2, 0, 1))
    noisy = (originals.float() / 255 + 0.05 * torch.randn(originals.shape, generator=g)).clamp(0, 1)
    for copies in (torch.stack(reencoded), noisy):
        found = find_overlap(copies, ds.test_images)
        assert [(m.index, m.split_index, m.exact) for m in found.matches] == [
            (i, int(j), False) for i, j in enumerate(picked)]

    prints = fingerprints(ds.test_images)
    pairs = set()
    for start in range(0, len(prints), 2000):  # each test image against every other one
        distance = torch.cdist(prints[start:start + 2000], prints)
        distance[torch.arange(len(distance)), torch.arange(start, start + len(distance))] = float("inf")
        pairs |= {tuple(sorted((start + i, j))) for i, j in (distance < NEAR_THRESHOLD).nonzero().tolist()}
    assert pairs == {(164, 505), (5269, 5595), (5296, 5415), (6498, 6886)}

    dc = shared_data / "distilled" / "dc_cifar10_convnet_ipc10.pt"
    if dc.is_file():
        images = torch.load(dc, weights_only=False)["data"][-1][0]  # the shared data's own file: trusted
        pixels = images * torch.tensor([0.2023, 0.1994, 0.2010]).view(1, 3, 1, 1) + torch.tensor(
            [0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
        assert find_overlap(pixels, ds.test_images, "test", ds.train_images).matches == ()
