import pytest
import torch

from ddlib.data.datasets import load_dataset
from ddlib.methods.dm import distribution_matching
from ddlib.methods.select import farthest_point_indices, kcenter_subset, random_subset


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


def test_kcenter_subset(digits):
    a = kcenter_subset(digits, 3, seed=0, device="cpu", epochs=10)
    b = kcenter_subset(digits, 3, seed=0, device="cpu", epochs=10)
    assert a.class_counts == [3] * 10 and a.method == "kcenter"
    assert a.provenance["indices"] == b.provenance["indices"]
    assert a.provenance["feature_model_test_accuracy"] > 0.5  # 10 epochs on 1,347 digits
    assert a.provenance["indices"] != random_subset(digits, 3, seed=0).provenance["indices"]


def test_dm_is_seeded_and_lowers_its_loss(digits):
    short = distribution_matching(digits, 2, iterations=2, batch_real=16, seed=0, device="cpu")
    again = distribution_matching(digits, 2, iterations=2, batch_real=16, seed=0, device="cpu")
    longer = distribution_matching(digits, 2, iterations=40, batch_real=16, seed=0, device="cpu")
    assert torch.equal(short.images, again.images)
    assert short.class_counts == [2] * 10 and short.images.shape == (20, 1, 8, 8)
    assert longer.provenance["final_loss"] < short.provenance["final_loss"]
    start = random_subset(digits, 2, seed=0)
    assert torch.equal(short.labels, start.labels)
    assert not torch.allclose(longer.images, start.images)  # the images moved


@pytest.mark.parametrize("init", ["noise", "kcenter"])
def test_dm_initialisations(digits, init):
    out = distribution_matching(digits, 1, iterations=1, batch_real=8, init=init, seed=0, device="cpu")
    assert out.provenance["init"] == init and out.images.shape == (10, 1, 8, 8)
    if init == "kcenter":
        start = kcenter_subset(digits, 1, seed=0, device="cpu")
        assert torch.equal(out.labels, start.labels)


def test_dm_refuses_unknown_init(digits):
    with pytest.raises(ValueError, match="init"):
        distribution_matching(digits, 1, iterations=1, init="zeros")


def test_dm_from_kcenter_starts_at_the_kcenter_images(digits):
    """With no iteration, DM returns its start: exactly the K-Center images for ``init: kcenter``
    (with the feature model trained ``init_epochs``), random real images for ``init: real``."""
    start = distribution_matching(digits, 2, iterations=0, init="kcenter", init_epochs=3, seed=0, device="cpu")
    chosen = kcenter_subset(digits, 2, seed=0, device="cpu", epochs=3)
    assert torch.allclose(start.images, chosen.images, atol=1e-6) and start.provenance["init_epochs"] == 3
    real = distribution_matching(digits, 2, iterations=0, init="real", seed=0, device="cpu")
    assert torch.allclose(real.images, random_subset(digits, 2, seed=0).images, atol=1e-6)
    assert not torch.allclose(start.images, real.images)
