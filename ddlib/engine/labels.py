"""Soft labels: the losses that train on them, online teacher relabelling, and stored soft labels.

Most recent distillation methods report accuracies trained on soft labels, either stored with the
set (DATM, MTT's learned labels) or produced on the fly by pretrained teachers that relabel every
augmented batch (SRe2L, RDED, G-VBSM, EDC). DD-Ranking's point is that much of the reported gain
comes from these labels; this module makes both kinds available to the one training loop
(:func:`ddlib.engine.train.train_and_test`) through its loss hook ``loss(logits, targets, inputs)``.

Target convention (one for every loss here). A loss is built with ``targets_are_logits``:

* ``targets_are_logits=True``: the targets are *logits* (a teacher relabelling the batch, or
  stored logits); the loss applies its temperature to them and to the student alike, as in
  Hinton et al. (2015) and the SRe2L / RDED / EDC evaluation code.
* ``targets_are_logits=False`` (default): the targets are int class labels (read as one-hot) or
  *probability rows that are already at the loss's temperature*. :func:`stored_targets` turns a
  set's stored soft labels (probabilities or logits) into such rows for a given temperature.

:class:`TeacherRelabel` sets the flag itself; :func:`create_loss` builds a hook from a YAML spec.
The losses are registered on :data:`LOSSES` (a :class:`ddlib.specs.registry.Registry`, by
:func:`register_loss`): each is one class,
its keyword-only ``__init__`` parameters with their defaults the spec's parameters; every hook
carries its canonical name (``hook.name``).
Training, caching and loading the teachers themselves is :mod:`ddlib.protocols.teachers`.
"""

from __future__ import annotations

import copy

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddlib.data.digest import tensor_digest
from ddlib.specs.registry import Entry, Registry, Spec, parse_number

if TYPE_CHECKING:
    from ddlib.data.distilled import DistilledSet

__all__ = [
    "SoftLoss", "LossSpec", "register_loss", "ce_loss", "kl_loss", "sce_loss", "mse_ce_loss", "create_loss", "LOSSES",
    "TeacherRelabel", "teacher_augment", "LABEL_MIXING_OPS", "stored_targets",
]


# --------------------------------------------------------------------------- losses


def _number(value: Any) -> float | None:
    """A number as params files write it (``4``, ``"1e-3"``, ``"1/2"``), or None."""
    try:
        return parse_number(value)
    except ValueError:
        return None


def _loss_name(kind: str, params: Mapping[str, Any], targets_are_logits: bool = False) -> str:
    """``kl(t_squared=True,temperature=4.0)``: every parameter, sorted (the reuse keys' spelling)."""
    return LossSpec.spell(kind, params, {"targets_are_logits": True} if targets_are_logits else None)


class LossSpec(Spec):
    """A loss spec: flags true or false; ``temperature`` a positive number, weights non-negative."""

    @classmethod
    def check(cls, entry: Entry, key: str, value: Any) -> Any:
        if isinstance(entry.defaults[key], bool):
            if not isinstance(value, bool):
                raise ValueError(f"loss {entry.name!r}: {key} must be true or false, got {value!r}")
            return value
        number = _number(value)  # YAML reads 1e-3 as a string
        if number is None or not (number > 0 if key == "temperature" else number >= 0):
            raise ValueError(f"loss {entry.name!r}: {key} must be a {'positive' if key == 'temperature' else 'non-negative'} "
                             f"number, got {value!r}")
        return number

    # ``kl(t_squared=True,temperature=4.0)``: the reuse keys' spelling
    sorted_params, separator, bare_name = True, ",", False

    @classmethod
    def show(cls, key: str, value: Any) -> str:
        return f"{value}"


LOSSES: Registry = Registry("loss", spec=LossSpec)


def register_loss(name: str):
    """Decorator: register a :class:`SoftLoss` subclass as loss ``name`` (its ``kind``). Its
    ``__init__(self, targets_are_logits=False, *, param=default, ...)`` gives the spec's parameters."""

    def decorate(cls):
        cls.kind = name
        return LOSSES.register(name)(cls)

    return decorate


def _probabilities(targets: torch.Tensor, num_classes: int, are_logits: bool, temperature: float = 1.0) -> torch.Tensor:
    """Targets as probability rows: int labels -> one-hot; logits -> softmax(t / T); rows as given."""
    if not targets.is_floating_point():
        return F.one_hot(targets.long(), num_classes).float()
    if are_logits:
        return F.softmax(targets.float() / temperature, dim=1)
    return targets.float()


class SoftLoss:
    """A loss hook ``loss(logits, targets, inputs)``; ``compute(logits, target, labels)`` separates
    the soft target (teacher logits or probabilities) from the ground truth (used by ``mse_ce``'s CE
    term), so :class:`TeacherRelabel` can pass the teachers' logits and the batch's labels apart."""

    kind = ""
    source = ""  # "stored:" for labels shipped with a set (stored()): part of the name

    def __init__(self, targets_are_logits: bool = False, **params: Any):
        self.targets_are_logits = bool(targets_are_logits)
        self.params = params

    @property
    def name(self) -> str:
        """Canonical name with every resolved parameter: part of the evaluation cache key."""
        return self.source + _loss_name(self.kind, self.params, self.targets_are_logits)

    def stored(self) -> "SoftLoss":
        """The same loss on soft labels stored with a set (or computed once by a teacher and kept):
        named ``stored:<name>``, so its trainings are keyed apart from online relabelling."""
        other = copy.copy(self)
        other.source = "stored:"
        return other

    def describe(self) -> str:
        """The loss's canonical text (with ``stored:`` for stored soft labels), which trainings are keyed by."""
        return self.name

    def __repr__(self) -> str:
        return f"<loss {self.name}>"

    def compute(self, logits: torch.Tensor, target: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each loss's formula: ``logits`` against the soft ``target``, ``labels`` the ground truth (from ``__call__``)."""
        raise NotImplementedError

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor | None = None) -> torch.Tensor:
        # Without a teacher the targets are also the ground truth (as probabilities if they are logits).
        labels = F.softmax(targets.float(), dim=1) if self.targets_are_logits and targets.is_floating_point() else targets
        return self.compute(logits, targets, labels)


@register_loss("ce")
class _CrossEntropy(SoftLoss):
    def __init__(self, targets_are_logits: bool = False):
        super().__init__(targets_are_logits)

    def compute(self, logits, target, labels):
        if not target.is_floating_point():
            return F.cross_entropy(logits, target)
        return F.cross_entropy(logits, _probabilities(target, logits.shape[1], self.targets_are_logits))


@register_loss("kl")
class _KLDivergence(SoftLoss):
    def __init__(self, targets_are_logits: bool = False, *, temperature: float = 4.0, t_squared: bool = True):
        super().__init__(targets_are_logits, temperature=float(temperature), t_squared=bool(t_squared))

    def compute(self, logits, target, labels):
        t = self.params["temperature"]
        p = _probabilities(target, logits.shape[1], self.targets_are_logits, t)
        loss = F.kl_div(F.log_softmax(logits / t, dim=1), p, reduction="batchmean")
        return loss * (t * t) if self.params["t_squared"] else loss


@register_loss("sce")
class _SoftCrossEntropy(SoftLoss):
    def __init__(self, targets_are_logits: bool = False, *, temperature: float = 1.0):
        super().__init__(targets_are_logits, temperature=float(temperature))

    def compute(self, logits, target, labels):
        t = self.params["temperature"]
        p = _probabilities(target, logits.shape[1], self.targets_are_logits, t)
        return -(p * F.log_softmax(logits / t, dim=1)).sum(1).mean()


@register_loss("mse_ce")
class _MSECrossEntropy(SoftLoss):
    def __init__(self, targets_are_logits: bool = False, *, mse_weight: float = 1.0, ce_weight: float = 0.1):
        super().__init__(targets_are_logits, mse_weight=float(mse_weight), ce_weight=float(ce_weight))

    def compute(self, logits, target, labels):
        if self.targets_are_logits and target.is_floating_point():
            mse = F.mse_loss(logits, target.float())  # EDC: MSE between raw student and teacher logits
        else:  # probabilities (or int labels): compare in probability space
            mse = F.mse_loss(F.softmax(logits, dim=1), _probabilities(target, logits.shape[1], False))
        loss = self.params["mse_weight"] * mse
        if self.params["ce_weight"]:
            loss = loss + self.params["ce_weight"] * F.cross_entropy(logits, labels)
        return loss


def ce_loss(*, targets_are_logits: bool = False) -> SoftLoss:
    """Cross-entropy with int labels or probability rows (``F.cross_entropy`` takes both)."""
    return _CrossEntropy(targets_are_logits)


def kl_loss(temperature: float = 4.0, t_squared: bool = True, *, targets_are_logits: bool = False) -> SoftLoss:
    """``T² · KL(p_T || softmax(z / T))`` (batch mean), the knowledge-distillation loss of Hinton et
    al. (2015) used by SRe2L and RDED to train on teacher labels. ``T = 4`` is RDED's CIFAR
    setting. The T² factor keeps gradient magnitudes independent of T (Hinton); SRe2L, RDED and
    EDC's code leave it out (DD-Ranking's ``scale_loss`` defaults to off): set ``t_squared: false``
    to reproduce their numbers. ``p_T`` is ``softmax(targets / T)`` for logits, else the targets."""
    return _KLDivergence(targets_are_logits, temperature=temperature, t_squared=t_squared)


def sce_loss(temperature: float = 1.0, *, targets_are_logits: bool = False) -> SoftLoss:
    """Soft cross-entropy ``-Σ p · log softmax(z / T)`` (batch mean): DATM's loss for its learned
    soft labels (T = 1 there); equals ``ce`` for one-hot targets at T = 1."""
    return _SoftCrossEntropy(targets_are_logits, temperature=temperature)


def mse_ce_loss(mse_weight: float = 1.0, ce_weight: float = 0.1, *, targets_are_logits: bool = False) -> SoftLoss:
    """EDC's / G-VBSM's ``mse_gt`` loss: ``mse_weight · MSE(z, t) + ce_weight · CE(z, y)``.

    Read from EDC's evaluation code (github.com/shaoshitong/EDC, ``Branch_CIFAR_10/train/
    direct_train.py``): ``F.mse_loss(output, soft_label) + F.cross_entropy(output, target) *
    args.ce_weight``, where ``soft_label`` is the mean of the teachers' raw logits, ``output`` the
    student's raw logits (no softmax, no temperature) and ``target`` the images' ground-truth
    labels; ``ce_weight`` defaults to 0.1 there (0.025 in its CIFAR-10 script). DD-Ranking's
    ``MSEGTLoss`` is the same. With probability targets (stored soft labels, no teacher) the MSE
    compares ``softmax(z)`` with the targets instead, and the CE term uses the targets themselves.
    """
    return _MSECrossEntropy(targets_are_logits, mse_weight=mse_weight, ce_weight=ce_weight)


def _split(spec: str | Mapping | None) -> tuple[Any, dict]:
    """``(name, params)`` of a loss spec: ``"kl"``, ``{"name": "kl", "temperature": 4}`` (the presets'
    form), ``{"kl": {"temperature": 4}}`` (the registry's) or None (``ce``)."""
    if spec is None:
        return "ce", {}
    if isinstance(spec, str):
        return spec, {}
    spec = dict(spec)
    if "name" not in spec and len(spec) == 1 and next(iter(spec)) in LOSSES:
        ((name, params),) = spec.items()
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"loss {name!r}: parameters must be a mapping, got {params!r}")
        return name, dict(params or {})
    return spec.pop("name", None), spec


def create_loss(spec: str | dict | None, *, targets_are_logits: bool = False) -> tuple[SoftLoss, str]:
    """A loss hook and its canonical name from a params spec ``{"name": "kl", "temperature": 4}``
    (or ``{"kl": {"temperature": 4}}``, or just ``"kl"``). Unknown names, unknown keys and bad
    values raise ``ValueError`` naming them, so a typo never silently trains with a default.
    ``targets_are_logits`` is not a spec key: it follows from where the targets come from (see the
    module docstring)."""
    name, params = _split(spec)
    if not isinstance(name, str) or name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; known: {LOSSES.names()}" if name is not None
                         else f"loss spec needs a 'name' (one of {LOSSES.names()})")
    known = LOSSES.params(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} for loss {name!r}; known: {sorted(known) or 'none'}")
    hook = LOSSES.create({name: params}, targets_are_logits)
    return hook, hook.name


# --------------------------------------------------------------------------- teacher relabelling


def _modules_digest(modules: Sequence[nn.Module]) -> str:
    return tensor_digest(*[t for m in modules for t in m.state_dict().values()])


class TeacherRelabel:
    """Loss hook that relabels every augmented batch with pretrained teachers (SRe2L's FKD-style
    relabelling, RDED, G-VBSM, EDC), instead of storing soft labels.

    The teachers see the same normalised, augmented inputs as the student, in eval mode under
    ``torch.no_grad()`` (they are never updated: ``requires_grad`` is switched off). Several
    teachers are averaged in logit space, as G-VBSM and EDC ensemble theirs
    (``torch.stack(logits).mean(0)`` in EDC's ``direct_train.py``). The loss then compares the
    student's logits with those teacher logits (``targets_are_logits=True``); the batch's own
    targets are the ground truth of ``mse_ce``'s CE term. They must be the images' own labels, not
    label rows mixed by CutMix/Mixup: train with the augmentation :func:`teacher_augment` gives (as
    :mod:`ddlib.protocols.preset_eval` does), as DD-Ranking hands ``MSEGTLoss`` the unmixed
    ``raw_targets``.

    ``temperature`` (optional) sets the loss's temperature; giving it in both places differently is
    an error. Teachers are moved to the inputs' device on the first call if they are elsewhere.
    """

    def __init__(self, teachers: Sequence[nn.Module], temperature: float | None = None,
                 loss: str | dict | None = "kl"):
        if not teachers:
            raise ValueError("TeacherRelabel needs at least one teacher")
        name, params = _split(loss or "kl")
        if temperature is not None:
            if name in LOSSES and "temperature" not in LOSSES.params(name):
                raise ValueError(f"loss {name!r} takes no temperature (got temperature={temperature})")
            if "temperature" in params and _number(params["temperature"]) != _number(temperature):
                raise ValueError(f"two temperatures: {temperature} and the loss spec's {params['temperature']}")
            params["temperature"] = temperature
        self.loss, loss_name = create_loss({"name": name, **params}, targets_are_logits=True)
        self.teachers = list(teachers)
        for teacher in self.teachers:
            teacher.eval()
            teacher.requires_grad_(False)
        self.name = f"relabel({len(self.teachers)}x{_modules_digest(self.teachers)}):{loss_name}"
        self._last: tuple | None = None  # (inputs, their version, autocast on, logits) of the last batch

    @torch.no_grad()
    def teacher_logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Mean of the teachers' logits on ``inputs`` (eval mode, no autograd graph). The last batch's
        logits are kept: models trained in lockstep (the loop's lr candidates of one seed) hand every
        model the same batch object, and the teachers run once for all of them."""
        last = self._last
        if (last is not None and last[0] is inputs and last[1] == inputs._version
                and last[2] == torch.is_autocast_enabled(inputs.device.type)):
            return last[3]
        logits = self._forward(inputs)
        self._last = (inputs, inputs._version, torch.is_autocast_enabled(inputs.device.type), logits)
        return logits

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        outputs = []
        for teacher in self.teachers:
            if teacher.training:  # someone called .train() on it: BN statistics must not move
                teacher.eval()
            param = next(teacher.parameters(), None)
            if param is not None and param.device != inputs.device:
                teacher.to(inputs.device)
            outputs.append(teacher(inputs).float())
        return torch.stack(outputs).mean(0)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        return self.loss.compute(logits, self.teacher_logits(inputs), targets)

    def many(self, logits: torch.Tensor, targets: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The (S,) losses of S models trained together (the loop's batched mode): ``logits`` is
        S x B x K, ``targets[s]`` and ``inputs[s]`` model s's batch. The teachers run once, on the
        distinct input batches concatenated (models that share a seed share their batch object),
        instead of once per model."""
        distinct = list({id(x): x for x in inputs}.values())
        teacher = self.teacher_logits(distinct[0] if len(distinct) == 1 else torch.cat(distinct))
        by_batch = dict(zip((id(x) for x in distinct), teacher.split([len(x) for x in distinct])))
        return torch.stack([self.loss.compute(logits[s], by_batch[id(x)], targets[s]) for s, x in enumerate(inputs)])

    def describe(self) -> str:
        """The teachers' and the loss's canonical text, which trainings with this relabelling are keyed by."""
        return self.name

    def __repr__(self) -> str:
        return f"<TeacherRelabel {self.name}>"


LABEL_MIXING_OPS = ("cutmix", "mixup")  # augmentation ops that also mix the targets


class _UnmixedTargets:
    """An augmentation hook that augments the images and hands the targets back as given."""

    def __init__(self, augment):
        self.augment = augment
        self.name = f"{augment.name} [targets unmixed]"  # keyed apart from the mixing hook

    def __call__(self, x: torch.Tensor, targets: torch.Tensor, generator: torch.Generator):
        x, _ = self.augment(x, targets, generator)
        return x, targets

    def describe(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<augment {self.name}>"


def teacher_augment(augment):
    """The augmentation of a run relabelled online by teachers: the images as ``augment`` makes them,
    the targets left as they are (``augment`` itself where it mixes no labels).

    Why: the teachers label the mixed images themselves; the batch targets then only feed
    ``mse_ce``'s CE term, which EDC, G-VBSM and DD-Ranking compute on the images' own labels
    (DD-Ranking's CutMix and Mixup never touch targets; its ``train_one_epoch`` passes
    ``raw_targets`` to ``MSEGTLoss``). Area-mixed rows there moved the loss (1.2104 against the
    peer's 1.2010 on one batch)."""
    if augment is None:
        return None
    ops = [getattr(op, "name", "") for op in getattr(augment, "ops", [augment])]
    return _UnmixedTargets(augment) if any(op in LABEL_MIXING_OPS for op in ops) else augment


# --------------------------------------------------------------------------- stored soft labels


def stored_targets(distilled: "DistilledSet", temperature: float = 1.0, atol: float = 1e-3) -> torch.Tensor:
    """A set's stored ``soft_labels`` (N x C) as probability rows at ``temperature``, ready to be the
    training targets of ``ce``/``sce``/``kl`` (built with ``targets_are_logits=False``).

    The whole tensor is read one way: if every entry is non-negative and every row sums to 1
    (within ``atol``) the rows are probabilities, else logits (DATM and MTT-style learned labels
    are logits). Logits become ``softmax(z / T)``; probabilities ``softmax(log p / T)``, which is
    the same distribution when ``p = softmax(z)`` (and ``p`` itself at T = 1). Pass the ``kl``
    loss's temperature here so both sides of the KL are at the same T.
    Raises ``ValueError`` for a missing tensor, a wrong shape, or NaN/Inf.
    """
    soft = distilled.soft_labels
    if soft is None:
        raise ValueError(f"distilled set {distilled.method or distilled.source!r} has no soft labels")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")
    soft = soft.detach().float()
    expected = (len(distilled), distilled.num_classes)
    if tuple(soft.shape) != expected:
        raise ValueError(f"soft labels have shape {tuple(soft.shape)}, expected {expected} (images x classes)")
    if not torch.isfinite(soft).all():
        raise ValueError("soft labels contain NaN or Inf")
    if bool((soft >= 0).all()) and bool(((soft.sum(1) - 1).abs() <= atol).all()):
        if temperature == 1.0:
            return soft / soft.sum(1, keepdim=True)
        return F.softmax(torch.log(soft) / temperature, dim=1)
    return F.softmax(soft / temperature, dim=1)
