"""The recipe: how a model is trained on a (distilled) set, and the optimizer and schedule it builds.

A recipe is part of every evaluation's reuse key (:meth:`Recipe.to_dict`): fields that joined later
are keyed only away from their defaults (:data:`ddlib.specs.keys.LATER_RECIPE_DEFAULTS`), so every key
made before they existed stays valid. The loop that runs it is :mod:`ddlib.engine.train`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch

from ddlib.engine.device import PRECISIONS
from ddlib.specs.keys import LATER_RECIPE_DEFAULTS, without_later_defaults

__all__ = ["Recipe", "epochs_trained", "optimizer_and_scheduler", "OPTIMIZERS", "SCHEDULERS"]

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("step", "dc_step", "cosine", "cosine_half", "none")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1  # YAML's `true` is an int


@dataclass(frozen=True)
class Recipe:
    """How a model is trained on a (distilled) set. Defaults are the DC/DSA/DM evaluation recipe's
    hyper-parameters, with 300 epochs (DC-Bench's no-augmentation setting) instead of 1000, under
    ``scheduler: step``; DC's own loop, one epoch more and a momentum reset at the drop, is
    ``scheduler: dc_step`` (the DC-Bench protocols' default). ``step`` stays the default so that
    every recipe key made before ``dc_step`` existed keeps its meaning."""

    epochs: int = 300
    batch_size: int = 256
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    # "step": lr x 0.1 for the second half (epochs // 2 each); "dc_step": DC's and DC-Bench's own loop
    # (evaluate_synset): epochs + 1 epochs, lr x 0.1 with a new optimizer (momentum reset) after epoch
    # epochs // 2 + 1 (0-based), see _DCStep; "cosine": to lr_min (SRe2L: 0); "cosine_half": the quarter-period
    # cosine 0.5 * (1 + cos(pi * epoch / epochs / 2)) that ends at half the lr (RDED, EDC); "none"
    scheduler: str = "step"
    eval_batch_size: int = 1024  # test-pass batch on the CPU; on CUDA the largest that fits
    lr_min: float = 0.0  # the cosine schedule's final lr (DC-Bench's NAS proxy: 0.001)
    grad_clip: float | None = None  # clip the gradient norm to this (DC-Bench's NAS proxy: 5); None = never
    # How the arithmetic runs (not what is trained). In the recipe's key only where they change the
    # arithmetic (not fp32, not false), so every key made before these switches existed stays valid.
    # "auto": bf16 where the device computes it natively, else fp32 (resolve it before keying).
    precision: str = "auto"  # "auto" (bf16 where native, else fp32); "fp32"; "bf16" autocast
    channels_last: bool = False  # channels-last memory format for the model and its inputs
    compile: bool = False  # torch.compile the training forward (and backward); both modes

    def __post_init__(self):
        problems = []
        if not _positive_int(self.epochs):
            problems.append(f"epochs must be a positive integer, got {self.epochs!r}")
        if not _positive_int(self.batch_size):
            problems.append(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not _positive_int(self.eval_batch_size):
            problems.append(f"eval_batch_size must be a positive integer, got {self.eval_batch_size!r}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.scheduler not in SCHEDULERS:
            problems.append(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        for name in ("channels_last", "compile"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be true or false, got {getattr(self, name)!r}")
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
        """The recipe as a params dict (part of every evaluation's reuse key). Fields that joined later
        appear only where they change what is trained or how it is computed (``lr_min``/``grad_clip``
        away from their defaults, ``precision`` other than fp32, ``channels_last`` or ``compile``
        true), so every key made before they existed stays valid, and a run that trains or computes
        differently gets its own key. Resolve ``auto`` before keying (:func:`run_precision`): it means
        bf16 on one device and fp32 on another."""
        return without_later_defaults(asdict(self), LATER_RECIPE_DEFAULTS)


def _optimizer(recipe: Recipe, params) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


def epochs_trained(recipe: Recipe) -> int:
    """How many epochs the loop runs: ``recipe.epochs``, or one more under ``dc_step`` (DC's
    ``for ep in range(Epoch + 1)``, ``Epoch`` being its ``epoch_eval_train``)."""
    return recipe.epochs + 1 if recipe.scheduler == "dc_step" else recipe.epochs


class _DCStep(torch.optim.lr_scheduler.MultiStepLR):
    """DC's evaluation schedule (VICO-UoE/DatasetCondensation ``utils.evaluate_synset``, copied by
    DC-Bench's ``EvaluatorUtils.evaluate_synset_dataset``): ``Epoch + 1`` epochs; after epoch
    ``Epoch // 2 + 1`` (0-based) the lr drops x0.1 and a *new* SGD optimizer is built, so the
    momentum buffers start again. Here: the same lr drop (at scheduler step ``epochs // 2 + 2``) and
    the optimizer's state cleared at that step, which is what a new optimizer of the same kind,
    hyper-parameters and lr is (DC-Bench's Adam branch, which keeps its optimizer, is not this)."""

    def __init__(self, optimizer: torch.optim.Optimizer, epochs: int):
        self.reset_at = epochs // 2 + 2
        super().__init__(optimizer, milestones=[self.reset_at], gamma=0.1)

    def step(self):
        super().step()
        if self.last_epoch == self.reset_at:
            self.optimizer.state.clear()


def _scheduler(recipe: Recipe, optimizer) -> torch.optim.lr_scheduler.LRScheduler | None:
    if recipe.scheduler == "dc_step":
        return _DCStep(optimizer, recipe.epochs)
    if recipe.scheduler == "step":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[recipe.epochs // 2], gamma=0.1)
    if recipe.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=recipe.epochs, eta_min=recipe.lr_min)
    if recipe.scheduler == "cosine_half":  # RDED / EDC (DD-Ranking's 'cosine'): ends at lr / 2
        epochs = recipe.epochs
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.5 * (1.0 + math.cos(math.pi * e / epochs / 2)))
    return None


def optimizer_and_scheduler(recipe: Recipe, params, lr: float | None = None):
    """The recipe's optimizer over ``params`` (at ``lr``: a learning-rate search trains one recipe at
    several) and its schedule (``None`` for ``scheduler: none``)."""
    if lr is not None and lr != recipe.lr:
        recipe = replace(recipe, lr=lr)
    optimizer = _optimizer(recipe, params)
    return optimizer, _scheduler(recipe, optimizer)
