"""Evaluation beyond accuracy (issue 27): calibration, class-wise fairness and compute cost of a trained model.

Pure functions of what one test pass and one training already produce, so no model is run twice:

* **calibration**: expected calibration error over :data:`~ddlib.engine.test_pass.CALIBRATION_BINS`
  (15) equal-width confidence bins ``((m-1)/15, m/15]``, the confidence being the softmax probability
  of the predicted class (Guo et al., "On calibration of modern neural networks", ICML 2017), and the
  mean negative log-likelihood of the true class, from the sums the test pass accumulates
  (:func:`ddlib.engine.test_pass._calibration_sums`);
* **class-wise fairness**: per-class accuracies (recall) from the confusion matrix, their minimum
  (``worst_class_acc``), their population standard deviation over the classes (``class_acc_std``,
  ddof 0: the classes are all there are, not a sample) and ``max - min`` (``class_acc_range``);
* **compute**: FLOPs of one forward per image (:func:`flops_per_image`: ``torch.utils.flop_counter``,
  which counts matrix products and convolutions, a multiply-add as 2 FLOPs), training FLOPs taken as
  3 x forward x images seen (forward + backward ~ 2 x forward, the convention of Kaplan et al. 2020,
  "Scaling laws for neural language models"), testing FLOPs as forward x test images. Not counted:
  data augmentation, a relabelling teacher's forwards, adversarial training's attack steps.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn as nn

from ddlib.engine.test_pass import CALIBRATION_BINS

__all__ = ["calibration", "reliability_table", "class_fairness", "flops_per_image", "training_cost", "FAIRNESS",
           "CALIBRATION", "COST", "TRAIN_FLOPS_PER_FORWARD"]

CALIBRATION = ("ece", "nll")
FAIRNESS = ("worst_class_acc", "class_acc_std", "class_acc_range")
COST = ("train_flops", "test_flops", "train_images", "test_images", "train_steps")
TRAIN_FLOPS_PER_FORWARD = 3  # forward + backward (~2 x forward) per training image


def _split(sums: Sequence[float], bins: int) -> tuple[list[float], list[float], list[float], float]:
    if len(sums) != 3 * bins + 1:
        raise ValueError(f"calibration sums: expected {3 * bins + 1} values (3 x {bins} bins + NLL), got {len(sums)}")
    return list(sums[:bins]), list(sums[bins:2 * bins]), list(sums[2 * bins:3 * bins]), float(sums[3 * bins])


def calibration(sums: Sequence[float], bins: int = CALIBRATION_BINS) -> dict[str, float]:
    """``{"ece": ..., "nll": ...}`` from a test pass's sums: per bin the images, the correct ones and
    their confidences, then the summed NLL. ECE = sum over bins of |correct_b - confidence_b| / N,
    i.e. the bins' |accuracy - mean confidence| weighted by their share of the images."""
    counts, correct, confidence, nll = _split(sums, bins)
    n = sum(counts)
    if n == 0:
        return {"ece": float("nan"), "nll": float("nan")}
    return {"ece": sum(abs(c - p) for c, p in zip(correct, confidence)) / n, "nll": nll / n}


def reliability_table(sums: Sequence[float], bins: int = CALIBRATION_BINS) -> list[dict]:
    """One row per bin (the reliability diagram's bars): its bounds, images, accuracy and mean
    confidence (None where the bin is empty)."""
    counts, correct, confidence, _ = _split(sums, bins)
    return [{"low": m / bins, "high": (m + 1) / bins, "images": int(round(n)),
             "accuracy": c / n if n else None, "confidence": p / n if n else None}
            for m, (n, c, p) in enumerate(zip(counts, correct, confidence))]


def class_fairness(confusion: Sequence[Sequence[float]]) -> dict[str, float]:
    """Worst-class accuracy and the spread of per-class accuracies of a [true][predicted] count
    matrix; classes without test images are left out."""
    rows = [list(map(float, r)) for r in confusion]
    accuracies = [r[k] / sum(r) for k, r in enumerate(rows) if sum(r) > 0]
    if not accuracies:
        return {name: float("nan") for name in FAIRNESS}
    mean = sum(accuracies) / len(accuracies)
    return {"worst_class_acc": min(accuracies),
            "class_acc_std": math.sqrt(sum((a - mean) ** 2 for a in accuracies) / len(accuracies)),
            "class_acc_range": max(accuracies) - min(accuracies)}


def flops_per_image(build: Callable[[], nn.Module], input_shape: Sequence[int], batch: int = 2) -> float:
    """FLOPs of one forward per image of the model ``build()`` makes (eval mode), counted by
    :class:`torch.utils.flop_counter.FlopCounterMode` on one batch of ``batch`` images of
    ``input_shape`` (C, H, W) on the meta device: no memory, no compute, no draw from any generator.
    NaN where the model does not run on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            model = build().eval()
            x = torch.empty(batch, *input_shape)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(x)
        return counter.get_total_flops() / batch
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return float("nan")


def training_cost(forward_flops: float, train_images: int, epochs: int, batch_size: int, test_images: int) -> dict:
    """The cost columns of one trained and tested model (:data:`COST`): every epoch sees every
    training image once, in ``ceil(n / batch)`` steps."""
    seen = train_images * epochs
    return {"train_flops": TRAIN_FLOPS_PER_FORWARD * forward_flops * seen, "test_flops": forward_flops * test_images,
            "train_images": float(seen), "test_images": float(test_images),
            "train_steps": float(math.ceil(train_images / max(1, batch_size)) * epochs)}
