"""Adversarial-training objectives for the one training loop (``train_and_test(objective=...)``).

``create_objective(spec, mean=..., std=..., num_classes=...)`` turns a params entry into
``(objective, name)``: ``None`` / ``"standard"`` is plain training (no objective), otherwise a
name or a one-key mapping ``{name: {param: value}}`` of :data:`OBJECTIVES` (a
:class:`ddlib.specs.registry.Registry`; numbers may be strings such as ``"8/255"``). Each objective is one
function registered with ``@OBJECTIVES.register``: ``fn(model, x, y, generator, pixels, *, param=default)``,
its keyword-only parameters the spec's. The hook (:class:`AdversarialObjective`) carries its
canonical name (``objective.name``, every parameter spelled out):

- ``pgd_at`` (Madry et al. 2018, MadryLab/cifar10_challenge): mean CE on PGD-L∞ examples only.
- ``trades`` (Zhang et al. 2019, yaodongyu/TRADES ``trades.py``): CE(f(x), y) + β·KL(f(x) ‖ f(x_adv)).
- ``mart`` (Wang et al. 2020, YisenWang/MART ``mart.py``): boosted CE on f(x_adv) + β·KL·(1 − p_y(x)).
- ``beard_at``: BEARD's "+AT" as its code runs it (``eva_utils.epoch`` with ``train_attack='PGD'``),
  not a pixel-space PGD-AT: ``torchattacks.PGD`` (ε 8/255, step 2/225, 10 steps, no random start)
  on the *normalised* (DSA-augmented) batch, so ε and the step are in normalised units and
  torchattacks' [0, 1] clamp acts on normalised values; untargeted unless ``targeted: true``
  (then towards (y + 1) mod 10, BEARD's); mean CE on the adversarial batch only, the attack
  crafted in eval mode (torchattacks' default), the loss in train mode.

Defaults: eps 8/255, alpha (step) 2/255, 10 steps; β = 6 for TRADES and MART. The objective
gets the batch ``x`` normalised with ``mean``/``std`` (after any augmentation) and int labels.

Except in ``beard_at`` (BEARD's pipeline, on purpose), perturbations live in pixel space, as in the
papers: ε bounds |x_adv − x| in pixels, the perturbation δ is added as ``x + δ / std``. The inner loop keeps each pixel in the box
[min(x, 0), max(x, 1)]: for real images that is exactly the official clamp to [0, 1], while a
synthetic (distilled) pixel outside [0, 1] is never clipped back beyond where the clean image
already is (a pixel at 1.3 may stay at 1.3 or move down; one at −0.2 may stay or move up).
Not meant for a ``preprocess`` module (ZCA): the batch then is not a normalised pixel batch.

Why our own small PGD rather than torchattacks: torchattacks draws its random start from the
global RNG (our training must depend only on the loop's private generator) and clamps every pixel
to [0, 1], which would alter distilled images.

Differences from the official code (deliberate, all noted here):
- random starts come from the loop's generator; as in the official loops the start itself is not
  projected (only each step is), except that with ``steps: 0`` the returned batch is;
- TRADES: the clean softmax target of the inner KL is computed once per batch (under ``no_grad``,
  eval mode) instead of at every step, and the training loss reuses one clean forward pass for CE
  and KL (the official code runs ``model(x_natural)`` twice in train mode: same values and
  gradient, but BatchNorm running statistics are updated once more there);
- MART: the "most likely wrong class" is an argmax with the true class masked out, equal to the
  official ``argsort(...)[:, -2:]`` + ``where`` except on exact ties; ``(1/B)·sum`` is ``mean``.
- All three craft in the mode of the official code: PGD-AT in train mode (Madry's TF model is
  built with ``mode='train'`` and BatchNorm updates its statistics during the attack), TRADES and
  MART in eval mode (``model.eval()`` ... ``model.train()``). The model is in train mode on return.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddlib.engine.train import Objective
from ddlib.specs.registry import Entry, Registry, Spec, parse_number

__all__ = ["create_objective", "adversarial_batch", "PixelSpace", "OBJECTIVES", "AdversarialObjective",
           "import_torchattacks"]

EPS, ALPHA = 8 / 255, 2 / 255


def _number(name: str, key: str, value) -> float:
    """A non-negative finite number: int, float, or a string like ``"0.03"`` or ``"8/255"``."""
    try:
        out = parse_number(value)
    except ValueError:
        out = -1.0
    if out < 0:
        raise ValueError(f"adversarial objective {name!r}: {key} must be a non-negative number, got {value!r}")
    return out


def _resolve(name: str, key: str, value):
    if key == "steps":
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"adversarial objective {name!r}: steps must be a non-negative integer, got {value!r}")
        return value
    if key in ("random_start", "targeted"):
        if not isinstance(value, bool):
            raise ValueError(f"adversarial objective {name!r}: {key} must be true or false, got {value!r}")
        return value
    return _number(name, key, value)


def _show(key: str, value) -> str:
    if not isinstance(value, float):
        return str(value)
    if key in ("eps", "alpha") and value and abs(value * 255 - round(value * 255)) < 1e-9:
        return f"{round(value * 255)}/255"
    return f"{value:g}" if float(f"{value:g}") == value else repr(value)


class ObjectiveSpec(Spec):
    """An objective's spec: steps a non-negative integer, flags booleans, the rest non-negative
    numbers; written ``trades(beta=6, eps=8/255, alpha=2/255, steps=10)`` (the reuse keys' spelling)."""

    @classmethod
    def check(cls, entry: Entry, key: str, value: Any) -> Any:
        return _resolve(entry.name, key, value)

    bare_name = False

    @classmethod
    def show(cls, key: str, value: Any) -> str:
        return _show(key, value)


# name -> fn(model, x, y, generator, pixels, *, params); parameter order is the order of the canonical name.
OBJECTIVES: Registry = Registry("adversarial objective", spec=ObjectiveSpec)


class PixelSpace:
    """``mean``/``std`` of the normalisation, as (1, C, 1, 1) tensors cached per device and dtype."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean, self.std = tuple(map(float, mean)), tuple(map(float, std))
        self._cache: dict = {}

    def on(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, std)`` as (1, C, 1, 1) tensors on ``x``'s device and dtype, made once per pair."""
        key = (x.device, x.dtype)
        if key not in self._cache:
            as_t = lambda v: torch.tensor(v, dtype=x.dtype).view(1, -1, 1, 1).to(x.device)  # noqa: E731
            self._cache[key] = as_t(self.mean), as_t(self.std)
        return self._cache[key]


def adversarial_batch(
    model: nn.Module,
    x: torch.Tensor,
    inner_loss: Callable[[torch.Tensor], torch.Tensor],
    *,
    pixels: PixelSpace,
    eps: float,
    alpha: float,
    steps: int,
    start: str,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """PGD-L∞ in pixel space: ``steps`` signed-gradient ascent steps of ``inner_loss(model(x_adv))``.

    ``x`` is a normalised batch; the result is too (detached). ``start``: ``"uniform"`` (U[−ε, ε],
    Madry), ``"normal"`` (0.001·N(0, 1), TRADES and MART) or ``"none"``. Each step (not the start,
    as in the official code) is projected onto |δ| ≤ ε and the pixel box [min(p, 0), max(p, 1)] of
    the clean pixels p. Runs in the model's current mode; no host synchronisation.
    """
    mean, std = pixels.on(x)
    x = x.detach()
    p = x * std + mean
    lo = (-p).clamp(max=0).clamp(min=-eps)  # p + δ >= min(p, 0) and δ >= -ε
    hi = (1 - p).clamp(min=0).clamp(max=eps)  # p + δ <= max(p, 1) and δ <= ε
    if start == "uniform":
        delta = torch.empty_like(x).uniform_(-eps, eps, generator=generator)
    elif start == "normal":
        delta = 0.001 * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    elif start == "none":
        delta = torch.zeros_like(x)
    else:
        raise ValueError(f"unknown start {start!r} (uniform, normal, none)")
    with torch.enable_grad():
        for _ in range(steps):
            delta.requires_grad_(True)
            (grad,) = torch.autograd.grad(inner_loss(model(x + delta / std)), [delta])
            delta = (delta.detach() + alpha * grad.sign()).clamp(lo, hi)
    return (x + delta.clamp(lo, hi) / std).detach()  # the clamp only matters for steps == 0


def _int_labels(y: torch.Tensor) -> None:
    if y.ndim != 1 or y.dtype.is_floating_point:
        raise ValueError(
            f"adversarial objectives need int class labels, got targets of shape {tuple(y.shape)} and dtype "
            f"{y.dtype} (soft labels and label-mixing augmentations such as Mixup/CutMix are not supported)"
        )


@OBJECTIVES.register("pgd_at")
def pgd_at(model, x, y, generator, pixels, *, eps=EPS, alpha=ALPHA, steps=10, random_start=True):
    """Madry et al.: mean CE on PGD examples (crafted in train mode, as Madry's ``Model(mode='train')``)."""
    _int_labels(y)
    x_adv = adversarial_batch(model, x, lambda logits: F.cross_entropy(logits, y), pixels=pixels, eps=eps,
                              alpha=alpha, steps=steps, start="uniform" if random_start else "none",
                              generator=generator)
    return F.cross_entropy(model(x_adv), y)


@OBJECTIVES.register("trades")
def trades(model, x, y, generator, pixels, *, beta=6.0, eps=EPS, alpha=ALPHA, steps=10):
    """TRADES: CE(f(x), y) + β · KLDivLoss(sum)(log_softmax f(x_adv), softmax f(x)) / B, inner KL-PGD
    in eval mode from x + 0.001·N(0, 1)."""
    _int_labels(y)
    model.eval()
    try:
        with torch.no_grad():
            p_clean = F.softmax(model(x), dim=1)
        kl = lambda logits: F.kl_div(F.log_softmax(logits, dim=1), p_clean, reduction="sum")  # noqa: E731
        x_adv = adversarial_batch(model, x, kl, pixels=pixels, eps=eps, alpha=alpha, steps=steps, start="normal",
                                  generator=generator)
    finally:
        model.train()
    logits = model(x)
    robust = F.kl_div(F.log_softmax(model(x_adv), dim=1), F.softmax(logits, dim=1), reduction="batchmean")
    return F.cross_entropy(logits, y) + beta * robust


@OBJECTIVES.register("mart")
def mart(model, x, y, generator, pixels, *, beta=6.0, eps=EPS, alpha=ALPHA, steps=10):
    """MART: BCE(f(x_adv), y) + β · mean_i[KL(f(x_i) ‖ f(x_adv_i)) · (1 − p_y(x_i))], inner CE-PGD in
    eval mode from x + 0.001·N(0, 1); the constants 1.0001, 1e-12, 1.0000001 are MART's."""
    _int_labels(y)
    model.eval()
    try:
        x_adv = adversarial_batch(model, x, lambda logits: F.cross_entropy(logits, y), pixels=pixels, eps=eps,
                                  alpha=alpha, steps=steps, start="normal", generator=generator)
    finally:
        model.train()
    logits, logits_adv = model(x), model(x_adv)
    adv_probs = F.softmax(logits_adv, dim=1)
    new_y = adv_probs.scatter(1, y[:, None], -1.0).argmax(1)  # most likely wrong class on x_adv
    loss_adv = F.cross_entropy(logits_adv, y) + F.nll_loss(torch.log(1.0001 - adv_probs + 1e-12), new_y)
    nat_probs = F.softmax(logits, dim=1)
    true_probs = nat_probs.gather(1, y[:, None])[:, 0]
    kl = F.kl_div(torch.log(adv_probs + 1e-12), nat_probs, reduction="none").sum(1)
    return loss_adv + beta * (kl * (1.0000001 - true_probs)).mean()


def import_torchattacks():
    """torchattacks, imported where first needed (BEARD's attacks, "+AT"), with the install hint: it is not a
    dependency of ddlib (its requests pin conflicts: pyproject's adversarial extra)."""
    try:
        import torchattacks
    except ImportError as e:
        raise ImportError("BEARD's attacks need torchattacks, which is not installed: "
                          "pip install --no-deps 'torchattacks>=3.5.1,<4'") from e
    return torchattacks


@OBJECTIVES.register("beard_at")
def beard_at(model, x, y, generator, pixels, *, eps=EPS, alpha=2 / 225, steps=10, targeted=False):  # 2/225: BEARD's typo
    """BEARD's "+AT": torchattacks' PGD on the normalised batch ``x`` as BEARD's ``eva_utils.epoch``
    calls it (no random start: ``generator`` is unused), then CE on the adversarial batch."""
    _int_labels(y)
    atk = import_torchattacks().PGD(model, eps=eps, alpha=alpha, steps=steps, random_start=False)
    labels = y
    if targeted:
        atk.set_mode_targeted_by_label(quiet=True)
        labels = (y + 1) % 10
    return F.cross_entropy(model(atk(x, labels)), y)


class AdversarialObjective:
    """The objective hook ``objective(model, x, y, generator) -> loss`` of a parsed spec, on the
    normalisation ``pixels``; ``name`` (= ``describe()``) is the spec's canonical text."""

    def __init__(self, spec: ObjectiveSpec, pixels: PixelSpace):
        self.spec, self.pixels = spec, pixels
        self.name = spec.describe()

    def describe(self) -> str:
        """The spec's canonical text, which the trainings of this objective are keyed by."""
        return self.name

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None):
        return self.spec.entry.factory(model, x, y, generator, self.pixels, **self.spec.params)

    def __repr__(self) -> str:
        return f"<objective {self.name}>"


def create_objective(
    spec, *, mean: Sequence[float], std: Sequence[float], num_classes: int
) -> tuple[Objective | None, str]:
    """``(objective, name)`` for a params entry; ``(None, "standard")`` for plain training.

    ``spec``: ``None``, ``"standard"``, a name of :data:`OBJECTIVES`, or ``{name: {param: value}}``.
    ``name`` spells out every resolved parameter, e.g. ``"trades(beta=6, eps=8/255, alpha=2/255,
    steps=10)"``. Unknown names or parameters and bad values raise ``ValueError`` naming them.
    """
    params = {}
    if isinstance(spec, dict):
        if len(spec) != 1:
            keys = sorted(map(str, spec))
            raise ValueError(f"adversarial objective: give one name, as {{name: {{params}}}}, got keys {keys}")
        ((spec, params),) = spec.items()
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ValueError(f"adversarial objective {spec!r}: parameters must be a mapping, got {params!r}")
    if spec is None or spec == "standard":
        if params:
            raise ValueError(f"adversarial objective 'standard' takes no parameters, got {sorted(params)}")
        return None, "standard"
    if not isinstance(spec, str) or spec not in OBJECTIVES:
        raise ValueError(f"unknown adversarial objective {spec!r}; known: {['standard', *OBJECTIVES.names()]}")
    defaults = OBJECTIVES.params(spec)
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for adversarial objective {spec!r}; known: {list(defaults)}")
    parsed = OBJECTIVES.parse({spec: params})
    if len(mean) != len(std) or not len(mean) or any(float(s) <= 0 for s in std):
        raise ValueError(f"adversarial objective {spec!r}: bad mean/std {mean!r}, {std!r}")
    if spec == "mart" and num_classes < 2:
        raise ValueError(f"adversarial objective 'mart' needs at least 2 classes, got {num_classes}")
    if spec == "beard_at" and parsed.params["targeted"] and num_classes < 10:
        raise ValueError(f"adversarial objective 'beard_at': targeted targets (y + 1) mod 10 (BEARD's), which needs at "
                         f"least 10 classes, got {num_classes}")
    objective = AdversarialObjective(parsed, PixelSpace(mean, std))
    return objective, objective.name
