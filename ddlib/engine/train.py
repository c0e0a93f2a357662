"""The one training loop every protocol uses.

The training set lives on the device as a tensor (no DataLoader in the hot loop, as in
airbench); each step indexes a shuffled batch, converts it to float pixels, normalises it,
applies the augmentation hook, and takes an optimiser step on the loss hook. Callers pass a
list of seeds and get one result per seed, so a later version can batch the seeds into one
vectorised pass without changing them.

Determinism: a seed fixes the model initialisation (``torch.manual_seed``), the shuffling
and the augmentation draws (private generators). On the CPU the same config and seed give
the same accuracy bit for bit; on CUDA, cuDNN may differ in the last digits.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from ddlib.engine.device import generator, resolve_device, synchronize
from ddlib.models import create_model

__all__ = ["Recipe", "SeedResult", "train_and_evaluate", "evaluate", "Normalize", "cross_entropy_loss", "Objective",
           "NonFiniteLossError"]

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("step", "cosine", "cosine_half", "none")

# augment(x_normalised, targets, generator) -> (x, targets): label-mixing ops (Mixup, CutMix) change
# the targets too; targets are int labels or per-image target rows.
# loss(logits, targets, inputs) -> scalar: inputs are the augmented batch (teacher relabelling needs it).
AugmentHook = Callable[[torch.Tensor, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
LossHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# objective(model, x, targets, generator) -> scalar: the whole per-batch objective, for training that
# needs the model itself (adversarial training crafts examples against it). Default: loss(model(x), y, x).
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class Recipe:
    """How a model is trained on a (distilled) set. Defaults are the DC/DSA/DM evaluation recipe,
    with 300 epochs (DC-Bench's no-augmentation setting) instead of 1000."""

    epochs: int = 300
    batch_size: int = 256
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    # "step": lr x 0.1 for the second half (DC); "cosine": to lr_min (SRe2L: 0); "cosine_half": the quarter-period
    # cosine 0.5 * (1 + cos(pi * epoch / epochs / 2)) that ends at half the lr (RDED, EDC); "none"
    scheduler: str = "step"
    eval_batch_size: int = 1024
    lr_min: float = 0.0  # the cosine schedule's final lr (DC-Bench's NAS proxy: 0.001)
    grad_clip: float | None = None  # clip the gradient norm to this (DC-Bench's NAS proxy: 5); None = never

    def __post_init__(self):
        problems = []
        if not isinstance(self.epochs, int) or self.epochs < 1:
            problems.append(f"epochs must be a positive integer, got {self.epochs!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            problems.append(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not isinstance(self.eval_batch_size, int) or self.eval_batch_size < 1:
            problems.append(f"eval_batch_size must be a positive integer, got {self.eval_batch_size!r}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.scheduler not in SCHEDULERS:
            problems.append(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        for name in ("lr", "momentum", "weight_decay", "lr_min"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                problems.append(f"{name} must be a finite non-negative number, got {value!r}")
            elif name == "lr" and value == 0:
                problems.append("lr must be positive, got 0")
        clip = self.grad_clip
        if clip is not None and (not isinstance(clip, (int, float)) or isinstance(clip, bool) or not math.isfinite(clip)
                                 or clip <= 0):
            problems.append(f"grad_clip must be null or a positive number, got {clip!r}")
        if problems:
            raise ValueError("bad recipe: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, values: dict | None, base: "Recipe | None" = None) -> "Recipe":
        """Build from a params dict, naming any unknown key (a typo must not silently use a default)."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown recipe key(s) {unknown}; known: {sorted(known)}")
        merged = {**(asdict(base) if base else {}), **values}
        for name in ("lr", "momentum", "weight_decay", "lr_min"):  # YAML reads 1e-3 as a string
            if isinstance(merged.get(name), str):
                try:
                    merged[name] = float(merged[name])
                except ValueError:
                    raise ValueError(f"bad recipe: {name} must be a number, got {merged[name]!r}") from None
        return cls(**merged)

    def to_dict(self) -> dict:
        """All fields, except ``lr_min`` and ``grad_clip`` at their defaults: they joined later, and
        this dict is part of every evaluation's reuse key, so earlier keys stay valid."""
        out = asdict(self)
        for name in ("lr_min", "grad_clip"):
            if out[name] == _LATER_DEFAULTS[name]:
                del out[name]
        return out


_LATER_DEFAULTS = {"lr_min": 0.0, "grad_clip": None}


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf: the model is garbage, so there is no result to report."""


# Epochs between checks that the loss is still finite (each check waits for the device).
FINITE_CHECK_EVERY = 10


@dataclass
class SeedResult:
    seed: int
    test_accuracy: float  # fraction in [0, 1]
    epoch_losses: list[float]
    train_seconds: float
    eval_seconds: float
    model: nn.Module | None = field(default=None, repr=False)
    confusion: list[list[int]] | None = field(default=None, repr=False)  # [true class][predicted class] test counts


class Normalize(nn.Module):
    """Per-channel (x - mean) / std on tensors already on the device."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def as_pixels(x: torch.Tensor) -> torch.Tensor:
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with hard (int) or soft (probability rows) targets."""
    return F.cross_entropy(logits, targets)


def _optimizer(recipe: Recipe, params) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


def _scheduler(recipe: Recipe, optimizer) -> torch.optim.lr_scheduler.LRScheduler | None:
    if recipe.scheduler == "step":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[recipe.epochs // 2], gamma=0.1)
    if recipe.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=recipe.epochs, eta_min=recipe.lr_min)
    if recipe.scheduler == "cosine_half":  # RDED / EDC (DD-Ranking's 'cosine'): ends at lr / 2
        epochs = recipe.epochs
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.5 * (1.0 + math.cos(math.pi * e / epochs / 2)))
    return None


@torch.inference_mode()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalize: nn.Module, batch_size: int = 1024) -> float:
    """Top-1 accuracy (a fraction) of ``model`` on pixel ``images``, in large batches; ``normalize``
    maps pixels to the model's input (normalisation, then any preprocessing)."""
    device = next(model.parameters()).device
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for i in range(0, len(labels), batch_size):
        x = normalize(as_pixels(images[i : i + batch_size].to(device, non_blocking=True)))
        correct += (model(x).argmax(1) == labels[i : i + batch_size].to(device)).sum()
    return correct.item() / max(1, len(labels))


@torch.inference_mode()
def evaluate_confusion(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalize: nn.Module,
                       num_classes: int, batch_size: int = 1024) -> torch.Tensor:
    """Test counts per (true class, predicted class), on the CPU: the accuracy is its trace over
    the number of images, and the matrix is what a report shows of the model's mistakes."""
    device = next(model.parameters()).device
    model.eval()
    counts = torch.zeros(num_classes * num_classes, dtype=torch.long, device=device)
    for i in range(0, len(labels), batch_size):
        x = normalize(as_pixels(images[i : i + batch_size].to(device, non_blocking=True)))
        pairs = labels[i : i + batch_size].to(device) * num_classes + model(x).argmax(1)
        counts += torch.bincount(pairs, minlength=num_classes * num_classes)
    return counts.view(num_classes, num_classes).cpu()


def train_and_evaluate(
    model_name: str,
    train_images: torch.Tensor,
    train_targets: torch.Tensor,
    test_images: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    num_classes: int,
    mean: Sequence[float],
    std: Sequence[float],
    recipe: Recipe,
    seeds: Sequence[int],
    augment: AugmentHook | None = None,
    loss: LossHook | None = None,
    objective: Objective | None = None,
    preprocess: nn.Module | None = None,
    device: str | torch.device = "auto",
    model_kwargs: dict | None = None,
    keep_models: bool = False,
    progress: bool = False,
    desc: str = "train",
) -> list[SeedResult]:
    """Train one model per seed on (``train_images``, ``train_targets``) and test each.

    ``train_images`` are pixels (uint8 or float in [0, 1]); ``train_targets`` are int class
    labels or per-image target rows (soft labels). ``preprocess`` (e.g. ZCA whitening) runs after
    normalisation on training and test batches alike. ``objective`` replaces ``loss(model(x), y, x)``
    as the per-batch objective (adversarial training); it may not be combined with ``loss``.
    Returns one :class:`SeedResult` per seed.
    """
    if len(train_images) != len(train_targets):
        raise ValueError(f"{len(train_images)} training images but {len(train_targets)} targets")
    if len(train_images) == 0:
        raise ValueError("empty training set")
    if objective is not None and loss is not None:
        raise ValueError("give either a loss hook or an objective, not both")
    dev = resolve_device(device)
    loss = loss or cross_entropy_loss
    normalize = Normalize(mean, std).to(dev)
    if preprocess is not None:
        normalize = nn.Sequential(normalize, preprocess.to(dev))
    images = train_images.to(dev)
    targets = train_targets.to(dev)
    n = len(images)
    channels, height, width = images.shape[1:]
    results = []
    bar = tqdm(total=len(seeds) * recipe.epochs, desc=desc, disable=not progress, leave=False)
    for seed in seeds:
        torch.manual_seed(seed)
        model = create_model(model_name, channels, num_classes, (height, width), **(model_kwargs or {})).to(dev)
        order_gen = generator(seed)  # shuffling: CPU generator, identical on every device
        aug_gen = generator(seed + 1_000_003, dev)
        optimizer = _optimizer(recipe, model.parameters())
        scheduler = _scheduler(recipe, optimizer)
        epoch_losses = []
        synchronize(dev)
        start = time.perf_counter()
        model.train()
        for epoch in range(recipe.epochs):
            order = torch.randperm(n, generator=order_gen).to(dev)
            total = torch.zeros((), device=dev)
            for i in range(0, n, recipe.batch_size):
                idx = order[i : i + recipe.batch_size]
                x, y = normalize(as_pixels(images[idx])), targets[idx]
                if augment is not None:
                    x, y = augment(x, y, aug_gen)
                batch_loss = loss(model(x), y, x) if objective is None else objective(model, x, y, aug_gen)
                optimizer.zero_grad(set_to_none=True)
                batch_loss.backward()
                if recipe.grad_clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
                optimizer.step()
                total += batch_loss.detach() * len(idx)
            if scheduler is not None:
                scheduler.step()
            epoch_losses.append(total)
            bar.update(1)
            if (epoch + 1) % FINITE_CHECK_EVERY == 0 or epoch + 1 == recipe.epochs:
                _check_finite(epoch_losses, desc, seed, recipe)
        synchronize(dev)
        train_seconds = time.perf_counter() - start
        epoch_losses = (torch.stack(epoch_losses) / n).tolist()  # one sync per seed, not per step
        start = time.perf_counter()
        confusion = evaluate_confusion(model, test_images, test_labels, normalize, num_classes, recipe.eval_batch_size)
        accuracy = confusion.trace().item() / max(1, len(test_labels))  # the same fraction evaluate() gives
        synchronize(dev)
        eval_seconds = time.perf_counter() - start
        results.append(SeedResult(seed, accuracy, epoch_losses, train_seconds, eval_seconds,
                                  model if keep_models else None, confusion.tolist()))
    bar.close()
    return results


def _check_finite(epoch_losses: list[torch.Tensor], desc: str, seed: int, recipe: Recipe) -> None:
    """Stop a training whose loss is no longer finite, naming the evaluation and the first bad epoch."""
    losses = torch.stack(epoch_losses)
    bad = (~torch.isfinite(losses)).nonzero()
    if len(bad):
        epoch = int(bad[0]) + 1
        raise NonFiniteLossError(f"{desc}: training loss became {losses[epoch - 1].item()} at epoch {epoch} of "
                                 f"{recipe.epochs} (seed {seed}, lr {recipe.lr}): stopped, no result recorded")
