"""NAS-Bench-201 search space (ddlib.models.nasbench201) and DC-Bench's NAS protocol parts (ddlib.protocols.nas_space)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from ddlib.models import count_parameters, create_model, list_models
from ddlib.models.nasbench201 import OP_NAMES, TinyNetwork, format_arch, parse_arch
from ddlib.protocols.nas_space import NasError, load_ground_truth, rank_correlation, sample_architectures

EXAMPLE = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"
ALL_NONE = "|none~0|+|none~0|none~1|+|none~0|none~1|none~2|"
ALL_CONV3 = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|"
ALL_POOL = "|avg_pool_3x3~0|+|avg_pool_3x3~0|avg_pool_3x3~1|+|avg_pool_3x3~0|avg_pool_3x3~1|avg_pool_3x3~2|"
# The architecture whose CIFAR-10 parameter count D-X-Y/NATS-Bench issue #36 quotes (0.802426 MB, hp="12").
NATS_36 = "|skip_connect~0|+|none~0|nor_conv_3x3~1|+|avg_pool_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|"
BEST_C10 = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|nor_conv_3x3~2|"


pytestmark = pytest.mark.usefixtures("one_thread")


def _arch(ops):
    """Six ops in string order (1<-0, 2<-0, 2<-1, 3<-0, 3<-1, 3<-2) -> architecture string."""
    return f"|{ops[0]}~0|+|{ops[1]}~0|{ops[2]}~1|+|{ops[3]}~0|{ops[4]}~1|{ops[5]}~2|"


# --------------------------------------------------------------------------- architecture strings


@pytest.mark.parametrize("arch", [EXAMPLE, ALL_NONE, ALL_CONV3, ALL_POOL, NATS_36, BEST_C10,
                                  _arch(["nor_conv_1x1", "skip_connect", "none", "avg_pool_3x3", "nor_conv_3x3", "none"])])
def test_parse_format_round_trip(arch):
    nodes = parse_arch(arch)
    assert len(nodes) == 3 and [len(n) for n in nodes] == [1, 2, 3]
    assert all(op in OP_NAMES and 0 <= i < j for j, node in enumerate(nodes, 1) for op, i in node)
    assert format_arch(nodes) == arch
    assert parse_arch(format_arch(nodes)) == nodes


def test_parse_gives_op_input_pairs_and_canonicalises_edge_order():
    assert parse_arch(EXAMPLE) == (
        (("nor_conv_3x3", 0),),
        (("nor_conv_3x3", 0), ("avg_pool_3x3", 1)),
        (("skip_connect", 0), ("nor_conv_3x3", 1), ("skip_connect", 2)),
    )
    permuted = "|nor_conv_3x3~0|+|avg_pool_3x3~1|nor_conv_3x3~0|+|skip_connect~2|skip_connect~0|nor_conv_3x3~1|"
    assert format_arch(parse_arch(permuted)) == EXAMPLE
    assert format_arch([[("none", 0)], [("none", 0), ("none", 1)], [("none", 0), ("none", 1), ("none", 2)]]) == ALL_NONE


@pytest.mark.parametrize("bad", [
    "",
    "|nor_conv_3x3~0|",                                                   # one node
    "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|",                   # two nodes
    EXAMPLE + "+|none~0|",                                                # four nodes
    EXAMPLE.replace("avg_pool_3x3", "max_pool_3x3"),                      # not in NAS-Bench-201
    EXAMPLE.replace("nor_conv_3x3~0|+", "conv~0|+"),                      # unknown op
    EXAMPLE.replace("skip_connect~2", "skip_connect~1"),                  # node 3 lacks an edge from node 2
    EXAMPLE.replace("avg_pool_3x3~1", "avg_pool_3x3~2"),                  # an edge from a later node
    EXAMPLE.replace("|+|", "+"),                                          # missing pipes
    EXAMPLE.replace("~0|+|nor", "0|+|nor"),                               # missing ~
    EXAMPLE.replace("skip_connect~2|", "skip_connect~2|none~2|"),        # an extra edge
    "|nor_conv_3x3~0|+||+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|",  # empty node
])
def test_bad_strings_are_refused_naming_the_string(bad):
    with pytest.raises(ValueError) as info:
        parse_arch(bad)
    assert repr(bad) in str(info.value)


def test_non_strings_and_bad_structures_are_refused():
    with pytest.raises(ValueError):
        parse_arch(None)
    with pytest.raises(ValueError):
        format_arch([[("none", 0)], [("none", 0)]])
    with pytest.raises(ValueError):
        format_arch([[("conv", 0)], [("none", 0), ("none", 1)], [("none", 0), ("none", 1), ("none", 2)]])


# --------------------------------------------------------------------------- network


def test_registered_and_validated():
    assert "nasbench201" in list_models()
    with pytest.raises(ValueError, match="needs an architecture"):
        create_model("nasbench201", 3, 10, 32)
    with pytest.raises(ValueError, match="max_pool"):
        create_model("nasbench201", 3, 10, 32, arch=EXAMPLE.replace("avg_pool", "max_pool"))
    with pytest.raises(ValueError, match="divisible by 4"):
        create_model("nasbench201", 3, 10, 30, arch=EXAMPLE)
    with pytest.raises(ValueError, match="N must be"):
        create_model("nasbench201", 3, 10, 32, arch=EXAMPLE, N=0)


@pytest.mark.parametrize("arch, classes, size, expected", [
    # NAS-Bench-201 "params" (MB = 1e6 parameters), C=16, N=5. CIFAR-10 range 0.073306 .. 1.531546,
    # CIFAR-100 0.079156 .. 1.537396, ImageNet16-120 0.080456 .. 1.538696 (NAS-Bench-201-v1_1-096897).
    (ALL_NONE, 10, 32, 73_306),
    (ALL_POOL, 10, 32, 73_306),   # no convolution in the cell: the smallest
    (ALL_CONV3, 10, 32, 1_531_546),  # the largest
    (NATS_36, 10, 32, 802_426),   # D-X-Y/NATS-Bench issue #36
    (ALL_NONE, 100, 32, 79_156),
    (ALL_CONV3, 100, 32, 1_537_396),
    (ALL_NONE, 120, 16, 80_456),
    (ALL_CONV3, 120, 16, 1_538_696),
])
def test_parameter_counts_match_nas_bench_201(arch, classes, size, expected):
    assert count_parameters(create_model("nasbench201", 3, classes, size, arch=arch)) == expected


def test_parameter_count_per_edge_op():
    base = count_parameters(create_model("nasbench201", 3, 10, 32, arch=ALL_NONE))

    def one(op):
        return count_parameters(create_model("nasbench201", 3, 10, 32, arch=_arch([op] + ["none"] * 5)))

    assert one("nor_conv_3x3") - base == 5 * sum(9 * c * c + 2 * c for c in (16, 32, 64)) == 243_040
    assert one("nor_conv_1x1") - base == 5 * sum(c * c + 2 * c for c in (16, 32, 64)) == 28_000
    assert one("skip_connect") == one("avg_pool_3x3") == base


@pytest.mark.parametrize("C, N", [(16, 5), (8, 1)])
@pytest.mark.parametrize("shape", [(2, 3, 32, 32), (2, 1, 28, 28)])
def test_forward_shapes(C, N, shape):
    torch.manual_seed(0)
    model = create_model("nasbench201", shape[1], 10, shape[2:], arch=EXAMPLE, C=C, N=N)
    assert len(model.cells) == 3 * N + 2 and model.feature_dim == 4 * C
    x = torch.randn(shape)
    logits = model(x)
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    assert model.embed(x).shape == (2, 4 * C)
    model.eval()
    with torch.no_grad():
        assert model(x).shape == (2, 10)


def test_digits_size_and_state_dict_names_follow_autodl():
    model = create_model("nasbench201", 1, 10, 8, arch=EXAMPLE, C=8, N=1)
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    keys = set(model.state_dict())
    # InferCell's ``layers`` hold the six edges in string order; 0 is nor_conv_3x3 (1<-0).
    assert {"stem.0.weight", "cells.0.layers.0.op.1.weight", "cells.1.conv_a.op.1.weight",
            "cells.1.downsample.1.weight", "lastact.0.running_mean", "classifier.weight"} <= keys
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(bn.affine and bn.track_running_stats for bn in bns)


def _batch_norms(model):
    """(in a cell?, BatchNorm2d) for every BatchNorm of a TinyNetwork."""
    from ddlib.models.nasbench201 import InferCell

    cells = [m for m in model.modules() if isinstance(m, InferCell)]
    inside = {id(bn) for c in cells for bn in c.modules() if isinstance(bn, torch.nn.BatchNorm2d)}
    return [(id(bn) in inside, bn) for bn in model.modules() if isinstance(bn, torch.nn.BatchNorm2d)]


def test_dcbench_proxy_cells_have_non_affine_batch_norm():
    """DC-Bench's NAS proxy (justincui03/dc_benchmark darts-pt/nasbench201: ``TinyNetworkDarts(...,
    affine=False, track_running_stats=True)`` passes both to ``NAS201SearchCell``, whose ``OPS``
    build ``ReLUConvBN``'s ``BatchNorm2d(C_out, affine=affine, track_running_stats=...)``; the stem's
    ``BatchNorm2d(C)``, the ``ResNetBasicblock(C_prev, C_curr, 2)`` reductions and ``lastact`` use the
    default, affine): ``cell_affine=False`` builds exactly that split."""
    model = create_model("nasbench201", 3, 10, 32, arch=ALL_CONV3, C=16, N=1, cell_affine=False)
    norms = _batch_norms(model)
    assert sum(inside for inside, _ in norms) == 3 * 6  # 3 cells x 6 nor_conv_3x3 edges, one BN each
    for inside, bn in norms:
        assert bn.track_running_stats and bn.affine is (not inside)
        assert (bn.weight is None) is inside
    assert "cell_affine=False" in repr(model)
    # NAS-Bench-201's own networks (the ground truth) stay affine everywhere
    assert all(bn.affine for _, bn in _batch_norms(create_model("nasbench201", 3, 10, 32, arch=ALL_CONV3, N=1)))
    with pytest.raises(ValueError, match="cell_affine"):
        create_model("nasbench201", 3, 10, 32, arch=ALL_CONV3, cell_affine="no")


def test_all_none_cells_still_run():
    torch.manual_seed(0)
    model = create_model("nasbench201", 3, 10, 32, arch=ALL_NONE, C=8, N=1)
    a, b = torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32) * 3
    out = model(a)  # training mode: BN of an all-zero map is 0, never NaN
    assert torch.isfinite(out).all()
    out.sum().backward()  # gradients reach the residual blocks and the head
    assert model.classifier.weight.grad is not None
    model.eval()
    with torch.no_grad():
        ya, yb = model(a), model(b)
    # The first cell outputs zeros, so only the residual blocks' (input-independent) path is left.
    assert torch.isfinite(ya).all() and torch.equal(ya, yb)
    assert torch.equal(ya[0], ya[1])


def test_tiny_network_direct_and_arch_canonical():
    permuted = "|nor_conv_3x3~0|+|avg_pool_3x3~1|nor_conv_3x3~0|+|skip_connect~2|skip_connect~0|nor_conv_3x3~1|"
    net = TinyNetwork(permuted, channels=3, num_classes=5, C=4, N=1)
    assert net.arch == EXAMPLE and "C=4" in repr(net)


# --------------------------------------------------------------------------- ground truth

HEADER = ("CIFAR10TestAccuracy200Epochs,CIFAR100TestAccuracy200Epochs,ImageNetTestAccuracy200Epochs,"
          "ArchitectureString,UniqueString")
ROWS = [
    (93.5, 70.1, 44.0, BEST_C10, "u-best"),
    (85.9, 52.9, 26.6, EXAMPLE, "u-example"),
    (10.0, 1.0, 0.83, ALL_NONE, "u-zero"),
    (10.0, 1.0, 0.83, _arch(["none", "none", "none", "none", "none", "skip_connect"]), "u-zero"),
    (80.2, 50.3, 25.0, ALL_POOL, "u-pool"),
]


def _write(tmp_path, rows=ROWS, header=HEADER, name="gt.csv"):
    path = tmp_path / name
    lines = [header] + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_small_csv_and_pick_columns(tmp_path):
    path = _write(tmp_path)
    table = load_ground_truth(path)
    assert list(table.columns) == ["arch", "accuracy", "unique"]
    assert table.arch.tolist() == [r[3] for r in ROWS]
    assert table.accuracy.tolist() == [r[0] for r in ROWS]
    assert table.attrs["column"] == "CIFAR10TestAccuracy200Epochs" and table.attrs["source"] == str(path)
    assert load_ground_truth(path, dataset="cifar100").accuracy.tolist() == [r[1] for r in ROWS]
    assert load_ground_truth(path, dataset="imagenet16-120").accuracy.tolist() == [r[2] for r in ROWS]
    assert load_ground_truth(path, column="CIFAR100TestAccuracy200Epochs", dataset="cifar10").accuracy.iloc[0] == 70.1
    # Our own output layout reads back too.
    own = tmp_path / "own.csv"
    table.to_csv(own, index=False)
    assert load_ground_truth(own).equals(table)


def test_load_without_unique_column_and_with_spaces(tmp_path):
    path = _write(tmp_path, rows=[r[:4] for r in ROWS[:3]], header=", ".join(HEADER.split(",")[:4]))
    table = load_ground_truth(path, dataset="cifar10")
    assert list(table.columns) == ["arch", "accuracy"] and len(table) == 3


@pytest.mark.parametrize("mutate, message", [
    (lambda rows, header: (rows, header.replace("ArchitectureString", "Arch")), "no architecture column"),
    (lambda rows, header: (rows, header.replace("CIFAR10Test", "C10")), "no accuracy column"),
    (lambda rows, header: ([*rows[:2], (50.0, 1, 1, EXAMPLE.replace("avg_pool", "max_pool"), "x")], header),
     "row 3 (line 4)"),
    (lambda rows, header: ([*rows[:1], ("nan", 1, 1, EXAMPLE, "x")], header), "row 2 (line 3)"),
    (lambda rows, header: ([*rows[:1], ("", 1, 1, EXAMPLE, "x")], header), "not a number"),
    (lambda rows, header: ([*rows[:1], ("ninety", 1, 1, EXAMPLE, "x")], header), "not a number"),
    (lambda rows, header: ([*rows[:1], (101.0, 1, 1, EXAMPLE, "x")], header), "outside [0, 100]"),
    (lambda rows, header: ([*rows[:1], (-1.0, 1, 1, EXAMPLE, "x")], header), "outside [0, 100]"),
    (lambda rows, header: ([(0.9, 1, 1, BEST_C10, "a"), (0.8, 1, 1, EXAMPLE, "b")], header), "fractions"),
    (lambda rows, header: ([*rows, (50.0, 1, 1, EXAMPLE, "u-example")], header), "duplicate architecture"),
    (lambda rows, header: ([*rows[:1], (50.0, 1, 1, BEST_C10.replace("|+|skip_connect~0|nor_conv_3x3~1|",
                                                                      "|+|nor_conv_3x3~1|skip_connect~0|"), "x")],
                           header), "duplicate architecture"),
    (lambda rows, header: ([*rows[:1], (50.0, 1, 1, EXAMPLE, "")], header), "isomorphism class"),
    (lambda rows, header: ([], header), "no rows"),
])
def test_bad_csvs_raise_nas_error_naming_the_file(tmp_path, mutate, message):
    rows, header = mutate(list(ROWS), HEADER)
    path = _write(tmp_path, rows=rows, header=header)
    with pytest.raises(NasError) as info:
        load_ground_truth(path)
    assert str(path) in str(info.value) and message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unreadable_files_raise_nas_error(tmp_path):
    for path in (tmp_path / "missing.csv", tmp_path):
        with pytest.raises(NasError, match=str(path)):
            load_ground_truth(path)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(NasError, match="empty"):
        load_ground_truth(empty)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(NasError, match=str(binary)):
        load_ground_truth(binary)
    with pytest.raises(NasError, match="unknown dataset"):
        load_ground_truth(_write(tmp_path), dataset="mnist")


@pytest.fixture(scope="module")
def shared_table(shared_data):
    path = shared_data / "nasbench201-accuracy.csv"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return load_ground_truth(path, dataset="cifar10")


def test_shared_ground_truth(shared_table):
    table = shared_table
    assert len(table) == 15_625 and table.arch.is_unique
    assert table["unique"].nunique() == 6_466  # NAS-Bench-201's count of unique (non-isomorphic) cells
    assert 9.9 <= table.accuracy.min() <= 10.5 and 94.0 < table.accuracy.max() < 95.0  # percent
    by_arch = table.set_index("arch").accuracy
    assert 94.0 < by_arch[BEST_C10] < 94.5
    sample = sample_architectures(table, 50, seed=0, sampling="isomorphism")
    assert sample.arch.is_unique and sample["unique"].is_unique
    uniform = sample_architectures(table, 100, seed=0)  # DC-Bench's: uniform over the 15,625 strings
    assert uniform.arch.is_unique and len(uniform) == 100


# --------------------------------------------------------------------------- sampling


def _synthetic_table(n_classes=40, per_class=3):
    rng = np.random.default_rng(123)
    archs = [_arch(ops) for ops in (rng.choice(OP_NAMES, 6) for _ in range(5000))]
    archs = list(dict.fromkeys(archs))[: n_classes * per_class]
    return pd.DataFrame({"arch": archs, "accuracy": rng.uniform(10, 94, len(archs)),
                         "unique": [f"class{i // per_class}" for i in range(len(archs))]})


def test_sampling_is_deterministic_and_private():
    table = _synthetic_table()
    np.random.seed(1)
    torch.manual_seed(1)
    a = sample_architectures(table, 10, seed=7)
    np.random.seed(999)
    torch.manual_seed(999)
    state = np.random.get_state()[1].copy()
    b = sample_architectures(table, 10, seed=7)
    assert np.array_equal(np.random.get_state()[1], state)  # the global RNG is neither read nor advanced
    pd.testing.assert_frame_equal(a, b)
    c = sample_architectures(table.sample(frac=1.0, random_state=5), 10, seed=7)  # row order does not matter
    pd.testing.assert_frame_equal(a, c)
    assert sample_architectures(table, 10, seed=8).arch.tolist() != a.arch.tolist()


def test_sampling_by_isomorphism_class_draws_one_per_class():
    table = _synthetic_table(n_classes=40, per_class=3)
    sample = sample_architectures(table, 40, seed=0, sampling="isomorphism")
    assert len(sample) == 40 and sample.arch.is_unique and sample["unique"].is_unique
    assert set(sample.columns) == {"arch", "accuracy", "unique"}
    merged = sample.merge(table, on="arch", suffixes=("", "_t"))
    assert (merged.accuracy == merged.accuracy_t).all() and (merged["unique"] == merged["unique_t"]).all()
    with pytest.raises(ValueError, match="isomorphism classes"):
        sample_architectures(table, 41, seed=0, sampling="isomorphism")
    with pytest.raises(ValueError, match="UniqueString"):
        sample_architectures(table.drop(columns="unique"), 5, seed=0, sampling="isomorphism")
    with pytest.raises(ValueError, match="sampling must be one of"):
        sample_architectures(table, 5, seed=0, sampling="classes")


def test_uniform_sampling_is_dcbenchs_uniform_over_cell_strings():
    """DC-Bench draws each edge's op uniformly (uniform over the strings): a class of three strings
    is drawn three times as often as a class of one; isomorphism sampling draws them equally."""
    big = _synthetic_table(n_classes=10, per_class=3)  # 30 strings in 10 classes of 3
    small = _synthetic_table(n_classes=40, per_class=1).iloc[30:].assign(unique=lambda t: "single" + t.arch)
    table = pd.concat([big, small], ignore_index=True)  # 30 strings in classes of 3, 10 in classes of 1
    assert table.arch.is_unique
    in_big = lambda s: s["unique"].str.startswith("class").sum()  # noqa: E731
    uniform = sum(in_big(sample_architectures(table, 4, seed=s)) for s in range(400)) / 1600
    classes = sum(in_big(sample_architectures(table, 4, seed=s, sampling="isomorphism")) for s in range(400)) / 1600
    assert uniform == pytest.approx(30 / 40, abs=0.04) and classes == pytest.approx(10 / 20, abs=0.04)
    every = sample_architectures(table, 40, seed=0)
    assert every.arch.is_unique and len(every) == 40  # distinct, unlike DC-Bench's draws with replacement
    with pytest.raises(ValueError, match="41"):
        sample_architectures(table, 41, seed=0)
    assert sample_architectures(table.drop(columns="unique"), 30, seed=3).arch.is_unique
    with pytest.raises(ValueError):
        sample_architectures(table, 0, seed=0)


# --------------------------------------------------------------------------- rank correlation


def test_rank_correlation_hand_made():
    truth = [60.0, 70.0, 80.0, 90.0]
    perfect = rank_correlation([0.1, 0.2, 0.3, 0.4], truth)
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["kendall"] == pytest.approx(1.0)
    assert perfect["top1"] == 90.0 == perfect["best_possible"] and perfect["n"] == 4
    reverse = rank_correlation([4, 3, 2, 1], truth)
    assert reverse["spearman"] == pytest.approx(-1.0) and reverse["kendall"] == pytest.approx(-1.0)
    assert reverse["top1"] == 60.0 and reverse["best_possible"] == 90.0
    # One swapped pair of 4: 5 concordant, 1 discordant pair -> tau = 4/6; rho = 1 - 6*2/(4*15) = 0.8.
    swap = rank_correlation([1, 3, 2, 4], truth)
    assert swap["kendall"] == pytest.approx(2 / 3) and swap["spearman"] == pytest.approx(0.8)
    # Ties in the proxy: the first tied maximum in input order is the proxy's pick.
    tied = rank_correlation(np.array([0.3, 0.9, 0.9, 0.1]), pd.Series([50.0, 60.0, 70.0, 80.0]))
    assert tied["top1"] == 60.0 and tied["top1_index"] == 1 and tied["best_possible"] == 80.0
    # tau-b with ties, checked against the formula: (C - D) / sqrt((n0 - n1)(n0 - n2)).
    x, y = [1, 2, 2, 3], [1, 2, 3, 4]
    assert rank_correlation(x, y)["kendall"] == pytest.approx(5 / math.sqrt(5 * 6))


def test_rank_correlation_constant_and_bad_inputs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's ConstantInputWarning must not escape
        result = rank_correlation([0.5, 0.5, 0.5], [60.0, 70.0, 80.0])
    assert math.isnan(result["spearman"]) and math.isnan(result["kendall"])
    assert result["top1"] == 60.0 and result["best_possible"] == 80.0
    with pytest.raises(ValueError, match="at least 2"):
        rank_correlation([1.0], [2.0])
    with pytest.raises(ValueError, match="3 true"):
        rank_correlation([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="finite"):
        rank_correlation([1.0, float("nan")], [1.0, 2.0])


# --------------------------------------------------------------------------- smoke training


def test_smoke_training_two_architectures_on_digits():
    from ddlib.data.datasets import load_dataset
    from ddlib.engine.train import Recipe, train_and_test

    ds = load_dataset("digits")
    recipe = Recipe(epochs=2, batch_size=128)
    accuracies = []
    for arch in (EXAMPLE, "|nor_conv_1x1~0|+|skip_connect~0|avg_pool_3x3~1|+|none~0|nor_conv_3x3~1|skip_connect~2|"):
        (result,) = train_and_test("nasbench201", ds.train_images, ds.train_labels, ds.test_images,
                                       ds.test_labels, num_classes=10, mean=ds.mean, std=ds.std, recipe=recipe,
                                       seeds=[0], device="cpu", model_kwargs={"arch": arch, "C": 8, "N": 1})
        assert len(result.epoch_losses) == 2 and all(math.isfinite(v) for v in result.epoch_losses)
        assert math.isfinite(result.test_accuracy) and 0.0 <= result.test_accuracy <= 1.0
        accuracies.append(result.test_accuracy * 100)
    result = rank_correlation(accuracies, [85.9, 80.0])
    assert result["n"] == 2 and result["best_possible"] == 85.9
