"""Black-box transfer attacks: adversarial images crafted on a surrogate model, scored on target models.

:func:`transfer_attack` runs one attack white-box on the surrogate (:func:`ddlib.attacks.run_attack`:
seeded batches, targets, space, timing and query count as there) and classifies the resulting images
with each target model, batch by batch, without any access to the targets while crafting. BEARD's
black-box evaluation (``Code/evaluate_model_blackbox.py``, ``eva_utils.epoch_blackbox``) does the
same: the adversarial batch of its ``net_eval`` (the surrogate) is classified by every model of its
``eval_nets`` (the targets), whose accuracies are logged beside the surrogate's own.

Two identities follow, and the tests check them: a target that *is* the surrogate gets exactly the
white-box robust accuracy of the same attack and seed (in ``beard_compat`` space up to float rounding:
the target reads the images mapped back to pixels and normalised again); a target that ignores its
input keeps its clean accuracy, whatever the attack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.nn as nn

from ddlib.attacks.run import AttackOutcome, run_attack
from ddlib.attacks.targets import resolve_targets
from ddlib.engine.device import resolve_device
from ddlib.engine.test_pass import as_pixels

__all__ = ["TransferOutcome", "transfer_attack", "classify"]


@dataclass
class TransferOutcome:
    """One attack crafted on a surrogate: ``white_box`` is its outcome on the surrogate itself (its
    time and queries are the crafting cost); per target name, the share of all N adversarial images
    it classifies correctly (``robust_acc``), of the clean images (``clean_acc``), and in targeted
    mode the share classified as their target (``targeted_success``). Skipped (the attack cannot target):
    ``white_box.skipped`` and empty mappings."""

    white_box: AttackOutcome
    robust_acc: dict[str, float] = field(default_factory=dict)
    clean_acc: dict[str, float] = field(default_factory=dict)
    targeted_success: dict[str, float] = field(default_factory=dict)

    @property
    def skipped(self) -> bool:
        """Whether the attack was not crafted (it cannot target): then no target was attacked either."""
        return self.white_box.skipped


@torch.no_grad()
def classify(model: nn.Module, images: torch.Tensor, batch_size: int, device) -> torch.Tensor:
    """``model``'s predicted classes (CPU) for ``images`` (pixels; in ``beard_compat`` space the
    surrogate's adversarial images map back to values outside [0, 1], which the network sees as the
    normalised tensors BEARD's pipeline fed it), batch by batch, in eval mode (its flag restored)."""
    dev = resolve_device(device)
    model = model.to(dev)
    was_training = model.training
    model.eval()
    try:
        preds = [model(as_pixels(images[i : i + batch_size].to(dev))).argmax(1).cpu()
                 for i in range(0, len(images), batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)


def transfer_attack(spec, surrogate: nn.Module, targets: Mapping[str, nn.Module], images: torch.Tensor,
                    labels: torch.Tensor, *, num_classes: int, targeted: bool = False,
                    target_classes: torch.Tensor | str | None = None, batch_size: int = 256, seed: int = 0,
                    device="auto", space: str = "pixel", progress: bool = False) -> TransferOutcome:
    """Craft ``spec`` on ``surrogate`` (white-box, exactly as :func:`~ddlib.attacks.run_attack` with
    the same arguments) and score the adversarial images on every model of ``targets`` (name ->
    model taking pixels, e.g. a :class:`~ddlib.attacks.PixelModel`). ``target_classes``: the targeted
    mode's classes or kind (``next`` by default), as ``run_attack``'s ``targets``."""
    white = run_attack(spec, surrogate, images, labels, num_classes=num_classes, targeted=targeted,
                       targets=target_classes if targeted else None, batch_size=batch_size, seed=seed, device=device,
                       return_adv=True, progress=progress, space=space)
    out = TransferOutcome(white)
    if white.skipped:
        return out
    labels = torch.as_tensor(labels).long().cpu()
    goal = resolve_targets(targeted, target_classes if targeted else None, labels, num_classes, seed)
    adv = white.adv
    for name, target in targets.items():
        pred = classify(target, adv, batch_size, device)  # adv is in pixel units, whatever the space
        clean = classify(target, images, batch_size, device)
        n = max(1, len(labels))
        out.robust_acc[name] = float((pred == labels).sum()) / n
        out.clean_acc[name] = float((clean == labels).sum()) / n
        if targeted:
            out.targeted_success[name] = float((pred == goal).sum()) / n
    white.adv = None  # the images are not kept (N x C x H x W floats)
    return out
