"""The one training loop every protocol uses.

The training set lives on the device as a tensor (no DataLoader in the hot loop, as in
airbench); each step indexes a shuffled batch, converts it to float pixels, normalises it,
applies the augmentation hook, and takes an optimiser step on the loss hook. Callers pass a
list of seeds (and, optionally, one learning rate per seed) and get one result per seed.

Two modes run the same loop (:func:`choose_mode` says which one runs when):

* ``sequential``: one model after another.
* ``batched``: the S models of one call train at once, each with its own seed, data order,
  augmentation draws, learning rate, optimizer state and (BatchNorm) running statistics, through
  one vectorised forward/backward (:class:`ddlib.engine.stacked.StackedModels`: ``functional_call``
  + ``vmap``, i.e. grouped convolutions). Models that share a seed see the same batches, so their
  augmentation (and a relabelling teacher's forward pass, via a loss hook's ``many``) runs once.

Schedules: ``step`` (lr x 0.1 for the second half of ``epochs``), ``dc_step`` (DC's and DC-Bench's own
evaluation loop: ``epochs + 1`` epochs and a new optimizer at lr x 0.1 after epoch ``epochs // 2 + 1``,
so momentum restarts; both modes honour it), ``cosine``, ``cosine_half``, ``none``.

Faster steps (:class:`Recipe` switches): ``precision`` (``bf16`` autocast, or the default
``auto``: bf16 where the device computes it natively, else fp32), ``channels_last`` and
``compile`` (``torch.compile`` of the training forward, so of its backward: each model's in the
sequential mode, the stack's vmapped one in the batched mode). Test passes run in inference mode on a test set
converted and normalised once (cached per test tensor, so once per cell), in the largest batches
that fit on a GPU.

Determinism: a seed fixes the model initialisation (``torch.manual_seed``), the shuffling
and the augmentation draws (private generators). On the CPU the same config, seed and mode give
Where things live: the recipe, its optimizer and its schedules in :mod:`ddlib.engine.recipe`; the
test pass in :mod:`ddlib.engine.test_pass`; precision in :mod:`ddlib.engine.device`. Here, the loop:
:func:`_step` (one optimisation step, both modes), :func:`_train` (the epochs) and
:func:`train_and_test` (validate, choose the mode, train, test).

the same accuracy bit for bit; on CUDA, cuDNN may differ in the last digits. The batched mode
adds the arithmetic of grouped convolutions: a seed gives the same model as in the sequential
mode up to float rounding (``tests/test_batched.py`` states the measured tolerance).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from ddlib.engine.device import autocast, compile_cache_dir, generator, resolve_device, run_precision, synchronize
from ddlib.engine.test_pass import Normalize, PreparedTestSet, as_pixels, model_accuracy, model_confusion, standard_layout
from ddlib.engine.recipe import Recipe, epochs_trained, optimizer_and_scheduler
from ddlib.engine.stacked import StackedModels, stochastic_layers
from ddlib.models import create_model

# Internals that lived here before the recipe, precision and test pass had files of their own (tests use them).
from ddlib.engine.device import resolve_precision  # noqa: F401
from ddlib.engine.test_pass import _EVAL_BATCH, _largest_fitting  # noqa: F401
from ddlib.engine.recipe import _scheduler  # noqa: F401

__all__ = ["hook_name", "train_and_test", "SeedResult", "NonFiniteLossError", "choose_mode", "MODES", "lockstep", "AugmentHook",
           "LossHook", "Objective", "cross_entropy_loss", "EpochProgress",
           # re-exported from their own files
           "Recipe", "epochs_trained", "run_precision", "model_accuracy", "model_confusion", "Normalize", "as_pixels",
           "standard_layout"]

# augment(x_normalised, targets, generator) -> (x, targets): label-mixing ops (Mixup, CutMix) change
# the targets too; targets are int labels or per-image target rows.
# loss(logits, targets, inputs) -> scalar: inputs are the augmented batch (teacher relabelling needs it).
# A loss hook may also have ``many(logits S x B x K, [targets] * S, [inputs] * S) -> (S,) losses`` for the
# batched mode (a teacher then runs once on the distinct inputs of all S models); without it the hook
# is called once per model. Models that share a seed are handed the same ``inputs`` object.
AugmentHook = Callable[[torch.Tensor, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
LossHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# objective(model, x, targets, generator) -> scalar: the whole per-batch objective, for training that
# needs the model itself (adversarial training crafts examples against it). Default: loss(model(x), y, x).
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class EpochProgress:
    """Where a :func:`train_and_test` call is, for ``on_epoch``: the models training now (their (seed,
    lr): one, or several in lockstep or stacked), the epochs they finished (0: starting), how many of
    the call's models trained before them, and the seconds these have trained so far."""

    desc: str
    runs: tuple[tuple[int, float], ...]
    epoch: int
    epochs: int
    models_before: int
    models: int
    seconds: float

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until the call's last model is trained, at this group's pace (None before an epoch)."""
        if self.epoch == 0:
            return None
        per_epoch = self.seconds / self.epoch
        later = (self.models - self.models_before - len(self.runs)) / len(self.runs)  # groups of this size
        return per_epoch * (self.epochs - self.epoch) + later * per_epoch * self.epochs


OnEpoch = Callable[[EpochProgress], None]


def hook_name(hook, default: str) -> str:
    """The canonical name a hook carries (``hook.name``: every parameter spelled out), which reuse
    keys are derived from; ``default`` for no hook. A hook without a name is refused: a name passed
    beside a hook could go stale and let a changed hook reuse the old one's results."""
    if hook is None:
        return default
    name = getattr(hook, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{hook!r} has no canonical name (.name): every augmentation, loss, objective and "
                        "preprocessing hook carries the name its results are keyed by")
    return name


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with hard (int) or soft (probability rows) targets."""
    return F.cross_entropy(logits, targets)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf: the model is garbage, so there is no result to report."""


# Epochs between checks that the loss is still finite (each check waits for the device).
FINITE_CHECK_EVERY = 10


@dataclass
class SeedResult:
    seed: int
    test_accuracy: float  # fraction in [0, 1]
    epoch_losses: list[float]
    train_seconds: float  # the time of the models trained together (lockstep, stack) over their number
    eval_seconds: float
    model: nn.Module | None = field(default=None, repr=False)
    confusion: list[list[int]] | None = field(default=None, repr=False)  # [true class][predicted class] test counts
    calibration: list[float] | None = field(default=None, repr=False)  # test_pass._calibration_sums of the test pass
    lr: float | None = None  # the learning rate this model trained with
    mode: str = "sequential"  # or "batched"
    precision: str = "fp32"  # as resolved on the device ("auto" -> fp32 or bf16)


# --------------------------------------------------------------------------- modes

MODES = ("sequential", "batched")
# Batched mode, upper bounds per step (memory): models, and images (models x batch) on the CPU.
MAX_MODELS_PER_STEP = 32
CPU_IMAGES_PER_STEP = 1024


def choose_mode(requested: str | bool | None, device: torch.device, runs: int, *, objective: bool = False,
                recipe: Recipe | None = None) -> str:
    """Which mode trains ``runs`` models of one call (the rule, from ``bench/engine_throughput.py``):

    * ``sequential`` whenever the batched mode cannot run the job: an ``objective`` (adversarial
      training needs the model itself), ``channels_last`` (a sequential switch),
      ``grad_clip`` (a per-model gradient norm), or a model with dropout (``train_and_test``
      checks: vmap cannot draw it per model);
    * otherwise, automatically: ``batched`` on CUDA for two models or more (a 3-layer ConvNet step
      leaves a GPU mostly idle, so S models in one step cost little more than one), ``sequential``
      on the CPU and for a single model (measured by ``bench/engine_throughput.py`` on a 2-core
      EPYC: the CPU step is compute-bound already at 10 images and the grouped convolutions of the
      batched mode are no faster there than S dense ones; see bench/README.md).

    ``requested`` (``train_and_test(batched=...)``): ``None``/``"auto"`` applies the rule;
    ``True``/``"batched"`` forces the batched mode where it can run (even for one model: the
    benchmark measures its overhead); ``False``/``"sequential"`` forces sequential."""
    if requested in (False, "sequential"):
        return "sequential"
    if requested not in (None, "auto", True, "batched"):
        raise ValueError(f"batched must be None/'auto', True/'batched' or False/'sequential', got {requested!r}")
    if objective or (recipe is not None and (recipe.channels_last or recipe.grad_clip is not None)):
        return "sequential"
    if requested in (True, "batched"):
        return "batched"
    return "batched" if device.type == "cuda" and runs >= 2 else "sequential"


def lockstep(runs: Sequence[tuple[int, float]], *, objective: bool, stochastic: bool) -> list[list[int]]:
    """Which runs (seed, lr) the sequential mode trains together: the indices of the runs sharing a
    seed, in lockstep (every model sees the batches it would see alone, so its numbers are those of
    training it alone), unless an ``objective`` draws from the shared augmentation generator per
    model (adversarial training) or the model has ``stochastic`` layers (dropout draws from the
    global generator): then one run at a time."""
    if objective or stochastic:
        return [[i] for i in range(len(runs))]
    groups: dict[int, list[int]] = {}
    for i, (seed, _) in enumerate(runs):
        groups.setdefault(seed, []).append(i)
    return list(groups.values())


def _models_per_step(runs: int, batch: int, device: torch.device) -> int:
    """How many models one batched step holds (memory): at most MAX_MODELS_PER_STEP, and on the
    CPU at most CPU_IMAGES_PER_STEP images in all."""
    cap = MAX_MODELS_PER_STEP
    if device.type != "cuda":
        cap = min(cap, max(1, CPU_IMAGES_PER_STEP // max(1, batch)))
    return max(1, min(runs, cap))


def _many_losses(loss: LossHook, logits: torch.Tensor, ys: list, xs: list) -> torch.Tensor:
    """(S,) losses of S models: the hook's ``many`` where it has one, else one call per model."""
    many = getattr(loss, "many", None)
    if many is not None:
        return many(logits, ys, xs)
    return torch.stack([loss(logits[s], ys[s], xs[s]) for s in range(len(xs))])


# --------------------------------------------------------------------------- the loop

AUG_SEED_OFFSET = 1_000_003  # the augmentation generator of seed s is seeded with s + this


@dataclass
class _Loop:
    """What every model of one call shares: the training set on the device and its hooks, the
    recipe and precision, the architecture, the progress bar."""

    images: torch.Tensor  # pixels on the device
    targets: torch.Tensor  # int labels or per-image target rows
    normalize: nn.Module  # pixels -> the model's input (mean/std, or a preprocess such as ZCA)
    augment: AugmentHook | None
    loss: LossHook
    objective: Objective | None  # in place of loss(model(x), y, x) where given
    recipe: Recipe
    precision: str  # resolved: "fp32" or "bf16"
    device: torch.device
    architecture: Callable[[], nn.Module]  # a new, unseeded model of the call's architecture
    bar: tqdm
    desc: str = "train"
    on_epoch: OnEpoch | None = None
    models: int = 0  # in the call
    models_before: int = 0  # trained by the call before the group in training

    def new_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return self.architecture().to(self.device)

    def batch(self, idx: torch.Tensor, aug_gen: torch.Generator):
        x, y = self.normalize(as_pixels(self.images[idx])), self.targets[idx]
        if self.augment is not None:
            x, y = self.augment(x, y, aug_gen)
        return x, y


def _step(loop: _Loop, forward, x, y, aug_gen, optimizers, params=None) -> torch.Tensor:
    """One optimisation step, the same in both modes: the objective (or the loss of the logits)
    under autocast, backward, gradient clipping and the update. ``forward`` is one model on the
    batch ``x``, or a stack of S models on the batches of the list ``x`` (each model's loss from the
    hook's ``many``); returns the loss, or the S losses, detached."""
    with autocast(loop.precision, loop.device):
        if loop.objective is not None:
            losses = loop.objective(forward, x, y, aug_gen)
        elif isinstance(x, list):
            losses = _many_losses(loop.loss, forward(torch.stack(x)).float(), y, x)
        else:
            losses = loop.loss(forward(x).float(), y, x)
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    losses.sum().backward()
    if loop.recipe.grad_clip is not None:  # sequential mode only (choose_mode): one model's norm
        nn.utils.clip_grad_norm_(params, loop.recipe.grad_clip)
    for optimizer in optimizers:
        optimizer.step()
    return losses.detach()


def _train(loop: _Loop, group: _Lockstep | _Stack) -> tuple[list[list[float]], float]:
    """Train ``group``'s models for the recipe's epochs. Each seed has its own shuffling (a CPU
    generator: the same order on every device) and augmentation generator; each step draws one
    batch per seed, augmented once for all the models of that seed, and takes :func:`_step`. The
    loss is checked finite every ``FINITE_CHECK_EVERY`` epochs (a check waits for the device).
    Returns each model's mean loss per epoch and the training seconds per model."""
    recipe, dev, n = loop.recipe, loop.device, len(loop.images)
    order_gens = {s: generator(s) for s in group.seeds}
    aug_gens = {s: generator(s + AUG_SEED_OFFSET, dev) for s in group.seeds}
    epochs, totals = epochs_trained(recipe), []
    synchronize(dev)
    start = time.perf_counter()
    group.train()
    _report(loop, group, 0, epochs, 0.0)
    for epoch in range(epochs):
        orders = {s: torch.randperm(n, generator=g).to(dev) for s, g in order_gens.items()}
        total = torch.zeros(len(group.runs), device=dev)
        for i in range(0, n, recipe.batch_size):
            batches = {s: loop.batch(order[i : i + recipe.batch_size], aug_gens[s]) for s, order in orders.items()}
            total += group.step(loop, batches, aug_gens) * min(recipe.batch_size, n - i)
        for _, scheduler in group.steppers:
            if scheduler is not None:
                scheduler.step()
        totals.append(total)
        loop.bar.update(len(group.runs))
        _report(loop, group, epoch + 1, epochs, time.perf_counter() - start)
        if (epoch + 1) % FINITE_CHECK_EVERY == 0 or epoch + 1 == epochs:
            _check_finite(torch.stack(totals), loop.desc, group.runs, recipe)
    synchronize(dev)
    seconds = (time.perf_counter() - start) / len(group.runs)
    return (torch.stack(totals) / n).T.tolist(), seconds  # one sync per training, not per step


def _report(loop: _Loop, group: _Lockstep | _Stack, epoch: int, epochs: int, seconds: float) -> None:
    if loop.on_epoch is not None:
        loop.on_epoch(EpochProgress(loop.desc, tuple(group.runs), epoch, epochs, loop.models_before, loop.models, seconds))


class _Lockstep:
    """Sequential mode: runs of one seed (:func:`lockstep`), one model each, stepped in turn on each
    batch (drawn and augmented once, the same object for every model's loss hook, so a relabelling
    teacher runs once per step: ``TeacherRelabel`` keeps its last batch's logits)."""

    def __init__(self, loop: _Loop, runs: list[tuple[int, float]]):
        recipe, self.runs, self.seeds = loop.recipe, runs, [runs[0][0]]
        self.channels_last, self.models = recipe.channels_last, []
        for seed, _ in runs:  # the same initial weights for every lr, as trained alone
            model = loop.new_model(seed)
            self.models.append(model.to(memory_format=torch.channels_last) if self.channels_last else model)
        if recipe.compile:
            compile_cache_dir()  # kernels cached per instruction set (a stale one trained to NaN)
        self.forwards = [torch.compile(m) if recipe.compile else m for m in self.models]
        self.steppers = [optimizer_and_scheduler(recipe, m.parameters(), lr) for m, (_, lr) in zip(self.models, runs)]

    def train(self) -> None:
        for model in self.models:
            model.train()

    def step(self, loop: _Loop, batches: dict, aug_gens: dict) -> torch.Tensor:
        seed = self.seeds[0]
        x, y = batches[seed]
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return torch.stack([_step(loop, forward, x, y, aug_gens[seed], [optimizer], model.parameters())
                            for model, forward, (optimizer, _) in zip(self.models, self.forwards, self.steppers)])

    def test(self, tests: PreparedTestSet) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor, float]]:
        return [(model, *tests.test_one(model, self.channels_last)) for model in self.models]


class _Stack:
    """Batched mode: the runs' models as one :class:`StackedModels`, one vectorised step for all of
    them, one optimizer (and schedule) per distinct lr; models that share a seed share its batches."""

    def __init__(self, loop: _Loop, runs: list[tuple[int, float]]):
        self.runs, self.seeds = runs, list(dict.fromkeys(seed for seed, _ in runs))  # distinct, in order
        self.stack = StackedModels([loop.new_model(seed) for seed, _ in runs], compile=loop.recipe.compile)
        by_lr: dict[float, list[nn.Parameter]] = {}
        for model, (_, lr) in zip(self.stack.models, runs):
            by_lr.setdefault(lr, []).extend(model.parameters())
        self.steppers = [optimizer_and_scheduler(loop.recipe, params, lr) for lr, params in by_lr.items()]

    def train(self) -> None:
        self.stack.train()

    def step(self, loop: _Loop, batches: dict, aug_gens: dict) -> torch.Tensor:
        xs, ys = [batches[seed][0] for seed, _ in self.runs], [batches[seed][1] for seed, _ in self.runs]
        return _step(loop, self.stack, xs, ys, None, [optimizer for optimizer, _ in self.steppers])

    def test(self, tests: PreparedTestSet) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor, float]]:
        start = time.perf_counter()
        with torch.inference_mode():
            self.stack.eval()
            confusions, sums = tests.counts(self.stack.forward_shared, len(self.runs))
        synchronize(tests.device)
        seconds = (time.perf_counter() - start) / len(self.runs)
        return [(model, c, s, seconds) for model, c, s in zip(self.stack.release(), confusions, sums)]


def train_and_test(
    model_name: str,
    train_images: torch.Tensor,
    train_targets: torch.Tensor,
    test_images: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    num_classes: int,
    mean: Sequence[float],
    std: Sequence[float],
    recipe: Recipe,
    seeds: Sequence[int],
    lrs: Sequence[float] | None = None,
    augment: AugmentHook | None = None,
    loss: LossHook | None = None,
    objective: Objective | None = None,
    preprocess: nn.Module | None = None,
    device: str | torch.device = "auto",
    model_kwargs: dict | None = None,
    keep_models: bool = False,
    progress: bool = False,
    desc: str = "train",
    batched: str | bool | None = None,
    on_epoch: OnEpoch | None = None,
) -> list[SeedResult]:
    """Train one model per seed on (``train_images``, ``train_targets``) and test each.

    ``train_images`` are pixels (uint8 or float in [0, 1]); ``train_targets`` are int class
    labels or per-image target rows (soft labels). ``preprocess`` (ZCA whitening) maps pixels to the
    model's input in place of the mean/std normalisation, on training and test batches alike (MTT,
    DATM and DD-Ranking whiten [0, 1] pixels, not normalised ones). ``objective`` replaces ``loss(model(x), y, x)``
    as the per-batch objective (adversarial training); it may not be combined with ``loss``.
    ``lrs`` gives each seed its own learning rate (default: the recipe's for all; a seed may then
    repeat, e.g. one seed at every lr of a search). ``batched`` picks the mode (:func:`choose_mode`;
    default: automatic). ``on_epoch`` is called with an :class:`EpochProgress` when a group of models
    starts and after each of its epochs (the caller decides what to do with it, and how often: the
    engine knows nothing of files or tracking). Returns one :class:`SeedResult` per (seed, lr), in order.
    """
    runs = _runs(train_images, train_targets, recipe, seeds, lrs, loss, objective)
    dev = resolve_device(device)
    precision = run_precision(recipe, dev, objective is not None)
    architecture = _architecture(model_name, train_images.shape, num_classes, model_kwargs)
    mode, groups = _plan(batched, dev, runs, len(train_images), recipe, objective is not None, architecture, model_name)
    normalize = Normalize(mean, std).to(dev) if preprocess is None else preprocess.to(dev)
    bar = tqdm(total=len(runs) * epochs_trained(recipe), desc=desc, disable=not progress, leave=False)
    images = train_images.to(dev)
    loop = _Loop(images=standard_layout(images), targets=train_targets.to(dev),
                 normalize=normalize, augment=augment, loss=loss or cross_entropy_loss, objective=objective,
                 recipe=recipe, precision=precision, device=dev, architecture=architecture, bar=bar, desc=desc,
                 on_epoch=on_epoch, models=len(runs))
    tests = PreparedTestSet.of_call(test_images, test_labels, normalize, mean=mean, std=std, preprocess=preprocess,
                                    device=dev, num_classes=num_classes, batch_size=recipe.eval_batch_size,
                                    precision=precision, model_name=model_name, model_kwargs=model_kwargs)
    results = {}
    for indices in groups:
        group = (_Stack if mode == "batched" else _Lockstep)(loop, [runs[i] for i in indices])
        epoch_losses, train_seconds = _train(loop, group)
        for i, losses, (model, confusion, sums, eval_seconds) in zip(indices, epoch_losses, group.test(tests)):
            results[i] = SeedResult(runs[i][0], tests.accuracy(confusion), losses, train_seconds, eval_seconds,
                                    model if keep_models else None, confusion.tolist(), sums.tolist(), runs[i][1], mode,
                                    precision)
        loop.models_before += len(indices)
    bar.close()
    return [results[i] for i in range(len(runs))]


def _runs(train_images, train_targets, recipe: Recipe, seeds, lrs, loss, objective) -> list[tuple[int, float]]:
    """The (seed, lr) of every model to train, after checking the inputs."""
    if len(train_images) != len(train_targets):
        raise ValueError(f"{len(train_images)} training images but {len(train_targets)} targets")
    if len(train_images) == 0:
        raise ValueError("empty training set")
    if objective is not None and loss is not None:
        raise ValueError("give either a loss hook or an objective, not both")
    seeds = [int(s) for s in seeds]
    lrs = [float(recipe.lr)] * len(seeds) if lrs is None else [float(v) for v in lrs]
    if len(lrs) != len(seeds):
        raise ValueError(f"{len(seeds)} seeds but {len(lrs)} learning rates (give one per seed)")
    if any(not v >= 0 for v in lrs):
        raise ValueError(f"learning rates must be non-negative numbers, got {lrs}")
    return list(zip(seeds, lrs))


def _architecture(model_name: str, shape, num_classes: int, model_kwargs: dict | None) -> Callable[[], nn.Module]:
    return lambda: create_model(model_name, shape[1], num_classes, tuple(shape[2:]), **(model_kwargs or {}))


def _plan(requested, device: torch.device, runs: list[tuple[int, float]], n: int, recipe: Recipe, objective: bool,
          architecture: Callable[[], nn.Module], model_name: str) -> tuple[str, list[list[int]]]:
    """The mode (:func:`choose_mode`) and the groups of runs (their indices) trained together:
    sequential, the runs of one seed in lockstep (:func:`lockstep`); batched, as many models per
    step as fit (:func:`_models_per_step`)."""
    mode = choose_mode(requested, device, len(runs), objective=objective, recipe=recipe)
    with torch.device("meta"):  # the architecture only: no memory, no draws from the seeded generator
        random_layers = stochastic_layers(architecture())
    if mode == "batched" and random_layers:
        if requested in (True, "batched"):
            raise ValueError(f"batched=True: {model_name} has random layers {random_layers[:3]} (dropout), "
                             "which one vectorised pass cannot draw per model; train it with batched=False")
        mode = "sequential"
    if mode == "sequential":
        return mode, lockstep(runs, objective=objective, stochastic=bool(random_layers))
    step = _models_per_step(len(runs), min(recipe.batch_size, n), device)
    return mode, [list(range(i, min(i + step, len(runs)))) for i in range(0, len(runs), step)]


def _check_finite(totals: torch.Tensor, desc: str, runs: list[tuple[int, float]], recipe: Recipe) -> None:
    """Stop a training whose loss is no longer finite (``totals``: epochs x models), naming the
    evaluation, the first such model and its first bad epoch."""
    bad = ~torch.isfinite(totals)
    for s, (seed, lr) in enumerate(runs):
        if bad[:, s].any():
            epoch = int(bad[:, s].nonzero()[0]) + 1
            raise NonFiniteLossError(f"{desc}: training loss became {totals[epoch - 1, s].item()} at epoch {epoch} of "
                                     f"{epochs_trained(recipe)} (seed {seed}, lr {lr}): stopped, no result recorded")
