"""The loop's hooks (augmentation, loss, objective, preprocessing), their bundle and their canonical names.

:func:`ddlib.engine.train.train_and_test` calls them on every batch; the protocols build them and key
results by their names. Imports torch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["AugmentHook", "LossHook", "Objective", "Hooks", "hook_name", "cross_entropy_loss"]

# augment(x_normalised, targets, generator) -> (x, targets): label-mixing ops (Mixup, CutMix) change
# the targets too; targets are int labels or per-image target rows.
# loss(logits, targets, inputs) -> scalar: inputs are the augmented batch (teacher relabelling needs it).
# A loss hook may also have ``many(logits S x B x K, [targets] * S, [inputs] * S) -> (S,) losses`` for the
# batched mode (a teacher then runs once on the distinct inputs of all S models); without it the hook
# is called once per model. Models that share a seed are handed the same ``inputs`` object.
AugmentHook = Callable[[torch.Tensor, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
LossHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# objective(model, x, targets, generator) -> scalar: the whole per-batch objective, for training that
# needs the model itself (adversarial training crafts examples against it). Default: loss(model(x), y, x).
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


def hook_name(hook, default: str) -> str:
    """The canonical name a hook carries (``hook.name``: every parameter spelled out), which reuse
    keys are derived from; ``default`` for no hook. A hook without a name is refused: a name passed
    beside a hook could go stale and let a changed hook reuse the old one's results."""
    if hook is None:
        return default
    name = getattr(hook, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{hook!r} has no canonical name (.name): every augmentation, loss, objective and "
                        "preprocessing hook carries the name its results are keyed by")
    return name


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with hard (int) or soft (probability rows) targets."""
    return F.cross_entropy(logits, targets)


@dataclass(frozen=True)
class Hooks:
    """What a call plugs into the loop beside the recipe: ``augment`` (each training batch), ``loss``
    (default: :func:`cross_entropy_loss`) or ``objective`` (in its place, not both), ``preprocess``
    (ZCA whitening: pixels to the model's input in place of the mean/std normalisation, on training
    and test batches alike, as MTT, DATM and DD-Ranking whiten [0, 1] pixels). Each carries the
    canonical ``name`` its results are keyed by (:func:`hook_name`)."""

    augment: AugmentHook | None = None
    loss: LossHook | None = None
    objective: Objective | None = None
    preprocess: nn.Module | None = None

    def __post_init__(self):
        if self.objective is not None and self.loss is not None:
            raise ValueError("give either a loss hook or an objective, not both")

    def model_objective(self) -> Objective:
        """One model's per-batch objective: the objective hook, else the loss hook on the model's logits."""
        if self.objective is not None:
            return self.objective
        loss = self.loss or cross_entropy_loss
        return lambda model, x, y, generator: loss(model(x).float(), y, x)

    def stack_losses(self, logits: torch.Tensor, ys: list, xs: list) -> torch.Tensor:
        """(S,) losses of S stacked models: the loss hook's ``many`` where it has one, else one call per model."""
        loss = self.loss or cross_entropy_loss
        many = getattr(loss, "many", None)
        if many is not None:
            return many(logits, ys, xs)
        return torch.stack([loss(logits[s], ys[s], xs[s]) for s in range(len(xs))])
