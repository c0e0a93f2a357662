"""Adversarial attacks for robustness scores (BEARD protocol), on torchattacks 3.5.1, done right.

One registry, as in torchattacks and timm: ``create_attack(spec, model, num_classes)`` builds a
torchattacks attack from a spec, one small entry per attack. A spec is a registry name, a
one-key mapping ``{name: {param: value}}`` (the YAML form), or an :class:`AttackSpec`::

    attacks: [fgsm, {pgd: {eps: 4/255, random_start: true}}, {pgd_l2: {eps: 128/255, alpha: 15/255}}]

Numbers may be strings such as ``"8/255"`` (YAML reads them so); an unknown attack or parameter
raises ``ValueError`` naming it. Every parameter has a default (the table below), and
:meth:`AttackSpec.describe` gives the canonical string (name and every resolved parameter) to log.

What BEARD (Zhou et al. 2024, ``Code/eva_utils.py:epoch``) gets wrong and this module does not:

* **Pixel space.** torchattacks assumes inputs in [0, 1]: its ε, step sizes and clamping are in
  pixel units. BEARD feeds it *normalised* tensors, so its "ε = 8/255" is 8/255 in normalised
  units (8/255 × std ≈ 1.6/255 in pixels for CIFAR-10), while its [0, 1] clamp acts on normalised
  values: every pixel below its channel mean or above mean + std is moved there, a pixel-space
  change far larger than any ε. Here models are wrapped in :class:`PixelModel`, which normalises
  inside its forward, and images are pixels in [0, 1]. ``space="beard_compat"`` (see
  :func:`run_attack`) reproduces BEARD's pipeline exactly, to check a published number against it;
  its results are never a pixel-space robustness.
* **Targets for any number of classes.** BEARD targets ``(y + 1) % 10`` whatever the dataset
  (``eva_utils.epoch``, every targeted attack, CIFAR-100 and TinyImageNet included: only classes
  0-9 are ever targets there); :func:`target_labels` uses the dataset's class count (``next``),
  draws another class at random from a private, seeded generator (``random``), or gives BEARD's
  targets as a named kind (``next_mod10``, for ``beard_compat`` on other than 10 classes).
* **Skipped, not faked.** In targeted mode BEARD runs no attack for DeepFool and AutoAttack and
  logs the *clean* accuracy as their robust accuracy. Here an attack whose torchattacks class cannot
  target (``"targeted" not in atk.supported_mode``) is reported as skipped, with no accuracy.
* **Seeds.** BEARD seeds from the clock (``get_network`` and AutoAttack's ``seed=None`` both use
  ``time.time()``). Here each batch runs inside ``torch.random.fork_rng`` seeded from
  (seed, batch index), on CPU and CUDA, and AutoAttack gets the seed too: the same seed gives the
  same adversarial images, and the global generators are left as they were.
* **BEARD's PGD step** was ``alpha=2/225``, a typo for 2/255 (so 0.00889, not 0.00784); the
  default here is 2/255. Pass ``alpha: 2/225`` to reproduce BEARD.

Registry (defaults; torchattacks' own defaults unless noted):

============  =============  ==================================================================
name          class          parameters
============  =============  ==================================================================
fgsm          FGSM           eps 8/255
pgd           PGD            eps 8/255, alpha 2/255, steps 10, random_start False (torchattacks:
                             True; BEARD ran False)
pgd_l2        PGDL2          eps 128/255, alpha 15/255 (BEARD's; torchattacks: 1.0, 0.2),
                             steps 10, random_start False (torchattacks: True), eps_for_division
cw            CW             c 1, kappa 0, steps 100 (BEARD's; torchattacks: 50), lr 0.01
deepfool      DeepFool       steps 50, overshoot 0.02
autoattack    AutoAttack     norm Linf, eps 8/255, version standard, steps 10,
                             n_target_classes 9, n_queries 5000 (see :func:`_build_autoattack`)
difgsm        DIFGSM         eps 8/255, alpha 2/255, steps 10, decay 0, resize_rate 0.9,
                             diversity_prob 0.5, random_start False
mifgsm        MIFGSM         eps 8/255, alpha 2/255, steps 10, decay 1
tifgsm        TIFGSM         eps 8/255, alpha 2/255, steps 10, decay 0, kernel_name gaussian,
                             len_kernel 15, nsig 3, resize_rate 0.9, diversity_prob 0.5,
                             random_start False (3-channel images only: its kernel is fixed
                             to 3 groups)
eotpgd        EOTPGD         eps 8/255, alpha 2/255, steps 10, eot_iter 2, random_start True
upgd          UPGD           eps 8/255, alpha 2/255, steps 10, random_start False, loss ce,
                             decay 1, eot_iter 1
============  =============  ==================================================================

``cw`` and ``deepfool`` are minimum-norm attacks with no ε bound; the others keep every
adversarial image within ε of the clean one (L∞, or L2 for ``pgd_l2`` and ``autoattack`` with
``norm: L2``) and inside [0, 1].

Measurements (:func:`run_attack`): robust accuracy over all N images; the attack success rate as
the BEARD paper defines it (clean-correct and wrong after the attack, over all N); BEARD's code
convention clean − robust accuracy; targeted success; wall time of the attack pass (crafting +
classifying, synchronised on CUDA) next to :func:`clean_pass`'s time for BEARD's AE score; and the
largest L∞ and L2 perturbation actually applied, in pixel space.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torchattacks
from tqdm.auto import tqdm

from ddlib.engine.device import resolve_device, synchronize
from ddlib.engine.train import Normalize, as_pixels

__all__ = [
    "SPACES",
    "PixelModel",
    "AttackSpec",
    "AttackEntry",
    "CleanOutcome",
    "AttackOutcome",
    "TARGET_KINDS",
    "list_attacks",
    "get_entry",
    "parse_attack",
    "parse_attacks",
    "create_attack",
    "supports_targeted",
    "targeted_skip_reason",
    "target_labels",
    "batch_seed",
    "clean_pass",
    "run_attack",
]

TARGET_KINDS = ("next", "random", "next_mod10")
# Where the attack acts: "pixel" (pixels in [0, 1], ε a pixel-space bound: the default) or
# "beard_compat" (BEARD's pipeline: normalised tensors fed to torchattacks, see run_attack).
SPACES = ("pixel", "beard_compat")
_clock = time.perf_counter  # every timed region reads this clock (tests replace it with a counter)


class PixelModel(nn.Module):
    """Wraps a model that takes normalised inputs so that it takes pixels in [0, 1].

    ``forward(x) = model((x - mean) / std)``. Attacks on a ``PixelModel`` perturb pixels, so their ε,
    step sizes and [0, 1] clamping mean what they say.
    """

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.normalize = Normalize(mean, std)
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.normalize(x))

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """The inverse of the normalisation: model inputs back to pixel units."""
        return x * self.normalize.std + self.normalize.mean


# --------------------------------------------------------------------------- parameters


def _number(attack: str, key: str, value: Any) -> float:
    """A float from YAML (which reads ``8/255`` or ``1e-3`` as strings), naming attack and key."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = float(Fraction(value.strip())) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"attack {attack!r}: {key!r} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"attack {attack!r}: {key!r} must be finite, got {value!r}")
    return v


def _integer(attack: str, key: str, value: Any) -> int:
    v = _number(attack, key, value)
    if v != int(v):
        raise ValueError(f"attack {attack!r}: {key!r} must be an integer, got {value!r}")
    return int(v)


# Lower and upper bounds (inclusive) per parameter name; anything not listed must be >= 0.
_BOUNDS: dict[str, tuple[float, float | None]] = {
    "steps": (1, None),
    "eot_iter": (1, None),
    "len_kernel": (1, None),
    "n_target_classes": (1, None),
    "n_queries": (1, None),
    "diversity_prob": (0.0, 1.0),
    "resize_rate": (1e-12, None),
    "eps_for_division": (1e-300, None),
    "nsig": (1e-12, None),
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "norm": ("Linf", "L2"),
    "version": ("standard", "plus", "rand"),
    "kernel_name": ("gaussian", "linear", "uniform"),
    "loss": ("ce", "dlr", "margin"),
}


def _coerce(attack: str, key: str, default: Any, value: Any) -> Any:
    """``value`` converted to the type of ``default`` and range-checked."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"attack {attack!r}: {key!r} must be true or false, got {value!r}")
        return value
    if isinstance(default, str):
        choices = _CHOICES.get(key)
        if not isinstance(value, str) or (choices and value not in choices):
            raise ValueError(f"attack {attack!r}: {key!r} must be one of {choices}, got {value!r}")
        return value
    v = _integer(attack, key, value) if isinstance(default, int) else _number(attack, key, value)
    lo, hi = _BOUNDS.get(key, (0, None))
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"attack {attack!r}: {key!r} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")
    return v


def _format(key: str, value: Any) -> str:
    """Canonical, exact, readable: ``8/255`` for eps/alpha values that are exactly k/255."""
    if isinstance(value, float) and key in ("eps", "alpha"):
        k = round(value * 255)
        if k / 255 == value and k != 0:
            return f"{k}/255"
    return repr(value)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class AttackEntry:
    """One registry entry: the torchattacks class, our defaults, and how to build it."""

    name: str
    cls: type
    defaults: Mapping[str, Any]
    norm: str | None  # "Linf" or "L2": the threat model's bound; None: minimum-norm, unbounded
    build: Callable[..., Any] | None = None  # (model, params, num_classes, seed) -> attack; default cls(model, **params)


_REGISTRY: dict[str, AttackEntry] = {}
_NOT_PARAMS = {"model", "verbose", "seed", "n_classes"}


def _register(name: str, cls: type, bound: str | None, *, build=None, **overrides) -> None:
    """Defaults are the torchattacks constructor's, with ``overrides`` on top (new keys allowed only
    through ``build``)."""
    sig = inspect.signature(cls.__init__)
    defaults = {k: p.default for k, p in sig.parameters.items() if k != "self" and k not in _NOT_PARAMS}
    unknown = set(overrides) - set(defaults)
    if unknown and build is None:
        raise TypeError(f"{name}: {sorted(unknown)} are not {cls.__name__} arguments")
    defaults.update(overrides)
    _REGISTRY[name] = AttackEntry(name, cls, dict(sorted(defaults.items())), bound, build)


def _build_autoattack(model, params, num_classes, seed):
    """torchattacks' AutoAttack, seeded, with its target count from the data.

    What torchattacks 3.5.1 runs for ``version='standard'`` (``attacks/autoattack.py``: a
    ``MultiAttack`` that runs the components in this order, each on the images no earlier one has
    fooled, each attacking only images it classifies correctly), against the original AutoAttack
    of Croce & Hein (2020, ``fra31/auto-attack``, ``version='standard'``, same order):

    =========  ==========================================  ====================================
    component  torchattacks 3.5.1                           original AutoAttack (standard)
    =========  ==========================================  ====================================
    APGD-CE    10 iterations, 1 restart                     100 iterations, 1 restart
    APGD-T     DLR-targeted, 10 iterations, 1 restart,      100 iterations, 1 restart,
               n_classes − 1 target classes                 9 target classes
    FAB-T      10 iterations, 1 restart,                    100 iterations, 1 restart,
               n_classes − 1 target classes                 9 target classes
    Square     5000 queries, 1 restart, p_init 0.8          5000 queries, 1 restart, p_init 0.8
    =========  ==========================================  ====================================

    The step sizes, rho 0.75, FAB's alpha_max/eta/beta and Square's p_init match the original;
    the iteration counts do not (torchattacks builds APGD, APGD-T and FAB with their default
    ``steps=10``), and the target count follows torchattacks' ``n_classes`` argument, which is used
    for nothing but the number of target classes (``n_classes − 1``) and defaults to 10 (BEARD
    never set it): fewer than 10 classes then index past the logits, 100 classes give 99 targets.

    Here ``n_classes = min(num_classes, n_target_classes + 1)`` with ``n_target_classes = 9`` by
    default: min(C − 1, 9) targets, as the original, for any C. ``steps`` (default 10,
    torchattacks' and hence BEARD's) sets the iterations of APGD-CE, APGD-T and FAB-T, so
    ``steps: 100`` gives the original's; ``n_queries`` (default 5000 in both) is Square's budget.
    ``version: plus`` / ``rand`` are torchattacks' other lists (same ``steps``/``n_queries``
    overrides). Each component reseeds the global generator with ``seed`` at every call (the same
    for every batch); :func:`run_attack` runs it inside ``fork_rng`` so nothing leaks out.
    APGD-T's targeted DLR loss reads the 4th largest logit: at least 4 classes are needed.
    """
    if num_classes < 4:
        raise ValueError(f"attack 'autoattack' needs at least 4 classes (APGD-T's DLR loss), got {num_classes}")
    n_target = min(num_classes - 1, params["n_target_classes"])
    atk = torchattacks.AutoAttack(
        model, norm=params["norm"], eps=params["eps"], version=params["version"],
        n_classes=n_target + 1, seed=seed, verbose=False,
    )
    for component in atk._autoattack.attacks:
        if isinstance(component, (torchattacks.APGD, torchattacks.APGDT, torchattacks.FAB)):
            component.steps = params["steps"]
        elif isinstance(component, torchattacks.Square):
            component.n_queries = params["n_queries"]
    return atk


_register("fgsm", torchattacks.FGSM, "Linf", eps=8 / 255)
_register("pgd", torchattacks.PGD, "Linf", eps=8 / 255, alpha=2 / 255, steps=10, random_start=False)
_register("pgd_l2", torchattacks.PGDL2, "L2", eps=128 / 255, alpha=15 / 255, steps=10, random_start=False)
_register("cw", torchattacks.CW, None, c=1.0, kappa=0.0, steps=100, lr=0.01)
_register("deepfool", torchattacks.DeepFool, None, steps=50, overshoot=0.02)
_register(
    "autoattack", torchattacks.AutoAttack, "Linf", build=_build_autoattack,
    norm="Linf", eps=8 / 255, version="standard", steps=10, n_target_classes=9, n_queries=5000,
)
_register("difgsm", torchattacks.DIFGSM, "Linf", eps=8 / 255, decay=0.0)
_register("mifgsm", torchattacks.MIFGSM, "Linf", eps=8 / 255, decay=1.0)
_register("tifgsm", torchattacks.TIFGSM, "Linf", eps=8 / 255, decay=0.0, nsig=3.0)
_register("eotpgd", torchattacks.EOTPGD, "Linf", eps=8 / 255)
_register("upgd", torchattacks.UPGD, "Linf", eps=8 / 255, decay=1.0)


def list_attacks() -> list[str]:
    return sorted(_REGISTRY)


def get_entry(name: str) -> AttackEntry:
    if name not in _REGISTRY:
        raise ValueError(f"unknown attack {name!r}; known: {', '.join(list_attacks())}")
    return _REGISTRY[name]


@dataclass(frozen=True)
class AttackSpec:
    """A registry name and its fully resolved parameters (defaults filled in, types checked)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, name: str, params: Mapping[str, Any] | None = None) -> "AttackSpec":
        entry = get_entry(name)
        params = dict(params or {})
        unknown = sorted(set(params) - set(entry.defaults))
        if unknown:
            raise ValueError(f"attack {name!r}: unknown parameter(s) {unknown}; known: {sorted(entry.defaults)}")
        resolved = {k: (_coerce(name, k, d, params[k]) if k in params else d) for k, d in entry.defaults.items()}
        return cls(name, resolved)

    @property
    def entry(self) -> AttackEntry:
        return get_entry(self.name)

    @property
    def norm(self) -> str | None:
        """The threat model's norm ("Linf" or "L2"), or None for minimum-norm attacks (cw, deepfool)."""
        return self.params.get("norm", self.entry.norm) if self.entry.norm else None

    @property
    def eps(self) -> float | None:
        return self.params["eps"] if self.norm else None

    def describe(self) -> str:
        """Canonical string for MLflow: ``pgd(alpha=2/255, eps=8/255, random_start=False, steps=10)``."""
        return f"{self.name}(" + ", ".join(f"{k}={_format(k, v)}" for k, v in sorted(self.params.items())) + ")"

    def __str__(self) -> str:
        return self.describe()


def parse_attack(spec: "str | Mapping[str, Any] | AttackSpec") -> AttackSpec:
    """``"fgsm"``, ``{"pgd": {"eps": "4/255"}}`` or an :class:`AttackSpec` -> :class:`AttackSpec`."""
    if isinstance(spec, AttackSpec):
        return AttackSpec.create(spec.name, spec.params)
    if isinstance(spec, str):
        return AttackSpec.create(spec)
    if isinstance(spec, Mapping) and len(spec) == 1:
        (name, params), = spec.items()
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"attack {name!r}: parameters must be a mapping, got {params!r}")
        return AttackSpec.create(name, params)
    raise ValueError(f"an attack is a name or a one-key mapping {{name: {{param: value}}}}, got {spec!r}")


def parse_attacks(specs: Sequence) -> list[AttackSpec]:
    """A YAML list of attacks; the same attack twice (same description) is an error."""
    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Sequence):
        raise ValueError(f"attacks must be a list, got {specs!r}")
    out = [parse_attack(s) for s in specs]
    seen = [s.describe() for s in out]
    dupes = sorted({d for d in seen if seen.count(d) > 1})
    if dupes:
        raise ValueError(f"attack(s) listed twice: {dupes}")
    return out


def create_attack(spec, model: nn.Module, num_classes: int, *, seed: int = 0):
    """The torchattacks attack for ``spec`` on ``model`` (which must take pixels in [0, 1]).

    ``num_classes`` is the dataset's class count (AutoAttack's targets); ``seed`` is passed to
    attacks that take one (AutoAttack). The attack is in untargeted (default) mode.
    """
    spec = parse_attack(spec)
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    entry = spec.entry
    params = dict(spec.params)
    if entry.build is not None:
        return entry.build(model, params, num_classes, seed)
    return entry.cls(model, **params)


_SUPPORTED_MODES: dict[str, tuple[str, ...]] = {}


def _supported_modes(name: str) -> tuple[str, ...]:
    """``supported_mode`` of the attack's torchattacks class, read off an instance of the class
    itself on a dummy model (never through :func:`create_attack`, so the answer does not depend on
    what was built before)."""
    if name not in _SUPPORTED_MODES:
        _SUPPORTED_MODES[name] = tuple(get_entry(name).cls(nn.Linear(1, 10)).supported_mode)
    return _SUPPORTED_MODES[name]


def targeted_skip_reason(spec) -> str | None:
    """Why ``spec`` cannot run in targeted mode, or None if it can."""
    spec = parse_attack(spec)
    modes = _supported_modes(spec.name)
    if "targeted" not in modes:
        return f"{spec.name}: torchattacks {spec.entry.cls.__name__} supports {list(modes)} only, no targeted mode"
    if spec.name == "upgd" and spec.params["loss"] == "dlr":
        # UPGD's targeted DLR loss reads the true label, which set_mode_targeted_by_label replaces
        # with the target: the loss would be identically 0 (torchattacks 3.5.1 upgd.py dlr_loss).
        return "upgd: loss 'dlr' in targeted mode reads the true label, which torchattacks replaces with the target"
    return None


def supports_targeted(spec) -> bool:
    """Whether ``spec`` can run in targeted mode (``"targeted" in atk.supported_mode``)."""
    return targeted_skip_reason(spec) is None


# --------------------------------------------------------------------------- targets and seeds


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
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
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
    g = torch.Generator().manual_seed(_check_seed(seed))
    offset = torch.randint(1, num_classes, (y.numel(),), generator=g).view_as(y)
    return ((y.cpu() + offset) % num_classes).to(y.device)


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def batch_seed(seed: int, batch_index: int) -> int:
    """The seed of one batch: a hash of (seed, batch index) by NumPy's SeedSequence, in [0, 2**64)."""
    return int(np.random.SeedSequence([_check_seed(seed), int(batch_index)]).generate_state(1, dtype=np.uint64)[0])


def _fork_devices(device: torch.device) -> list[int]:
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


# --------------------------------------------------------------------------- clean and attack passes


@dataclass
class CleanOutcome:
    """The clean pass: accuracy (fraction), per-image correctness (CPU bool), wall seconds."""

    accuracy: float
    correct: torch.Tensor
    seconds: float
    n: int

    @property
    def seconds_per_sample(self) -> float:
        return self.seconds / max(1, self.n)


@dataclass
class AttackOutcome:
    """One attack on N images. Fractions in [0, 1]; times in seconds; norms in pixel units.

    * ``robust_acc``: share of all N images classified correctly after the attack.
    * ``asr``: attack success rate as the BEARD paper defines it: images classified correctly
      when clean *and* wrongly after the attack, over **all N images** (not over the clean-correct
      ones). ``asr <= clean_acc``.
    * ``asr_beard``: ``clean_acc - robust_acc``, the convention of BEARD's code and leaderboard
      (RR and AE are computed from accuracies). It equals ``asr`` minus the share of clean-wrong
      images that the attack happens to make correct, so ``asr_beard <= asr``.
    * ``targeted_success``: targeted mode only: share of all N classified as their target.
    * ``attack_seconds``: wall time of the attack pass (moving each batch to the device, crafting,
      classifying), synchronised on CUDA; ``seconds_per_sample`` = that / N.
    * ``clean_seconds``: wall time of the clean pass the attack was compared with (the one given,
      or the one :func:`run_attack` timed right before the attack, in the same process).
    * ``max_linf``, ``max_l2``: largest per-image L∞ and L2 norm of (adv − clean), in pixel units
      (in ``beard_compat`` space too, where they exceed ε: that is the point of showing them).
    * ``skipped``/``reason``: the attack cannot run in this mode (e.g. DeepFool targeted): every
      measurement is None; never report a skipped attack's accuracy.
    """

    name: str
    description: str
    targeted: bool
    n: int
    clean_acc: float | None = None
    robust_acc: float | None = None
    asr: float | None = None
    asr_beard: float | None = None
    targeted_success: float | None = None
    attack_seconds: float | None = None
    seconds_per_sample: float | None = None
    clean_seconds: float | None = None
    max_linf: float | None = None
    max_l2: float | None = None
    correct: torch.Tensor | None = field(default=None, repr=False)  # per image, after the attack
    adv: torch.Tensor | None = field(default=None, repr=False)  # adversarial pixels (return_adv=True)
    skipped: bool = False
    reason: str | None = None

    def metrics(self) -> dict[str, float]:
        """The numeric measurements that are set (for ``mlflow.log_metrics``)."""
        keys = ("clean_acc", "robust_acc", "asr", "asr_beard", "targeted_success", "attack_seconds",
                "seconds_per_sample", "clean_seconds", "max_linf", "max_l2")
        return {k: float(getattr(self, k)) for k in keys if getattr(self, k) is not None}


def _check_data(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if images.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    labels = torch.as_tensor(labels).long().cpu()
    if labels.shape != (len(images),):
        raise ValueError(f"{len(images)} images but labels of shape {tuple(labels.shape)}")
    if images.dtype != torch.uint8:
        if not images.is_floating_point():
            raise ValueError(f"images must be uint8 or float pixels, got {images.dtype}")
        if images.numel() and (float(images.min()) < 0.0 or float(images.max()) > 1.0):
            raise ValueError("float images must be pixels in [0, 1] (not normalised: wrap the model in PixelModel)")
    return labels


def _check_batch_size(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return batch_size


@torch.no_grad()
def clean_pass(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int = 256,
    device: str | torch.device = "auto",
) -> CleanOutcome:
    """Classify the clean images (pixels, uint8 or float in [0, 1]) batch by batch, timed like
    :func:`run_attack` times an attack (moving the batch to the device + forward, synchronised).
    ``model`` takes pixels (see :class:`PixelModel`); it is moved to the device and put in eval mode
    for the pass, its training flag restored after. One untimed forward pass on the first batch
    comes first, so one-off start-up costs (CUDA context, allocator, kernel selection) are not
    billed to the clean time, which BEARD's AE compares every attack time with."""
    labels = _check_data(images, labels)
    batch_size = _check_batch_size(batch_size)
    dev = resolve_device(device)
    model = model.to(dev)
    was_training = model.training
    model.eval()
    preds = []
    seconds = 0.0
    try:
        if len(labels):
            model(as_pixels(images[:batch_size].to(dev)))  # warm-up, untimed
        for i in range(0, len(labels), batch_size):
            synchronize(dev)
            start = _clock()
            x = as_pixels(images[i : i + batch_size].to(dev, non_blocking=True))
            pred = model(x).argmax(1)
            synchronize(dev)
            seconds += _clock() - start
            preds.append(pred.cpu())
    finally:
        model.train(was_training)
    pred = torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)
    correct = pred == labels
    return CleanOutcome(int(correct.sum()) / len(labels) if len(labels) else 0.0, correct, seconds, len(labels))


def _warm_up(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One forward and backward pass to the input (the parameters' gradients are left alone)."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        torch.autograd.grad(nn.functional.cross_entropy(model(x), y), [x])


def run_attack(
    spec,
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_classes: int,
    targeted: bool = False,
    targets: torch.Tensor | str | None = None,
    batch_size: int = 256,
    seed: int = 0,
    device: str | torch.device = "auto",
    clean: CleanOutcome | None = None,
    return_adv: bool = False,
    progress: bool = False,
    space: str = "pixel",
) -> AttackOutcome:
    """Run one attack on (``images``, ``labels``) and measure it (see :class:`AttackOutcome`).

    ``model`` takes pixels in [0, 1] (wrap a normalised-input model in :class:`PixelModel`); it is
    moved to the device and kept in eval mode throughout (torchattacks would switch it anyway).
    ``images`` are pixels (uint8, or float in [0, 1]); batches go to the device one at a time.

    ``targeted``: attack towards ``targets`` (a tensor of classes, or a :func:`target_labels` kind,
    ``"next"`` by default, ``"random"`` drawn with ``seed``) through torchattacks'
    ``set_mode_targeted_by_label``. An attack that cannot target is returned as skipped, unrun.

    ``seed``: batch b runs inside ``torch.random.fork_rng`` (CPU and the CUDA device) seeded with
    :func:`batch_seed` (seed, b), and AutoAttack gets ``seed``: the same seed, data, batch size and
    device give the same adversarial images; the global generators are left untouched.
    ``clean``: a :func:`clean_pass` of the same model and images; if omitted, one is run (and
    timed) right before the attack, in this process, so ``clean_seconds`` and ``attack_seconds``
    share the process, device and load. Adversarial images are floats (not re-quantised to uint8);
    ``return_adv`` keeps them (on the CPU, in pixel units) in ``AttackOutcome.adv``.

    ``space``: ``"pixel"`` (default) attacks ``model`` on pixels, so ε, step sizes and the [0, 1]
    clamp mean what they say. ``"beard_compat"`` reproduces BEARD's pipeline (``eva_utils.epoch``):
    ``model`` must be a :class:`PixelModel`; the attack runs on its inner model, fed the
    *normalised* images, so ε and steps are in normalised units and torchattacks' [0, 1] clamp
    acts on normalised values (moving every pixel below its channel mean up to it, and every pixel
    above mean + std down to it); the inner model classifies the result as BEARD's does. Only for
    checking a published BEARD number: its robust accuracies are not robustness to any pixel-space ε.
    """
    spec = parse_attack(spec)
    labels = _check_data(images, labels)
    batch_size = _check_batch_size(batch_size)
    seed = _check_seed(seed)
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    n = len(labels)
    base = dict(name=spec.name, description=spec.describe(), targeted=bool(targeted), n=n)
    if targeted:
        reason = targeted_skip_reason(spec)
        if reason is not None:
            return AttackOutcome(**base, skipped=True, reason=reason)
        if targets is None or isinstance(targets, str):
            targets = target_labels(labels, num_classes, targets or "next", seed)
        targets = torch.as_tensor(targets).long().cpu()
        if targets.shape != labels.shape:
            raise ValueError(f"targets must have shape {tuple(labels.shape)}, got {tuple(targets.shape)}")
        if n and (int(targets.min()) < 0 or int(targets.max()) >= num_classes):
            raise ValueError(f"targets must lie in [0, {num_classes})")
        if bool((targets == labels).any()):
            raise ValueError("a target equals the true label; targets must be other classes")
    elif targets is not None:
        raise ValueError("targets given for an untargeted attack")
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    if space == "beard_compat" and not isinstance(model, PixelModel):
        raise ValueError("space 'beard_compat' needs a PixelModel (it attacks the inner model on normalised inputs)")
    if spec.name == "tifgsm" and images.shape[1] != 3:
        raise ValueError(
            f"attack 'tifgsm' needs 3-channel images (torchattacks' TIFGSM kernel has 3 groups), got {images.shape[1]}"
        )

    dev = resolve_device(device)
    model = model.to(dev)
    if clean is None:
        clean = clean_pass(model, images, labels, batch_size, dev)
    elif clean.n != n:
        raise ValueError(f"clean pass has {clean.n} images, the attack {n}")
    if space == "beard_compat":  # BEARD: torchattacks on the normalised-input network, normalised tensors in
        attacked, to_input, to_pixels = model.model, model.normalize, model.to_pixels
    else:
        attacked, to_input, to_pixels = model, (lambda x: x), (lambda x: x)
    atk = create_attack(spec, attacked, num_classes, seed=seed)
    if targeted:
        atk.set_mode_targeted_by_label(quiet=True)

    was_training = model.training
    model.eval()
    if n:  # untimed: one-off costs (autograd, kernel selection) are not billed to whichever attack runs first
        _warm_up(attacked, to_input(as_pixels(images[:batch_size].to(dev))), labels[:batch_size].to(dev))
    correct, hit, advs = [], [], []
    seconds, max_linf, max_l2 = 0.0, 0.0, 0.0
    bar = tqdm(total=n, desc=spec.name, disable=not progress, leave=False)
    try:
        for b, i in enumerate(range(0, n, batch_size)):
            y = labels[i : i + batch_size]
            synchronize(dev)
            start = _clock()
            x = as_pixels(images[i : i + batch_size].to(dev, non_blocking=True))
            y_dev = (targets[i : i + batch_size] if targeted else y).to(dev)
            with torch.random.fork_rng(devices=_fork_devices(dev)):
                torch.manual_seed(batch_seed(seed, b))
                adv = atk(to_input(x), y_dev)
            with torch.no_grad():
                pred = attacked(adv).argmax(1)
            synchronize(dev)
            seconds += _clock() - start
            with torch.no_grad():
                adv = to_pixels(adv.detach())
                delta = (adv - x).flatten(1)
                if len(delta):
                    max_linf = max(max_linf, float(delta.abs().amax()))
                    max_l2 = max(max_l2, float(delta.norm(dim=1).amax()))
            pred = pred.cpu()
            if return_adv:
                advs.append(adv.detach().cpu())
            correct.append(pred == y)
            if targeted:
                hit.append(pred == targets[i : i + batch_size])
            bar.update(len(y))
    finally:
        bar.close()
        model.train(was_training)

    adv_correct = torch.cat(correct) if correct else torch.zeros(0, dtype=torch.bool)
    denom = max(1, n)
    robust = float(adv_correct.sum()) / denom
    return AttackOutcome(
        **base,
        clean_acc=clean.accuracy,
        robust_acc=robust,
        asr=float((clean.correct & ~adv_correct).sum()) / denom,
        asr_beard=clean.accuracy - robust,
        targeted_success=(float(torch.cat(hit).sum()) / denom if hit else 0.0) if targeted else None,
        attack_seconds=seconds,
        seconds_per_sample=seconds / denom,
        clean_seconds=clean.seconds,
        max_linf=max_linf,
        max_l2=max_l2,
        correct=adv_correct,
        adv=torch.cat(advs) if return_adv and advs else None,
    )
