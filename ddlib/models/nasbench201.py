"""NAS-Bench-201's search space in plain PyTorch: ``create_model("nasbench201", ..., arch=..., C=16, N=5)``.

A re-implementation of the networks NAS-Bench-201 (Dong & Yang, ICLR 2020) trained, following
D-X-Y/AutoDL-Projects (``models/cell_operations.py``: OPS, ReLUConvBN, POOLING, Zero, Identity,
FactorizedReduce, ResNetBasicblock; ``models/cell_infers/cells.py``: InferCell;
``models/cell_infers/tiny_network.py``: TinyNetwork). Module names follow theirs (``stem``,
``cells.<i>.layers.<j>.op``, ``conv_a``/``conv_b``/``downsample``, ``lastact``, ``classifier``),
so the state-dict keys of the two implementations line up.

The cell is a DAG of 4 nodes: node 0 is the cell input, node j = sum over i < j of
op_{j,i}(node i), and node 3 is the output. Each of the 6 edges carries one of 5 operations:

``none``           zeros (the edge is absent)
``skip_connect``   identity (FactorizedReduce where channels or stride change; never in TinyNetwork)
``nor_conv_1x1``   ReLU -> conv1x1 (no bias) -> BN
``nor_conv_3x3``   ReLU -> conv3x3 (no bias) -> BN
``avg_pool_3x3``   3x3 average pool, stride 1, padding 1, ``count_include_pad=False``

which gives 5**6 = 15,625 architectures, written as
``|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|``
(``op~i`` is the edge from node i; the three ``+``-separated groups are nodes 1, 2, 3).

TinyNetwork: stem conv3x3(in_channels -> C, no bias) + BN; N cells at C; ResNetBasicblock(C -> 2C,
stride 2); N cells at 2C; ResNetBasicblock(2C -> 4C, stride 2); N cells at 4C; BN + ReLU; global
average pool; linear classifier. Every BatchNorm keeps running statistics and is affine (InferCell's
and ResNetBasicblock's defaults, what NAS-Bench-201 trained), except that ``cell_affine=False``
makes the BatchNorms inside the cells non-affine: DC-Bench's NAS proxy (justincui03/dc_benchmark
``darts-pt/nasbench201``: ``TinyNetworkDarts`` builds its ``NAS201SearchCell`` ops with
``affine=False, track_running_stats=True``; stem, reduction blocks and ``lastact`` stay affine);
the nas protocol builds its proxies so. Weights keep PyTorch's default initialisation, as in
AutoDL-Projects. NAS-Bench-201 trained C=16, N=5 (15 cells); DC-Bench's NAS proxy uses a reduced
network (N=1, 3 cells).

Parameter counts match NAS-Bench-201's published ones exactly (its "params" field is in MB, meaning
millions of parameters, 1 MB = 1e6; BN running statistics are buffers and not counted). On CIFAR-10
(3x32x32, 10 classes, C=16, N=5): 0.073306 MB for any cell without convolutions (the smallest),
1.531546 MB for the all-``nor_conv_3x3`` cell (the largest), the range NAS-Bench-201-v1_1-096897's
``cifar10-valid`` entries span (CIFAR-100: 0.079156 to 1.537396; ImageNet16-120: 0.080456 to
1.538696); and 0.802426 MB for ``|skip_connect~0|+|none~0|nor_conv_3x3~1|+|avg_pool_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|``,
the ``get_cost_info(..., 'cifar10', hp='12')`` value quoted in D-X-Y/NATS-Bench issue #36. Each
``nor_conv_3x3`` edge adds 243,040 parameters and each ``nor_conv_1x1`` edge 28,000 (5 cells at each
of 16, 32, 64 channels).

Input sizes: each residual reduction adds a stride-2 conv3x3 branch to a 2x2 average-pool shortcut,
which agree only on even sides, so both sides must be divisible by 4 (32x32 CIFAR, 28x28 MNIST,
16x16 ImageNet16, 8x8 digits all are). The stem takes any number of input channels (1 for MNIST
and digits). ``forward`` takes normalised images and returns logits; ``embed`` returns the pooled
``feature_dim`` = 4C features before the classifier.
"""

from __future__ import annotations

import re
from typing import Sequence

import torch
import torch.nn as nn

from ddlib.models._registry import register_model

__all__ = ["OPS", "OP_NAMES", "parse_arch", "format_arch", "TinyNetwork", "InferCell", "ResNetBasicblock",
           "ReLUConvBN", "Pooling", "Zero", "Identity", "FactorizedReduce", "NUM_NODES"]

OP_NAMES = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
NUM_NODES = 4  # node 0 (input) and nodes 1..3; node 3 is the cell output

Arch = tuple[tuple[tuple[str, int], ...], ...]

_EDGE = re.compile(r"^([A-Za-z0-9_]+)~([0-9]+)$")


# --------------------------------------------------------------------------- architecture strings


def parse_arch(arch: str) -> Arch:
    """``"|op~0|+|op~0|op~1|+|op~0|op~1|op~2|"`` -> ``((("op", 0),), (("op", 0), ("op", 1)), (...))``.

    Returns one tuple per node 1..3, each holding that node's ``(op, input_node)`` edges sorted by
    input node. Node j must have exactly one edge from each i < j (in any order; the result is
    canonical), and every op must be one of :data:`OP_NAMES`. Anything else raises ``ValueError``
    naming the string.
    """
    if not isinstance(arch, str):
        raise ValueError(f"architecture must be a string, got {type(arch).__name__} {arch!r}")
    text = arch.strip()
    groups = text.split("+")
    if len(groups) != NUM_NODES - 1:
        raise ValueError(f"bad architecture string {arch!r}: expected {NUM_NODES - 1} '+'-separated nodes, "
                         f"got {len(groups)}")
    nodes = []
    for j, group in enumerate(groups, start=1):
        if len(group) < 2 or not (group.startswith("|") and group.endswith("|")):
            raise ValueError(f"bad architecture string {arch!r}: node {j} {group!r} must look like '|op~0|...|'")
        edges = []
        for token in group[1:-1].split("|"):
            match = _EDGE.match(token)
            if match is None:
                raise ValueError(f"bad architecture string {arch!r}: node {j} has edge {token!r}, expected 'op~i'")
            op, source = match.group(1), int(match.group(2))
            if op not in OP_NAMES:
                raise ValueError(f"bad architecture string {arch!r}: unknown operation {op!r} "
                                 f"(known: {', '.join(OP_NAMES)})")
            edges.append((op, source))
        sources = sorted(source for _, source in edges)
        if sources != list(range(j)):
            raise ValueError(f"bad architecture string {arch!r}: node {j} must have one edge from each of "
                             f"nodes {list(range(j))}, got inputs {[s for _, s in edges]}")
        nodes.append(tuple(sorted(edges, key=lambda edge: edge[1])))
    return tuple(nodes)


def format_arch(nodes: Sequence[Sequence[tuple[str, int]]]) -> str:
    """The inverse of :func:`parse_arch`: ``format_arch(parse_arch(s)) == s`` for canonical strings.

    Validates its input the same way (via a round trip through :func:`parse_arch`).
    """
    try:
        text = "+".join("|" + "|".join(f"{op}~{int(source)}" for op, source in node) + "|" for node in nodes)
    except (TypeError, ValueError) as error:
        raise ValueError(f"bad architecture {nodes!r}: expected 3 sequences of (op, input_node) pairs") from error
    return "+".join("|" + "|".join(f"{op}~{i}" for op, i in node) + "|" for node in parse_arch(text))


# --------------------------------------------------------------------------- operations (cell_operations.py)


class ReLUConvBN(nn.Module):
    """AutoDL-Projects' ``ReLUConvBN``: ReLU, conv (no bias), BatchNorm; the ``nor_conv_1x1``/``3x3`` cell operations."""
    def __init__(self, C_in, C_out, kernel_size, stride, padding, dilation, affine=True, track_running_stats=True):
        super().__init__()
        self.op = nn.Sequential(
            nn.ReLU(inplace=False),
            nn.Conv2d(C_in, C_out, kernel_size, stride=stride, padding=padding, dilation=dilation, bias=False),
            nn.BatchNorm2d(C_out, affine=affine, track_running_stats=track_running_stats),
        )

    def forward(self, x):
        return self.op(x)


class Pooling(nn.Module):
    """AutoDL-Projects' ``POOLING`` (average mode): a ReLUConvBN 1x1 first only when channels change."""

    def __init__(self, C_in, C_out, stride, affine=True, track_running_stats=True):
        super().__init__()
        self.preprocess = None if C_in == C_out else ReLUConvBN(C_in, C_out, 1, 1, 0, 1, affine, track_running_stats)
        self.op = nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)

    def forward(self, x):
        return self.op(x if self.preprocess is None else self.preprocess(x))


class Identity(nn.Module):
    """The ``skip_connect`` cell operation where channels and stride stay the same."""
    def forward(self, x):
        return x


class Zero(nn.Module):
    """The ``none`` cell operation: zeros of the output's shape (an edge that passes nothing on)."""
    def __init__(self, C_in, C_out, stride):
        super().__init__()
        self.C_in, self.C_out, self.stride = C_in, C_out, stride
        self.is_zero = True

    def forward(self, x):
        if self.C_in == self.C_out:
            return x.mul(0.0) if self.stride == 1 else x[:, :, :: self.stride, :: self.stride].mul(0.0)
        shape = list(x.shape)
        shape[1] = self.C_out
        return x.new_zeros(shape)

    def extra_repr(self):
        return f"C_in={self.C_in}, C_out={self.C_out}, stride={self.stride}"


class FactorizedReduce(nn.Module):
    """``skip_connect`` where channels or stride change (never inside TinyNetwork's cells)."""

    def __init__(self, C_in, C_out, stride, affine=True, track_running_stats=True):
        super().__init__()
        self.stride = stride
        self.relu = nn.ReLU(inplace=False)
        if stride == 2:
            halves = [C_out // 2, C_out - C_out // 2]
            self.convs = nn.ModuleList(nn.Conv2d(C_in, h, 1, stride=2, padding=0, bias=False) for h in halves)
            self.pad = nn.ConstantPad2d((0, 1, 0, 1), 0)
        elif stride == 1:
            self.conv = nn.Conv2d(C_in, C_out, 1, stride=1, padding=0, bias=False)
        else:
            raise ValueError(f"invalid stride {stride}")
        self.bn = nn.BatchNorm2d(C_out, affine=affine, track_running_stats=track_running_stats)

    def forward(self, x):
        if self.stride == 2:
            x = self.relu(x)
            y = self.pad(x)
            out = torch.cat([self.convs[0](x), self.convs[1](y[:, :, 1:, 1:])], dim=1)
        else:
            out = self.conv(x)
        return self.bn(out)


def _skip(C_in, C_out, stride, affine, track):
    return Identity() if stride == 1 and C_in == C_out else FactorizedReduce(C_in, C_out, stride, affine, track)


OPS = {
    "none": lambda C_in, C_out, stride, affine, track: Zero(C_in, C_out, stride),
    "skip_connect": _skip,
    "nor_conv_1x1": lambda C_in, C_out, stride, affine, track: ReLUConvBN(C_in, C_out, 1, stride, 0, 1, affine, track),
    "nor_conv_3x3": lambda C_in, C_out, stride, affine, track: ReLUConvBN(C_in, C_out, 3, stride, 1, 1, affine, track),
    "avg_pool_3x3": lambda C_in, C_out, stride, affine, track: Pooling(C_in, C_out, stride, affine, track),
}
assert tuple(OPS) == OP_NAMES


class ResNetBasicblock(nn.Module):
    """The reduction block between stages: two ReLUConvBN 3x3 plus an avgpool2 -> conv1x1 shortcut."""

    def __init__(self, inplanes, planes, stride, affine=True, track_running_stats=True):
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"invalid stride {stride}")
        self.conv_a = ReLUConvBN(inplanes, planes, 3, stride, 1, 1, affine, track_running_stats)
        self.conv_b = ReLUConvBN(planes, planes, 3, 1, 1, 1, affine, track_running_stats)
        if stride == 2:
            self.downsample = nn.Sequential(
                nn.AvgPool2d(kernel_size=2, stride=2, padding=0),
                nn.Conv2d(inplanes, planes, kernel_size=1, stride=1, padding=0, bias=False),
            )
        elif inplanes != planes:
            self.downsample = ReLUConvBN(inplanes, planes, 1, 1, 0, 1, affine, track_running_stats)
        else:
            self.downsample = None
        self.in_dim, self.out_dim, self.stride = inplanes, planes, stride

    def forward(self, x):
        residual = x if self.downsample is None else self.downsample(x)
        return residual + self.conv_b(self.conv_a(x))


# --------------------------------------------------------------------------- cell and network


class InferCell(nn.Module):
    """One NAS-Bench-201 cell: ``layers`` holds the 6 edge ops in string order (node 1's, 2's, 3's)."""

    def __init__(self, arch: Arch, C_in: int, C_out: int, stride: int = 1, affine=True, track_running_stats=True):
        super().__init__()
        self.layers = nn.ModuleList()
        self.node_IX: list[list[int]] = []  # per node: indices into self.layers
        self.node_IN: list[list[int]] = []  # per node: the input node of each of those layers
        for node in arch:
            index, inputs = [], []
            for op, source in node:
                if source == 0:
                    layer = OPS[op](C_in, C_out, stride, affine, track_running_stats)
                else:
                    layer = OPS[op](C_out, C_out, 1, affine, track_running_stats)
                index.append(len(self.layers))
                inputs.append(source)
                self.layers.append(layer)
            self.node_IX.append(index)
            self.node_IN.append(inputs)
        self.in_dim, self.out_dim = C_in, C_out

    def forward(self, x):
        nodes = [x]
        for index, inputs in zip(self.node_IX, self.node_IN):
            nodes.append(sum(self.layers[layer](nodes[i]) for layer, i in zip(index, inputs)))
        return nodes[-1]


class TinyNetwork(nn.Module):
    """NAS-Bench-201's macro skeleton around a cell ``arch``; ``forward`` gives logits, ``embed`` features."""

    def __init__(self, arch: str, channels: int = 3, num_classes: int = 10, C: int = 16, N: int = 5,
                 cell_affine: bool = True):
        super().__init__()
        for name, value in (("C", C), ("N", N), ("channels", channels), ("num_classes", num_classes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"nasbench201: {name} must be a positive integer, got {value!r}")
        if not isinstance(cell_affine, bool):
            raise ValueError(f"nasbench201: cell_affine must be true or false, got {cell_affine!r}")
        genotype = parse_arch(arch)
        self.arch = format_arch(genotype)
        self.C, self.N, self.cell_affine = C, N, cell_affine
        self.stem = nn.Sequential(nn.Conv2d(channels, C, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(C))
        layer_channels = [C] * N + [C * 2] + [C * 2] * N + [C * 4] + [C * 4] * N
        layer_reductions = [False] * N + [True] + [False] * N + [True] + [False] * N
        C_prev = C
        self.cells = nn.ModuleList()
        for C_curr, reduction in zip(layer_channels, layer_reductions):
            cell = (ResNetBasicblock(C_prev, C_curr, 2) if reduction
                    else InferCell(genotype, C_prev, C_curr, 1, affine=cell_affine))
            self.cells.append(cell)
            C_prev = cell.out_dim
        self.lastact = nn.Sequential(nn.BatchNorm2d(C_prev), nn.ReLU(inplace=True))
        self.global_pooling = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(C_prev, num_classes)
        self.feature_dim = C_prev

    def extra_repr(self):
        return f"arch={self.arch}, C={self.C}, N={self.N}" + ("" if self.cell_affine else ", cell_affine=False")

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The features the classifier reads (K-Center selection and Distribution Matching use them)."""
        feature = self.stem(x)
        for cell in self.cells:
            feature = cell(feature)
        return self.global_pooling(self.lastact(feature)).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))


@register_model("nasbench201")
def nasbench201(channels, num_classes, image_size, arch: str | None = None, C: int = 16, N: int = 5,
                cell_affine: bool = True):
    """NAS-Bench-201 TinyNetwork for cell ``arch`` (required); C=16, N=5 is the benchmark's network,
    N=1 with ``cell_affine=False`` DC-Bench's reduced search proxy. Image sides must be divisible by 4."""
    if arch is None:
        raise ValueError("model 'nasbench201' needs an architecture: model_kwargs={'arch': '|op~0|+|op~0|op~1|+...'}")
    h, w = image_size
    if h % 4 or w % 4:
        raise ValueError(f"nasbench201 needs image sides divisible by 4 (two stride-2 residual blocks whose "
                         f"average-pool shortcut and strided conv must agree), got {h}x{w}")
    return TinyNetwork(arch, channels=channels, num_classes=num_classes, C=C, N=N, cell_affine=cell_affine)
