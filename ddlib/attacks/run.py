"""The measuring loop: :func:`clean_pass` and :func:`run_attack` (see :class:`AttackOutcome`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ddlib.attacks.checks import check_batch_size, check_data, check_inputs, check_space
from ddlib.attacks.catalog import create_attack, parse_attack, targeted_skip_reason
from ddlib.attacks.spaces import attack_space
from ddlib.attacks.targets import batch_seed, resolve_targets
from ddlib.engine.device import resolve_device, synchronize
from ddlib.engine.test_pass import as_pixels

__all__ = ["CleanOutcome", "AttackOutcome", "clean_pass", "run_attack"]

_clock = time.perf_counter  # every timed region reads this clock (tests replace it with a counter)


@dataclass
class CleanOutcome:
    """The clean pass: accuracy (fraction), per-image correctness (CPU bool), wall seconds."""

    accuracy: float
    correct: torch.Tensor
    seconds: float
    n: int

    @property
    def seconds_per_sample(self) -> float:
        """The clean pass's wall seconds per image, the unit timings are compared in."""
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
    * ``queries``: model evaluations per image the attack made (its queries, for a query attack such
      as Square or SPSA): the rows of every forward pass of the attacked model while crafting,
      counted by a hook (a batch of B images counts B), summed and divided by N; the warm-up and the
      classification of the result are not counted. Square stops querying an image once fooled, so
      this is a mean; gradient attacks count their forward passes the same way.
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
    queries: float | None = None
    correct: torch.Tensor | None = field(default=None, repr=False)  # per image, after the attack
    adv: torch.Tensor | None = field(default=None, repr=False)  # adversarial pixels (return_adv=True)
    skipped: bool = False
    reason: str | None = None

    def metrics(self) -> dict[str, float]:
        """The numeric measurements that are set (for ``mlflow.log_metrics``)."""
        keys = ("clean_acc", "robust_acc", "asr", "asr_beard", "targeted_success", "attack_seconds",
                "seconds_per_sample", "clean_seconds", "max_linf", "max_l2", "queries")
        return {k: float(getattr(self, k)) for k in keys if getattr(self, k) is not None}


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
    ``model`` takes pixels (see :class:`~ddlib.attacks.PixelModel`); it is moved to the device and
    put in eval mode for the pass, its training flag restored after. One untimed forward pass on the
    first batch comes first, so one-off start-up costs (CUDA context, allocator, kernel selection)
    are not billed to the clean time, which BEARD's AE compares every attack time with."""
    labels = check_data(images, labels)
    batch_size = check_batch_size(batch_size)
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


def _fork_devices(device: torch.device) -> list[int]:
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


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

    ``model`` takes pixels in [0, 1] (wrap a normalised-input model in :class:`~ddlib.attacks.PixelModel`);
    it is moved to the device and kept in eval mode throughout (torchattacks would switch it anyway).
    ``images`` are pixels (uint8, or float in [0, 1]); batches go to the device one at a time.

    ``targeted``: attack towards ``targets`` (a tensor of classes, or a :func:`~ddlib.attacks.target_labels`
    kind, ``"next"`` by default, ``"random"`` drawn with ``seed``) through torchattacks'
    ``set_mode_targeted_by_label``. An attack that cannot target is returned as skipped, unrun.

    ``seed``: batch b runs inside ``torch.random.fork_rng`` (CPU and the CUDA device) seeded with
    :func:`~ddlib.attacks.batch_seed` (seed, b), and AutoAttack gets ``seed``: the same seed, data,
    batch size and device give the same adversarial images; the global generators are left untouched.
    ``clean``: a :func:`clean_pass` of the same model and images; if omitted, one is run (and
    timed) right before the attack, in this process, so ``clean_seconds`` and ``attack_seconds``
    share the process, device and load. Adversarial images are floats (not re-quantised to uint8);
    ``return_adv`` keeps them (on the CPU, in pixel units) in ``AttackOutcome.adv``.

    ``space``: ``"pixel"`` (default) attacks ``model`` on pixels, so ε, step sizes and the [0, 1]
    clamp mean what they say. ``"beard_compat"`` reproduces BEARD's pipeline (``eva_utils.epoch``):
    ``model`` must be a :class:`~ddlib.attacks.PixelModel`; the attack runs on its inner model, fed the
    *normalised* images, so ε and steps are in normalised units and torchattacks' [0, 1] clamp
    acts on normalised values (moving every pixel below its channel mean up to it, and every pixel
    above mean + std down to it); the inner model classifies the result as BEARD's does. Only for
    checking a published BEARD number: its robust accuracies are not robustness to any pixel-space ε.
    """
    spec = parse_attack(spec)
    labels, batch_size, seed = check_inputs(images, labels, num_classes, batch_size, seed)
    n = len(labels)
    base = dict(name=spec.name, description=spec.describe(), targeted=bool(targeted), n=n)
    if targeted and (reason := targeted_skip_reason(spec)) is not None:
        return AttackOutcome(**base, skipped=True, reason=reason)
    targets = resolve_targets(targeted, targets, labels, num_classes, seed)
    check_space(space, model, spec, images)

    dev = resolve_device(device)
    model = model.to(dev)
    if clean is None:
        clean = clean_pass(model, images, labels, batch_size, dev)
    elif clean.n != n:
        raise ValueError(f"clean pass has {clean.n} images, the attack {n}")
    attacked, to_input, to_pixels = attack_space(model, space)
    atk = create_attack(spec, attacked, num_classes, seed=seed)
    if targeted:
        atk.set_mode_targeted_by_label(quiet=True)
    goal = targets if targeted else labels  # what the attack is given: the targets, or the true labels

    was_training = model.training
    model.eval()
    if n:  # untimed: one-off costs (autograd, kernel selection) are not billed to whichever attack runs first
        _warm_up(attacked, to_input(as_pixels(images[:batch_size].to(dev))), labels[:batch_size].to(dev))
    preds, advs = [], []
    seconds, max_linf, max_l2 = 0.0, 0.0, 0.0
    rows = [0]  # images through the attacked model's forward (the attack's queries, and the classification)
    counting = attacked.register_forward_pre_hook(lambda _module, args: rows.__setitem__(0, rows[0] + len(args[0])))
    queries = 0
    bar = tqdm(total=n, desc=spec.name, disable=not progress, leave=False)
    try:
        for b, i in enumerate(range(0, n, batch_size)):
            synchronize(dev)
            start = _clock()
            x = as_pixels(images[i : i + batch_size].to(dev, non_blocking=True))
            with torch.random.fork_rng(devices=_fork_devices(dev)):
                torch.manual_seed(batch_seed(seed, b))
                before = rows[0]
                adv = atk(to_input(x), goal[i : i + batch_size].to(dev))
                queries += rows[0] - before
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
            preds.append(pred.cpu())
            if return_adv:
                advs.append(adv.detach().cpu())
            bar.update(len(x))
    finally:
        counting.remove()
        bar.close()
        model.train(was_training)

    pred = torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)
    adv_correct = pred == labels
    denom = max(1, n)
    robust = float(adv_correct.sum()) / denom
    return AttackOutcome(
        **base,
        clean_acc=clean.accuracy,
        robust_acc=robust,
        asr=float((clean.correct & ~adv_correct).sum()) / denom,
        asr_beard=clean.accuracy - robust,
        targeted_success=float((pred == targets).sum()) / denom if targeted else None,
        attack_seconds=seconds,
        seconds_per_sample=seconds / denom,
        clean_seconds=clean.seconds,
        max_linf=max_linf,
        max_l2=max_l2,
        queries=queries / denom,
        correct=adv_correct,
        adv=torch.cat(advs) if return_adv and advs else None,
    )
