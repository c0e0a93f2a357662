"""DC's LeNet (``networks.py`` of VICO-UoE/DatasetCondensation; DC-Bench's ``networks/lenet.py``).

conv5x5(6) -> ReLU -> maxpool2 -> conv5x5(16) -> ReLU -> maxpool2 -> fc 120 -> ReLU -> fc 84 ->
ReLU -> fc classes. The first conv pads by 0, or by 2 for 28x28 grayscale (DC's MNIST padding: the
map is then 28x28, as for CIFAR). DC hard-codes ``nn.Linear(16 * 5 * 5, 120)``; we compute the
flattened size from the image size (the same 16*5*5 at 32x32 and 28x28, 16*13*13 at 64x64).
``embed`` is the 84-dimensional input of the last linear layer, as for ``mlp``; names
(``features``, ``fc_1``..``fc_3``) are DC's, so DC state dicts load as they are.

Parameters on CIFAR-10 (3x32x32, 10 classes), by hand from DC's definition:
    conv1  3*6*5*5 + 6        =    456
    conv2  6*16*5*5 + 16      =  2,416
    fc_1   (16*5*5)*120 + 120 = 48,120
    fc_2   120*84 + 84        = 10,164
    fc_3   84*10 + 10         =    850
    total                       62,006
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ddlib.models._registry import register_model
from ddlib.models._dc import check_map, first_padding


class LeNet(nn.Module):
    """DC's LeNet (``lenet``), its layer names kept so DC state dicts load."""
    def __init__(self, channels, num_classes, image_size):
        super().__init__()
        pad = first_padding(channels, image_size, default=0, mnist=2)
        h, w = image_size
        h, w = (h + 2 * pad - 4) // 2, (w + 2 * pad - 4) // 2
        check_map("lenet", image_size, h, w, "after conv1")
        h, w = (h - 4) // 2, (w - 4) // 2
        check_map("lenet", image_size, h, w, "after conv2 (needs at least 16x16 inputs)")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, kernel_size=5, padding=pad),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.fc_1 = nn.Linear(16 * h * w, 120)
        self.fc_2 = nn.Linear(120, 84)
        self.fc_3 = nn.Linear(84, num_classes)
        self.feature_dim = 84

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The features the classifier reads (K-Center selection and Distribution Matching use them)."""
        x = self.features(x).flatten(1)
        return torch.relu(self.fc_2(torch.relu(self.fc_1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_3(self.embed(x))


@register_model("lenet")
def lenet(channels, num_classes, image_size):
    """DC's LeNet."""
    return LeNet(channels, num_classes, image_size)
