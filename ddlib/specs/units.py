"""One table of units: every quantity ddlib reports is read in one unit wherever it is shown.

Inside a computation accuracies are fractions (what :mod:`ddlib.scores.metrics`' formulas take). Wherever a
person reads a number (``ddlib score``'s table, ``ddlib.score()``'s result, the notebooks, the MLflow
runs, the leaderboards, the site, the report card and the exports) it is in the unit this table
gives its name: accuracies and rates in %, differences of accuracies in points, scores on 0-100,
times in seconds, counts as counts, AUCs on 0-1 (0.5: chance), losses in nats, learning rates as
given. :func:`shown` and :func:`computed` convert one way and back, so the MLflow layer
(:mod:`ddlib.store.tracking`) writes shown values and reads them back for the formulas.

A name is found by its quantity: ``per_seed/`` (a per-seed history), ``_mean`` / ``_std`` /
``_low`` / ``_high`` (a summary), ``cost.`` and the role after a dot (``ece.syn_hard``,
``cost.train_seconds.rdm_hard``) and an attack before one (``fgsm.robust_acc``) are read past. A
name no rule knows is shown as logged (:data:`AS_LOGGED`); a protocol of one's own can
:func:`register` its names.

>>> shown("acc_syn_hard_mean", 0.5)
50.0
>>> computed("hlr", 25.0)
0.25
>>> unit_of("cost.train_images.syn_hard").name, unit_of("nll.syn_hard").name, unit_of("lrs").name
('images', 'nats', '0-100')
>>> format_value("lr_syn_hard", 0.01), format_value("loss_auc_set", 0.5312)
('0.01', '0.531')
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["Unit", "unit_of", "quantity", "shown", "computed", "format_value", "register", "explicit", "PERCENT",
           "POINTS", "SCORE", "SECONDS", "COUNT", "IMAGES", "FLOPS", "NATS", "AUC", "CORRELATION", "LEARNING_RATE",
           "RATIO", "EPSILON", "AS_LOGGED", "PER_SEED", "SUMMARY_SUFFIXES", "shown_frame", "display_name",
           "ABBREVIATIONS"]


@dataclass(frozen=True)
class Unit:
    """How a quantity is shown: ``scale`` times the computed value, formatted with ``fmt``; ``name``
    is what a caption or a column header says (``%``, ``points``, ``s``)."""

    name: str
    scale: float = 1.0
    fmt: str = "{:.2f}"
    what: str = ""  # a few words for captions: "accuracy in %"

    def format(self, value: float) -> str:
        """A shown value (already scaled) as text; NaN and None as ``n/a``."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        return self.fmt.format(value)


PERCENT = Unit("%", 100.0, "{:.2f}", "accuracy or rate in %")
POINTS = Unit("points", 100.0, "{:.2f}", "difference of accuracies in points")
SCORE = Unit("0-100", 1.0, "{:.2f}", "score on 0-100")
SECONDS = Unit("s", 1.0, "{:.2f}", "seconds")
SECONDS_FINE = Unit("s", 1.0, "{:.4f}", "seconds")
COUNT = Unit("count", 1.0, "{:.0f}", "a count")
IMAGES = Unit("images", 1.0, "{:.0f}", "images")
FLOPS = Unit("FLOPs", 1.0, "{:.3g}", "floating-point operations")
NATS = Unit("nats", 1.0, "{:.3f}", "loss in nats")
AUC = Unit("AUC", 1.0, "{:.3f}", "area under the ROC curve (0.5: chance)")
CORRELATION = Unit("correlation", 1.0, "{:.2f}", "rank correlation")
LEARNING_RATE = Unit("lr", 1.0, "{:.3g}", "learning rate")
RATIO = Unit("ratio", 1.0, "{:.4g}", "ratio")
EPSILON = Unit("eps", 1.0, "{:.4g}", "perturbation budget")
GPU_HOURS = Unit("GPU hours", 1.0, "{:.3g}", "GPU hours a set's maker declared for making it")
AS_LOGGED = Unit("as logged", 1.0, "{:.4g}", "no unit known: as logged")

PER_SEED = "per_seed/"  # a cell run's per-seed history of a value (step = seed)
SUMMARY_SUFFIXES = ("_mean", "_std", "_low", "_high")

# Exact quantity names first, then patterns (first match wins). Kept in one place: every surface reads it.
_EXACT: dict[str, Unit] = {
    # DD-Ranking and DC-Bench scores on 0-100, BEARD's in percent of their own definition
    **{name: SCORE for name in ("lrs", "ars", "rr", "rr_rome", "rr_rome_plus", "ae", "crei", "crei_rome", "rcr", "rrm",
                                "aem", "creim", "rcrm", "i_rr", "i_crei", "irr", "icrei")},
    **{name: POINTS for name in ("hlr", "ior", "ior_aug", "ior_noaug", "ior_matched")},
    # accuracies of the NAS ground truth (its file's percent) are computed in % already
    "top1": Unit("%", 1.0, "{:.2f}", "accuracy in %"), "best_possible": Unit("%", 1.0, "{:.2f}", "accuracy in %"),
    **{name: CORRELATION for name in ("spearman", "kendall", "tau", "pearson")},
    **{name: PERCENT for name in ("test_accuracy", "ece", "worst_class_acc", "class_acc_range", "class_acc_std", "asr",
                                  "asr_beard", "relative", "curve")},
    **{name: NATS for name in ("nll", "train_loss", "loss")},
    **{name: COUNT for name in ("models_trained", "models_reused", "image_epochs_trained", "lr_searches_run",
                                "lr_searches_reused", "members", "num_archs", "seeds", "train_steps", "queries",
                                "evaluations", "models")},
    **{name: IMAGES for name in ("images", "train_images", "test_images", "attack_images")},
    **{name: FLOPS for name in ("train_flops", "test_flops", "flops_per_image", "flops")},
    "construction_gpu_hours": GPU_HOURS,  # a set's declared cost (its measured one: _seconds, _flops)
    "compression_ratio": RATIO, "eps": EPSILON, "lr": LEARNING_RATE, "curve_auc": PERCENT,
    # black-box transfer (ddlib.protocols.blackbox): a target's clean accuracy, its accuracy under transfer,
    # the share hitting the target class
    **{name: PERCENT for name in ("clean", "to", "transfer", "hit", "targeted_success", "from")},
    "max_linf": EPSILON, "max_l2": EPSILON,  # the largest perturbation an attack made, in pixel units
    "timing_process": Unit("id", 1.0, "{:.0f}", "the id of the process that timed an attack"),
    # NAS-Bench-201's ground truth (its file's percent) and the proxies' accuracies, computed in % beside it
    "gt": Unit("%", 1.0, "{:.2f}", "accuracy in %"), "proxy": Unit("%", 1.0, "{:.2f}", "accuracy in %"),
}
_PATTERNS: list[tuple[re.Pattern, Unit]] = [
    (re.compile(r"seconds_per_sample$"), SECONDS_FINE),
    (re.compile(r"(^|_)(seconds|time)$"), SECONDS),
    (re.compile(r"_(flops)$"), FLOPS),
    (re.compile(r"_images$"), IMAGES),
    (re.compile(r"(^|_)auc(_|$)"), AUC),  # membership-inference AUCs (loss_auc_set, shadow_auc_full)
    (re.compile(r"(^|_)tpr(_|$)"), PERCENT),  # true-positive rates at a fixed false-positive rate
    (re.compile(r"^lr(_|$)"), LEARNING_RATE),  # lr_syn_hard: the learning rate a side trained at
    (re.compile(r"^score_lr"), PERCENT),  # an lr candidate's validation accuracy
    (re.compile(r"^ior_"), POINTS),
    (re.compile(r"^gap_"), POINTS),  # label_regimes: acc_syn_<regime> - acc_rdm_<regime>
    (re.compile(r"^acc(_|$)|_acc$|_acc_|accuracy"), PERCENT),
]
# Heads of dotted names that are a quantity with a role after the dot (ece.syn_hard); every other head
# (an attack's name: fgsm.robust_acc) is read past.
_QUANTITY_HEADS = ("ece", "nll", "worst_class_acc", "class_acc_range", "class_acc_std", "curve", "curve_auc", "clean",
                   "to", "transfer", "hit", "gt", "proxy", "from")
_REGISTERED: dict[str, Unit] = {}


def register(name: str, unit: Unit) -> None:
    """Give a quantity of your own (a protocol's value name) its unit."""
    _REGISTERED[name] = unit


def _lookup(base: str) -> Unit | None:
    if base in _REGISTERED:
        return _REGISTERED[base]
    if base in _EXACT:
        return _EXACT[base]
    for pattern, unit in _PATTERNS:
        if pattern.search(base):
            return unit
    return None


def quantity(name: str) -> str:
    """The quantity a logged or shown name measures: ``per_seed/cost.train_seconds.syn_hard_mean`` ->
    ``train_seconds``, ``fgsm.robust_acc`` -> ``robust_acc``, ``ece.rdm_hard`` -> ``ece``."""
    base = name[len(PER_SEED):] if name.startswith(PER_SEED) else name
    for suffix in SUMMARY_SUFFIXES:  # class_acc_std_mean -> class_acc_std; a bare class_acc_std -> class_acc (also %)
        if base.endswith(suffix) and len(base) > len(suffix):
            base = base[: -len(suffix)]
            break
    return _head(base)


def _head(base: str) -> str:
    if "." not in base:
        return base
    first, rest = base.split(".", 1)
    if first == "cost":
        return rest.split(".", 1)[0]
    if first in _QUANTITY_HEADS:
        return first
    return rest.split(".", 1)[0] if _lookup(rest.split(".", 1)[0]) is not None else first


def unit_of(name: str) -> Unit:
    """The unit of a logged, per-seed or summary name (:data:`AS_LOGGED` where no rule knows it)."""
    return _lookup(quantity(name)) or AS_LOGGED


def explicit(name: str) -> bool:
    """Whether a rule of this table (not the fallback) gives ``name`` its unit."""
    return _lookup(quantity(name)) is not None


def shown(name: str, value: float) -> float:
    """A computed value in its shown unit (accuracies times 100, ...); NaN stays NaN."""
    scale = unit_of(name).scale
    return value if scale == 1.0 or value is None else float(value) * scale


def computed(name: str, value: float) -> float:
    """The inverse of :func:`shown`: a shown (or logged) value back in the unit the formulas take."""
    scale = unit_of(name).scale
    return value if scale == 1.0 or value is None else float(value) / scale


def format_value(name: str, value: float, is_shown: bool = False) -> str:
    """A computed value (``is_shown``: a value already in its unit) as the text every table prints."""
    unit = unit_of(name)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return unit.format(float(value) if is_shown else shown(name, value))


# Abbreviations shown in capitals in every table (HLR, LRS, CREI, ...).
ABBREVIATIONS = ("lrs", "ars", "hlr", "ior", "ior_aug", "ior_noaug", "rr", "ae", "crei", "rcr", "rrm", "aem", "creim",
                 "rcrm")


def display_name(name: str) -> str:
    """A value's name as a table heads it: the abbreviations in capitals (``hlr`` -> ``HLR``)."""
    return name.upper() if name in ABBREVIATIONS else name


def shown_frame(table, keep: tuple[str, ...] = ("seed",)):
    """A DataFrame of computed values (one column per name) in shown units; ``keep`` columns and
    columns that are not numbers stay as they are."""
    out = table.copy()
    for column in out.columns:
        if column not in keep and out[column].dtype.kind in "fi" and unit_of(str(column)).scale != 1.0:
            out[column] = out[column].astype(float) * unit_of(str(column)).scale
    return out
