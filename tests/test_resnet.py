import pytest
import torch
import torch.nn as nn
from timm.models.resnet import Bottleneck

from ddlib.models import count_parameters, create_model, list_models
from ddlib.models.resnet import ResNet


@pytest.mark.parametrize("name", ["resnet18", "resnet18_bn"])
def test_resnet18_parameter_count_on_cifar10(name):
    # DC's ResNet-18 (and kuangliu's CIFAR ResNet-18) on 3x32x32, 10 classes. GroupNorm(C, C) and
    # BatchNorm2d both carry 2C affine parameters, so both variants have the same count.
    assert count_parameters(create_model(name, 3, 10, 32)) == 11_173_962


def test_instance_norm_variant_uses_groupnorm_with_one_channel_per_group():
    model = create_model("resnet18", 3, 10, 32)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 + 8 * 2 + 3  # stem, two per block, three shortcuts
    assert all(m.num_groups == m.num_channels and m.affine for m in norms)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    bn = create_model("resnet18_bn", 3, 10, 32)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in bn.modules()) == 20
    assert not any(isinstance(m, nn.GroupNorm) for m in bn.modules())


def test_cifar_stem_has_no_downsampling():
    model = create_model("resnet18", 3, 10, 32)
    assert (model.conv1.kernel_size, model.conv1.stride, model.conv1.padding) == ((3, 3), (1, 1), (1, 1))
    assert model.conv1.bias is None
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())


@pytest.mark.parametrize(
    "channels,size,final_map",
    [(1, 28, 4), (3, 32, 4), (3, 64, 8)],  # DC: 4x4 before the final pool at 32x32 (and 28x28)
)
def test_forward_shapes_and_embedding(channels, size, final_map):
    model = create_model("resnet18", channels, 10, size).eval()
    x = torch.randn(1, channels, size, size)
    with torch.no_grad():
        features = model.forward_features(x)
        assert features.shape == (1, 512, final_map, final_map)
        embedding = model.embed(x)
        assert model.feature_dim == 512 and embedding.shape == (1, 512)
        logits = model(x)
    assert logits.shape == (1, 10)
    torch.testing.assert_close(model.fc(embedding), logits)


def test_resnet18_bn_forward_and_train_step():
    model = create_model("resnet18_bn", 3, 10, 16)
    x = torch.randn(2, 3, 16, 16)
    loss = nn.functional.cross_entropy(model(x), torch.tensor([0, 1]))
    loss.backward()
    assert model.conv1.weight.grad is not None


def test_dc_initialisation_not_timms():
    torch.manual_seed(0)
    model = create_model("resnet18", 3, 10, 32)
    # timm zero-initialises each block's last norm and uses Kaiming fan-out; DC uses PyTorch defaults.
    assert all(torch.equal(m.bn2.weight, torch.ones_like(m.bn2.weight)) for m in model.layer1)
    conv = model.layer4[0].conv2  # default init: uniform within 1/sqrt(fan_in)
    assert conv.weight.abs().max() <= 1 / (512 * 9) ** 0.5 + 1e-7
    torch.manual_seed(0)
    again = create_model("resnet18", 3, 10, 32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_too_small_image_is_refused_for_instance_norm():
    # At 8x8 the last stage is 1x1, where GroupNorm(C, C) outputs a constant: the net ignores its input.
    with pytest.raises(ValueError, match="too small"):
        create_model("resnet18", 1, 10, 8)
    bn = create_model("resnet18_bn", 1, 10, 8)  # batch norm normalises across the batch: fine
    assert bn(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_registry_lists_resnets():
    assert {"resnet18", "resnet18_bn"} <= set(list_models())


def test_deeper_layouts_take_one_line():
    # Ready for resnet152: the block layout is all a variant needs (counts as kuangliu's CIFAR ResNets).
    assert count_parameters(ResNet(3, 10, (32, 32), layers=(3, 4, 6, 3), block=Bottleneck, norm="batch")) == 23_520_842
    with pytest.raises(ValueError, match="unknown norm"):
        ResNet(3, 10, (32, 32), layers=(2, 2, 2, 2), norm="layer")
