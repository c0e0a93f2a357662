"""Scores as pure functions. Accuracies are fractions in [0, 1]; scores are on a 0-100 scale.

DD-Ranking (Li et al., 2025) defines the Label-Robust Score from two differences:

* HLR, hard-label recovery = acc_real_hard - acc_syn_hard (smaller is better), and
* IOR, improvement over random = acc_syn_any - acc_rdm_any (larger is better),

combined as alpha = w * IOR - (1 - w) * HLR and mapped from [-1, 1] onto [0, 100] by
100 * (e^alpha - e^-1) / (e - e^-1). The Augmentation-Robust Score does the same with
beta = gamma * IOR_aug + (1 - gamma) * IOR_noaug.

The peer package feeds accuracies in percentage points into the exponential, so its scores
leave [0, 100]; here every input is checked to be a fraction, which keeps the scores inside.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

__all__ = ["hlr", "ior", "lrs", "ars", "normalized_exp_score", "mean_std"]

_E, _INV_E = math.e, math.exp(-1.0)


def _check_fraction(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be an accuracy fraction in [0, 1], got {value!r} (percent? divide by 100)")
    return value


def _check_difference(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or not -1.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a difference of fractions in [-1, 1], got {value!r} (percent? divide by 100)")
    return value


def _check_weight(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value


def hlr(acc_real_hard: float, acc_syn_hard: float) -> float:
    """Hard-label recovery: how far the distilled set's hard-label accuracy is from full data."""
    return _check_fraction("acc_real_hard", acc_real_hard) - _check_fraction("acc_syn_hard", acc_syn_hard)


def ior(acc_syn_any: float, acc_rdm_any: float) -> float:
    """Improvement over a random subset of the same size, evaluated the same way."""
    return _check_fraction("acc_syn_any", acc_syn_any) - _check_fraction("acc_rdm_any", acc_rdm_any)


def normalized_exp_score(x: float) -> float:
    """Map x in [-1, 1] onto [0, 100] by 100 * (e^x - e^-1) / (e - e^-1)."""
    x = _check_difference("score argument", x)
    return 100.0 * (math.exp(x) - _INV_E) / (_E - _INV_E)


def lrs(hlr_value: float, ior_value: float, w: float = 0.5) -> float:
    """Label-Robust Score in [0, 100] from HLR and IOR (both fractions), weight ``w`` on IOR."""
    w = _check_weight("w", w)
    alpha = w * _check_difference("IOR", ior_value) - (1.0 - w) * _check_difference("HLR", hlr_value)
    return normalized_exp_score(alpha)


def ars(ior_aug: float, ior_noaug: float, gamma: float = 0.5) -> float:
    """Augmentation-Robust Score in [0, 100] from IOR with and without augmentation."""
    gamma = _check_weight("gamma", gamma)
    beta = gamma * _check_difference("IOR_aug", ior_aug) + (1.0 - gamma) * _check_difference("IOR_noaug", ior_noaug)
    return normalized_exp_score(beta)


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof=0, as DC and DD-Ranking report)."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std())
