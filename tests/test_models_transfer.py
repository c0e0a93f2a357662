"""DC-Bench's cross-architecture models: ResNet-152, ViT, and DC's AlexNet, VGG-11 and LeNet, and
the DC MNIST IPC 1 set through the transfer protocol against the accuracies DC recorded for it.

Models are built once per (name, input) with seed 0 and shared between tests (ResNet-152 is slow
to build and run on a CPU); forwards never change parameters, so the shared copies stay "initial".
"""

import os

import pytest
import torch
import torch.nn as nn

from ddlib.models import count_parameters, create_model, list_models

NEW = ["resnet152", "resnet152_bn", "vit", "alexnet", "alexnet_bn", "vgg11", "vgg11_bn", "lenet"]
BN = {"resnet152_bn", "alexnet_bn", "vgg11_bn"}
HEAD = {"resnet152": "fc", "resnet152_bn": "fc", "vit": "head", "alexnet": "fc", "alexnet_bn": "fc",
        "vgg11": "classifier", "vgg11_bn": "classifier", "lenet": "fc_3"}
# (feature_dim at 3x32x32, feature_dim at 1x28x28): DC's MNIST padding makes 28x28 behave like 32x32.
FEATURES = {"resnet152": 2048, "resnet152_bn": 2048, "vit": 512, "alexnet": 192 * 4 * 4,
            "alexnet_bn": 192 * 4 * 4, "vgg11": 512, "vgg11_bn": 512, "lenet": 84}
INPUTS = [(3, 32), (1, 28)]

_BUILT: dict = {}


pytestmark = pytest.mark.usefixtures("one_thread")


def built(name, channels=3, size=32):
    """``create_model(name, channels, 10, size)`` after ``torch.manual_seed(0)``, built once."""
    key = (name, channels, size)
    if key not in _BUILT:
        torch.manual_seed(0)
        _BUILT[key] = create_model(name, channels, 10, size)
    return _BUILT[key]


@pytest.mark.parametrize(
    "name,count",
    [
        ("resnet18", 11_173_962),
        ("resnet152", 58_156_618),  # DC's ResNet152 = kuangliu's CIFAR ResNet-152
        ("resnet152_bn", 58_156_618),  # GroupNorm(C, C) and BatchNorm2d both carry 2C parameters
        ("vit", 9_523_722),  # DC-Bench's ViT (vit-pytorch), see vit.py for the sum
        # By hand from DC's networks.py; the sums are written out in each module's docstring.
        ("alexnet", 1_872_202),  # convs 1,841,472 + fc 192*4*4*10 + 10
        ("alexnet_bn", 1_874_122),  # + 2 * (128 + 192 + 256 + 192 + 192) BN parameters
        ("vgg11", 9_231_114),  # convs 9,220,480 + norms 5,504 + fc 5,130
        ("vgg11_bn", 9_231_114),
        ("lenet", 62_006),  # 456 + 2,416 + 48,120 + 10,164 + 850
    ],
)
def test_parameter_count_on_cifar10(name, count):
    model = built(name) if name in NEW else create_model(name, 3, 10, 32)
    assert count_parameters(model) == count


def test_registry_lists_the_new_models():
    assert set(NEW) <= set(list_models())


@pytest.mark.parametrize("channels,size", INPUTS)
@pytest.mark.parametrize("name", NEW)
def test_forward_and_embed_shapes(name, channels, size):
    model = built(name, channels, size)
    assert model.feature_dim == FEATURES[name]
    x = torch.randn(2, channels, size, size)
    for mode in ["train", "eval"] if name in BN else ["eval"]:
        model.train(mode == "train")
        with torch.no_grad():
            logits, embedding = model(x), model.embed(x)
        assert logits.shape == (2, 10), mode
        assert embedding.shape == (2, model.feature_dim), mode
    # embed is exactly what the classifier sees (eval mode: no dropout, BN uses its running statistics)
    torch.testing.assert_close(getattr(model, HEAD[name])(embedding), logits)


def test_bn_variant_trains():
    model = built("alexnet_bn")
    model.train()
    loss = nn.functional.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([0, 1]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", NEW)
def test_same_seed_gives_same_initial_weights(name):
    first = built(name)  # seed 0
    torch.manual_seed(0)
    again = create_model(name, 3, 10, 32)
    for (key, a), (_, b) in zip(first.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), key
    if not name.startswith("resnet152"):  # and a different seed gives different weights (not worth a 3rd ResNet-152)
        torch.manual_seed(1)
        other = create_model(name, 3, 10, 32)
        assert not all(torch.equal(a, b) for a, b in zip(first.parameters(), other.parameters()))


@pytest.mark.parametrize(
    "name,channels,size,match",
    [
        ("resnet152", 1, 8, "too small"),  # last stage 1x1: GroupNorm(C, C) would output a constant
        ("alexnet", 3, 4, "too small for alexnet"),  # three 2x2 pools
        ("alexnet_bn", 3, 4, "too small for alexnet_bn"),
        ("vgg11", 3, 16, "too small for vgg11"),  # five 2x2 pools need 32x32
        ("vgg11_bn", 1, 8, "too small for vgg11_bn"),
        ("lenet", 1, 8, "too small for lenet"),  # two 5x5 valid convs and two pools need 16x16
        ("vit", 3, 30, "multiple of the patch size 4"),
        ("vit", 3, 2, "multiple of the patch size 4"),
    ],
)
def test_too_small_or_misfit_image_is_refused(name, channels, size, match):
    with pytest.raises(ValueError, match=match):
        create_model(name, channels, 10, size)


def test_smallest_sizes_that_fit():
    assert create_model("lenet", 1, 10, 16)(torch.randn(1, 1, 16, 16)).shape == (1, 10)
    assert create_model("alexnet", 1, 10, 8).feature_dim == 192  # 8x8 digits: 8 -> 4 -> 2 -> 1
    assert create_model("vgg11", 3, 10, 32).feature_dim == 512


@pytest.mark.parametrize(
    "name,feature_dim",
    [("alexnet", 192 * 8 * 8), ("vgg11", 512 * 2 * 2), ("lenet", 84), ("vit", 512)],
)
def test_flattened_size_follows_the_image_size(name, feature_dim):
    # DC hard-codes the 32x32 flattened size (192*4*4, 512, 16*5*5); we compute it, so 64x64 works.
    model = create_model(name, 3, 10, 64).eval()
    assert model.feature_dim == feature_dim
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    if name == "lenet":
        assert model.fc_1.in_features == 16 * 13 * 13


def _convs(model):
    return [(m.in_channels, m.out_channels, m.kernel_size[0], m.padding[0]) for m in model.modules()
            if isinstance(m, nn.Conv2d)]


def test_dc_layer_layouts_and_mnist_padding():
    # DC: AlexNet's first conv pads 4 for grayscale, 2 otherwise; VGG's 3 / 1; LeNet's 2 / 0.
    assert _convs(built("alexnet")) == [(3, 128, 5, 2), (128, 192, 5, 2), (192, 256, 3, 1), (256, 192, 3, 1),
                                        (192, 192, 3, 1)]
    assert _convs(built("alexnet", 1, 28))[0] == (1, 128, 5, 4)
    assert _convs(built("vgg11")) == [(3, 64, 3, 1), (64, 128, 3, 1), (128, 256, 3, 1), (256, 256, 3, 1),
                                      (256, 512, 3, 1), (512, 512, 3, 1), (512, 512, 3, 1), (512, 512, 3, 1)]
    assert _convs(built("vgg11", 1, 28))[0] == (1, 64, 3, 3)
    assert _convs(built("lenet")) == [(3, 6, 5, 0), (6, 16, 5, 0)]
    assert _convs(built("lenet", 1, 28))[0] == (1, 6, 5, 2)
    assert [(m.in_features, m.out_features) for m in built("lenet").modules() if isinstance(m, nn.Linear)] == [
        (400, 120), (120, 84), (84, 10)]
    # 8x8 digits keep the ordinary padding, as in convnet.py
    assert _convs(create_model("alexnet", 1, 10, 8))[0] == (1, 128, 5, 2)


def test_state_dict_keys_are_dcs():
    # Same Sequential layout and names as DC's networks.py, so DC checkpoints load unchanged.
    convs = [0, 3, 6, 8, 10]
    assert list(built("alexnet").state_dict()) == [f"features.{i}.{p}" for i in convs for p in ("weight", "bias")] + [
        "fc.weight", "fc.bias"]
    bn = built("alexnet_bn").state_dict()
    assert "features.1.running_mean" in bn and "features.14.weight" in bn and "features.15.running_var" in bn
    vgg = built("vgg11").state_dict()  # conv, norm, relu per conv; one index per max-pool
    assert {"features.0.weight", "features.1.weight", "features.4.weight", "features.25.weight",
            "features.26.bias", "classifier.weight"} <= set(vgg)
    assert "features.27.weight" not in vgg  # a ReLU
    assert list(built("lenet").state_dict()) == ["features.0.weight", "features.0.bias", "features.3.weight",
                                                 "features.3.bias", "fc_1.weight", "fc_1.bias", "fc_2.weight",
                                                 "fc_2.bias", "fc_3.weight", "fc_3.bias"]


def test_norms():
    groups = [m for m in built("vgg11").modules() if isinstance(m, nn.GroupNorm)]
    assert len(groups) == 8 and all(m.num_groups == m.num_channels and m.affine for m in groups)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in built("vgg11_bn").modules()) == 8
    assert sum(isinstance(m, nn.BatchNorm2d) for m in built("alexnet_bn").modules()) == 5
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) for m in built("alexnet").modules())
    resnet = built("resnet152")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in resnet.modules())
    assert sum(isinstance(m, nn.GroupNorm) for m in resnet.modules()) == 1 + 3 * 50 + 4  # stem, blocks, shortcuts


def test_resnet152_layout():
    model = built("resnet152")
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == [3, 8, 36, 3]
    assert (model.conv1.kernel_size, model.conv1.stride) == ((3, 3), (1, 1))
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    conv = model.layer4[0].conv2  # PyTorch's default init (DC), not timm's Kaiming fan-out
    assert conv.weight.abs().max() <= 1 / (512 * 9) ** 0.5 + 1e-7


def test_vit_matches_dc_bench():
    model = built("vit")
    assert model.patch_embed.proj.kernel_size == (4, 4) and model.patch_embed.grid_size == (8, 8)
    assert model.pos_embed.shape == (1, 8 * 8 + 1, 512) and model.cls_token.shape == (1, 1, 512)
    assert len(model.blocks) == 6
    block = model.blocks[0]
    assert block.attn.num_heads == 8 and block.attn.head_dim == 64 and block.attn.qkv.bias is None
    assert (block.mlp.fc1.in_features, block.mlp.fc1.out_features) == (512, 512)
    # vit-pytorch's dropout 0.1 after the attention projection and in the MLP, emb_dropout 0.1, nothing else
    assert block.attn.proj_drop.p == block.mlp.drop1.p == block.mlp.drop2.p == model.pos_drop.p == 0.1
    assert block.attn.attn_drop.p == 0.0 and model.head_drop.p == 0.0
    assert model.norm.eps == 1e-5  # nn.LayerNorm's default, as in vit-pytorch
    # DC-Bench's init: randn class token and positions, PyTorch's default Linear (uniform within 1/sqrt(fan_in))
    assert 0.9 < model.pos_embed.std().item() < 1.1
    assert model.head.weight.abs().max() <= 1 / 512 ** 0.5 + 1e-7
    assert built("vit", 1, 28).patch_embed.grid_size == (7, 7)


def test_vit_embed_is_the_class_token():
    model = built("vit").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        torch.testing.assert_close(model.embed(x), tokens[:, 0])


# --------------------------------------------------------------------------- against DC's own measurements

DC_MNIST = "distilled/dc_mnist_convnet_ipc1.pt"
DC_AUGMENT = {"dc_augment": {"strategy": "crop_scale_rotate"}}  # what DC evaluates MNIST with
LONG_CHECKS = "DDLIB_LONG_CHECKS"  # set to 1 to also check AlexNet, VGG-11 and ResNet-18 (~15-40 min on 2 cores)


def _recorded(path) -> dict[str, float]:
    """The file's recorded accuracies (percent): the mean of its 100 runs per architecture."""
    accs = torch.load(path, weights_only=False)["accs_all_exps"]
    return {name.lower(): 100 * sum(v) / len(v) for name, v in accs.items()}


def _dc_mnist_transfer(shared_data, models, **params):
    """The DC MNIST IPC 1 set through the transfer protocol under DC's evaluation: its augmentation
    and 1000 epochs (DC trains 1000 whenever it augments), one seed; ConvNet 300 epochs."""
    from ddlib.protocols import transfer

    path = shared_data / DC_MNIST
    if not path.is_file() or not (shared_data / "mnist.npz").is_file():
        pytest.skip(f"{path} or mnist.npz not present")
    cell = transfer.open_cell(dataset="mnist", data_root=str(shared_data / "mnist.npz"), method="dc", ipc=1,
                              source={"kind": "file", "path": str(path)}, seeds=[0], models=models,
                              augment=DC_AUGMENT, aug_epochs=1000, model_recipes={"convnet": {"epochs": 300}},
                              device="cpu", **params)
    cell.progress = False
    result = transfer.evaluate(cell, transfer.obtain(cell))
    cell.close()
    return {m: result.summary[f"acc_{m}_mean"] for m in models}, _recorded(path)  # in % (ddlib.specs.units)


@pytest.mark.slow
def test_dc_mnist_ipc1_under_dcs_augmentation_matches_dcs_recorded_accuracies(mlflow_store, shared_data):
    """ConvNet, 300 epochs, ``dc_augment: {strategy: crop_scale_rotate}`` on the shared DC MNIST IPC 1
    set lands within 1.5 points of the ConvNet accuracy the file records (91.8 %: the mean of its 100
    runs); MLP and LeNet under DC's evaluation (its augmentation, 1000 epochs) within 2.5 points of
    theirs (70.1, 85.6 %). Full MNIST test set, seed 0 (measured: ConvNet 91.9 %, 91.3 ± 0.4 over 3
    seeds; MLP 70.0 %, LeNet 85.5 % on a 2,000-image test subset). Without augmentation the ConvNet
    scores about 86 %: the check fails on an augmentation that does nothing or the wrong thing.
    Why it takes 48 s alone on one Zen 3 thread (about 70 s beside the suite's other workers): 24 s of
    training (2,303 steps: ConvNet 300, MLP and LeNet 1,000 each, DC's augmentation 4 s of it), 17 s
    of test passes over the 10,000 MNIST test images (three models; the published numbers are on the
    full set), the rest imports and loading MNIST."""
    got, recorded = _dc_mnist_transfer(shared_data, ["convnet", "mlp", "lenet"])
    assert abs(recorded["convnet"] - 91.8) < 0.05
    assert abs(got["convnet"] - recorded["convnet"]) <= 1.5, (got, recorded)
    for model in ("mlp", "lenet"):
        assert abs(got[model] - recorded[model]) <= 2.5, (model, got, recorded)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(LONG_CHECKS) != "1", reason=f"{LONG_CHECKS}=1 runs it (15-40 min on a 2-core CPU)")
def test_dc_mnist_ipc1_on_dcs_larger_architectures_matches_dcs_recorded_accuracies(mlflow_store, shared_data):
    """AlexNet, VGG-11 and ResNet-18 under DC's evaluation within 2.5 points of the accuracies the
    file records (85.3, 84.2, 90.2 %): our DC architectures against what DC measured with its own.
    Seed 0 on a stratified 2,000-image test subset (the training, 1000 epochs each, is the cost;
    measured 84.8 / 84.0 / 90.2 %, 14 + 9 + 27 min on a 2-core CPU under load)."""
    models = ["convnet", "alexnet", "vgg11", "resnet18"]
    got, recorded = _dc_mnist_transfer(shared_data, models, test_size=2000)
    for model in models[1:]:
        assert abs(got[model] - recorded[model]) <= 2.5, (model, got, recorded)
