"""Scores of a robustness curve (robust accuracy against the attack strength ε).

The area under the curve summarises a model's robustness over a range of ε in one number, so two
models whose curves cross (one better at small ε, the other at large) are ranked by the whole range,
not by the one ε a leaderboard happened to pick (BEARD's 8/255). It is normalised by the ε range:
the trapezoid area divided by (ε_max − ε_min) is the curve's mean accuracy over the range, in the
accuracies' unit (a fraction here), comparable across grids whose ε lists span different ranges only
if they span the same range (the ε list is part of what a curve is: name it with the number).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

__all__ = ["curve_auc", "curve_aucs", "AUC_PREFIX"]

AUC_PREFIX = "curve_auc."  # per seed and on the leaderboard: curve_auc.<attack>


def curve_auc(eps: Sequence[float], accuracies: Sequence[float]) -> float:
    """Trapezoid area under robust accuracy against ε, divided by the ε range (max − min): the mean
    accuracy over the range. Points are sorted by ε; NaN with fewer than two distinct ε or a NaN
    accuracy (a point that did not run). The same ε twice is refused (two values for one point)."""
    if len(eps) != len(accuracies):
        raise ValueError(f"curve_auc: {len(eps)} epsilons but {len(accuracies)} accuracies")
    points = sorted((float(e), float(a)) for e, a in zip(eps, accuracies))
    xs = [e for e, _ in points]
    if any(not math.isfinite(e) or e < 0 for e in xs):
        raise ValueError(f"curve_auc: epsilons must be finite and >= 0, got {list(eps)}")
    if len(set(xs)) != len(xs):
        raise ValueError(f"curve_auc: an epsilon appears twice in {list(eps)}")
    ys = [a for _, a in points]
    if len(xs) < 2 or any(math.isnan(a) for a in ys):
        return float("nan")
    return float(np.trapezoid(ys, xs) / (xs[-1] - xs[0]))


def curve_aucs(values: Mapping[str, float], scale: float = 1.0) -> dict[str, float]:
    """Per attack with ``curve.<attack>.<eps>`` values in ``values`` (a per-seed row): its
    ``curve_auc.<attack>`` (:func:`~ddlib.scores.robustness.curve_auc`, times ``scale``); NaN points
    (a seed without them) give NaN."""
    by_attack: dict[str, list[tuple[float, float]]] = {}
    for key, value in values.items():
        if isinstance(key, str) and key.startswith("curve."):
            _, attack, eps = key.split(".", 2)
            by_attack.setdefault(attack, []).append((float(eps), float(value)))
    return {f"{AUC_PREFIX}{attack}": scale * curve_auc([e for e, _ in pts], [a for _, a in pts])
            for attack, pts in by_attack.items()}
