import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ddlib.data.datasets import load_dataset, reduce_dataset
from ddlib.data.distilled import DistilledSet
from ddlib.engine.labels import TeacherRelabel, create_loss, kl_loss, mse_ce_loss, sce_loss, stored_targets
from ddlib.protocols import teachers
from ddlib.protocols.teachers import CheckpointError, get_teachers, load_teacher
from ddlib.models import create_model
from ddlib.engine.train import Recipe, train_and_test

TINY = Recipe(epochs=1, batch_size=256)


def softmax(row, t=1.0):
    e = [math.exp(v / t) for v in row]
    return [v / sum(e) for v in e]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="module")
def small_digits(digits):
    return reduce_dataset(digits, train_per_class=10, test_size=100)


# --------------------------------------------------------------------------- losses against hand values


def test_ce_with_int_and_probability_targets():
    hook, name = create_loss({"name": "ce"})
    z = torch.tensor([[1.0, 2.0, 3.0]])
    expected = -math.log(softmax([1, 2, 3])[2])
    assert hook(z, torch.tensor([2]), z) == pytest.approx(expected, rel=1e-6)
    assert hook(z, torch.tensor([[0.0, 0.0, 1.0]]), z) == pytest.approx(expected, rel=1e-6)
    assert name == "ce()"


def test_kl_with_temperature_and_t_squared_on_teacher_logits():
    z, t, T = [1.0, 2.0, 3.0], [3.0, 1.0, 0.0], 2.0
    p, q = softmax(t, T), softmax(z, T)
    kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    hook, name = create_loss({"name": "kl", "temperature": T}, targets_are_logits=True)
    assert hook(torch.tensor([z]), torch.tensor([t]), None) == pytest.approx(T * T * kl, rel=1e-5)
    plain, _ = create_loss({"name": "kl", "temperature": T, "t_squared": False}, targets_are_logits=True)
    assert plain(torch.tensor([z]), torch.tensor([t]), None) == pytest.approx(kl, rel=1e-5)
    assert name == "kl(t_squared=True,temperature=2.0,targets_are_logits=True)"


def test_kl_with_probability_targets_uses_them_as_given():
    z, p, T = [0.5, -1.0], [0.25, 0.75], 4.0
    q = softmax(z, T)
    kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    hook = kl_loss(temperature=T)  # default: targets are probabilities already at T
    assert hook(torch.tensor([z]), torch.tensor([p]), None) == pytest.approx(16 * kl, rel=1e-5)
    # Batch mean: two identical rows give the same value.
    assert hook(torch.tensor([z, z]), torch.tensor([p, p]), None) == pytest.approx(16 * kl, rel=1e-5)


def test_kl_defaults_are_rded_sre2l_temperature_and_hinton_scaling():
    hook, name = create_loss("kl")
    assert hook.params == {"temperature": 4.0, "t_squared": True}


def test_soft_cross_entropy_equals_ce_for_one_hot_targets():
    torch.manual_seed(0)
    z = torch.randn(5, 4)
    y = torch.tensor([0, 3, 1, 2, 3])
    sce, _ = create_loss("sce")
    torch.testing.assert_close(sce(z, F.one_hot(y, 4).float(), z), F.cross_entropy(z, y))
    torch.testing.assert_close(sce(z, y, z), F.cross_entropy(z, y))  # int labels read as one-hot
    p = torch.tensor([[0.2, 0.8]])
    expected = -(0.2 * math.log(softmax([1.0, 0.0])[0]) + 0.8 * math.log(softmax([1.0, 0.0])[1]))
    assert sce_loss()(torch.tensor([[1.0, 0.0]]), p) == pytest.approx(expected, rel=1e-6)


def test_mse_ce_is_edc_form_on_teacher_logits():
    z, t, y = [1.0, 0.0, -1.0], [2.0, 0.0, 1.0], 1
    mse = sum((a - b) ** 2 for a, b in zip(z, t)) / 3  # raw logits, no softmax or temperature
    ce = -math.log(softmax(z)[y])
    hook = mse_ce_loss(mse_weight=2.0, ce_weight=0.5, targets_are_logits=True)
    value = hook.compute(torch.tensor([z]), torch.tensor([t]), torch.tensor([y]))
    assert value == pytest.approx(2.0 * mse + 0.5 * ce, rel=1e-6)
    default, _ = create_loss("mse_ce")
    assert default.params == {"mse_weight": 1.0, "ce_weight": 0.1}  # EDC's --ce-weight default


def test_mse_ce_on_probability_targets_compares_probabilities():
    z, p = [1.0, 0.0], [0.3, 0.7]
    q = softmax(z)
    mse = sum((a - b) ** 2 for a, b in zip(q, p)) / 2
    ce = -sum(pi * math.log(qi) for pi, qi in zip(p, q))
    hook, _ = create_loss({"name": "mse_ce", "mse_weight": 1, "ce_weight": "1e-1"})  # YAML strings accepted
    assert hook(torch.tensor([z]), torch.tensor([p]), None) == pytest.approx(mse + 0.1 * ce, rel=1e-6)
    only_mse = mse_ce_loss(ce_weight=0.0)
    assert only_mse(torch.tensor([z]), torch.tensor([p])) == pytest.approx(mse, rel=1e-6)


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"name": "kl", "temprature": 4}, r"unknown key\(s\) \['temprature'\] for loss 'kl'"),
        ({"name": "ce", "temperature": 2}, r"unknown key\(s\) \['temperature'\] for loss 'ce'"),
        ({"name": "mse_ce", "weight": 1}, r"unknown key\(s\) \['weight'\]"),
        ({"name": "focal"}, "unknown loss 'focal'"),
        ({}, "needs a 'name'"),
        ({"name": "kl", "temperature": 0}, "temperature must be a positive number"),
        ({"name": "kl", "t_squared": "yes"}, "t_squared must be true or false"),
        ({"name": "mse_ce", "ce_weight": -1}, "ce_weight must be a non-negative number"),
    ],
)
def test_bad_loss_specs_are_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        create_loss(spec)


def test_loss_names_distinguish_parameters():
    names = {create_loss(s)[1] for s in ["kl", {"name": "kl", "temperature": 2}, {"name": "kl", "t_squared": False},
                                         "sce", "ce", "mse_ce"]}
    assert len(names) == 6


def test_losses_are_one_registry_and_each_hook_carries_its_name():
    """The registry form {name: {params}} and fractions are read; a new loss is one registered class."""
    from ddlib.engine.labels import LOSSES, SoftLoss, register_loss

    hook, name = create_loss({"kl": {"temperature": "1/2"}})
    assert name == hook.name == hook.describe() == "kl(t_squared=True,temperature=0.5)"
    assert LOSSES.parse({"kl": {"temperature": 0.5}}).describe() == name
    assert LOSSES.names() == ["ce", "kl", "mse_ce", "sce"] and LOSSES.params("mse_ce") == {"mse_weight": 1.0,
                                                                                           "ce_weight": 0.1}

    @register_loss("toy_l1")
    class _L1(SoftLoss):
        def __init__(self, targets_are_logits=False, *, weight: float = 1.0):
            super().__init__(targets_are_logits, weight=float(weight))

        def compute(self, logits, target, labels):
            return self.params["weight"] * F.l1_loss(logits.softmax(1), F.one_hot(target, logits.shape[1]).float())

    try:
        hook, name = create_loss({"name": "toy_l1", "weight": "1/4"})
        assert name == "toy_l1(weight=0.25)" and create_loss({"toy_l1": {"weight": 0.25}})[1] == name
        z, y = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([0])
        assert hook(z, y) == pytest.approx(0.25 * nn.L1Loss()(z.softmax(1), torch.tensor([[1.0, 0.0, 0.0]])).item())
        with pytest.raises(ValueError, match="weight must be a non-negative number"):
            create_loss({"name": "toy_l1", "weight": -1})
    finally:
        LOSSES.remove("toy_l1")


# --------------------------------------------------------------------------- teacher relabelling


def linear_teacher(weight):
    m = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        m.weight.copy_(torch.tensor(weight))
    return m


def test_teachers_are_averaged_in_logit_space():
    a = linear_teacher([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = linear_teacher([[3.0, 0.0], [0.0, -1.0], [0.0, 2.0]])
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    relabel = TeacherRelabel([a, b], loss={"name": "mse_ce", "ce_weight": 0.0})
    mean_logits = (a(x) + b(x)) / 2
    torch.testing.assert_close(relabel.teacher_logits(x), mean_logits.detach())
    z = torch.zeros(2, 3)
    assert relabel(z, torch.tensor([0, 1]), x) == pytest.approx(float((mean_logits ** 2).mean()), rel=1e-6)
    # KL target is softmax(mean logits / T), not the mean of the teachers' probabilities.
    kl = TeacherRelabel([a, b], temperature=2.0, loss="kl")
    expected = 4 * F.kl_div(F.log_softmax(z / 2, 1), F.softmax(mean_logits / 2, 1), reduction="batchmean")
    assert kl(z, torch.tensor([0, 1]), x) == pytest.approx(float(expected), rel=1e-6)


def test_teacher_relabel_mse_ce_uses_the_batch_targets_as_ground_truth():
    a = linear_teacher([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x, z, y = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.0, -0.5]]), torch.tensor([2])
    relabel = TeacherRelabel([a], loss={"name": "mse_ce", "mse_weight": 1.0, "ce_weight": 0.5})
    expected = F.mse_loss(z, a(x)) + 0.5 * F.cross_entropy(z, y)
    assert relabel(z, y, x) == pytest.approx(float(expected), rel=1e-6)


def test_teacher_relabel_temperature_conflicts_are_refused():
    a = linear_teacher([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="two temperatures"):
        TeacherRelabel([a], temperature=2.0, loss={"name": "kl", "temperature": 4.0})
    with pytest.raises(ValueError, match="takes no temperature"):
        TeacherRelabel([a], temperature=2.0, loss="mse_ce")
    with pytest.raises(ValueError, match="at least one teacher"):
        TeacherRelabel([])
    assert TeacherRelabel([a], temperature=3.0).loss.params["temperature"] == 3.0


class Recorder(nn.Module):
    """Wraps a teacher and keeps the inputs it saw."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return self.inner(x)


def test_teacher_relabel_inside_the_training_loop_never_updates_teachers(small_digits):
    ds = small_digits
    torch.manual_seed(1)
    teacher = create_model("convnet_bn", ds.channels, ds.num_classes, ds.image_size)  # BN: stats must not move
    teacher.train()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    recorder = Recorder(teacher)
    relabel = TeacherRelabel([recorder], temperature=4.0, loss="kl")
    assert not recorder.training and all(not p.requires_grad for p in teacher.parameters())

    def constant_augment(x, y, gen):  # the teacher must see the augmented batch, not the clean one
        return torch.full_like(x, 0.25), y

    results = train_and_test("convnet", ds.train_images, ds.train_labels, ds.test_images, ds.test_labels,
                                 num_classes=ds.num_classes, mean=ds.mean, std=ds.std, recipe=Recipe(epochs=2, batch_size=32),
                                 seeds=[0], augment=constant_augment, loss=relabel, device="cpu")
    assert math.isfinite(results[0].test_accuracy) and all(math.isfinite(v) for v in results[0].epoch_losses)
    assert len(recorder.seen) == 2 * math.ceil(len(ds.train_labels) / 32)
    assert all(torch.all(x == 0.25) for x in recorder.seen)
    after = teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in teacher.parameters())


# --------------------------------------------------------------------------- teachers: trained once, reused


def test_get_teachers_trains_once_and_reuses_the_mlflow_artifact(small_digits, mlflow_store, monkeypatch):
    from ddlib.store import tracking
    digits = small_digits  # 100 training images: the store, not the training, is under test

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking.tracking_uri())  # undone after the test
    first = get_teachers(digits, "convnet", 2, TINY, device="cpu")
    assert len(first) == 2 and all(not m.training for m in first)
    runs = tracking.Tracker("teachers").find_finished({"ddlib.kind": "teacher"})
    assert len(runs) == 2
    assert {r.data.params["seed"] for r in runs} == {"0", "1"}
    assert all(0.0 <= r.data.metrics["test_accuracy"] <= 100.0 for r in runs)  # in % (ddlib.specs.units), as shown
    assert all(r.data.tags["ddlib.specs.units"] == "shown" for r in runs)
    assert all(r.data.params["arch"] == "convnet" and r.data.params["dataset"] == "digits" for r in runs)
    assert all(r.data.tags[teachers.TEACHER_KEY_TAG] for r in runs)

    def no_training(*args, **kwargs):
        raise AssertionError("teachers were trained a second time")

    monkeypatch.setattr(teachers, "train_and_test", no_training)
    second = get_teachers(digits, "convnet", 2, TINY, device="cpu")
    for a, b in zip(first, second):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(first[0].classifier.weight, first[1].classifier.weight)  # two seeds, two teachers
    # A seed subset reuses too; a different recipe is a different teacher.
    assert len(get_teachers(digits, "convnet", 1, TINY, device="cpu", seeds=[1])) == 1
    with pytest.raises(AssertionError, match="second time"):
        get_teachers(digits, "convnet", 1, Recipe(epochs=2, batch_size=256), device="cpu")


def test_teacher_key_depends_on_content_arch_recipe_and_seed(digits, small_digits):
    key = teachers.teacher_key(digits, "convnet", TINY, 0)
    assert key == teachers.teacher_key(digits, "convnet", TINY, 0)
    others = [teachers.teacher_key(small_digits, "convnet", TINY, 0), teachers.teacher_key(digits, "mlp", TINY, 0),
              teachers.teacher_key(digits, "convnet", Recipe(epochs=2), 0), teachers.teacher_key(digits, "convnet", TINY, 1),
              teachers.teacher_key(digits, "convnet", TINY, 0, augment_name="flip")]
    assert key not in others and len(set(others)) == len(others)


def test_get_teachers_refuses_bad_seed_lists(digits):
    with pytest.raises(ValueError, match="distinct seeds"):
        get_teachers(digits, "convnet", 2, TINY, device="cpu", seeds=[0])


# --------------------------------------------------------------------------- teachers from checkpoints


def test_checkpoint_loading(digits, tmp_path):
    torch.manual_seed(3)
    model = create_model("convnet", digits.channels, digits.num_classes, digits.image_size)
    plain, wrapped = tmp_path / "teacher.pt", tmp_path / "wrapped.pth"
    torch.save(model.state_dict(), plain)
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, wrapped)
    teachers = get_teachers(digits, "convnet", 2, TINY, device="cpu", checkpoint=[plain, wrapped])
    for t in teachers:
        assert not t.training
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), t.state_dict().values()))
    assert len(get_teachers(digits, "convnet", 1, TINY, device="cpu", checkpoint=str(plain))) == 1
    with pytest.raises(ValueError, match=r"3 teacher\(s\) asked for but 2 checkpoint\(s\)"):
        get_teachers(digits, "convnet", 3, TINY, device="cpu", checkpoint=[plain, wrapped])


def test_wrong_checkpoint_names_the_file(digits, tmp_path):
    wrong = tmp_path / "mlp_teacher.pt"
    torch.save(create_model("mlp", digits.channels, digits.num_classes, digits.image_size).state_dict(), wrong)
    with pytest.raises(CheckpointError, match=r"mlp_teacher\.pt: does not fit 'convnet'"):
        get_teachers(digits, "convnet", 1, TINY, device="cpu", checkpoint=wrong)
    with pytest.raises(CheckpointError, match=r"missing\.pt: no such teacher checkpoint"):
        load_teacher("convnet", digits, tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage\.pt: unreadable"):
        load_teacher("convnet", digits, garbage)
    not_state = tmp_path / "list.pt"
    torch.save([1, 2], not_state)
    with pytest.raises(CheckpointError, match=r"list\.pt: not a state_dict"):
        load_teacher("convnet", digits, not_state)


# --------------------------------------------------------------------------- stored soft labels


def distilled_with(soft, n=4, classes=3):
    labels_ = torch.arange(n) % classes
    return DistilledSet(torch.rand(n, 1, 8, 8), labels_, classes, soft_labels=soft, method="test")


def test_stored_probabilities_pass_through_and_logits_are_softmaxed():
    probs = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]])
    torch.testing.assert_close(stored_targets(distilled_with(probs)), probs)
    logits = torch.tensor([[2.0, -1.0, 0.0], [0.0, 0.0, 0.0], [5.0, 1.0, 1.0], [-2.0, 3.0, 0.5]])
    torch.testing.assert_close(stored_targets(distilled_with(logits)), F.softmax(logits, 1))
    torch.testing.assert_close(stored_targets(distilled_with(logits), temperature=4.0), F.softmax(logits / 4, 1))
    # Probabilities at another temperature: the same distribution as tempering their logits.
    torch.testing.assert_close(stored_targets(distilled_with(F.softmax(logits, 1)), temperature=4.0),
                               F.softmax(logits / 4, 1))


def test_stored_targets_refuses_bad_tensors():
    with pytest.raises(ValueError, match="no soft labels"):
        stored_targets(distilled_with(None))
    with pytest.raises(ValueError, match=r"shape \(4, 2\), expected \(4, 3\)"):
        stored_targets(distilled_with(torch.ones(4, 2)))
    with pytest.raises(ValueError, match="NaN or Inf"):
        stored_targets(distilled_with(torch.full((4, 3), float("nan"))))


def test_stored_soft_labels_train_with_kl(small_digits):
    ds = small_digits
    n = len(ds.train_labels)
    logits = torch.randn(n, ds.num_classes) + 5 * F.one_hot(ds.train_labels, ds.num_classes)
    distilled = DistilledSet(ds.pixels(), ds.train_labels, ds.num_classes, soft_labels=logits)
    hook, _ = create_loss({"name": "kl", "temperature": 4.0})
    targets = stored_targets(distilled, temperature=4.0)
    result = train_and_test("convnet", distilled.images, targets, ds.test_images, ds.test_labels,
                                num_classes=ds.num_classes, mean=ds.mean, std=ds.std, recipe=Recipe(epochs=2, batch_size=50),
                                seeds=[0], loss=hook, device="cpu")[0]
    assert math.isfinite(result.epoch_losses[-1]) and 0.0 <= result.test_accuracy <= 1.0


def test_teacher_augment_leaves_the_targets_of_label_mixing_ops_unmixed():
    """Issue 54, 2.1: under online relabelling the batch targets feed only mse_ce's CE term, which the
    peer computes on the images' own labels (tests/test_conformance_ddranking.py checks one training
    step against its code); the images are mixed exactly as without the wrapper."""
    from ddlib.engine.augment import create_augment
    from ddlib.engine.labels import teacher_augment

    spec = [{"flip": {"p": 0.5}}, {"cutmix": {"alpha": 1.0}}]
    mixing = create_augment(spec, mean=(0.0,), std=(1.0,), num_classes=10)
    wrapped = teacher_augment(mixing)
    x, y = torch.rand(6, 1, 8, 8), torch.arange(6)
    mixed_x, mixed_y = mixing(x.clone(), y, torch.Generator().manual_seed(3))
    ours_x, ours_y = wrapped(x.clone(), y, torch.Generator().manual_seed(3))
    assert torch.equal(ours_x, mixed_x) and torch.equal(ours_y, y) and mixed_y.is_floating_point()
    assert wrapped.name != mixing.name  # keyed apart from the mixing hook
    plain = create_augment([{"flip": {"p": 0.5}}], mean=(0.0,), std=(1.0,), num_classes=10)
    assert teacher_augment(plain) is plain and teacher_augment(None) is None
