import pytest
import torch

from ddlib.data.datasets import load_dataset
from ddlib.engine.device import resolve_device
from ddlib.methods.select import random_subset
from ddlib.engine.train import Recipe, train_and_evaluate


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _train(ds, subset, seeds, **kw):
    recipe = kw.pop("recipe", Recipe(epochs=15, batch_size=32))
    return train_and_evaluate("convnet", subset.images, kw.pop("targets", subset.labels), ds.test_images,
                              ds.test_labels, num_classes=10, mean=ds.mean, std=ds.std, recipe=recipe,
                              seeds=seeds, device="cpu", **kw)


def test_same_seed_same_result_and_different_seeds_differ(digits):
    subset = random_subset(digits, 5, seed=0)
    a = _train(digits, subset, [0, 1])
    b = _train(digits, subset, [0])
    assert a[0].test_accuracy == b[0].test_accuracy
    assert a[0].epoch_losses == b[0].epoch_losses
    assert a[0].epoch_losses != a[1].epoch_losses
    assert [r.seed for r in a] == [0, 1]


def test_training_learns_and_reports_timings(digits):
    subset = random_subset(digits, 10, seed=0)
    (r,) = _train(digits, subset, [0], recipe=Recipe(epochs=40, batch_size=50))
    assert r.test_accuracy > 0.6  # chance is 0.1
    assert len(r.epoch_losses) == 40 and r.epoch_losses[-1] < r.epoch_losses[0]
    assert r.train_seconds > 0 and r.eval_seconds > 0
    assert r.model is None
    # the test counts per (true, predicted) class: every test image once, the accuracy on the diagonal
    counts = torch.tensor(r.confusion)
    assert counts.shape == (10, 10) and counts.sum() == len(digits.test_labels)
    assert counts.sum(1).tolist() == torch.bincount(digits.test_labels, minlength=10).tolist()
    assert counts.trace().item() / counts.sum().item() == r.test_accuracy


def test_global_rng_state_does_not_change_results(digits):
    subset = random_subset(digits, 3, seed=0)
    torch.manual_seed(123)
    a = _train(digits, subset, [7])[0].epoch_losses
    torch.manual_seed(999)
    torch.rand(10)
    b = _train(digits, subset, [7])[0].epoch_losses
    assert a == b


def test_soft_targets_and_hooks_are_used(digits):
    subset = random_subset(digits, 2, seed=0)
    soft = torch.nn.functional.one_hot(subset.labels, 10).float() * 0.9 + 0.01
    calls = {"augment": 0, "loss": 0}

    def augment(x, targets, generator):
        calls["augment"] += 1
        assert isinstance(generator, torch.Generator) and len(targets) == len(x)
        return x + 0.01 * torch.randn(x.shape, generator=generator), targets

    def loss(logits, targets, inputs):
        calls["loss"] += 1
        assert targets.shape == (len(inputs), 10)
        return torch.nn.functional.cross_entropy(logits, targets)

    (r,) = _train(digits, subset, [0], targets=soft, augment=augment, loss=loss, keep_models=True,
                  recipe=Recipe(epochs=3, batch_size=8))
    assert calls == {"augment": 9, "loss": 9}  # 20 images / 8 -> 3 steps x 3 epochs
    assert isinstance(r.model, torch.nn.Module)


def test_step_scheduler_drops_lr_at_half(digits, monkeypatch):
    seen = []
    original = torch.optim.SGD.step

    def spy(self, *a, **k):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *a, **k)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    subset = random_subset(digits, 1, seed=0)
    _train(digits, subset, [0], recipe=Recipe(epochs=4, batch_size=256, lr=0.1))
    assert seen == pytest.approx([0.1, 0.1, 0.01, 0.01])


@pytest.mark.parametrize("opt,sched", [("adam", "cosine"), ("adamw", "none"), ("sgd", "cosine")])
def test_other_optimizers_and_schedulers_run(digits, opt, sched):
    subset = random_subset(digits, 2, seed=0)
    (r,) = _train(digits, subset, [0], recipe=Recipe(epochs=2, optimizer=opt, scheduler=sched, lr=0.001))
    assert 0.0 <= r.test_accuracy <= 1.0


def test_recipe_validation_names_the_key():
    with pytest.raises(ValueError, match="unknown recipe key.*'epoch'"):
        Recipe.from_dict({"epoch": 10})
    with pytest.raises(ValueError, match="optimizer"):
        Recipe(optimizer="rmsprop")
    with pytest.raises(ValueError, match="epochs"):
        Recipe(epochs=0)
    assert Recipe.from_dict({"lr": "1e-3"}).lr == 0.001
    assert Recipe.from_dict({"epochs": 5}, base=Recipe(lr=0.5)).lr == 0.5


def test_mismatched_inputs_are_refused(digits):
    subset = random_subset(digits, 2, seed=0)
    with pytest.raises(ValueError, match="targets"):
        _train(digits, subset, [0], targets=subset.labels[:3])


def test_device_auto_picks_cuda_only_when_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"


def test_preprocess_runs_on_training_and_test_batches(digits):
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x):
            seen.append(len(x))
            return x

    subset = random_subset(digits, 2, seed=0)
    _train(digits, subset, [0], preprocess=Spy(), recipe=Recipe(epochs=2, batch_size=20, eval_batch_size=500))
    assert seen == [20, 20, 450]  # two training steps, then the 450 test images in one batch
