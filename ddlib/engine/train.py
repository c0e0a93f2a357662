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
the same accuracy bit for bit; on CUDA, cuDNN may differ in the last digits. The batched mode
adds the arithmetic of grouped convolutions: a seed gives the same model as in the sequential
mode up to float rounding (``tests/test_batched.py`` states the measured tolerance).

Where things live: the recipe, its optimizer and its schedules in :mod:`ddlib.engine.recipe`; the
test pass in :mod:`ddlib.engine.test_pass`; precision in :mod:`ddlib.engine.device`. Here:
:func:`train_and_test` (bundle the :class:`Hooks`, validate, choose the mode), :func:`_sequential` and
:func:`_batched` (a group of models resolved for its mode) and :func:`_train_and_test_group`, the loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ddlib.data.device_copies import on_device
from ddlib.engine.hooks import AugmentHook, Hooks, LossHook, Objective, cross_entropy_loss, hook_name
from ddlib.engine.device import autocast, compile_cache_dir, generator, resolve_device, run_precision, synchronize
from ddlib.engine.test_pass import Normalize, PreparedTestSet, as_pixels, model_accuracy, model_confusion, standard_layout
from ddlib.engine.recipe import Recipe, epochs_trained, optimizer_and_scheduler
from ddlib.engine.stacked import StackedModels, stochastic_layers
from ddlib.models import create_model

__all__ = ["train_and_test", "SeedResult", "NonFiniteLossError", "choose_mode", "MODES", "lockstep", "EpochProgress",
           # re-exported from their own files
           "Hooks", "hook_name", "AugmentHook", "LossHook", "Objective", "cross_entropy_loss", "Recipe", "epochs_trained",
           "run_precision", "model_accuracy", "model_confusion", "Normalize", "as_pixels", "standard_layout"]


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


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf: the model is garbage, so there is no result to report."""


# Epochs between checks that the loss is still finite (each check waits for the device).
FINITE_CHECK_EVERY = 10


@dataclass
class SeedResult:
    """One trained model's outcome: its seed, test accuracy, losses and timings (and the model when kept)."""

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


# --------------------------------------------------------------------------- the loop

AUG_SEED_OFFSET = 1_000_003  # the augmentation generator of seed s is seeded with s + this


@dataclass(frozen=True)
class _Loop:
    """What every model of one call trains on and with: the training set on the device, its hooks, the
    recipe and precision, the architecture."""

    images: torch.Tensor  # pixels on the device
    targets: torch.Tensor  # int labels or per-image target rows
    normalize: nn.Module  # pixels -> the model's input (mean/std, or the hooks' preprocess such as ZCA)
    hooks: Hooks
    recipe: Recipe
    precision: str  # resolved: "fp32" or "bf16"
    architecture: Callable[[], nn.Module]  # a new, unseeded model of the call's architecture

    @property
    def device(self) -> torch.device:
        return self.images.device

    def new_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return self.architecture().to(self.device)

    def batch(self, idx: torch.Tensor, aug_gen: torch.Generator):
        """The batch ``idx`` as the models take it: pixels, normalised, augmented (and in channels-last
        layout for the ``channels_last`` switch, once for every model that steps on it)."""
        x, y = self.normalize(as_pixels(self.images[idx])), self.targets[idx]
        if self.hooks.augment is not None:
            x, y = self.hooks.augment(x, y, aug_gen)
        if self.recipe.channels_last:  # sequential mode only (choose_mode)
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y


@dataclass(frozen=True)
class _Trainee:
    """What one optimisation step drives: one model (sequential mode) or a stack of S (batched)."""

    losses: Callable[[dict, dict], torch.Tensor]  # (batches, aug generators) per seed -> its loss, or S losses
    optimizers: list[torch.optim.Optimizer]
    parameters: list[nn.Parameter]  # what ``grad_clip`` clips (sequential mode only: one model's norm)


@dataclass(frozen=True)
class _Group:
    """Models trained together, resolved for their mode into the objects the loop calls."""

    mode: str
    runs: list[tuple[int, float]]  # (seed, lr) per model
    trainees: list[_Trainee]  # stepped in turn on each batch
    schedulers: list  # stepped after each epoch
    modules: list  # switched to training mode (models, or the stack)
    test: Callable[[PreparedTestSet], list[tuple[nn.Module, torch.Tensor, torch.Tensor, float]]]


def _sequential(loop: _Loop, runs: list[tuple[int, float]]) -> _Group:
    """Sequential mode: runs of one seed (:func:`lockstep`), one model each, stepped in turn on each
    batch (drawn and augmented once, the same object for every model's loss hook, so a relabelling
    teacher runs once per step: ``TeacherRelabel`` keeps its last batch's logits)."""
    recipe, seed, objective = loop.recipe, runs[0][0], loop.hooks.model_objective()
    models = [loop.new_model(seed) for _ in runs]  # the same initial weights for every lr, as trained alone
    if recipe.channels_last:
        models = [model.to(memory_format=torch.channels_last) for model in models]
    if recipe.compile:
        compile_cache_dir()  # kernels cached per instruction set (a stale one trained to NaN)
    trainees, schedulers = [], []
    for model, (_, lr) in zip(models, runs):
        forward = torch.compile(model) if recipe.compile else model
        optimizer, scheduler = optimizer_and_scheduler(recipe, model.parameters(), lr)

        def losses(batches, aug_gens, forward=forward):
            x, y = batches[seed]
            return objective(forward, x, y, aug_gens[seed])

        trainees.append(_Trainee(losses, [optimizer], list(model.parameters())))
        schedulers.append(scheduler)

    def test(tests: PreparedTestSet):
        return [(model, *tests.test_one(model, recipe.channels_last)) for model in models]

    return _Group("sequential", runs, trainees, [s for s in schedulers if s is not None], models, test)


def _batched(loop: _Loop, runs: list[tuple[int, float]]) -> _Group:
    """Batched mode: the runs' models as one :class:`StackedModels`, one vectorised step for all of
    them, one optimizer (and schedule) per distinct lr; models that share a seed share its batches."""
    stack = StackedModels([loop.new_model(seed) for seed, _ in runs], compile=loop.recipe.compile)
    by_lr: dict[float, list[nn.Parameter]] = {}
    for model, (_, lr) in zip(stack.models, runs):
        by_lr.setdefault(lr, []).extend(model.parameters())
    steppers = [optimizer_and_scheduler(loop.recipe, params, lr) for lr, params in by_lr.items()]

    def losses(batches, aug_gens):
        xs, ys = [batches[seed][0] for seed, _ in runs], [batches[seed][1] for seed, _ in runs]
        return loop.hooks.stack_losses(stack(torch.stack(xs)).float(), ys, xs)

    def test(tests: PreparedTestSet):
        start = time.perf_counter()
        with torch.inference_mode():
            stack.eval()
            confusions, sums = tests.counts(stack.forward_shared, len(runs))
        synchronize(tests.device)
        seconds = (time.perf_counter() - start) / len(runs)
        return [(model, c, s, seconds) for model, c, s in zip(stack.release(), confusions, sums)]

    trainee = _Trainee(losses, [optimizer for optimizer, _ in steppers], [])
    return _Group("batched", runs, [trainee], [s for _, s in steppers if s is not None], [stack], test)


class _Progress:
    """A call's progress: its bar, and ``on_epoch`` told where each group of models is."""

    def __init__(self, desc: str, models: int, epochs: int, show: bool, on_epoch: OnEpoch | None):
        self.desc, self.models, self.on_epoch, self.models_before = desc, models, on_epoch, 0
        self.bar = tqdm(total=models * epochs, desc=desc, disable=not show, leave=False)

    def report(self, runs: list[tuple[int, float]], epoch: int, epochs: int, seconds: float) -> None:
        if epoch:  # one finished
            self.bar.update(len(runs))
        if self.on_epoch is not None:
            self.on_epoch(EpochProgress(self.desc, tuple(runs), epoch, epochs, self.models_before, self.models, seconds))


def _train_and_test_group(loop: _Loop, group: _Group, tests: PreparedTestSet, progress: _Progress) -> list[SeedResult]:
    """Train ``group``'s models for the recipe's epochs, then test them. Each seed has its own shuffling
    (a CPU generator: the same order on every device) and augmentation generator; each step draws one
    batch per seed, augmented once for all the models of that seed, and steps each trainee on it. The
    loss is checked finite every ``FINITE_CHECK_EVERY`` epochs (a check waits for the device). Returns
    one result per model, with its model."""
    recipe, dev, n, batch = loop.recipe, loop.device, len(loop.images), loop.recipe.batch_size
    seeds = list(dict.fromkeys(seed for seed, _ in group.runs))
    order_gens = {s: generator(s) for s in seeds}
    aug_gens = {s: generator(s + AUG_SEED_OFFSET, dev) for s in seeds}
    epochs, totals = epochs_trained(recipe), []
    synchronize(dev)
    start = time.perf_counter()
    for module in group.modules:
        module.train()
    progress.report(group.runs, 0, epochs, 0.0)
    for epoch in range(epochs):
        orders = {s: torch.randperm(n, generator=g).to(dev) for s, g in order_gens.items()}
        total = torch.zeros(len(group.runs), device=dev)
        for i in range(0, n, batch):
            batches = {s: loop.batch(order[i : i + batch], aug_gens[s]) for s, order in orders.items()}
            step_losses = []
            for trainee in group.trainees:
                with autocast(loop.precision, dev):
                    losses = trainee.losses(batches, aug_gens)  # forward, then the loss hook or the objective
                for optimizer in trainee.optimizers:
                    optimizer.zero_grad(set_to_none=True)
                losses.sum().backward()
                if recipe.grad_clip is not None:
                    nn.utils.clip_grad_norm_(trainee.parameters, recipe.grad_clip)
                for optimizer in trainee.optimizers:
                    optimizer.step()
                step_losses.append(losses.detach().reshape(-1))
            total += torch.cat(step_losses) * min(batch, n - i)
        for scheduler in group.schedulers:
            scheduler.step()
        totals.append(total)
        progress.report(group.runs, epoch + 1, epochs, time.perf_counter() - start)
        if (epoch + 1) % FINITE_CHECK_EVERY == 0 or epoch + 1 == epochs:
            _check_finite(torch.stack(totals), progress.desc, group.runs, recipe)
    synchronize(dev)
    train_seconds = (time.perf_counter() - start) / len(group.runs)
    epoch_losses = (torch.stack(totals) / n).T.tolist()  # one sync per training, not per step
    return [SeedResult(seed, tests.accuracy(confusion), losses, train_seconds, eval_seconds, model, confusion.tolist(),
                       sums.tolist(), lr, group.mode, loop.precision)
            for (seed, lr), losses, (model, confusion, sums, eval_seconds) in zip(group.runs, epoch_losses,
                                                                                  group.test(tests))]


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
    labels or per-image target rows (soft labels). ``augment``, ``loss``, ``objective`` and
    ``preprocess`` are the :class:`Hooks`. ``lrs`` gives each seed its own learning rate (default:
    the recipe's for all; a seed may then repeat, e.g. one seed at every lr of a search). ``batched``
    picks the mode (:func:`choose_mode`; default: automatic). ``on_epoch`` is called with an
    :class:`EpochProgress` when a group of models starts and after each of its epochs (the caller
    decides what to do with it, and how often: the engine knows nothing of files or tracking).
    Returns one :class:`SeedResult` per (seed, lr), in order.
    """
    hooks = Hooks(augment=augment, loss=loss, objective=objective, preprocess=preprocess)
    runs = _runs(train_images, train_targets, recipe, seeds, lrs)
    dev = resolve_device(device)
    precision = run_precision(recipe, dev, hooks.objective is not None)
    architecture = _architecture(model_name, train_images.shape, num_classes, model_kwargs)
    mode, groups = _plan(batched, dev, runs, len(train_images), recipe, hooks.objective is not None, architecture,
                         model_name)
    normalize = Normalize(mean, std).to(dev) if preprocess is None else preprocess.to(dev)
    loop = _Loop(standard_layout(on_device(train_images, dev)), train_targets.to(dev), normalize, hooks, recipe, precision,
                 architecture)
    tests = PreparedTestSet.of_call(test_images, test_labels, normalize, mean=mean, std=std, preprocess=preprocess,
                                    device=dev, num_classes=num_classes, batch_size=recipe.eval_batch_size,
                                    precision=precision, model_name=model_name, model_kwargs=model_kwargs)
    tracker = _Progress(desc, len(runs), epochs_trained(recipe), progress, on_epoch)
    results = {}
    for indices in groups:
        group = (_batched if mode == "batched" else _sequential)(loop, [runs[i] for i in indices])
        for i, result in zip(indices, _train_and_test_group(loop, group, tests, tracker)):
            results[i] = result if keep_models else replace(result, model=None)
        tracker.models_before += len(indices)
    tracker.bar.close()
    return [results[i] for i in range(len(runs))]


def _runs(train_images, train_targets, recipe: Recipe, seeds, lrs) -> list[tuple[int, float]]:
    """The (seed, lr) of every model to train, after checking the inputs."""
    if len(train_images) != len(train_targets):
        raise ValueError(f"{len(train_images)} training images but {len(train_targets)} targets")
    if len(train_images) == 0:
        raise ValueError("empty training set")
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
