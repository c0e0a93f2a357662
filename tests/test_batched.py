"""The training loop's batched mode: S models per step (``functional_call`` + ``vmap``) must train
each model as the sequential mode does.

Measured tolerance (``bench/batched_tolerance.py``: digits, IPC 10, 8 seeds, fp32, one thread, on one
Zen 5 EPYC with its own AVX-512 kernels and with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``,
the kernel paths of an AVX2-only CPU; numbers in bench/README.md):

* after one epoch (2 steps of 25 digits, CutMix and soft targets), every weight and running
  statistic within 1e-5 of the sequential model with batch norm (measured at most 5.4e-7 on either
  path, 4 subsets), within 1e-3 with instance norm (measured 2.9e-5 AVX-512 / 1.9e-4 AVX2: the
  2x2 maps of 8x8 digits divide by tiny standard deviations; after two epochs AVX2 reached 1e-3,
  which is why this compares one);
* after 30 epochs the models are the same up to float rounding that training amplified (weights
  within 0.03 for the instance-norm ConvNet, which normalises 2x2 maps on 8x8 digits). What is
  compared is continuous in the weights: each model's mean test cross-entropy differs by at most
  3.7e-3 (AVX-512) / 2.5e-3 (AVX2); tolerance 0.015. Accuracy is not compared per model: a model
  flips 0-5 of the 450 test images on AVX-512 and 0-12 on AVX2 (the 2-point tolerance once held
  here failed on an AVX2 CPU). The mean accuracy over 5 seeds differs by at most 0.62 (AVX-512) /
  0.0 (AVX2) points; tolerance 1.5 points, a guard against a batched mode that trains worse.
* within the batched mode a seed's model is bit for bit the same whatever S and its companions
  (exact, so asserted exactly).

These tolerances were measured in fp32, so the recipes here say ``precision: fp32`` (the default,
``auto``, is bf16 on CPUs that compute it natively, where rounding differences are larger).
"""

import pytest
import torch
import torch.nn.functional as F

from ddlib.data.datasets import load_dataset
from ddlib.engine.augment import create_augment
from ddlib.engine.labels import TeacherRelabel
from ddlib.engine.stacked import StackedModels
from ddlib.engine.train import Recipe, choose_mode, train_and_test
from ddlib.methods.select import random_subset
from ddlib.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")

WEIGHT_TOL = 1e-5
ONE_EPOCH_TOL = {"convnet": 1e-3, "convnet_bn": 1e-5}  # measured on AVX-512 and AVX2 (module docstring)
TEST_LOSS_TOL, ACC_TOL_MEAN = 0.015, 0.015


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _train(ds, subset, seeds, batched, model="convnet", **kw):
    recipe = kw.pop("recipe", Recipe(precision="fp32", epochs=1, batch_size=16))
    return train_and_test(model, subset.images, kw.pop("targets", subset.labels), ds.test_images, ds.test_labels,
                              num_classes=10, mean=ds.mean, std=ds.std, recipe=recipe, seeds=seeds, device="cpu",
                              batched=batched, keep_models=True, **kw)


def _max_state_diff(a, b) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return max((sa[k].double() - sb[k].double()).abs().max().item() for k in sa)


@pytest.mark.parametrize("model", ["convnet", "convnet_bn"])
def test_one_epoch_equals_sequential_with_lrs_augmentation_and_soft_targets(digits, model):
    subset = random_subset(digits, 5, seed=0)
    soft = F.one_hot(subset.labels, 10).float() * 0.9 + 0.01
    augment = create_augment(["flip", {"cutmix": {"alpha": 1.0}}], mean=digits.mean, std=digits.std, num_classes=10)
    kw = dict(targets=soft, augment=augment, model=model,
              recipe=Recipe(precision="fp32", epochs=1, batch_size=25, scheduler="cosine"))
    seeds, lrs = [0, 1, 2], [0.01, 0.05, 0.002]
    seq = _train(digits, subset, seeds, False, lrs=lrs, **kw)
    bat = _train(digits, subset, seeds, True, lrs=lrs, **kw)
    assert [r.mode for r in seq] == ["sequential"] * 3 and [r.mode for r in bat] == ["batched"] * 3
    assert [(r.seed, r.lr) for r in bat] == list(zip(seeds, lrs))
    for s, b in zip(seq, bat):
        assert _max_state_diff(s.model, b.model) < ONE_EPOCH_TOL[model]
        assert b.epoch_losses == pytest.approx(s.epoch_losses, rel=1e-5)
    # different lrs really train differently (a batched path that ignored them would fail above)
    assert _max_state_diff(bat[0].model, bat[2].model) > 1e-3


def test_batch_norm_running_statistics_are_per_model(digits):
    subset = random_subset(digits, 5, seed=0)
    seq = _train(digits, subset, [0, 1], False, model="convnet_bn")
    bat = _train(digits, subset, [0, 1], True, model="convnet_bn")
    bn_seq = [dict(r.model.named_buffers()) for r in seq]
    bn_bat = [dict(r.model.named_buffers()) for r in bat]
    key = "features.1.running_mean"
    assert not torch.allclose(bn_bat[0][key], bn_bat[1][key])  # each model its own statistics
    for s, b in zip(bn_seq, bn_bat):
        for name in s:
            assert torch.allclose(s[name].double(), b[name].double(), atol=WEIGHT_TOL), name
    assert int(bn_bat[0]["features.1.num_batches_tracked"]) == int(bn_seq[0]["features.1.num_batches_tracked"]) == 4
    # the released models own their buffers (not views of one stacked tensor)
    assert bn_bat[0][key].untyped_storage().data_ptr() != bn_bat[1][key].untyped_storage().data_ptr()


def _test_loss(model, ds) -> float:
    from ddlib.engine.train import Normalize

    with torch.no_grad():
        return F.cross_entropy(model.eval()(Normalize(ds.mean, ds.std)(ds.test_images.float())), ds.test_labels).item()


@pytest.mark.parametrize("model", ["convnet", "convnet_bn"])
def test_trained_models_equal_sequential_within_the_measured_tolerance(digits, model):
    """After 30 epochs, five batched models match five sequential ones within the measured tolerances
    (module docstring): each model's test cross-entropy, and the mean accuracy. Why each case takes about
    10 s: ten ConvNets of 30 epochs on 100 digits (120 steps each, one thread), five one after another
    and the same five in one batched step, about half each; the tolerances were measured at 30 epochs
    and 5 seeds, where training has amplified the rounding differences and the models have learned (a
    mode that trains worse shows only then)."""
    subset = random_subset(digits, 10, seed=0)
    recipe = Recipe(precision="fp32", epochs=30, batch_size=32)
    seeds = [0, 1, 2, 3, 4]
    seq = _train(digits, subset, seeds, False, model=model, recipe=recipe)
    bat = _train(digits, subset, seeds, True, model=model, recipe=recipe)
    for s, b in zip(seq, bat):
        assert abs(_test_loss(s.model, digits) - _test_loss(b.model, digits)) <= TEST_LOSS_TOL, s.seed
    mean_seq = sum(r.test_accuracy for r in seq) / len(seq)
    assert abs(mean_seq - sum(r.test_accuracy for r in bat) / len(bat)) <= ACC_TOL_MEAN
    assert min(r.test_accuracy for r in seq) > 0.3  # the models learned something (chance is 0.1)


def test_a_seed_trains_the_same_model_whatever_its_companions(digits):
    subset = random_subset(digits, 5, seed=0)
    recipe = Recipe(precision="fp32", epochs=5, batch_size=16)
    five = _train(digits, subset, [0, 1, 2, 3, 4], True, recipe=recipe)
    two = _train(digits, subset, [3, 7], True, recipe=recipe)
    assert _max_state_diff(five[3].model, two[0].model) == 0.0
    assert five[3].test_accuracy == two[0].test_accuracy and five[3].epoch_losses == two[0].epoch_losses
    for r in five + two:  # each model's own test counts, its accuracy on the diagonal
        counts = torch.tensor(r.confusion)
        assert counts.shape == (10, 10) and counts.sum() == len(digits.test_labels)
        assert counts.trace().item() / counts.sum().item() == r.test_accuracy
    assert five[3].confusion == two[0].confusion and five[3].confusion != five[0].confusion


def test_models_sharing_a_seed_share_batches_and_augmentation_draws(digits):
    subset = random_subset(digits, 5, seed=0)
    calls = []
    augment = create_augment("flip", mean=digits.mean, std=digits.std, num_classes=10)

    def counting(x, y, g):
        calls.append(len(x))
        return augment(x, y, g)

    lrs = [0.001, 0.01, 0.1]
    bat = _train(digits, subset, [4, 4, 4], True, lrs=lrs, augment=counting)
    assert len(calls) == 4  # 50 images / 16 -> 4 steps, once for the three models
    calls.clear()
    seq = _train(digits, subset, [4, 4, 4], False, lrs=lrs, augment=counting)
    assert len(calls) == 4  # the sequential mode trains a seed's lrs in lockstep: one draw per step too
    for s, b in zip(seq, bat):
        assert _max_state_diff(s.model, b.model) < WEIGHT_TOL


def test_lockstep_lrs_train_each_model_as_alone_with_one_teacher_forward_per_step(digits):
    """The lr candidates of one seed (sequential mode) train in lockstep: the same numbers, bit for
    bit, as each lr trained alone, with one augmentation draw and one teacher forward per step."""
    torch.manual_seed(0)
    teacher = create_model("convnet", 1, 10, (8, 8))
    hook = TeacherRelabel([teacher], temperature=4.0, loss={"name": "kl", "t_squared": False})
    forwards = []
    teacher.register_forward_hook(lambda m, i, o: forwards.append(len(i[0])))
    augment = create_augment("flip", mean=digits.mean, std=digits.std, num_classes=10)
    subset = random_subset(digits, 5, seed=0)
    recipe = Recipe(precision="fp32", epochs=3, batch_size=16)
    lrs = [0.001, 0.01, 0.1]
    together = _train(digits, subset, [2, 2, 2], False, lrs=lrs, loss=hook, augment=augment, recipe=recipe)
    assert len(forwards) == 3 * 4  # 3 epochs x 4 steps, once for the three models
    forwards.clear()
    alone = [_train(digits, subset, [2], False, lrs=[lr], loss=hook, augment=augment, recipe=recipe)[0] for lr in lrs]
    assert len(forwards) == 3 * 3 * 4
    for t, a in zip(together, alone):
        assert t.epoch_losses == a.epoch_losses and t.test_accuracy == a.test_accuracy and t.lr == a.lr
        assert _max_state_diff(t.model, a.model) == 0
    assert together[0].epoch_losses != together[2].epoch_losses  # the lrs did differ
    # mixed seeds keep their order; a dropout model or an objective trains one run at a time
    from ddlib.engine.train import lockstep

    assert lockstep([(0, 0.1), (1, 0.1), (0, 0.01)], objective=False, stochastic=False) == [[0, 2], [1]]
    assert lockstep([(0, 0.1), (0, 0.01)], objective=True, stochastic=False) == [[0], [1]]
    assert lockstep([(0, 0.1), (0, 0.01)], objective=False, stochastic=True) == [[0], [1]]


def test_teacher_relabel_many_runs_the_teacher_once_per_step(digits):
    torch.manual_seed(0)
    teacher = create_model("convnet", 1, 10, (8, 8))
    hook = TeacherRelabel([teacher], temperature=4.0, loss={"name": "kl", "t_squared": False})
    forwards = []
    teacher.register_forward_hook(lambda m, i, o: forwards.append(len(i[0])))
    x = [torch.randn(6, 1, 8, 8) for _ in range(2)]
    inputs = [x[0], x[1], x[0]]  # models 0 and 2 share a seed, so a batch
    targets = [torch.randint(0, 10, (6,)) for _ in inputs]
    logits = torch.randn(3, 6, 10)
    many = hook.many(logits, targets, inputs)
    assert forwards == [12]  # one forward on the two distinct batches
    one_by_one = torch.stack([hook(logits[s], targets[s], inputs[s]) for s in range(3)])
    assert torch.allclose(many, one_by_one, atol=1e-6)


def test_teacher_relabelled_training_equals_sequential(digits):
    torch.manual_seed(0)
    teacher = create_model("convnet", 1, 10, (8, 8))
    hook = TeacherRelabel([teacher], temperature=4.0, loss={"name": "kl", "t_squared": False})
    subset = random_subset(digits, 5, seed=0)
    seq = _train(digits, subset, [0, 1], False, loss=hook, lrs=[0.05, 0.01])
    bat = _train(digits, subset, [0, 1], True, loss=hook, lrs=[0.05, 0.01])
    for s, b in zip(seq, bat):
        assert _max_state_diff(s.model, b.model) < WEIGHT_TOL


def test_objectives_fall_back_to_sequential(digits):
    from ddlib.engine.adversarial_training import create_objective

    objective, _ = create_objective({"pgd_at": {"steps": 1}}, mean=digits.mean, std=digits.std, num_classes=10)
    subset = random_subset(digits, 2, seed=0)
    results = _train(digits, subset, [0, 1], True, objective=objective)
    assert [r.mode for r in results] == ["sequential", "sequential"]


def test_mode_rule():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_mode(None, cpu, 5) == "sequential"  # measured: no gain on the CPU
    assert choose_mode(None, cuda, 5) == "batched"
    assert choose_mode("auto", cuda, 1) == "sequential"
    assert choose_mode(None, cuda, 5, objective=True) == "sequential"
    assert choose_mode(None, cuda, 5, recipe=Recipe(compile=True)) == "batched"  # the stack compiles
    assert choose_mode(None, cuda, 5, recipe=Recipe(channels_last=True)) == "sequential"
    assert choose_mode(True, cpu, 5) == "batched"
    assert choose_mode(False, cuda, 5) == "sequential"
    with pytest.raises(ValueError, match="batched"):
        choose_mode("yes", cpu, 5)


def test_lrs_must_match_seeds(digits):
    subset = random_subset(digits, 2, seed=0)
    with pytest.raises(ValueError, match="learning rates"):
        _train(digits, subset, [0, 1], None, lrs=[0.1])


def test_stacked_models_forward_matches_each_model():
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(create_model("convnet_bn", 3, 10, (16, 16)))
    reference = [create_model("convnet_bn", 3, 10, (16, 16)) for _ in range(3)]
    for r, m in zip(reference, models):
        r.load_state_dict(m.state_dict())
    stack = StackedModels(models).eval()
    x = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        out = stack.forward_shared(x)
        for s, r in enumerate(reference):
            assert torch.allclose(out[s], r.eval()(x), atol=1e-5)
    with pytest.raises(ValueError, match="one architecture"):
        StackedModels([models[0], create_model("mlp", 3, 10, (16, 16))])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batched_on_cuda_equals_sequential(digits):
    subset = random_subset(digits, 5, seed=0)
    kw = dict(num_classes=10, mean=digits.mean, std=digits.std, recipe=Recipe(precision="fp32", epochs=2, batch_size=16),
              seeds=[0, 1, 2], device="cuda", keep_models=True)
    seq = train_and_test("convnet", subset.images, subset.labels, digits.test_images, digits.test_labels,
                             batched=False, **kw)
    auto = train_and_test("convnet", subset.images, subset.labels, digits.test_images, digits.test_labels, **kw)
    assert [r.mode for r in auto] == ["batched"] * 3
    for s, b in zip(seq, auto):
        assert _max_state_diff(s.model, b.model) < 1e-4


def test_models_with_dropout_train_sequentially(digits, monkeypatch):
    subset = random_subset(digits, 2, seed=0)
    kw = dict(num_classes=10, mean=digits.mean, std=digits.std, recipe=Recipe(precision="fp32", epochs=1, batch_size=20),
              seeds=[0, 1], device="cpu")
    images = torch.nn.functional.interpolate(subset.images.float(), size=(32, 32))  # the ViT wants 32x32
    test = torch.nn.functional.interpolate(digits.test_images[:20].float(), size=(32, 32))
    with pytest.raises(ValueError, match="random layers"):
        train_and_test("vit", images, subset.labels, test, digits.test_labels[:20], batched=True, **kw)
    from ddlib.engine import train as train_mod
    from ddlib.engine.stacked import stochastic_layers

    monkeypatch.setattr(train_mod, "choose_mode", lambda *a, **k: "batched")  # as the rule picks on CUDA
    results = train_and_test("vit", images, subset.labels, test, digits.test_labels[:20], **kw)
    assert [r.mode for r in results] == ["sequential", "sequential"]
    assert stochastic_layers(create_model("vit", 1, 10, (32, 32)))
    assert not stochastic_layers(create_model("convnet_bn", 1, 10, (32, 32)))


def test_dc_step_trains_as_the_sequential_mode(digits):
    """DC's schedule (one more epoch, lr x 0.1 and momentum reset after epoch epochs // 2 + 1) in the
    batched mode: each optimizer of the stack drops and resets as the sequential one does."""
    subset = random_subset(digits, 5, seed=0)
    recipe = Recipe(precision="fp32", epochs=5, batch_size=25, lr=0.01, scheduler="dc_step")
    seq = _train(digits, subset, [0, 1], False, recipe=recipe)
    bat = _train(digits, subset, [0, 1], True, recipe=recipe)
    for s, b in zip(seq, bat):
        assert len(s.epoch_losses) == len(b.epoch_losses) == 6
        assert abs(_test_loss(s.model, digits) - _test_loss(b.model, digits)) <= TEST_LOSS_TOL, s.seed


def test_both_modes_take_one_step_function(digits, monkeypatch):
    """One optimisation step (autocast, loss or objective, backward, clipping, update) for both
    modes: models in lockstep take it one after another on each batch, a stack once for all."""
    from dataclasses import replace

    from ddlib.engine import train as train_mod

    taken, train_group = [], train_mod._train_and_test_group

    def spy(loop, group, *args):  # the models each trainee's step computes losses for
        def counted(trainee):
            def losses(*batches):
                out = trainee.losses(*batches)
                taken.append(out.numel())
                return out
            return replace(trainee, losses=losses)
        return train_group(loop, replace(group, trainees=[counted(t) for t in group.trainees]), *args)

    monkeypatch.setattr(train_mod, "_train_and_test_group", spy)
    subset = random_subset(digits, 2, seed=0)  # 20 images: 2 batches of 10 per epoch
    recipe = Recipe(precision="fp32", epochs=3, batch_size=10)
    _train(digits, subset, [0, 0], False, recipe=recipe, lrs=[0.01, 0.02])
    assert taken == [1] * (2 * 3 * 2)  # 2 models x 3 epochs x 2 batches, one model a step
    taken.clear()
    _train(digits, subset, [0, 1], True, recipe=recipe)
    assert taken == [2] * (3 * 2)  # one step for the stack of 2 models


def test_batchnorm_stack_on_cuda_branch_gives_the_same_logits():
    """The CUDA-only branch for BatchNorm under vmap (a bf16 input normalised in fp32; a shared test
    batch copied to every model, since vmap's BatchNorm rule on CUDA cannot take it unbatched: both
    seen on an H200) run here on the CPU: the same logits as the plain vmapped path, and fp32 inputs
    untouched by the hook."""
    from ddlib.engine.stacked import StackedModels, _float_input
    from ddlib.models import create_model

    torch.manual_seed(0)
    models = [create_model("convnet_bn", 3, 10, (32, 32)) for _ in range(3)]
    x = torch.randn(8, 3, 32, 32)
    stack = StackedModels(models)
    assert not stack.batchnorm_on_cuda  # the branch is CUDA's only
    with torch.no_grad():
        stack.train()
        stack(torch.randn(3, 8, 3, 32, 32))  # running statistics of their own
        stack.eval()
        plain = stack.forward_shared(x)
        stack.batchnorm_on_cuda = True
        copied = stack.forward_shared(x)
    assert (plain - copied).abs().max() < 1e-5  # one conv over the copies, not one of stacked weights: rounding
    bf16 = torch.randn(2, 3).bfloat16()
    assert _float_input(None, (bf16,))[0].dtype == torch.float32
    fp32 = (torch.randn(2, 3),)
    assert _float_input(None, fp32) is fp32


@pytest.mark.slow
def test_compiled_batched_step_trains_the_eager_models(digits):
    """``compile`` in the batched mode compiles the vmapped forward (and its backward): the same models
    as the eager stack up to rounding, BatchNorm's running statistics (updated in place through the
    stack's buffers) included. Measured on a Zen 5 EPYC after 2 epochs, natively and on the AVX2
    paths: weights and statistics within 3.4e-7, per-epoch losses within 4.8e-7 (with instance norm,
    ``convnet``: 2.6e-7 / 4.8e-7); on an H200, per-epoch losses within 2.4e-7 (bench/batched_compile.py).
    One architecture here: the compile costs about 20 s on two cores."""
    subset = random_subset(digits, 5, seed=0)
    recipe = dict(precision="fp32", epochs=2, batch_size=16)
    seeds, lrs = [0, 1, 2], [0.01, 0.05, 0.002]
    kw = dict(model="convnet_bn", lrs=lrs)
    eager = _train(digits, subset, seeds, True, recipe=Recipe(**recipe), **kw)
    compiled = _train(digits, subset, seeds, True, recipe=Recipe(**recipe, compile=True), **kw)
    assert [r.mode for r in compiled] == ["batched"] * 3
    for e, c in zip(eager, compiled):
        assert _max_state_diff(e.model, c.model) < WEIGHT_TOL
        assert c.epoch_losses == pytest.approx(e.epoch_losses, rel=1e-5)
    assert _max_state_diff(compiled[0].model, compiled[1].model) > 1e-3  # the models are not one model


# --------------------------------------------------------------------------- opt-in levers (issue 55)


def _lever_loop(ds, subset, seeds, lrs, epochs, batch, model="convnet_bn", how=None, channels_last=False):
    """The engine's batched training (its initialisation, data orders, step schedule) on stacked leaves
    and a :class:`StackedSGD`: autograd (``how`` None) or a :class:`StackedTrainStep` (``how``)."""
    from ddlib.engine.device import generator
    from ddlib.engine.recipe import _scheduler
    from ddlib.engine.stacked import StackedSGD, StackedTrainStep, channels_last_batch
    from ddlib.engine.test_pass import Normalize, as_pixels

    recipe = Recipe(precision="fp32", epochs=epochs, batch_size=batch)
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(create_model(model, subset.images.shape[1], 10, tuple(subset.images.shape[2:])))
    stack = StackedModels(models, stacked_leaves=True, channels_last=channels_last)
    optimizer = StackedSGD(stack.parameters(), lrs, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    scheduler = _scheduler(recipe, optimizer)
    step = StackedTrainStep(stack, optimizer, how=how) if how else None
    normalize, gens, n = Normalize(ds.mean, ds.std), [generator(s) for s in seeds], len(subset.images)
    stack.train()
    for _ in range(epochs):
        orders = torch.stack([torch.randperm(n, generator=g) for g in gens])
        for i in range(0, n, batch):
            idx = orders[:, i:i + batch]
            x, y = normalize(as_pixels(subset.images[idx])), subset.labels[idx]
            x = channels_last_batch(x) if channels_last else x
            if step is not None:
                step(x, y)
                continue
            logits = stack(x)
            losses = torch.stack([F.cross_entropy(logits[s], y[s]) for s in range(len(seeds))])
            optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            optimizer.step()
        scheduler.step()
    return stack.release()


@pytest.fixture(scope="module")
def levers_reference(digits):
    """The sequential mode's models that the levers must train: 3 seeds at 3 lrs, 2 epochs of 2 steps."""
    subset = random_subset(digits, 5, seed=0)
    seeds, lrs = [0, 1, 2], [0.01, 0.05, 0.002]
    seq = _train(digits, subset, seeds, False, model="convnet_bn", lrs=lrs,
                 recipe=Recipe(precision="fp32", epochs=2, batch_size=25))
    return subset, seeds, lrs, [r.model for r in seq]


@pytest.mark.parametrize("how, channels_last", [(None, False), ("eager", False), (None, True)])
def test_stacked_leaves_levers_train_as_the_sequential_mode(digits, levers_reference, how, channels_last):
    """The opt-in levers (stacked leaves + one foreach SGD; the whole step through ``torch.func.grad``;
    channels-last leaves and batches) train the sequential mode's models, lrs, momentum, weight decay,
    the step schedule's drop and BatchNorm's running statistics included: after 2 epochs of 2 steps,
    within the one-epoch tolerance of the default batched mode (measured on a 2-core Zen 3: at most
    2e-7 apart)."""
    subset, seeds, lrs, sequential = levers_reference
    levers = _lever_loop(digits, subset, seeds, lrs, 2, 25, how=how, channels_last=channels_last)
    for s, m in zip(sequential, levers):
        assert _max_state_diff(s, m) < ONE_EPOCH_TOL["convnet_bn"]
    assert _max_state_diff(levers[0], levers[2]) > 1e-3  # the models are not one model


def test_stacked_levers_refuse_what_they_cannot_do():
    from ddlib.engine.stacked import StackedSGD, StackedTrainStep

    models = [create_model("convnet", 3, 10, (16, 16)) for _ in range(2)]
    with pytest.raises(ValueError, match="needs stacked_leaves"):
        StackedModels(models, channels_last=True)
    with pytest.raises(ValueError, match="stacked_leaves=True"):
        StackedModels(models).parameters()
    stack = StackedModels(models, stacked_leaves=True)
    with pytest.raises(ValueError, match="3 lrs"):
        StackedSGD(stack.parameters(), [0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="needs StackedModels"):
        StackedTrainStep(StackedModels(models), StackedSGD(stack.parameters(), [0.1, 0.1]))


def test_stacked_sgd_is_each_models_torch_sgd_through_a_dc_step_reset():
    """One StackedSGD over stacked tensors steps each model as its own torch SGD at its own lr: momentum,
    weight decay, the schedule's drop and ``dc_step``'s momentum reset (the buffers keep their addresses)."""
    from ddlib.engine.recipe import _scheduler, epochs_trained, optimizer_and_scheduler
    from ddlib.engine.stacked import StackedSGD

    torch.manual_seed(0)
    weights, lrs = torch.randn(3, 4, 5), [0.1, 0.02, 0.5]
    recipe = Recipe(epochs=4, scheduler="dc_step", precision="fp32")
    stacked = weights.clone().requires_grad_(True)
    optimizer = StackedSGD([stacked], lrs, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    scheduler, buffer = _scheduler(recipe, optimizer), optimizer._momentum[stacked]
    own = [weights[s].clone().requires_grad_(True) for s in range(3)]
    theirs = [optimizer_and_scheduler(recipe, [p], lr) for p, lr in zip(own, lrs)]
    for _ in range(epochs_trained(recipe)):
        grads = torch.randn(3, 4, 5)
        stacked.grad = grads.clone()
        optimizer.step()
        scheduler.step()
        for s, (opt, sched) in enumerate(theirs):
            own[s].grad = grads[s].clone()
            opt.step()
            sched.step()
    assert optimizer._momentum[stacked] is buffer
    for s in range(3):
        assert torch.allclose(stacked[s], own[s], rtol=0, atol=1e-7)
