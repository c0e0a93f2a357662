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


# DC's MLP and LeNet on MNIST (1x28x28, 10 classes), layer by layer as DC's networks.py
# (VICO-UoE/DatasetCondensation) builds them: state_dict() names and shapes of DC's MLP(1, 10) and
# LeNet(1, 10), listed from DC's own modules. LeNet's first conv pads by 2 on 1-channel input, so its
# flattened map is 16 x 5 x 5 as on 32x32; the MLP reads 28 * 28 * 1 inputs.
DC_MNIST_LAYERS = {
    "mlp": [("fc_1.weight", (128, 784)), ("fc_1.bias", (128,)), ("fc_2.weight", (128, 128)), ("fc_2.bias", (128,)),
            ("fc_3.weight", (10, 128)), ("fc_3.bias", (10,))],
    "lenet": [("features.0.weight", (6, 1, 5, 5)), ("features.0.bias", (6,)), ("features.3.weight", (16, 6, 5, 5)),
              ("features.3.bias", (16,)), ("fc_1.weight", (120, 400)), ("fc_1.bias", (120,)),
              ("fc_2.weight", (84, 120)), ("fc_2.bias", (84,)), ("fc_3.weight", (10, 84)), ("fc_3.bias", (10,))],
}


@pytest.mark.parametrize("name,count", [("mlp", 118_282), ("lenet", 61_706)])  # DC's MLP(1, 10), LeNet(1, 10)
def test_dc_mlp_and_lenet_on_mnist_are_dcs_layers_in_dcs_order(name, count):
    """Same parameters, same shapes, created in the same order as DC's: under one torch.manual_seed
    ddlib's model starts from DC's initial weights (the training pin in test_integration_mnist.py
    depends on it), and LeNet's names are DC's, so a DC state dict loads as it is."""
    model = create_model(name, 1, 10, 28)
    assert count_parameters(model) == count == sum(torch.Size(s).numel() for _, s in DC_MNIST_LAYERS[name])
    assert [tuple(v.shape) for v in model.state_dict().values()] == [s for _, s in DC_MNIST_LAYERS[name]]
    if name == "lenet":
        assert list(model.state_dict()) == [k for k, _ in DC_MNIST_LAYERS[name]]
        assert model.features[0].padding == (2, 2)
    torch.manual_seed(0)  # DC's modules in the order DC's __init__ creates them (ReLU and pooling draw nothing)
    dc_like = (torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.Linear(128, 128), torch.nn.Linear(128, 10))
               if name == "mlp" else
               torch.nn.Sequential(torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.Conv2d(6, 16, 5),
                                   torch.nn.Linear(400, 120), torch.nn.Linear(120, 84), torch.nn.Linear(84, 10)))
    torch.manual_seed(0)
    ours = create_model(name, 1, 10, 28)
    for a, b in zip(dc_like.state_dict().values(), ours.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_registry_lists_and_refuses_unknown_names():
    assert {"convnet", "convnet_bn", "convnet_nonorm", "convnet_d4", "mlp"} <= set(list_models())
    with pytest.raises(ValueError, match="unknown model 'resnet9000'"):
        create_model("resnet9000", 3, 10, 32)


def test_too_small_image_is_refused():
    with pytest.raises(ValueError, match="too small"):
        create_model("convnet_d4", 1, 10, 8)


# ---------------------------------------------------------------- the ConvNet's 2x2 average pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 128, 32, 32), (7, 128, 16, 16), (300, 128, 8, 8), (5, 3, 7, 7), (2, 16, 2, 2),
                                   (3, 8, 5, 6)])
def test_cpu_pool_has_avg_pool2d_bits_forward_and_backward(dtype, shape, monkeypatch):
    """The pool's forward (a depthwise convolution) and its backward (an interleaving copy) equal
    avg_pool2d's and avg_pool2d_backward's bit for bit, with and without autograd, odd sizes
    included (the row and column avg_pool2d drops get a zero gradient)."""
    import torch.nn.functional as F

    import ddlib.models._pool as pool
    from ddlib.models._pool import AvgPool2x2

    monkeypatch.setattr(pool, "MIN_ELEMENTS", 0)  # the fast path at every size

    g = torch.Generator().manual_seed(sum(shape))
    for x in (torch.randn(shape, generator=g), torch.relu(torch.randn(shape, generator=g) * 40)):
        x = x.to(dtype)
        with torch.inference_mode():
            fast = AvgPool2x2()(x)
        assert fast.dtype == dtype and fast.shape == F.avg_pool2d(x, 2).shape
        assert torch.equal(fast, F.avg_pool2d(x, 2))
        grad_out = torch.randn(fast.shape, generator=g).to(dtype)
        ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = AvgPool2x2()(ours)
        assert torch.equal(out, F.avg_pool2d(ref, 2))
        out.backward(grad_out)
        F.avg_pool2d(ref, 2).backward(grad_out)
        assert ours.grad.dtype == dtype and ours.grad.shape == x.shape
        assert torch.equal(ours.grad, ref.grad)


def test_cpu_pool_runs_under_vmap_and_twice_differentiated(monkeypatch):
    """Batched mode runs the models under torch.func.vmap, and a gradient of a gradient goes
    through the pool: both as with avg_pool2d."""
    import torch.nn.functional as F
    from torch.func import grad, vmap

    import ddlib.models._pool as pool
    from ddlib.models._pool import AvgPool2x2

    monkeypatch.setattr(pool, "MIN_ELEMENTS", 0)

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 4, 6, 8, 8, generator=g), torch.randn(3, 6, 4, 4, generator=g)

    def loss(pool):
        return lambda x, w: (pool(x * x) * w).sum()

    ours, ref = loss(AvgPool2x2()), loss(lambda t: F.avg_pool2d(t, 2))
    assert torch.equal(vmap(ours)(x, w), vmap(ref)(x, w))
    assert torch.equal(vmap(grad(ours))(x, w), vmap(grad(ref))(x, w))
    ours, ref = x[0].clone().requires_grad_(), x[0].clone().requires_grad_()
    for t, pooling in ((ours, AvgPool2x2()), (ref, lambda t: F.avg_pool2d(t, 2))):
        (first,) = torch.autograd.grad((pooling(t * t) ** 2).sum(), t, create_graph=True)
        first.square().sum().backward()
    assert torch.equal(ours.grad, ref.grad)


@pytest.mark.parametrize("bf16", [False, True])
def test_convnet_trains_to_the_same_weights_with_the_fast_pool(bf16, monkeypatch):
    """A ConvNet trained with the pool's fast CPU path ends with the weights of the same ConvNet
    trained with nn.AvgPool2d, bit for bit (fp32, and under bf16 autocast), and its logits under
    inference equal them too."""
    import copy

    import torch.nn as nn

    import ddlib.models._pool as pool

    monkeypatch.setattr(pool, "MIN_ELEMENTS", 0)
    calls = []
    monkeypatch.setattr(pool._Pool2x2, "setup_context", staticmethod(lambda ctx, inputs, output: calls.append(1) or
                                                                      setattr(ctx, "size", tuple(inputs[0].shape[-2:]))))

    torch.manual_seed(0)
    model = create_model("convnet", channels=3, num_classes=10, image_size=(16, 16))
    plain = copy.deepcopy(model)
    plain.features = nn.Sequential(*[nn.AvgPool2d(2, 2) if isinstance(m, pool.AvgPool2x2) else m for m in plain.features])
    assert sum(isinstance(m, pool.AvgPool2x2) for m in model.features) == 3
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 3, 16, 16, generator=g), torch.randint(0, 10, (20,), generator=g)
    for net in (model, plain):
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        for _ in range(5):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
    assert len(calls) == 3 * 5  # the fast path in every pool of every step
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        assert torch.equal(model.eval()(x), plain.eval()(x))
