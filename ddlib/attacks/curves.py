"""Robustness curves: robust accuracy against ε for a set of attacks (the adversarial protocol's
``eps_curve``), and the area under each curve (:func:`ddlib.scores.robustness.curve_auc`).

``eps_curve`` is ``{attacks: [specs], eps: [values]}`` (or ``{attack: spec, eps: [values]}``, one
attack): every attack at every ε, each attack with its other parameters as given. Each attack needs
an ε (a bounded threat model: not ``cw`` or ``deepfool``) and its own name (the metrics are named
``curve.<attack>.<eps>``). In pixel space ε = 0 is the clean accuracy (no attack is run: no
perturbation is allowed). In ``beard_compat`` space the attack runs at ε = 0: BEARD's pipeline
clamps the *normalised* tensor to [0, 1] whatever the budget, which moves pixels (BACON IPC 50:
clean 65.5 %, FGSM at ε = 0 49.25 % on 400 images), so its ε = 0 point is not the clean accuracy.
AutoAttack's components (``aa_apgd_ce``, ``aa_apgd_t``, ``aa_fab_t``, ``aa_square``:
:mod:`ddlib.attacks.autoattack_parts`) draw one curve each::

    eps_curve: {attacks: [pgd, autoattack, aa_apgd_ce, aa_apgd_t, aa_fab_t, aa_square],
                eps: [0, 1/255, 2/255, 4/255, 8/255]}
"""

from __future__ import annotations

from typing import Mapping

from ddlib.attacks.catalog import AttackSpec, parse_attack, targeted_skip_reason
from ddlib.scores.robustness import AUC_PREFIX, curve_aucs  # noqa: F401 (re-exported: no torchattacks needed there)

__all__ = ["CurvePoint", "parse_curve", "point_key", "curve_aucs", "AUC_PREFIX"]



class CurvePoint:
    """One point: ``attack`` (its name), ``eps`` and the spec to run (None at ε = 0 in pixel space: the
    clean accuracy)."""

    def __init__(self, attack: str, eps: float, spec: AttackSpec | None):
        self.attack, self.eps, self.spec = attack, eps, spec

    @property
    def key(self) -> str:
        """The metric name this point is logged under (:func:`point_key`; the summary parses it back)."""
        return point_key(self.attack, self.eps)


def point_key(attack: str, eps: float) -> str:
    """Metric name of one point (the summary parses it back)."""
    return f"curve.{attack}.{eps:.6f}"


def _with_eps(spec: AttackSpec, eps) -> AttackSpec:
    return parse_attack({spec.name: {**spec.params, "eps": eps}})


def parse_curve(curve, targeted: bool = False, space: str = "pixel") -> list[CurvePoint]:
    """The points of ``curve`` (None: none), attack by attack in the order given, ε ascending; at
    ε = 0 no attack in pixel space (the clean accuracy), the attack at ε = 0 in ``beard_compat``
    space (its clamp on normalised tensors acts with no budget).
    ``ValueError`` naming the problem for a malformed curve, an attack without ε, one that cannot
    target in a targeted cell, an attack named twice or two ε that round to one metric name."""
    if curve is None:
        return []
    form = "{attacks: [<name or {name: params}>, ...], eps: [values]} (or {attack: <spec>, eps: [values]})"
    if not isinstance(curve, Mapping) or len(curve) != 2 or "eps" not in curve \
            or not ({"attack", "attacks"} & set(curve)) or not isinstance(curve["eps"], list) or not curve["eps"]:
        raise ValueError(f"eps_curve must be null or {form}, got {curve!r}")
    given = [curve["attack"]] if "attack" in curve else curve["attacks"]
    if not isinstance(given, list) or not given:
        raise ValueError(f"eps_curve: attacks must be a non-empty list, got {given!r}")
    points, names = [], []
    for raw in given:
        base = parse_attack(raw)
        if base.eps is None:
            raise ValueError(f"attack {base.name!r} has no epsilon (a minimum-norm attack)")
        if targeted and (reason := targeted_skip_reason(base)):
            raise ValueError(f"mode targeted: {reason}")
        if base.name in names:
            raise ValueError(f"attack {base.name!r} listed twice (its points are named after it)")
        names.append(base.name)
        specs = sorted((_with_eps(base, e) for e in curve["eps"]), key=lambda s: s.eps)
        keys = [point_key(base.name, s.eps) for s in specs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"two epsilons give one point ({sorted(keys)}): list each once, distinct to 6 decimals")
        points += [CurvePoint(base.name, s.eps, s if s.eps > 0 or space != "pixel" else None) for s in specs]
    return points
