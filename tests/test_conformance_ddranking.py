"""ddlib against DD-Ranking's own released code (``ddranking==0.2.0``, run in its own venv by the
harness of ``tests/peer.py``; the peer side is ``tests/peer_ddranking.py``), on identical inputs and
forced random draws: ZCA whitening, DSA, CutMix, Mixup, the soft-label losses, the LRS/ARS
arithmetic, the ConvNet variants and ResNet-18-BN, the ``cosine`` schedule, one loss inside an
augmented training step, and the protocol's flow (which sides train, on which labels, with which
augmentation, at which lr or searched, a random subset per run). All cases run in one peer
subprocess for the module; the module skips, saying why, where the peer's venv cannot be had (no
network to PyPI): ``make test`` and ``.ci/run`` set that venv up first and print a line when it
cannot be, and the skip is a pytest warning in the summary.

Named differences that stay (docs/deviations.md, "DD-Ranking"): the peer feeds accuracies in
percent to its exponential map (``test_scores_...``); CutMix's partner is the reversed batch (the
peer: a random permutation, the same in law for a shuffled batch). ddlib's CutMix mixes the targets
by area where no teacher relabels (the peer never mixes them; no preset pairs CutMix with hard or
stored labels); under online relabelling the targets stay unmixed, as the peer's.
"""

from __future__ import annotations

import math
import types
import warnings

import pytest
import torch

from peer import PeerSkipped, PeerUnavailable, ddranking_python, result, run_cases

DSA_PARAMS = {"flip": 0.5, "rotate": 15.0, "saturation": 2.0, "brightness": 1.0, "contrast": 0.5, "scale": 1.2,
              "crop": 0.125, "cutout": 0.5}  # DD-Ranking configs/Demo_LRS_Hard_Label.yaml aug_params
DSA_SEEDS = [0, 1, 2, 3]
CUTMIX_DRAWS = [(0.75, 16, 16), (0.7, 5, 20), (0.55, 0, 31), (0.95, 30, 2), (0.3, 12, 7)]  # cut 16, 17, 21, 7, 26 px
MIXUP_LAMS = [0.0, 0.3, 0.5, 0.87]
TEMPERATURES = [1.0, 4.0, 20.0]
MSE_GT = [(1.0, 0.0), (1.0, 0.1), (0.5, 0.025)]
CONVNETS = {"convnet": ("ConvNet-3", 32), "convnet_bn": ("ConvNet-3-BN", 32),
            "convnet_d4": ("ConvNet-4", 64), "convnet_d4_bn": ("ConvNet-4-BN", 64),
            "resnet18_bn": ("ResNet-18-BN", 32)}  # the soft-label presets' student
STEP_DRAWS = [(0.75, 16, 16), (0.3, 12, 7), (0.55, 0, 31)]  # CutMix inside one training step (item 1)
SCHEDULES = [("cosine", 300), ("cosine", 7)]  # DD-Ranking's 'cosine' (ddlib's cosine_half)
# What the peer's LRS evaluators are handed per method (DD-Ranking's configs, eval branch: DC/DSA/MTT/DATM
# CIFAR10 IPC10.yaml, SRe2L's; the syn_lr its scripts pass: the set's learned lr, or the method's lr)
FLOW = {
    "dc": {"evaluator": "hard", "aug": None, "syn_lr": None},
    "mtt": {"evaluator": "hard", "aug": "dsa", "syn_lr": 0.02},
    "datm": {"evaluator": "soft", "aug": "dsa", "syn_lr": 0.02, "mode": "S", "criterion": "sce",
             "loss_kwargs": {"temperature": 1.0, "scale_loss": False}, "use_aug_for_hard": True},
    "sre2l": {"evaluator": "soft", "aug": "cutmix", "syn_lr": 0.001, "mode": "M", "criterion": "kl",
              "loss_kwargs": {"temperature": 20.0, "scale_loss": False}, "use_aug_for_hard": False},
}
FLOW_COMMON = {"num_eval": 2, "ipc": 2, "num_classes": 10, "optimizer": "sgd", "scheduler": "step", "step_size": 10,
               "batch": 256, "aug_params": None}
WEIGHTS = [0.1, 0.5, 0.9]
LRS_RUNS = [  # accuracies (fractions) of three evaluation runs
    {"syn_hard": 0.412, "real_hard": 0.846, "rdm_hard": 0.263, "syn_any": 0.557, "rdm_any": 0.431},
    {"syn_hard": 0.398, "real_hard": 0.851, "rdm_hard": 0.271, "syn_any": 0.549, "rdm_any": 0.447},
    {"syn_hard": 0.425, "real_hard": 0.843, "rdm_hard": 0.259, "syn_any": 0.562, "rdm_any": 0.425},
]
ARS_RUNS = [
    {"syn_aug": 0.602, "rdm_aug": 0.488, "syn_noaug": 0.521, "rdm_noaug": 0.452},
    {"syn_aug": 0.597, "rdm_aug": 0.495, "syn_noaug": 0.533, "rdm_noaug": 0.441},
    {"syn_aug": 0.611, "rdm_aug": 0.479, "syn_noaug": 0.515, "rdm_noaug": 0.460},
]
ZCA_TRAIN_PER_CLASS, ZCA_TEST = 500, 1000


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _batch(n=8, size=32, seed=0):
    return torch.randn(n, 3, size, size, generator=_gen(seed))


def _logits(seed):
    g = _gen(seed)
    return torch.randn(16, 10, generator=g) * 3, torch.randn(16, 10, generator=g) * 3, torch.randint(0, 10, (16,), generator=g)


def _peer_key(key: str) -> str:
    """A ddlib parameter's name in the peer's networks: its ResNet names the projection ``shortcut`` and the
    head ``classifier`` (torchvision's and ddlib's: ``downsample``, ``fc``); the ConvNets' names agree."""
    return key.replace(".downsample.", ".shortcut.").replace("fc.", "classifier.", 1) if key.startswith(
        ("layer", "fc.")) else key


def _convnet_inputs():
    from ddlib.models import create_model

    models, ours = {}, {}
    for i, (name, (peer_name, size)) in enumerate(CONVNETS.items()):
        torch.manual_seed(i)
        model = create_model(name, 3, 10, size)
        x = torch.randn(4, 3, size, size, generator=_gen(100 + i))
        model.train()
        with torch.no_grad():  # non-trivial BatchNorm running statistics
            model(torch.randn(8, 3, size, size, generator=_gen(200 + i)) * 2 + 0.5)
        models[peer_name] = {"state": {_peer_key(k): v.clone() for k, v in model.state_dict().items()}, "x": x,
                             "num_classes": 10, "im_size": (size, size)}
        ours[peer_name] = (model, x)
    return models, ours


def _step_inputs():
    """A student and a teacher ConvNet-3 (their weights, the heads scaled up so the CE term is not flat),
    a batch of 8 pixel images and labels, and the G-VBSM preset's loss weights: one augmented training
    step under online relabelling."""
    from ddlib.models import create_model
    from ddlib.protocols.presets import load_preset

    nets = []
    for seed, head in ((11, 8.0), (12, 1.0)):  # a confident student
        torch.manual_seed(seed)
        state = create_model("convnet", 3, 10, 32).state_dict()
        nets.append({k: v * head if k.startswith("classifier.") else v.clone() for k, v in state.items()})
    loss = load_preset("gvbsm").loss  # G-VBSM's weights (EDC's: ce_weight 0.025)
    g = _gen(13)
    return {"student": nets[0], "teacher": nets[1], "x": torch.rand(8, 3, 32, 32, generator=g),
            "y": torch.randint(0, 10, (8,), generator=g), "weights": (loss["mse_weight"], loss["ce_weight"])}


@pytest.fixture(scope="module")
def cifar_subset(peer_available, shared_data_or_none, tmp_path_factory):
    """A class-stratified CIFAR-10 (JPEG) subset, and the same images in torchvision's layout for the peer."""
    if shared_data_or_none is None or not (shared_data_or_none / "cifar10-jpeg.tar.gz").is_file():
        return None
    from bench.vs_ddranking import write_torchvision_cifar10
    from ddlib.store.cache import cache_dir
    from ddlib.data.datasets import load_dataset, reduce_dataset
    from ddlib.data.loaders import extract_archive

    root = extract_archive(shared_data_or_none / "cifar10-jpeg.tar.gz", cache_dir() / "cifar10-jpeg")
    ds = reduce_dataset(load_dataset("cifar10", root), ZCA_TRAIN_PER_CLASS, ZCA_TEST, seed=0)
    folder = write_torchvision_cifar10(ds, tmp_path_factory.mktemp("peer-cifar") / "cifar10")
    return ds, folder


@pytest.fixture(scope="module")
def peer_available():
    try:
        return ddranking_python()
    except PeerUnavailable as why:
        message = f"DD-Ranking's own code is not available here, the conformance tests did not run: {why}"
        warnings.warn(message, PeerSkipped, stacklevel=2)  # loud: in the summary's warnings, not only in -rs
        pytest.skip(message)


@pytest.fixture(scope="module")
def peer(peer_available, cifar_subset):
    """Every case's peer outputs, from one subprocess in DD-Ranking's venv."""
    student, teacher, labels = _logits(0)
    cases = {
        "dsa": {"x": _batch(), "params": DSA_PARAMS, "seeds": DSA_SEEDS,
                "ops": ["scale", "rotate", "flip", "color", "crop", "cutout"]},
        "cutmix": {"x": _batch(6, 32, 1), "draws": CUTMIX_DRAWS},
        "mixup": {"x": _batch(6, 32, 2), "lams": MIXUP_LAMS},
        "losses": {"student": student, "teacher": teacher, "labels": labels, "temperatures": TEMPERATURES,
                   "mse_gt": MSE_GT},
        "convnet": {"models": _convnet_inputs()[0]},
        "scores": {"lrs_runs": LRS_RUNS, "ars_runs": ARS_RUNS, "weights": WEIGHTS},
        "train_step": {**_step_inputs(), "draws": STEP_DRAWS},
        "schedule": {"lr": 0.1, "schedules": [(name, epochs, None) for name, epochs in SCHEDULES]},
        "flow": {"configs": {name: {**FLOW_COMMON, "aug_params": DSA_PARAMS, **cfg} for name, cfg in FLOW.items()}},
    }
    if cifar_subset is not None:
        cases["zca"] = {"root": str(cifar_subset[1])}
    return run_cases(cases)


# --------------------------------------------------------------------------- ZCA


def test_zca_whitening_is_ddrankings_on_the_same_real_images(peer, cifar_subset):
    """On the same 5,000 + 1,000 CIFAR-10 (JPEG) images, ddlib's ZCA gives DD-Ranking's whitened training
    and test images (get_dataset with use_zca), and its inverse gives the pixels back. Why it takes about
    16 s (and its setup about 22 s): most of the call is fit_zca's float64 SVD of the 3072 x 3072 pixel
    covariance; the setup is the module's one peer subprocess (torch and ddranking imports, then the
    peer's own ZCA fit, the same SVD), shared by every case. The SVD's cost is set by CIFAR-10's
    32 x 32 x 3 pixels, not by the number of images, and the peer whitens only CIFAR-10, so no smaller
    input tests its whitening."""
    # DD-Ranking get_dataset(use_zca=True): kornia ZCAWhitening(eps=0.1) fitted on ToTensor() pixels
    # of the whole training set, applied to training and test images. ddlib's one ZCA (Cell.zca) is
    # fit_zca on the training set; a preset feeds it pixels in place of the normalisation.
    if cifar_subset is None:
        pytest.skip("CIFAR-10 (JPEG) not in ../shared/data: DD-Ranking's get_dataset reads CIFAR-10 only")
    from ddlib.data.datasets import to_float_pixels
    from ddlib.engine.augment import fit_zca, zca_to_pixels

    ds, _ = cifar_subset
    out = result(peer, "zca")
    assert torch.equal(torch.as_tensor(out["train_labels"]), ds.train_labels)  # the same images, in order
    zca = fit_zca(ds.train_images)
    train, test = zca(to_float_pixels(ds.train_images)), zca(to_float_pixels(ds.test_images))
    scale = out["test"].abs().max().item()
    assert (train - out["train"]).abs().max().item() < 1e-3 * scale
    assert (test - out["test"]).abs().max().item() < 1e-3 * scale
    # a set the peer whitened goes back to the very pixels with ddlib's inverse
    assert (zca_to_pixels(out["test"], zca) - to_float_pixels(ds.test_images)).abs().max().item() < 1e-3


# --------------------------------------------------------------------------- DSA


def test_dsa_parameters_and_strategy_are_ddrankings(peer):
    from ddlib.engine.augment import DSA_DEFAULT_STRATEGY, DSAParams

    out = result(peer, "dsa")
    p = DSAParams()
    ours = {"flip": p.prob_flip, "rotate": p.ratio_rotate, "saturation": p.saturation, "brightness": p.brightness,
            "contrast": p.contrast, "scale": p.ratio_scale, "crop": p.ratio_crop_pad, "cutout": p.ratio_cutout}
    assert ours == out["params"]  # what the peer's own DSA object holds (its configs' aug_params)
    # aug_mode 'S': one op drawn uniformly per batch from the same six (their order differs, their law does not)
    assert out["aug_mode"] == "S" and sorted(out["ops"]) == sorted(DSA_DEFAULT_STRATEGY.split("_"))


@pytest.mark.parametrize("op", ["scale", "rotate", "flip", "color", "crop", "cutout"])
def test_dsa_op_outputs_are_ddrankings_for_the_same_draws(peer, op):
    # The peer draws from the global CPU generator after torch.manual_seed(seed); ddlib from a CPU
    # generator seeded alike: the same numbers, so the same transform. DD-Ranking's (and MTT's)
    # scale/rotate sample with align_corners=True, DC's with the default False: the DD-Ranking
    # presets say align_corners: true.
    from ddlib.engine.augment import DSAParams, dsa_op

    out = result(peer, "dsa")
    x = _batch()
    params = DSAParams(align_corners=True)
    for seed in DSA_SEEDS:
        ours = dsa_op(x.clone(), op, _gen(seed), params)
        assert torch.allclose(ours, out[(op, seed)], atol=1e-5), (op, seed)


def test_dsa_presets_of_dd_ranking_sample_as_the_peer(peer):
    # each DD-Ranking preset's own DSA hook, one op forced, against the peer's DSA op on the same draw
    from ddlib.engine.augment import create_augment
    from ddlib.protocols.presets import load_preset

    out = result(peer, "dsa")
    x = _batch()
    for name in ("dsa", "dm", "mtt", "datm", "datadam"):
        (spec,) = [op for op in load_preset(name).augment if "dsa" in op]
        for op in ("scale", "rotate", "crop"):
            forced = [{"dsa": {**spec["dsa"], "strategy": op, "mode": "all"}}]  # that op, no op draw
            hook = create_augment(forced, mean=(0.0,) * 3, std=(1.0,) * 3, num_classes=10)
            for seed in DSA_SEEDS[:2]:
                ours, _ = hook(x.clone(), torch.arange(len(x)), _gen(seed))
                assert torch.allclose(ours, out[(op, seed)], atol=1e-5), (name, op, seed)


# --------------------------------------------------------------------------- CutMix, Mixup


class _Forced(types.SimpleNamespace):
    """``torch`` for the mixing module, with ``randint`` returning the given values in order."""

    def __init__(self, values):
        super().__init__()
        self._values = iter(values)

    def randint(self, low, high, size=(), generator=None, device=None):
        return torch.tensor(next(self._values), device=device)

    def __getattr__(self, name):
        return getattr(torch, name)


def test_cutmix_is_ddrankings_for_the_same_draws(peer, monkeypatch):
    # ddranking/aug/cutmix.py (the CutMix authors' rand_bbox, as SRe2L/RDED use it): a box of
    # int(size * sqrt(1 - lam)) around the centre, cx - cut // 2 to cx + cut // 2 clipped, pasted
    # from the partner. Forced: lambda, the row and column centres, the reversed batch as partner.
    from ddlib.engine.augment import create_augment, mixing

    out = result(peer, "cutmix")["images"]
    x = _batch(6, 32, 1)
    hook = create_augment([{"cutmix": {"alpha": 1.0}}], mean=(0.0,) * 3, std=(1.0,) * 3, num_classes=10)
    for (lam, r, c), theirs in zip(CUTMIX_DRAWS, out):
        monkeypatch.setattr(mixing, "_sample_beta", lambda alpha, g, device, lam=lam: torch.tensor(lam, dtype=torch.float64))
        monkeypatch.setattr(mixing, "torch", _Forced([r, c]))
        ours, _ = hook(x.clone(), torch.arange(6), _gen(0))
        monkeypatch.setattr(mixing, "torch", torch)
        assert torch.equal(ours, theirs), (lam, r, c)


def test_mixup_is_ddrankings_for_the_same_draws(peer, monkeypatch):
    from ddlib.engine.augment import create_augment, mixing

    out = result(peer, "mixup")["images"]
    x = _batch(6, 32, 2)
    hook = create_augment([{"mixup": {"alpha": 0.8}}], mean=(0.0,) * 3, std=(1.0,) * 3, num_classes=10)
    for lam, theirs in zip(MIXUP_LAMS, out):
        monkeypatch.setattr(mixing, "_sample_beta", lambda alpha, g, device, lam=lam: torch.tensor(lam, dtype=torch.float64))
        ours, _ = hook(x.clone(), torch.arange(6), _gen(0))
        assert torch.allclose(ours, theirs, atol=1e-6), lam


# --------------------------------------------------------------------------- losses


def test_soft_label_losses_are_ddrankings(peer):
    # KLDivergenceLoss(temperature, scale_loss), SoftCrossEntropyLoss, MSEGTLoss of ddranking/loss,
    # on teacher logits (relabelling, soft_label_mode M) and on stored logits (mode S: the set's
    # soft labels go to the loss as logits; ddlib turns them into rows at the loss's temperature).
    from ddlib.data.distilled import DistilledSet
    from ddlib.engine.labels import kl_loss, mse_ce_loss, sce_loss, stored_targets

    out = result(peer, "losses")
    student, teacher, labels = _logits(0)
    stored = DistilledSet(torch.zeros(16, 3, 2, 2), labels, 10, soft_labels=teacher)
    for t in TEMPERATURES:
        for scale in (False, True):
            theirs = out[("kl", t, scale)]
            relabel = kl_loss(t, t_squared=scale, targets_are_logits=True).compute(student, teacher, labels)
            rows = kl_loss(t, t_squared=scale)(student, stored_targets(stored, temperature=t))
            assert relabel.item() == pytest.approx(theirs.item(), rel=1e-5)
            assert rows.item() == pytest.approx(theirs.item(), rel=1e-5)
        theirs = out[("sce", t)]
        assert (sce_loss(t, targets_are_logits=True).compute(student, teacher, labels).item()
                == pytest.approx(theirs.item(), rel=1e-5))
        assert sce_loss(t)(student, stored_targets(stored, temperature=t)).item() == pytest.approx(theirs.item(), rel=1e-5)
    for mse_w, ce_w in MSE_GT:
        ours = mse_ce_loss(mse_w, ce_w, targets_are_logits=True).compute(student, teacher, labels)
        assert ours.item() == pytest.approx(out[("mse_gt", mse_w, ce_w)].item(), rel=1e-5)


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize("name", list(CONVNETS))
def test_convnet_variants_forward_as_ddrankings_with_the_same_weights(peer, name):
    peer_name = CONVNETS[name][0]
    out = result(peer, "convnet")[peer_name]
    _, ours = _convnet_inputs()
    model, x = ours[peer_name]
    # loaded strictly: the same layers and shapes, under the peer's names
    assert sorted(out["keys"]) == sorted(_peer_key(k) for k in model.state_dict())
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x), out["eval"], atol=1e-5)
        model.train()
        assert torch.allclose(model(x), out["train"], atol=1e-5)


# --------------------------------------------------------------------------- scores


@pytest.mark.parametrize("w", WEIGHTS)
def test_lrs_and_ars_arithmetic_is_ddrankings(peer, w):
    # The peer's compute_metrics with its accuracy helpers replaced by the given accuracies: its own
    # differences, exponential map and mean/std over runs. Its map has no x100 (ddlib's scores are
    # on 0-100) and it is fed percent in its code: given fractions, it is ddlib's to the last digit.
    from ddlib.scores import metrics
    out = result(peer, "scores")
    hlr = [metrics.hlr(r["real_hard"], r["syn_hard"]) for r in LRS_RUNS]
    ior_hard = [metrics.ior(r["syn_hard"], r["rdm_hard"]) for r in LRS_RUNS]
    ior_soft = [metrics.ior(r["syn_any"], r["rdm_any"]) for r in LRS_RUNS]
    for kind, ior in (("lrs_hard", ior_hard), ("lrs_soft", ior_soft)):
        theirs = out[(kind, "fraction", w)]
        lrs_mean, lrs_std = metrics.mean_std([metrics.lrs(h, i, w) for h, i in zip(hlr, ior)])
        assert metrics.mean_std(hlr) == pytest.approx((theirs["hard_label_recovery_mean"], theirs["hard_label_recovery_std"]),
                                                      abs=1e-12)
        assert metrics.mean_std(ior) == pytest.approx((theirs["improvement_over_random_mean"],
                                                       theirs["improvement_over_random_std"]), abs=1e-12)
        assert (lrs_mean, lrs_std) == pytest.approx((100 * theirs["label_robust_score_mean"],
                                                     100 * theirs["label_robust_score_std"]), abs=1e-9)
        # the peer's own call (percent accuracies) leaves the score's range: the deviation ddlib names
        in_percent = out[(kind, "percent", w)]["label_robust_score_mean"]
        assert not 0.0 <= in_percent <= 1.0
    aug = [metrics.ior(r["syn_aug"], r["rdm_aug"]) for r in ARS_RUNS]
    noaug = [metrics.ior(r["syn_noaug"], r["rdm_noaug"]) for r in ARS_RUNS]
    theirs = out[("ars", "fraction", w)]
    assert metrics.mean_std(aug) == pytest.approx((theirs["with_aug_scores_mean"], theirs["with_aug_scores_std"]), abs=1e-12)
    assert metrics.mean_std(noaug) == pytest.approx((theirs["without_aug_scores_mean"], theirs["without_aug_scores_std"]),
                                                    abs=1e-12)
    ars = metrics.mean_std([metrics.ars(a, n, w) for a, n in zip(aug, noaug)])
    assert ars == pytest.approx((100 * theirs["augmentation_robust_score_mean"],
                                 100 * theirs["augmentation_robust_score_std"]), abs=1e-9)
    assert not math.isnan(out[("ars", "percent", w)]["augmentation_robust_score_mean"])


# --------------------------------------------------------------------------- one augmented training step


def test_mse_ce_inside_an_augmented_training_step_is_the_peers(peer, monkeypatch):
    """Issue 54, 2.1: G-VBSM's (and EDC's) preset trains with CutMix under online relabelling; in one step of ddlib's
    loop (the batch, the preset's augmentation as the protocols build it, the teacher hook, the
    step's loss) the loss is the one the peer's own ``train_one_epoch`` computes on the same batch
    and draws: its ``MSEGTLoss`` takes the teachers' logits of the mixed images and the *unmixed*
    labels. Area-mixed labels in the CE term were 1.2104 against the peer's 1.2010."""
    from dataclasses import replace
    from types import SimpleNamespace

    from ddlib.engine import train as engine
    from ddlib.engine.augment import create_augment, mixing
    from ddlib.engine.hooks import Hooks
    from ddlib.engine.labels import TeacherRelabel
    from ddlib.engine.recipe import Recipe
    from ddlib.engine.test_pass import Normalize
    from ddlib.models import create_model
    from ddlib.protocols.preset_eval import preset_augment
    from ddlib.protocols.presets import load_preset

    inputs = _step_inputs()
    gvbsm = load_preset("gvbsm")
    preset = replace(gvbsm, augment=[op for op in gvbsm.augment if "cutmix" in op])  # its batch-level op (the
    # per-image crops and flips are the peer's custom_train_trans, outside its step)
    plain = (0.0,) * 3, (1.0,) * 3

    def step(augment, lam, r, c):
        nets = []
        for state in (inputs["student"], inputs["teacher"]):
            nets.append(create_model("convnet", 3, 10, 32))
            nets[-1].load_state_dict(state)
        student, teacher = nets
        loop = SimpleNamespace(images=inputs["x"], targets=inputs["y"], normalize=Normalize(*plain), recipe=Recipe(),
                               hooks=Hooks(augment=augment, loss=TeacherRelabel([teacher], loss=preset.loss)))
        monkeypatch.setattr(mixing, "_sample_beta", lambda alpha, g, device: torch.tensor(lam, dtype=torch.float64))
        monkeypatch.setattr(mixing, "torch", _Forced([r, c]))
        x, y = engine._Loop.batch(loop, torch.arange(8), _gen(0))
        monkeypatch.setattr(mixing, "torch", torch)
        loss = loop.hooks.model_objective()(student, x, y, _gen(0))  # the step's forward and loss
        return x, y, loss.item()

    augment = preset_augment(preset, True, *plain, num_classes=10)
    mixing_hook = create_augment(preset.augment, mean=plain[0], std=plain[1], num_classes=10)
    for (lam, r, c), theirs in zip(STEP_DRAWS, result(peer, "train_step")):
        x, y, loss = step(augment, lam, r, c)
        assert torch.equal(x, theirs["images"]), (lam, r, c)  # the same mixed batch
        assert torch.equal(y, theirs["ground_truth"])  # the CE term's labels: the images' own
        assert loss == pytest.approx(theirs["loss"].item(), rel=1e-6), (lam, r, c)
        # what the loss was before: the CE term on area-mixed rows, off the peer's number (8.4666 against
        # 8.4977 for the first draw)
        assert abs(step(mixing_hook, lam, r, c)[2] - theirs["loss"].item()) > 1e-4


# --------------------------------------------------------------------------- schedule


def test_cosine_half_is_the_peers_cosine_epoch_by_epoch(peer):
    # DD-Ranking's 'cosine' (get_lr_scheduler): LambdaLR 0.5 (1 + cos(pi e / E / 2)), stepped once per epoch
    from ddlib.engine.recipe import Recipe, optimizer_and_scheduler

    out = result(peer, "schedule")
    for name, epochs in SCHEDULES:
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer, scheduler = optimizer_and_scheduler(Recipe(epochs=epochs, lr=0.1, scheduler="cosine_half"), [param])
        lrs = []
        for _ in range(epochs):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        assert lrs == pytest.approx(out[(name, epochs)], rel=1e-12, abs=0)


# --------------------------------------------------------------------------- the protocol's flow


_BATCH_OPS = {"dsa": "DSA", "cutmix": "Cutmix", "mixup": "Mixup"}


def _peer_flow(records: list) -> dict:
    """{run: {(set, labels, relabelled, batch-level aug): lr or 'searched over (...)'}} of the peer's trainings."""
    grouped: dict = {}
    for r in records:
        side = ("rdm" if r["set"].startswith("rdm") else r["set"], r["labels"], r["relabel"], r["aug"])
        grouped.setdefault(r["run"], {}).setdefault(side, []).append(r["lr"])
    return {run: {side: (lrs[0] if len(lrs) == 1 else f"searched over {tuple(lrs)}") for side, lrs in sides.items()}
            for run, sides in grouped.items()}


def _ddlib_flow(preset: str, monkeypatch, **set_fields) -> tuple[dict, list]:
    """The same record for ddlib's label_robust on a digits cell (two seeds, the full lr grid) with every
    training replaced by a recorder (Cell.train_eval), and a small untrained teacher: what it would train."""
    from dataclasses import replace

    from ddlib.engine.labels import TeacherRelabel
    from ddlib.models import create_model
    from ddlib.protocols import label_robust, preset_eval
    from ddlib.protocols.cell import Cell, TrainedModel

    calls = []

    def train_eval(cell, role, images, targets, recipe, seeds, *, lrs=None, augment=None, loss=None,
                   preprocess=None, **_):
        from ddlib.engine.train import hook_name

        lrs = [recipe.lr] * len(seeds) if lrs is None else list(lrs)
        for seed, lr in zip(seeds, lrs):
            name = role(lr) if callable(role) else role
            calls.append({"role": name, "seed": seed, "lr": lr, "augment": hook_name(augment, "none"),
                          "loss": hook_name(loss, "ce"), "preprocess": hook_name(preprocess, "none"),
                          "targets": "hard" if not targets.is_floating_point() else "rows", "images": images})
        return [TrainedModel(role(lr) if callable(role) else role, s, 0.5, 0.0, 0.0, "fake", False)
                for s, lr in zip(seeds, lrs)]

    def teacher_hook(self, preset_):
        torch.manual_seed(0)
        key = ("fake teacher", preset_.name)
        if key not in self.cell.cache:
            self.cell.cache[key] = TeacherRelabel([create_model("convnet", 1, 10, 8)], loss=preset_.loss)
        return self.cell.cache[key]

    monkeypatch.setattr(Cell, "train_eval", train_eval)
    monkeypatch.setattr(preset_eval.SideTrainer, "_teacher_hook", teacher_hook)
    cell = label_robust.open_cell(dataset="digits", method="flow", source={"kind": "random", "seed": 7}, ipc=2,
                                  model="convnet", seeds=[0, 1], preset=preset)
    cell.progress = False
    distilled = label_robust.obtain(cell)
    distilled = replace(distilled, **{k: v(distilled) if callable(v) else v for k, v in set_fields.items()})
    label_robust.evaluate(cell, distilled)
    cell.close()
    flow: dict = {}
    for c in calls:
        if "-lr" in c["role"]:
            continue
        side = c["role"].split("_")[0]
        trials = tuple(t["lr"] for t in calls if t["role"].startswith(c["role"] + "-lr") and t["seed"] == c["seed"])
        labels = {"hard": "hard", "rows": "stored" if side == "syn" else "teacher_logits"}[c["targets"]]
        ops = [op for op in _BATCH_OPS if c["augment"].startswith(op + "(") or f" + {op}(" in c["augment"]]
        key = (side, labels, c["loss"].startswith("relabel("), _BATCH_OPS[ops[0]] if ops else None)
        flow.setdefault(c["seed"], {})[key] = f"searched over {trials}" if trials else c["lr"]
    return flow, calls


@pytest.mark.parametrize("name,set_fields", [
    ("dc", {}),
    ("mtt", {"learned_lr": 0.02}),
    ("datm", {"learned_lr": 0.02, "soft_labels": lambda d: torch.randn(len(d), 10)}),
    ("sre2l", {}),
])
def test_label_robust_trains_the_sides_the_peer_trains(peer, mlflow_store, monkeypatch, name, set_fields):
    """Issue 54, 2.4: per evaluation run, which sides train, on which labels (teacher labels for the random
    side), with which batch-level augmentation (``use_aug_for_hard``; none for DC), at which lr or
    searched over which grid (``lr_policy: paper``: the peer called with ``syn_lr``), and a new random
    subset per run; against the peer's ``compute_metrics`` with its training loop recorded."""
    out = result(peer, "flow")[name]
    theirs = _peer_flow(out["trainings"])
    ours, calls = _ddlib_flow(name, monkeypatch, **set_fields)
    assert [ours[s] for s in (0, 1)] == [theirs[r] for r in (0, 1)]
    # a new random subset per run, in both
    assert out["draws"] == [0, 1]
    rdm = {c["seed"]: c["images"] for c in calls if c["role"].startswith("rdm_") and "-lr" not in c["role"]}
    assert not torch.equal(rdm[0], rdm[1])
    # under a ZCA preset every side, the full-data reference too, is whitened: the peer's sides all come
    # from get_dataset(use_zca)'s one transform (its real side trains on that dst_train)
    from ddlib.protocols.presets import load_preset

    preprocess = {c["preprocess"] for c in calls}
    assert len(preprocess) == 1 and (next(iter(preprocess)) != "none") == load_preset(name).zca
