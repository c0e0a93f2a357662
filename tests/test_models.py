import pytest
import torch

from ddlib.models import count_parameters, create_model, list_models


def test_convnet_parameter_count_on_cifar10():
    # DC's ConvNet (depth 3, width 128, instance norm, avg pool) on 3x32x32, 10 classes.
    assert count_parameters(create_model("convnet", 3, 10, 32)) == 320_010


@pytest.mark.parametrize("name,count", [
    # conv 3->128, 3 x conv 128->128, 4 x norm (2 x 128 each), linear from the 2x2x128 map after 4 pools
    ("convnet_d4", 3_584 + 3 * 147_584 + 4 * 256 + 128 * 2 * 2 * 10 + 10),
    ("mlp", 3 * 32 * 32 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10),  # DC's MLP: 3072 -> 128 -> 128 -> 10
])
def test_other_dc_parameter_counts_on_cifar10(name, count):
    assert count == {"convnet_d4": 452_490, "mlp": 411_146}[name]  # as the README states them
    assert count_parameters(create_model(name, 3, 10, 32)) == count


def test_instance_norm_is_groupnorm_with_one_channel_per_group():
    model = create_model("convnet", 3, 10, 32)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert len(norms) == 3 and all(m.num_groups == m.num_channels == 128 and m.affine for m in norms)


@pytest.mark.parametrize(
    "name,channels,size,feature_dim",
    [
        ("convnet", 3, 32, 128 * 4 * 4),
        ("convnet", 1, 28, 128 * 4 * 4),  # DC's MNIST padding: 28x28 behaves like 32x32
        ("convnet", 1, 8, 128),  # digits
        ("convnet_bn", 3, 32, 2048),
        ("convnet_nonorm", 3, 32, 2048),
        ("convnet_d4", 3, 64, 128 * 4 * 4),
        ("mlp", 3, 32, 128),
    ],
)
def test_forward_shapes_and_embedding(name, channels, size, feature_dim):
    model = create_model(name, channels, 10, size)
    x = torch.randn(4, channels, size, size)
    assert model(x).shape == (4, 10)
    assert model.embed(x).shape == (4, feature_dim)


def test_norm_variants_use_their_norm():
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in create_model("convnet_bn", 3, 10, 32).modules())
    plain = create_model("convnet_nonorm", 3, 10, 32)
    assert not any(isinstance(m, (torch.nn.BatchNorm2d, torch.nn.GroupNorm)) for m in plain.modules())


def test_mlp_has_three_linear_layers_of_width_128():
    linears = [m for m in create_model("mlp", 1, 10, 28).modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 128), (128, 128), (128, 10)]


def test_registry_lists_and_refuses_unknown_names():
    assert {"convnet", "convnet_bn", "convnet_nonorm", "convnet_d4", "mlp"} <= set(list_models())
    with pytest.raises(ValueError, match="unknown model 'resnet9000'"):
        create_model("resnet9000", 3, 10, 32)


def test_too_small_image_is_refused():
    with pytest.raises(ValueError, match="too small"):
        create_model("convnet_d4", 1, 10, 8)


# ---------------------------------------------------------------- the ConvNet's 2x2 average pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 128, 32, 32), (7, 128, 16, 16), (300, 128, 8, 8), (5, 3, 7, 7), (2, 16, 2, 2)])
def test_cpu_test_pass_pool_has_avg_pool2d_bits(dtype, shape):
    """The depthwise-convolution path (taken without autograd) equals avg_pool2d bit for bit."""
    import torch.nn.functional as F

    from ddlib.models._pool import AvgPool2x2

    g = torch.Generator().manual_seed(sum(shape))
    for x in (torch.randn(shape, generator=g), torch.relu(torch.randn(shape, generator=g) * 40)):
        x = x.to(dtype)
        with torch.inference_mode():
            fast = AvgPool2x2()(x)
        assert fast.dtype == dtype and fast.shape == F.avg_pool2d(x, 2).shape
        assert torch.equal(fast, F.avg_pool2d(x, 2))


def test_convnet_takes_the_fast_pool_in_test_passes_only_and_keeps_its_outputs(monkeypatch):
    """A ConvNet's logits under inference equal those of the same weights with nn.AvgPool2d, in
    fp32 and under bf16 autocast; training (autograd on) keeps avg_pool2d."""
    import copy

    import torch.nn as nn

    import ddlib.models._pool as pool

    calls = []
    conv2d = pool.F.conv2d
    monkeypatch.setattr(pool.F, "conv2d", lambda *a, **k: calls.append(k.get("groups", 1)) or conv2d(*a, **k))
    torch.manual_seed(0)
    model = create_model("convnet", channels=3, num_classes=10, image_size=(32, 32)).eval()
    plain = copy.deepcopy(model)
    plain.features = nn.Sequential(*[nn.AvgPool2d(2, 2) if isinstance(m, pool.AvgPool2x2) else m for m in plain.features])
    assert sum(isinstance(m, pool.AvgPool2x2) for m in model.features) == 3
    x = torch.randn(64, 3, 32, 32)
    for bf16 in (False, True):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            assert torch.equal(model(x), plain(x))
    assert calls.count(128) == 6  # 3 pools x 2 passes (nn.Conv2d goes through F.conv2d too, groups 1)
    model.train()(x).sum().backward()
    assert calls.count(128) == 6
