"""Scores as pure functions. Accuracies are fractions in [0, 1]; scores are on a 0-100 scale.

DD-Ranking (Li et al., 2025) defines the Label-Robust Score from two differences:

* HLR, hard-label recovery = acc_real_hard - acc_syn_hard (smaller is better), and
* IOR, improvement over random = acc_syn_any - acc_rdm_any (larger is better),

combined as alpha = w * IOR - (1 - w) * HLR and mapped from [-1, 1] onto [0, 100] by
100 * (e^alpha - e^-1) / (e - e^-1). The Augmentation-Robust Score does the same with
beta = gamma * IOR_aug + (1 - gamma) * IOR_noaug.

The peer package feeds accuracies in percentage points into the exponential, so its scores
leave [0, 100]; here every input is checked to be a fraction, which keeps the scores inside.

BEARD (Zhou et al., 2024) scores adversarial robustness with RR, AE and CREI (and their
multi-model versions RRM, AEM). **Those functions take accuracies in percent (0-100) and times in
seconds**, exactly as BEARD's ``auto_metrics.py`` does, unlike the DD-Ranking functions above,
which take fractions. See :func:`rr`.
"""

from __future__ import annotations

import math
import warnings
from typing import Iterable, Sequence

import numpy as np

__all__ = [
    "hlr", "ior", "lrs", "ars", "normalized_exp_score", "mean_std",
    "rr", "ae", "crei", "rr_multi", "ae_multi", "rcr", "rcr_multi", "CLEAN_TIMES", "beard_clean_time",
    "RR_VARIANTS", "MIN_ATTACKS", "beard_scores", "beard_scores_multi",
    "SANITY_VALUES", "CHANCE_MARGIN", "near_chance",
]

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


# --------------------------------------------------------------------------- BEARD: RR, AE, CREI
#
# As BEARD's code computes them (Code/metrics/white_box/auto_metrics.py, metrics_type "beard";
# Code/metrics/white_box/evaluate_metrics.py builds the inputs): ACCURACIES IN PERCENT (0-100),
# TIMES IN SECONDS. None stands for an attack that did not run (BEARD sets DeepFool and AutoAttack
# to None in targeted mode) and is dropped. Scores are returned unrounded (BEARD rounds to 2 places).
#
# Which clean time AE compares with. BEARD's logs hold two clean-pass times per model, one timed in
# the targeted loop and one in the untargeted loop. Its published tables (BACON, CIFAR-10, targeted
# AE 29.46 / 28.71 / 31.21 at IPC 1 / 10 / 50; unified AEM 29.27, CREI 33.05) use each mode's
# own; its metric toolkit (evaluate_metrics.py, and the example in its white_box/README.md: AE
# 29.70 at IPC 1, AEM 29.83) uses the smaller of the two in both modes. In BEARD's logs the
# targeted clean pass ran first in the process, so it carries the start-up cost and is the larger.
#
# AST. The paper defines an average success time (the time an attack needs to fool the model,
# conditional on success); neither BEARD's code nor ddlib computes it: AE and every logged time are
# the wall time of the whole attack pass over all N images, successful or not.
CLEAN_TIMES = ("mode", "min_of_modes")


def beard_clean_time(own: float, other_mode: float | None = None, rule: str = "mode") -> float:
    """The clean time AE compares with: ``"mode"`` (default, BEARD's published tables): the clean
    pass timed with this mode's attacks (``own``); ``"min_of_modes"`` (BEARD's metric toolkit and
    its README example): the smaller of the two modes' clean times, so ``other_mode`` is needed."""
    if rule not in CLEAN_TIMES:
        raise ValueError(f"clean time rule must be one of {CLEAN_TIMES}, got {rule!r}")
    own = _seconds("clean time", own)
    if rule == "mode":
        return own
    if other_mode is None:
        raise ValueError("clean time rule 'min_of_modes' needs the other mode's clean time")
    return min(own, _seconds("other mode's clean time", other_mode))


def _percent(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be an accuracy in percent (0-100), got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} is NaN; an accuracy in percent (0-100) is needed")
    if not 0.0 <= value <= 100.0:
        raise ValueError(f"{name} must be an accuracy in percent (0-100), got {value!r}")
    return value


def _seconds(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a time in seconds, got {value!r}")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be a finite time in seconds, got {value!r}")
    if value < 0.0:
        raise ValueError(f"{name} must be a non-negative time in seconds, got {value!r}")
    return value


def _present(name: str, values, check) -> list[float]:
    """``values`` without the None entries (skipped attacks), each checked."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a list of values (None for a skipped attack), got {values!r}")
    return [check(f"{name}[{i}]", v) for i, v in enumerate(values) if v is not None]


def _per_model(clean_name: str, cleans, attack_name: str, attacks, check) -> tuple[list[float], list[float]]:
    if isinstance(cleans, (str, bytes)) or not isinstance(cleans, (Sequence, np.ndarray)) or len(cleans) == 0:
        raise ValueError(f"{clean_name} must be a non-empty list, one value per model")
    if isinstance(attacks, (str, bytes)) or not isinstance(attacks, (Sequence, np.ndarray)) or len(attacks) != len(cleans):
        raise ValueError(f"{attack_name} must hold one list per model ({len(cleans)}), got {attacks!r}")
    clean = [check(f"{clean_name}[{m}]", c) for m, c in enumerate(cleans)]
    pooled = [v for m, per in enumerate(attacks) for v in _present(f"{attack_name}[{m}]", per, check)]
    return clean, pooled


def _warn_if_fractions(clean: list[float], attack: list[float]) -> None:
    if max(clean + attack) <= 1.0 and max(clean) > 0.0:
        warnings.warn(
            "every accuracy is <= 1: BEARD's scores take accuracies in PERCENT (0-100), not fractions",
            UserWarning, stacklevel=3,
        )


RR_VARIANTS = ("beard", "rome", "rome+")


def _check_variant(variant: str) -> str:
    if variant not in RR_VARIANTS:
        raise ValueError(f"RR variant must be one of {RR_VARIANTS}, got {variant!r}")
    return variant


def _rr(clean: list[float], attack: list[float], what: str, variant: str = "beard") -> float:
    _check_variant(variant)
    if not attack:
        raise ValueError(f"every attack accuracy is None (all attacks skipped): cannot compute {what}")
    _warn_if_fractions(clean, attack)
    avg_clean, avg_attack, min_attack = float(np.mean(clean)), float(np.mean(attack)), min(attack)
    if avg_clean == min_attack:  # BEARD: avoid dividing by zero (checked before any variant, as its toolkit)
        return 0.0
    if variant == "beard":
        return 100.0 * (1.0 - (avg_clean - avg_attack) / (avg_clean - min_attack))
    if avg_clean == 0.0:  # an attack raised accuracy above a clean 0: the toolkit divides by zero
        return float("nan")
    if variant == "rome":
        return 100.0 * (1.0 - (avg_clean - avg_attack) * (avg_clean - min_attack) / avg_clean ** 2)
    asr = avg_clean - np.asarray(attack, dtype=float)  # rome+: ASR per attack, against the mean clean accuracy
    penalty = float(np.mean(np.where(asr < 0, -asr, 0.0)))  # attacks that raised accuracy, in points
    return 100.0 * (1.0 - float(np.mean(asr)) * float(np.max(asr)) / avg_clean ** 2 - 0.01 * penalty)


def _ae(clean: list[float], attack: list[float], what: str) -> float:
    if not attack:
        raise ValueError(f"every attack time is None (all attacks skipped): cannot compute {what}")
    avg_clean, avg_attack, max_attack = float(np.mean(clean)), float(np.mean(attack)), max(attack)
    if max_attack == avg_clean:  # BEARD: avoid dividing by zero
        return 0.0
    return 100.0 * (avg_attack - avg_clean) / (max_attack - avg_clean)


def rr(clean_acc: float, attack_accs: Sequence[float | None], variant: str = "beard") -> float:
    """BEARD's Robustness Ratio, in percent. INPUTS IN PERCENT (0-100), not fractions.

    RR = 100 * (1 - (clean - mean(attack_accs)) / (clean - min(attack_accs))), i.e. 1 - mean ASR /
    max ASR with ASR = clean - attack accuracy. None entries (skipped attacks) are dropped; all
    None raises ValueError; clean == min(attack_accs) gives 0 (BEARD's guard). Higher is better.

    ``variant``: BEARD's metric toolkit (``Code/metrics/white_box/auto_metrics.py``,
    ``calculate_rr(..., metrics_type)``) has three, and BEARD's Table 15 reports ``rome``:

    * ``"beard"`` (default): the formula above (the paper's RR, its main tables);
    * ``"rome"``: 100 * (1 - (clean - mean) * (clean - min) / clean²), mean ASR times max ASR over
      clean²: the I-RR of Zhou et al.'s ROME (ICML 2025), whose Table 1 it reproduces from BEARD's
      BACON logs (the paper's own text was not available to us: see ``docs/robustness-curves.md``);
    * ``"rome+"``: ``rome`` with ASR_i = clean - acc_i and a penalty for attacks that *raise*
      accuracy: 100 * (1 - mean(ASR) * max(ASR) / clean² - 0.01 * mean(max(-ASR_i, 0))) (the
      penalty is in points, scaled by 0.01 whatever the clean accuracy, as the toolkit does);
      equal to ``rome`` when no attack raises accuracy.

    All three return 0 when clean == min(attack_accs), the toolkit's guard, checked before the
    variant (so ``rome`` of a model no attack hurts is 0, not the formula's 100); ``rome`` and
    ``rome+`` are NaN for a clean accuracy of 0 below an attack's (the toolkit divides by zero).

    RR is *not monotone* in robustness: it only measures how evenly the attacks succeed. With clean
    70, attack accuracies [60, 60, 60], [70, 70, 70] and [0, 0, 0] all give RR 0, and a model that
    no attack hurts scores the same as one every attack destroys. Read it next to :func:`rcr`.
    """
    return _rr([_percent("clean_acc", clean_acc)], _present("attack_accs", attack_accs, _percent), "RR", variant)


def ae(clean_time: float, attack_times: Sequence[float | None]) -> float:
    """BEARD's Attack Efficiency ratio, in percent. TIMES IN SECONDS (any one unit works).

    AE = 100 * (mean(attack_times) - clean_time) / (max(attack_times) - clean_time): how much of
    the slowest attack's extra cost the average attack needs. None entries are dropped; all None
    raises ValueError; max(attack_times) == clean_time gives 0 (BEARD's guard). ``clean_time``: see
    :func:`beard_clean_time` (BEARD's published tables use the clean pass of the same mode).
    """
    return _ae([_seconds("clean_time", clean_time)], _present("attack_times", attack_times, _seconds), "AE")


def crei(rr_value: float, ae_value: float, alpha: float = 0.5) -> float:
    """BEARD's Comprehensive Robustness-Efficiency Index: alpha * RR + (1 - alpha) * AE (percent).
    Works the same on RRM and AEM (multi-model CREI)."""
    alpha = _check_weight("alpha", alpha)
    for name, value in (("RR", rr_value), ("AE", ae_value)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be finite, got {value!r}")
    return alpha * float(rr_value) + (1.0 - alpha) * float(ae_value)


def rr_multi(clean_accs: Sequence[float], attack_accs: Sequence[Sequence[float | None]],
             variant: str = "beard") -> float:
    """BEARD's multi-model RR (RRM), in percent. INPUTS IN PERCENT (0-100).

    ``clean_accs``: one clean accuracy per model (e.g. per IPC); ``attack_accs``: one list per
    model. As BEARD: the *mean* clean accuracy over models against the attack accuracies *pooled*
    over all models and attacks (mean and min), with RR's formula (``variant``: see :func:`rr`)
    and edge cases.
    """
    clean, pooled = _per_model("clean_accs", clean_accs, "attack_accs", attack_accs, _percent)
    return _rr(clean, pooled, "RRM", variant)


def ae_multi(clean_times: Sequence[float], attack_times: Sequence[Sequence[float | None]]) -> float:
    """BEARD's multi-model AE (AEM), in percent. TIMES IN SECONDS. The mean clean time over models
    against the attack times pooled over all models and attacks, with AE's formula and edge cases."""
    clean, pooled = _per_model("clean_times", clean_times, "attack_times", attack_times, _seconds)
    return _ae(clean, pooled, "AEM")


def _rcr(clean: list[float], attack: list[float], what: str) -> float:
    if not attack:
        raise ValueError(f"every attack accuracy is None (all attacks skipped): cannot compute {what}")
    _warn_if_fractions(clean, attack)
    avg_clean = float(np.mean(clean))
    if avg_clean == 0.0:
        raise ValueError(f"clean accuracy is 0: {what} (attack accuracy / clean accuracy) is undefined")
    return 100.0 * float(np.mean(attack)) / avg_clean


def rcr(clean_acc: float, attack_accs: Sequence[float | None]) -> float:
    """Robust-to-clean ratio, in percent: 100 * mean(attack_accs) / clean. INPUTS IN PERCENT.

    Not a BEARD score: the monotone companion of :func:`rr`. RR compares the attacks with each
    other (mean vs. worst drop), so it cannot tell a model no attack hurts from one every attack
    destroys (both RR 0). RCR is the share of the clean accuracy kept under attack on average:
    0 when every attack drives accuracy to 0, 100 when no attack changes it (above 100 only if
    attacks raise accuracy), and it rises whenever any attack accuracy rises. Higher = more robust.
    None entries are dropped as in RR; clean 0 raises ValueError.
    """
    return _rcr([_percent("clean_acc", clean_acc)], _present("attack_accs", attack_accs, _percent), "RCR")


def rcr_multi(clean_accs: Sequence[float], attack_accs: Sequence[Sequence[float | None]]) -> float:
    """Multi-model RCR, pooled as BEARD pools RRM: 100 * mean(pooled attack accs) / mean(clean accs)."""
    clean, pooled = _per_model("clean_accs", clean_accs, "attack_accs", attack_accs, _percent)
    return _rcr(clean, pooled, "RCR (multi)")


# At least this many attacks must have run for RR, AE and CREI: they compare the attacks with each
# other (mean against worst), so one attack gives RR 0, AE 100 and CREI 50 whatever the model.
MIN_ATTACKS = 2
_NAN = float("nan")


def beard_scores(clean_acc: float, attack_accs: Sequence[float | None], clean_time: float,
                 attack_times: Sequence[float | None], alpha: float = 0.5,
                 rr_variant: str = "beard") -> dict[str, float]:
    """One model's scores, as the protocol logs them and the leaderboard recomputes them (percent,
    seconds; None entries are skipped attacks): ``rr`` (BEARD's), ``rr_rome``, ``rr_rome_plus``
    (:func:`rr` variants), ``ae``, ``crei`` (alpha on the ``rr_variant`` RR and AE), ``crei_rome`` (ROME's
    I-CREI: alpha on ``rr_rome``, ROME's I-RR, and AE, whatever ``rr_variant``) and ``rcr``.

    NaN, never a number that means nothing: RR, AE and CREI when fewer than :data:`MIN_ATTACKS`
    attacks ran (one attack gives RR 0, AE 100, CREI 50 by construction); AE and CREI when
    ``clean_time`` is NaN (no clean time from the attacks' process, see the protocol); RCR when the
    clean accuracy is 0."""
    _check_variant(rr_variant)
    accs = _present("attack_accs", attack_accs, _percent)
    times = _present("attack_times", attack_times, _seconds)
    clean = _percent("clean_acc", clean_acc)
    out = {"rcr": rcr(clean, accs) if clean > 0 and accs else _NAN}
    if len(accs) < MIN_ATTACKS:
        return {"rr": _NAN, "rr_rome": _NAN, "rr_rome_plus": _NAN, "ae": _NAN, "crei": _NAN, "crei_rome": _NAN, **out}
    rrs = {name: rr(clean, accs, v) for name, v in (("rr", "beard"), ("rr_rome", "rome"), ("rr_rome_plus", "rome+"))}
    ae_value = _NAN if math.isnan(float(clean_time)) else ae(clean_time, times)
    rr_used = rrs[{"beard": "rr", "rome": "rr_rome", "rome+": "rr_rome_plus"}[rr_variant]]
    return {**rrs, "ae": ae_value, "crei": _NAN if math.isnan(ae_value) else crei(rr_used, ae_value, alpha),
            "crei_rome": _NAN if math.isnan(ae_value) else crei(rrs["rr_rome"], ae_value, alpha), **out}


def beard_scores_multi(clean_accs: Sequence[float], attack_accs: Sequence[Sequence[float | None]],
                       clean_times: Sequence[float], attack_times: Sequence[Sequence[float | None]],
                       alpha: float = 0.5, rr_variant: str = "beard") -> dict[str, float]:
    """The multi-model scores (one model per IPC), with :func:`beard_scores`' NaN rules on the
    pooled attacks: ``rrm``, ``rrm_rome``, ``rrm_rome_plus``, ``aem``, ``creim``, ``creim_rome`` (I-CREI), ``rcrm``.

    ROME's Table 1 (Zhou et al., ICML 2025) reports RR, CREI, I-RR and I-CREI over IPC 1, 10 and 50 so:
    ``rrm``, ``creim``, ``rrm_rome`` and ``creim_rome`` with each mode's own clean time (pinned in
    ``tests/test_metrics_beard.py`` on BEARD's BACON logs)."""
    _check_variant(rr_variant)
    clean, pooled = _per_model("clean_accs", clean_accs, "attack_accs", attack_accs, _percent)
    out = {"rcrm": rcr_multi(clean_accs, attack_accs) if min(clean) > 0 and pooled else _NAN}
    if len(pooled) < MIN_ATTACKS:
        return {"rrm": _NAN, "rrm_rome": _NAN, "rrm_rome_plus": _NAN, "aem": _NAN, "creim": _NAN, "creim_rome": _NAN,
                **out}
    rrs = {name: rr_multi(clean_accs, attack_accs, v)
           for name, v in (("rrm", "beard"), ("rrm_rome", "rome"), ("rrm_rome_plus", "rome+"))}
    aem = _NAN if any(math.isnan(float(t)) for t in clean_times) else ae_multi(clean_times, attack_times)
    rr_used = rrs[{"beard": "rrm", "rome": "rrm_rome", "rome+": "rrm_rome_plus"}[rr_variant]]
    return {**rrs, "aem": aem, "creim": _NAN if math.isnan(aem) else crei(rr_used, aem, alpha),
            "creim_rome": _NAN if math.isnan(aem) else crei(rrs["rrm_rome"], aem, alpha), **out}


# --------------------------------------------------------------------------- sanity flags

# The accuracies that must be well above chance for a cell's scores to mean anything: the full-data
# reference, and the model trained on the distilled set (a random subset may be near chance at IPC 1).
SANITY_VALUES = {
    "acc_real_hard": "full-data reference", "acc_full": "full-data reference",
    "acc_syn_hard": "distilled set", "acc_syn_any": "distilled set", "acc_syn_noaug": "distilled set",
    "acc_syn_aug": "distilled set", "acc_set": "distilled set", "acc_reference": "distilled set",
    "acc_none": "distilled set", "clean_acc": "distilled set",
}
CHANCE_MARGIN = 0.02  # "near chance": at most 2 points above 1 / classes (or below it)


def near_chance(values: dict[str, float], num_classes: int, margin: float = CHANCE_MARGIN) -> list[str]:
    """Notes for the accuracies of ``values`` (fractions, keyed as :data:`SANITY_VALUES`) that are at
    most ``margin`` above chance, 1 / ``num_classes`` (or below it): a smoke run (1 epoch, a reduced
    dataset) whose LRS or robustness score must not be read as a result. With more than 50 classes
    the margin is chance itself (twice chance is flagged: ImageNet-1K's 0.2 %, where 2 points would
    flag real IPC-1 results). Empty when all are well above chance."""
    chance = 1.0 / num_classes
    margin = min(margin, chance)
    notes = []
    for key, what in SANITY_VALUES.items():
        value = values.get(key)
        if value is None or not math.isfinite(float(value)):
            continue
        if float(value) <= chance + margin:
            notes.append(f"{what} near chance ({key} {100 * float(value):.1f} %, chance {100 * chance:.1f} %)")
    return notes
