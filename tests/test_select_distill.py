from pathlib import Path

import pytest
import torch
import yaml

from ddlib.data.datasets import load_dataset
from ddlib.data.datasets import Dataset
from ddlib.engine.train import Recipe, train_and_test
from ddlib.methods.select import (farthest_point_indices, feature_model_name, kcenter_subset,
                                  kmeans_nearest_indices, random_subset)
from ddlib.methods.sources import obtain_set, resolve_source


pytestmark = pytest.mark.usefixtures("one_thread")  # 8x8 digits: a second thread only adds overhead


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_random_subset_is_per_class_and_reproducible(digits):
    a, b, c = random_subset(digits, 5, seed=1), random_subset(digits, 5, seed=1), random_subset(digits, 5, seed=2)
    assert a.class_counts == [5] * 10 and a.ipc == 5
    assert torch.equal(a.images, b.images) and a.provenance["indices"] == b.provenance["indices"]
    assert a.provenance["indices"] != c.provenance["indices"]
    # the images really are the training images at those indices, as pixels
    idx = torch.tensor(a.provenance["indices"])
    assert torch.equal(a.images, digits.pixels("train")[idx])
    assert torch.equal(a.labels, digits.train_labels[idx])


def test_random_subset_refuses_impossible_ipc(digits):
    with pytest.raises(ValueError, match="ipc must be in"):
        random_subset(digits, 10_000)


def test_farthest_point_picks_one_point_per_cluster():
    torch.manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    points = torch.cat([c + 0.1 * torch.randn(20, 2) for c in centres])
    chosen = farthest_point_indices(points, 4)
    assert sorted((chosen // 20).tolist()) == [0, 1, 2, 3]
    assert len(set(chosen.tolist())) == 4


def _clusters_with_outliers():
    """Four tight clusters of 20 points, each with one far outlier (rows 80-83)."""
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    points = torch.cat([c + 0.3 * torch.randn(20, 2, generator=g) for c in centres])
    outliers = centres * 1.0 + torch.tensor([[-6.0, -6.0], [16.0, -6.0], [-6.0, 16.0], [16.0, 16.0]])
    return torch.cat([points, outliers]), centres


def test_kmeans_kcenter_picks_the_point_nearest_each_centre_where_greedy_picks_outliers():
    """DC-Bench's K-Center keeps typical images (nearest the k-means centres); the greedy
    farthest-point rule spends its picks on the outliers."""
    points, centres = _clusters_with_outliers()
    chosen = kmeans_nearest_indices(points, 4, seed=0)
    assert sorted((chosen // 20).tolist()) == [0, 1, 2, 3]  # one per cluster, none an outlier
    for i in chosen.tolist():  # each the point nearest its cluster's centre (the mean of its 20 points and outlier)
        c = i // 20
        centre = torch.cat([points[c * 20:(c + 1) * 20], points[80 + c:81 + c]]).mean(0, keepdim=True)
        assert i == int(torch.cdist(centre, points).argmin())
    greedy = farthest_point_indices(points, 4)
    assert (greedy >= 80).sum() >= 3  # greedy: mostly the outliers
    assert torch.equal(kmeans_nearest_indices(points, 4, seed=0), chosen)  # seeded


def test_kmeans_kcenter_keeps_distinct_images():
    points = torch.tensor([[0.0, 0.0], [0.0, 0.1], [5.0, 5.0]])
    chosen = kmeans_nearest_indices(points, 3, seed=0)
    assert sorted(chosen.tolist()) == [0, 1, 2]
    twins = torch.zeros(6, 2)  # every centre is nearest the same image: the next nearest are taken
    with pytest.warns(Warning, match="distinct clusters"):  # scikit-learn's ConvergenceWarning
        assert len(set(kmeans_nearest_indices(twins, 3, seed=0).tolist())) == 3


def test_feature_model_depth_follows_the_image_size(digits):
    assert feature_model_name(digits) == "convnet"
    big = Dataset("tiny", torch.zeros(2, 3, 64, 64), torch.tensor([0, 1]), torch.zeros(2, 3, 64, 64),
                  torch.tensor([0, 1]), ("a", "b"), (0.5,) * 3, (0.5,) * 3)
    assert feature_model_name(big) == "convnet_d4"


def test_kcenter_subset(digits):
    a = kcenter_subset(digits, 3, seed=0, device="cpu", epochs=10)
    b = kcenter_subset(digits, 3, seed=0, device="cpu", epochs=10)
    assert a.class_counts == [3] * 10 and a.method == "kcenter"
    assert a.provenance["indices"] == b.provenance["indices"]
    assert a.provenance["feature_model_test_accuracy"] > 0.5  # 10 epochs on 1,347 digits
    assert a.provenance["feature_model"] == "convnet" and a.provenance["kmeans_n_init"] == 10
    assert a.provenance["indices"] != random_subset(digits, 3, seed=0).provenance["indices"]


def test_kcenter_features_train_in_fp32_where_bf16_is_native(digits, monkeypatch, tmp_path):
    """The set a method selects must not depend on the machine: the feature network ignores the
    default ``precision: auto`` and trains in fp32 even where the device computes bf16."""
    from ddlib.engine import device as device_mod

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))  # trained here, not found in a cache
    monkeypatch.setattr(device_mod, "bf16_supported", lambda d: True)
    assert device_mod.resolve_precision("auto", torch.device("cpu")) == "bf16"
    a = kcenter_subset(digits, 1, seed=0, device="cpu", epochs=2)
    assert a.provenance["feature_precision"] == "fp32" and a.provenance["feature_model_from"] == "trained"


def test_the_kcenter_feature_network_is_trained_once_per_machine(digits, monkeypatch, tmp_path):
    """Every K-Center cell of a grid (and DM started from K-Center images) needs the same feature
    network: the second one loads it, and selects the very same images."""
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    a = kcenter_subset(digits, 2, seed=0, device="cpu", epochs=2)
    b = kcenter_subset(digits, 3, seed=0, device="cpu", epochs=2)
    again = kcenter_subset(digits, 2, seed=0, device="cpu", epochs=2)
    assert a.provenance["feature_model_from"] == "trained" and b.provenance["feature_model_from"] == "cache"
    assert again.provenance["indices"] == a.provenance["indices"]
    assert again.provenance["feature_model_test_accuracy"] == a.provenance["feature_model_test_accuracy"]
    assert kcenter_subset(digits, 2, seed=1, device="cpu", epochs=2).provenance["feature_model_from"] == "trained"


def test_dm_runs_with_one_seed_share_their_real_side_and_give_a_fresh_runs_images(digits, monkeypatch, tmp_path):
    """DM's real class means depend on the seed, not on the start or the IPC: the second of DM from
    real images and DM from K-Center images (another IPC) reads them from the cache and makes the
    very images a run without the cache makes; so does a noise start (its noise has a generator of its
    own), whose images are then a fresh noise run's."""
    import hashlib

    from ddlib.methods.dm import distribution_matching

    def images(cache, **kw):
        monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / cache))
        out = distribution_matching(digits, kw.pop("ipc"), iterations=15, batch_real=8, device="cpu", seed=3, **kw)
        return hashlib.sha256(out.images.numpy().tobytes()).hexdigest()

    def means(cache):
        return sorted(p.name for p in (tmp_path / cache / "features").glob("digits-dm-real-means-*.pt"))

    fresh = images("alone", ipc=2, init="kcenter", init_epochs=1)
    assert images("shared", ipc=1) and len(means("shared")) == 1
    entry = tmp_path / "shared" / "features" / means("shared")[0]
    written = entry.stat().st_mtime_ns
    assert images("shared", ipc=2, init="kcenter", init_epochs=1) == fresh
    assert means("shared") == [entry.name] and entry.stat().st_mtime_ns == written  # read, not computed again
    noise = images("noise alone", ipc=1, init="noise")
    assert images("shared", ipc=1, init="noise") == noise and means("shared") == [entry.name]
    monkeypatch.setattr("ddlib.methods.dm.REAL_MEANS_MAX_BYTES", 0)  # a run too large to keep them: computed, not kept
    assert images("small", ipc=2, init="kcenter", init_epochs=1) == fresh and means("small") == []


def test_a_dm_set_is_distilled_once_per_machine(digits, monkeypatch, tmp_path):
    """A second cell, protocol or --force rerun asking for the same DM set reads it, bit for bit the
    distilled one; another option, or a damaged entry, distils again."""
    from ddlib.methods.dm import distribution_matching

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))

    def dm(**kw):
        return distribution_matching(digits, 2, iterations=10, batch_real=8, device="cpu", seed=3, **kw)

    first, again = dm(), dm()
    assert first.provenance.pop("from") == "distilled" and again.provenance.pop("from") == "cache"
    assert torch.equal(first.images, again.images) and torch.equal(first.labels, again.labels)
    assert first.provenance == again.provenance  # the final loss and every option
    assert dm(lr_img=0.5).provenance["from"] == "distilled"
    (entry,) = [p for p in (tmp_path / "features").glob("digits-dm-set-ipc2-*.pt")
                if torch.load(p, weights_only=True)["provenance"]["lr_img"] == 1.0]
    entry.write_bytes(b"not a torch file")
    damaged = dm()
    assert damaged.provenance["from"] == "distilled" and torch.equal(damaged.images, first.images)


def test_a_label_robust_cell_scores_the_same_with_its_dm_set_read_from_the_cache(digits, mlflow_store, monkeypatch,
                                                                                 tmp_path):
    """DM reseeds the global generator every iteration; a cell that reads the set skips all that, and
    must still train its models from the same draws (every training seeds itself)."""
    from ddlib.store import tracking
    from ddlib.protocols import label_robust

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "cache"))
    params = dict(dataset="digits", method="dm", source={"kind": "dm", "iterations": 10, "batch_real": 8}, ipc=2,
                  model="convnet", recipe={"epochs": 20, "lr": 0.05}, real_recipe={"epochs": 1}, seeds=[0, 1],
                  lr_policy="fixed")
    results = []
    for store in ("first", "second"):  # a store each: the second cell trains again, its DM set from the cache
        monkeypatch.setenv("DDLIB_MLRUNS", str(tmp_path / store))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / store / 'mlflow.db'}")
        monkeypatch.setattr(tracking, "_CLIENTS", {})
        cell = label_robust.open_cell(**params)
        cell.progress = False
        distilled = label_robust.obtain(cell)
        results.append((distilled.provenance["from"], label_robust.evaluate(cell, distilled).per_seed))
        cell.close()
    assert [origin for origin, _ in results] == ["distilled", "cache"]
    first, second = (table[["acc_syn_hard", "acc_rdm_hard", "acc_real_hard", "lrs"]] for _, table in results)
    assert first["acc_syn_hard"].min() > 0.3 and first.equals(second)  # trained (not at chance), and bit for bit


def test_dm_caches_no_real_means_for_a_network_that_draws_in_its_forward_pass():
    """A ViT's dropout draws from the global generator in the real pass too: skipping that pass on a
    cache hit would change the synthetic pass's draws, so such networks are never cached."""
    from types import SimpleNamespace

    from ddlib.methods.dm import _draws_in_forward

    cifar_shaped = SimpleNamespace(channels=3, num_classes=10, image_size=(32, 32))
    assert _draws_in_forward("vit", cifar_shaped) and not _draws_in_forward("convnet", cifar_shaped)


def test_kcenter_greedy_is_a_source_of_its_own(digits):
    spec = resolve_source("kcenter_greedy")
    assert spec == {"kind": "kcenter_greedy"}
    out = obtain_set("kcenter_greedy", {"kind": "kcenter_greedy", "epochs": 2}, digits, 3, device="cpu")
    assert out.method == "kcenter_greedy" and out.provenance["selection"].startswith("greedy")
    assert out.class_counts == [3] * 10
    same_features = kcenter_subset(digits, 3, seed=0, device="cpu", epochs=2)  # k-means picks other images
    assert out.provenance["indices"] != same_features.provenance["indices"]


@pytest.mark.slow
def test_kcenter_is_not_worse_than_random_on_digits_ipc10(digits):
    """The issue's check: DC-Bench's K-Center at IPC 10 on digits lands within a point of random or
    above, with the demo's recipe, seeds and K-Center epochs, read from params/demo.yaml (measured on
    a 2-core Zen 3, 2026-11-28: 91.6 % against random's 88.0 % at its 60 epochs; 97.1 % against 93.9 %
    at 200, where the greedy farthest-point rule, which picks outliers, gave 85.7 %). Six trainings
    of 60 steps and K-Center's 20-epoch feature network: about 20 s on one Zen 3 thread (61 s at 200
    epochs and two seeds, as this test ran before the demo's recipe went down to 60 epochs)."""
    demo = yaml.safe_load((Path(__file__).resolve().parents[1] / "params" / "demo.yaml").read_text())
    recipe = Recipe.from_dict(demo["params"]["recipe"])
    seeds = demo["params"]["seeds"]

    def accuracy(subset):
        results = train_and_test("convnet", subset.images, subset.labels, digits.test_images, digits.test_labels,
                                     num_classes=10, mean=digits.mean, std=digits.std, recipe=recipe, seeds=seeds,
                                     device="cpu")
        return 100 * sum(r.test_accuracy for r in results) / len(results)

    random_acc = accuracy(random_subset(digits, 10, seed=0))
    kcenter_acc = accuracy(kcenter_subset(digits, 10, seed=0, device="cpu", epochs=demo["methods"]["kcenter"]["epochs"]))
    assert kcenter_acc >= random_acc - 1.0, (kcenter_acc, random_acc)
