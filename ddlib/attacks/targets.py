"""Targets of a targeted attack, and the seed of each attacked batch."""

from __future__ import annotations

import numpy as np
import torch

from ddlib.attacks.checks import check_num_classes, check_seed, check_targets

__all__ = ["TARGET_KINDS", "target_labels", "resolve_targets", "batch_seed"]

TARGET_KINDS = ("next", "random", "next_mod10")


def target_labels(labels: torch.Tensor, num_classes: int, kind: str = "next", seed: int = 0) -> torch.Tensor:
    """Target classes for a targeted attack, never the true label.

    ``next``: (y + 1) mod C, with C = ``num_classes`` of the data.
    ``random``: a uniformly drawn *other* class, from a private CPU generator seeded by ``seed``:
    the same labels and seed give the same targets, whatever the model and the global RNG state.
    ``next_mod10``: (y + 1) mod 10 whatever C, as BEARD's ``eva_utils`` hard-codes it (equal to
    ``next`` on 10 classes; never the true label on more; refused below 10 classes, where class
    C would be a target).
    Returned on ``labels``' device, as int64.
    """
    if kind not in TARGET_KINDS:
        raise ValueError(f"target kind must be one of {TARGET_KINDS}, got {kind!r}")
    check_num_classes(num_classes)
    y = torch.as_tensor(labels).long()
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{int(y.min())}, {int(y.max())}]")
    if kind == "next":
        return (y + 1) % num_classes
    if kind == "next_mod10":
        if num_classes < 10:
            raise ValueError(f"target kind 'next_mod10' ((y + 1) mod 10, BEARD's) needs at least 10 classes, "
                             f"got {num_classes}")
        return (y + 1) % 10
    g = torch.Generator().manual_seed(check_seed(seed))
    offset = torch.randint(1, num_classes, (y.numel(),), generator=g).view_as(y)
    return ((y.cpu() + offset) % num_classes).to(y.device)


def resolve_targets(targeted: bool, targets, labels: torch.Tensor, num_classes: int, seed: int) -> torch.Tensor | None:
    """The targets of an attack on ``labels``: None untargeted (where giving targets is an error);
    targeted, ``targets`` (a tensor) checked, or drawn by :func:`target_labels` (a kind, ``next``
    if None)."""
    if not targeted:
        if targets is not None:
            raise ValueError("targets given for an untargeted attack")
        return None
    if targets is None or isinstance(targets, str):
        targets = target_labels(labels, num_classes, targets or "next", seed)
    return check_targets(targets, labels, num_classes)


def batch_seed(seed: int, batch_index: int) -> int:
    """The seed of one batch: a hash of (seed, batch index) by NumPy's SeedSequence, in [0, 2**64)."""
    return int(np.random.SeedSequence([check_seed(seed), int(batch_index)]).generate_state(1, dtype=np.uint64)[0])
