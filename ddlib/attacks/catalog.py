"""The catalog of attacks: their registry (:data:`ATTACKS`, on :class:`ddlib.specs.registry.Registry`), their
specs (:class:`AttackSpec`) and the torchattacks attacks registered on it.

An entry is a factory ``factory(model, num_classes, seed, *, param=default, ...) -> attack``
(a torchattacks attack, or anything with its interface: ``atk(x, y)``, ``supported_mode``,
``set_mode_targeted_by_label``); its keyword-only parameters with defaults are the spec's
parameters, and ``norm`` ("Linf", "L2", or None for a minimum-norm attack) is its threat model.
:func:`register_attack` is the decorator; the torchattacks classes below are registered with their
constructors' defaults (``_torchattack``), which :class:`AttackSpec` checks and writes canonically.

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
square        Square         norm Linf, eps 8/255, n_queries 5000, n_restarts 1, p_init 0.8,
                             loss margin, resc_schedule True; seed: the attack seed (BEARD's
                             call, ``eva_utils.epoch``, exactly, with its ``seed=0`` at seed 0)
spsa          SPSA           eps 8/255 (BEARD's; torchattacks: 0.3), delta 0.01, lr 0.01,
                             nb_iter 1, nb_sample 128, max_batch_size 64
============  =============  ==================================================================

``square`` and ``spsa`` are query (score-based, black-box) attacks: they read the model's logits,
never its gradients. BEARD (``Code/eva_utils.py``, 2025) calls ``Square`` with the arguments above
in both modes, and ``SPSA(net, eps=8/255)`` in targeted mode only: its untargeted ``Spsa`` branch
runs ``AutoAttack(net, eps=8/255)`` instead (a copy-paste slip, so its published untargeted SPSA
accuracy, 27.0 on BACON IPC 50, is AutoAttack's 27.01); here ``spsa`` is SPSA in both modes. At
BEARD's settings SPSA moves no pixel by more than ``nb_iter`` x ``lr`` = 0.01 = 2.55/255 (one Adam
step, each of about ``lr``): it spends under a third of its 8/255 budget, so its robust accuracy is
that of a 2.55/255 attack; ``nb_iter: 4`` or more lets it reach 8/255
(``tests/test_attacks_query.py``). Each attack's queries (model evaluations per image, counted) are
measured by :func:`ddlib.attacks.run_attack`.

``cw`` and ``deepfool`` are minimum-norm attacks with no ε bound; the others keep every
adversarial image within ε of the clean one (L∞, or L2 for ``pgd_l2`` and ``autoattack`` with
``norm: L2``) and inside [0, 1]. Numbers may be strings such as ``"8/255"`` (YAML reads them so;
:func:`ddlib.specs.registry.parse_number`); an unknown attack or parameter raises ``ValueError`` naming it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import torch.nn as nn

from ddlib.engine.adversarial_training import import_torchattacks
from ddlib.specs.registry import Entry, Registry, Spec, parse_number

torchattacks = import_torchattacks()

__all__ = ["ATTACKS", "AttackSpec", "register_attack", "list_attacks", "get_entry", "parse_attack", "parse_attacks",
           "create_attack", "supports_targeted", "targeted_skip_reason", "NORMS"]

NORMS = ("Linf", "L2", None)

# --------------------------------------------------------------------------- parameters

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
    "n_restarts": (1, None),
    "p_init": (1e-12, 1.0),
    "nb_iter": (1, None),
    "nb_sample": (1, None),
    "max_batch_size": (1, None),
    "delta": (1e-12, None),
}
_CHOICES: dict[str | tuple[str, str], tuple[str, ...]] = {  # name, or (attack, name)
    "norm": ("Linf", "L2"),
    "version": ("standard", "plus", "rand"),
    "kernel_name": ("gaussian", "linear", "uniform"),
    "loss": ("ce", "dlr", "margin"),
    ("square", "loss"): ("ce", "margin"),  # an attack's own choices, where they differ from the shared ones
}


def _coerce(attack: str, key: str, default: Any, value: Any) -> Any:
    """``value`` converted to the type of ``default`` and range-checked."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"attack {attack!r}: {key!r} must be true or false, got {value!r}")
        return value
    if isinstance(default, str):
        choices = _CHOICES.get((attack, key), _CHOICES.get(key))
        if not isinstance(value, str) or (choices and value not in choices):
            raise ValueError(f"attack {attack!r}: {key!r} must be one of {choices}, got {value!r}")
        return value
    v = parse_number(value, f"attack {attack!r}: {key!r}")
    if isinstance(default, int):
        if v != int(v):
            raise ValueError(f"attack {attack!r}: {key!r} must be an integer, got {value!r}")
        v = int(v)
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


class AttackSpec(Spec):
    """An attack and its fully resolved parameters (defaults filled in, types checked)."""

    @classmethod
    def check(cls, entry: Entry, key: str, value: Any) -> Any:
        return _coerce(entry.name, key, entry.defaults[key], value)

    @property
    def norm(self) -> str | None:
        """The threat model's norm ("Linf" or "L2"), or None for minimum-norm attacks (cw, deepfool)."""
        bound = self.entry.meta.get("norm")
        return self.params.get("norm", bound) if bound else None

    @property
    def eps(self) -> float | None:
        """The ε bound in pixel units of a norm-bounded attack; None for a minimum-norm one (cw, deepfool)."""
        return self.params["eps"] if self.norm else None

    # Written for MLflow and the reuse keys: ``pgd(alpha=2/255, eps=8/255, random_start=False, steps=10)``.
    sorted_params, bare_name = True, False

    @classmethod
    def show(cls, key: str, value: Any) -> str:
        return _format(key, value)


ATTACKS: Registry = Registry("attack", spec=AttackSpec)


def register_attack(name: str | None = None, *, norm: str | None, **meta) -> Callable:
    """Decorator: register ``factory(model, num_classes, seed, *, param=default, ...) -> attack`` as an
    attack. ``norm``: "Linf" or "L2" (the spec's ``eps`` bounds the perturbation in that norm), or
    None (a minimum-norm attack, no ε). ``channels=3`` in ``meta``: images of that many channels only."""
    if norm not in NORMS:
        raise ValueError(f"attack {name!r}: norm must be one of {NORMS}, got {norm!r}")
    return ATTACKS.register(name, norm=norm, **meta)


# --------------------------------------------------------------------------- the torchattacks attacks

_NOT_PARAMS = {"model", "verbose", "seed", "n_classes"}


def _torchattack(name: str, cls: type, bound: str | None, /, *, build: Callable | None = None, **overrides) -> None:
    """Register torchattacks' ``cls`` with threat model ``bound`` (its ``norm``): its constructor's defaults, with
    ``overrides`` on top (new keys
    allowed only with ``build(model, num_classes, seed, **params)``, which then makes the attack)."""
    sig = inspect.signature(cls.__init__)
    defaults = {k: p.default for k, p in sig.parameters.items() if k != "self" and k not in _NOT_PARAMS}
    unknown = set(overrides) - set(defaults)
    if unknown and build is None:
        raise TypeError(f"{name}: {sorted(unknown)} are not {cls.__name__} arguments")
    defaults.update(overrides)

    def make(model, num_classes, seed, **params):
        return cls(model, **params)

    ATTACKS.add(name, build or make, defaults=dict(sorted(defaults.items())), norm=bound, cls=cls,
                **({"channels": 3} if cls is torchattacks.TIFGSM else {}))


def _build_autoattack(model, num_classes, seed, *, norm, eps, version, steps, n_target_classes, n_queries):
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
    for every batch); :func:`ddlib.attacks.run_attack` runs it inside ``fork_rng`` so nothing leaks out.
    APGD-T's targeted DLR loss reads the 4th largest logit: at least 4 classes are needed.
    """
    if num_classes < 4:
        raise ValueError(f"attack 'autoattack' needs at least 4 classes (APGD-T's DLR loss), got {num_classes}")
    n_target = min(num_classes - 1, n_target_classes)
    atk = torchattacks.AutoAttack(model, norm=norm, eps=eps, version=version, n_classes=n_target + 1, seed=seed,
                                  verbose=False)
    for component in atk._autoattack.attacks:
        if isinstance(component, (torchattacks.APGD, torchattacks.APGDT, torchattacks.FAB)):
            component.steps = steps
        elif isinstance(component, torchattacks.Square):
            component.n_queries = n_queries
    return atk


_torchattack("fgsm", torchattacks.FGSM, "Linf", eps=8 / 255)
_torchattack("pgd", torchattacks.PGD, "Linf", eps=8 / 255, alpha=2 / 255, steps=10, random_start=False)
_torchattack("pgd_l2", torchattacks.PGDL2, "L2", eps=128 / 255, alpha=15 / 255, steps=10, random_start=False)
_torchattack("cw", torchattacks.CW, None, c=1.0, kappa=0.0, steps=100, lr=0.01)
_torchattack("deepfool", torchattacks.DeepFool, None, steps=50, overshoot=0.02)
_torchattack(
    "autoattack", torchattacks.AutoAttack, "Linf", build=_build_autoattack,
    norm="Linf", eps=8 / 255, version="standard", steps=10, n_target_classes=9, n_queries=5000,
)
_torchattack("difgsm", torchattacks.DIFGSM, "Linf", eps=8 / 255, decay=0.0)
_torchattack("mifgsm", torchattacks.MIFGSM, "Linf", eps=8 / 255, decay=1.0)
_torchattack("tifgsm", torchattacks.TIFGSM, "Linf", eps=8 / 255, decay=0.0, nsig=3.0)  # its kernel: 3 groups
_torchattack("eotpgd", torchattacks.EOTPGD, "Linf", eps=8 / 255)
_torchattack("upgd", torchattacks.UPGD, "Linf", eps=8 / 255, decay=1.0)


def _build_square(model, num_classes, seed, *, norm, eps, n_queries, n_restarts, p_init, loss, resc_schedule):
    """torchattacks' Square seeded with the attack seed (it reseeds the global generator with it at
    every call, as AutoAttack does; BEARD passes ``seed=0``)."""
    return torchattacks.Square(model, norm=norm, eps=eps, n_queries=n_queries, n_restarts=n_restarts, p_init=p_init,
                               loss=loss, resc_schedule=resc_schedule, seed=seed, verbose=False)


_torchattack("square", torchattacks.Square, "Linf", build=_build_square)
_torchattack("spsa", torchattacks.SPSA, "Linf", eps=8 / 255)


# --------------------------------------------------------------------------- lookup and specs


def list_attacks() -> list[str]:
    """The registered attacks' names, sorted: what a params file's ``attacks:`` list may name."""
    return ATTACKS.names()


def get_entry(name: str) -> Entry:
    """The registry entry of ``name``: ``defaults``, ``norm``, and ``cls`` for a torchattacks class."""
    return ATTACKS.entry(name)


def parse_attack(spec: "str | Mapping[str, Any] | AttackSpec") -> AttackSpec:
    """``"fgsm"``, ``{"pgd": {"eps": "4/255"}}`` or an :class:`AttackSpec` -> :class:`AttackSpec`."""
    return ATTACKS.parse(spec)


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
    """Build the attack a spec names, on a model, with its parameters checked.

    The spec is what a params file writes (a name, or a name with parameters); every parameter not
    given takes the catalog's default (see the table above), so the same spec is the same attack
    everywhere it is named. The attack is in untargeted (default) mode.

    Args:
        spec: ``"fgsm"``, ``{"pgd": {"eps": "4/255", "steps": 20}}`` or an :class:`AttackSpec`.
        model: the attacked network, taking pixels in [0, 1] (:class:`~ddlib.attacks.spaces.PixelModel` wraps one that does not).
        num_classes: the dataset's class count (an integer >= 2: AutoAttack's targets).
        seed: the seed of attacks that draw at random (AutoAttack, Square).

    Returns:
        A torchattacks attack (or one with its interface): ``attack(images, labels)`` returns
        the adversarial images.

    Raises:
        ValueError: an unknown attack, parameter or value, or a bad ``num_classes``.

    Example:
        >>> import torch
        >>> from ddlib.attacks import create_attack
        >>> from ddlib.models import create_model
        >>> model = create_model("convnet", 3, 10, 32).eval()
        >>> attack = create_attack({"pgd": {"eps": "4/255", "steps": 2}}, model, num_classes=10)
        >>> images, labels = torch.rand(4, 3, 32, 32), torch.randint(0, 10, (4,))
        >>> adversarial = attack(images, labels)
        >>> bool((adversarial - images).abs().max() <= 4 / 255 + 1e-6)
        True
    """
    spec = parse_attack(spec)
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    return ATTACKS.create(spec, model, num_classes, seed)


_SUPPORTED_MODES: dict[tuple, tuple[str, ...]] = {}


def _supported_modes(entry: Entry) -> tuple[str, ...]:
    """``supported_mode`` of the attack: of an instance of its torchattacks class (or, for another
    attack, of one built with its defaults) on a dummy model, never through :func:`create_attack`,
    so the answer does not depend on what was built before."""
    key = (entry.name, id(entry.factory))
    if key not in _SUPPORTED_MODES:
        cls = entry.meta.get("cls")
        atk = cls(nn.Linear(1, 10)) if cls is not None else entry.factory(nn.Linear(1, 10), 10, 0, **entry.defaults)
        _SUPPORTED_MODES[key] = tuple(getattr(atk, "supported_mode", ("default",)))
    return _SUPPORTED_MODES[key]


def targeted_skip_reason(spec) -> str | None:
    """Why ``spec`` cannot run in targeted mode, or None if it can."""
    spec = parse_attack(spec)
    modes = _supported_modes(spec.entry)
    if "targeted" not in modes:
        cls = spec.entry.meta.get("cls")
        what = f"torchattacks {cls.__name__}" if cls is not None else "it"
        return f"{spec.name}: {what} supports {list(modes)} only, no targeted mode"
    if spec.name == "upgd" and spec.params["loss"] == "dlr":
        # UPGD's targeted DLR loss reads the true label, which set_mode_targeted_by_label replaces
        # with the target: the loss would be identically 0 (torchattacks 3.5.1 upgd.py dlr_loss).
        return "upgd: loss 'dlr' in targeted mode reads the true label, which torchattacks replaces with the target"
    return None


def supports_targeted(spec) -> bool:
    """Whether ``spec`` can run in targeted mode (``"targeted" in atk.supported_mode``)."""
    return targeted_skip_reason(spec) is None
