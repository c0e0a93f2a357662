"""AutoAttack's four components as attacks of their own (``aa_apgd_ce``, ``aa_apgd_t``, ``aa_fab_t``,
``aa_square``), each built as torchattacks 3.5.1's ``AutoAttack(version='standard')`` builds it.

Why: AutoAttack reports one robust accuracy (the images no component fooled); DD-RobustBench (IEEE TIP
2025) reads its parts separately, and a robustness curve per component shows which one does the
work. torchattacks' ``attacks/autoattack.py`` composes, in this order (a ``MultiAttack``, each
component on the images the earlier ones left correct):

============  ===================================================================================
name          torchattacks call (``eps``, ``norm``, ``seed`` as AutoAttack's)
============  ===================================================================================
aa_apgd_ce    ``APGD(loss='ce', n_restarts=1)``
aa_apgd_t     ``APGDT(n_classes=n, n_restarts=1)``
aa_fab_t      ``FAB(multi_targeted=True, n_classes=n, n_restarts=1)``
aa_square     ``Square(n_queries=5000, n_restarts=1)``
============  ===================================================================================

with the parameters of ddlib's ``autoattack`` entry (:func:`ddlib.attacks.catalog._build_autoattack`):
``steps`` (default 10, torchattacks' and BEARD's) for APGD-CE, APGD-T and FAB-T, ``n = min(C,
n_target_classes + 1)`` (9 target classes by default, as the original AutoAttack), ``n_queries``
(default 5000) for Square. ``torchattacks.MultiAttack`` over the four, in this order, is ddlib's
``autoattack`` (``tests/test_attack_curves.py`` checks both against torchattacks' own AutoAttack).

Each runs alone on all N images here, so its robust accuracy is its own, never AutoAttack's (which
is at most the smallest of the four). FAB-T is multi-targeted (it tries the top ``n - 1`` other
classes) and ignores a target it is given, so it has no targeted mode; APGD-CE and APGD-T have none in
torchattacks; Square has torchattacks' targeted mode (AutoAttack runs it untargeted).
"""

from __future__ import annotations

import torchattacks

from ddlib.attacks.catalog import ATTACKS

__all__ = ["COMPONENTS"]

COMPONENTS = ("aa_apgd_ce", "aa_apgd_t", "aa_fab_t", "aa_square")  # AutoAttack's order


def _classes(name: str, num_classes: int, n_target_classes: int, least: int = 2) -> int:
    """torchattacks' ``n_classes`` as ddlib's ``autoattack`` sets it: ``min(C - 1, n_target_classes) + 1``."""
    if num_classes < least:
        raise ValueError(f"attack {name!r} needs at least {least} classes (its targeted DLR loss), got {num_classes}")
    return min(num_classes - 1, n_target_classes) + 1


def _apgd_ce(model, num_classes, seed, *, norm, eps, steps):
    return torchattacks.APGD(model, eps=eps, norm=norm, seed=seed, verbose=False, loss="ce", n_restarts=1, steps=steps)


def _apgd_t(model, num_classes, seed, *, norm, eps, steps, n_target_classes):
    n = _classes("aa_apgd_t", num_classes, n_target_classes, least=4)
    return torchattacks.APGDT(model, eps=eps, norm=norm, seed=seed, verbose=False, n_classes=n, n_restarts=1,
                              steps=steps)


def _fab_t(model, num_classes, seed, *, norm, eps, steps, n_target_classes):
    n = _classes("aa_fab_t", num_classes, n_target_classes)
    atk = torchattacks.FAB(model, eps=eps, norm=norm, seed=seed, verbose=False, multi_targeted=True, n_classes=n,
                           n_restarts=1, steps=steps)
    atk.supported_mode = ["default"]  # multi-targeted: a given target would be ignored
    return atk


def _square(model, num_classes, seed, *, norm, eps, n_queries):
    return torchattacks.Square(model, eps=eps, norm=norm, seed=seed, verbose=False, n_queries=n_queries, n_restarts=1)


_COMMON = {"norm": "Linf", "eps": 8 / 255}
ATTACKS.add("aa_apgd_ce", _apgd_ce, defaults={**_COMMON, "steps": 10}, norm="Linf")
ATTACKS.add("aa_apgd_t", _apgd_t, defaults={**_COMMON, "steps": 10, "n_target_classes": 9}, norm="Linf")
ATTACKS.add("aa_fab_t", _fab_t, defaults={**_COMMON, "steps": 10, "n_target_classes": 9}, norm="Linf")
ATTACKS.add("aa_square", _square, defaults={**_COMMON, "n_queries": 5000}, norm="Linf")
