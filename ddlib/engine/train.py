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
``compile`` (``torch.compile`` of the model, so of its forward and backward). Test passes run in inference mode on a test set
converted and normalised once (cached per test tensor, so once per cell), in the largest batches
that fit on a GPU.

Determinism: a seed fixes the model initialisation (``torch.manual_seed``), the shuffling
and the augmentation draws (private generators). On the CPU the same config, seed and mode give
the same accuracy bit for bit; on CUDA, cuDNN may differ in the last digits. The batched mode
adds the arithmetic of grouped convolutions: a seed gives the same model as in the sequential
mode up to float rounding (``tests/test_batched.py`` states the measured tolerance).
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from ddlib.engine.device import (PRECISIONS, autocast, compile_cache_dir, generator, resolve_device, resolve_precision,
                                 synchronize)
from ddlib.engine.stacked import StackedModels, stochastic_layers
from ddlib.models import create_model

__all__ = ["Recipe", "SeedResult", "epochs_trained", "run_precision", "train_and_evaluate", "evaluate", "evaluate_confusion", "Normalize",
           "cross_entropy_loss", "Objective", "NonFiniteLossError", "choose_mode", "MODES"]

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("step", "dc_step", "cosine", "cosine_half", "none")

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


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1  # YAML's `true` is an int


@dataclass(frozen=True)
class Recipe:
    """How a model is trained on a (distilled) set. Defaults are the DC/DSA/DM evaluation recipe's
    hyper-parameters, with 300 epochs (DC-Bench's no-augmentation setting) instead of 1000, under
    ``scheduler: step``; DC's own loop, one epoch more and a momentum reset at the drop, is
    ``scheduler: dc_step`` (the DC-Bench protocols' default). ``step`` stays the default so that
    every recipe key made before ``dc_step`` existed keeps its meaning."""

    epochs: int = 300
    batch_size: int = 256
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    # "step": lr x 0.1 for the second half (epochs // 2 each); "dc_step": DC's and DC-Bench's own loop
    # (evaluate_synset): epochs + 1 epochs, lr x 0.1 with a new optimizer (momentum reset) after epoch
    # epochs // 2 + 1 (0-based), see _DCStep; "cosine": to lr_min (SRe2L: 0); "cosine_half": the quarter-period
    # cosine 0.5 * (1 + cos(pi * epoch / epochs / 2)) that ends at half the lr (RDED, EDC); "none"
    scheduler: str = "step"
    eval_batch_size: int = 1024  # test-pass batch on the CPU; on CUDA the largest that fits
    lr_min: float = 0.0  # the cosine schedule's final lr (DC-Bench's NAS proxy: 0.001)
    grad_clip: float | None = None  # clip the gradient norm to this (DC-Bench's NAS proxy: 5); None = never
    # How the arithmetic runs (not what is trained). In the recipe's key only where they change the
    # arithmetic (not fp32, not false), so every key made before these switches existed stays valid.
    # "auto": bf16 where the device computes it natively, else fp32 (resolve it before keying).
    precision: str = "auto"  # "auto" (bf16 where native, else fp32); "fp32"; "bf16" autocast
    channels_last: bool = False  # channels-last memory format for the model and its inputs
    compile: bool = False  # torch.compile the model (forward and backward); sequential mode only

    def __post_init__(self):
        problems = []
        if not _positive_int(self.epochs):
            problems.append(f"epochs must be a positive integer, got {self.epochs!r}")
        if not _positive_int(self.batch_size):
            problems.append(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not _positive_int(self.eval_batch_size):
            problems.append(f"eval_batch_size must be a positive integer, got {self.eval_batch_size!r}")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.scheduler not in SCHEDULERS:
            problems.append(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        for name in ("channels_last", "compile"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("lr", "momentum", "weight_decay", "lr_min"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                problems.append(f"{name} must be a finite non-negative number, got {value!r}")
            elif name == "lr" and value == 0:
                problems.append("lr must be positive, got 0")
        clip = self.grad_clip
        if clip is not None and (not isinstance(clip, (int, float)) or isinstance(clip, bool) or not math.isfinite(clip)
                                 or clip <= 0):
            problems.append(f"grad_clip must be null or a positive number, got {clip!r}")
        if problems:
            raise ValueError("bad recipe: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, values: dict | None, base: "Recipe | None" = None) -> "Recipe":
        """Build from a params dict, naming any unknown key (a typo must not silently use a default)."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown recipe key(s) {unknown}; known: {sorted(known)}")
        merged = {**(asdict(base) if base else {}), **values}
        for name in ("lr", "momentum", "weight_decay", "lr_min"):  # YAML reads 1e-3 as a string
            if isinstance(merged.get(name), str):
                try:
                    merged[name] = float(merged[name])
                except ValueError:
                    raise ValueError(f"bad recipe: {name} must be a number, got {merged[name]!r}") from None
        return cls(**merged)

    def to_dict(self) -> dict:
        """The recipe as a params dict (part of every evaluation's reuse key). Fields that joined later
        appear only where they change what is trained or how it is computed (``lr_min``/``grad_clip``
        away from their defaults, ``precision`` other than fp32, ``channels_last`` or ``compile``
        true), so every key made before they existed stays valid, and a run that trains or computes
        differently gets its own key. Resolve ``auto`` before keying (:func:`run_precision`): it means
        bf16 on one device and fp32 on another."""
        out = asdict(self)
        for name, default in _LATER_DEFAULTS.items():
            if out[name] == default:
                del out[name]
        return out


_LATER_DEFAULTS = {"lr_min": 0.0, "grad_clip": None, "precision": "fp32", "channels_last": False, "compile": False}


def run_precision(recipe: Recipe, device: torch.device, objective: bool = False) -> str:
    """The precision a training runs in: the recipe's, with ``auto`` resolved on ``device``. An
    adversarial-training ``objective`` (gradients with respect to the inputs) keeps ``auto`` at fp32:
    bf16 was measured to keep accuracy for plain training only; ``bf16`` given explicitly applies."""
    if objective and recipe.precision == "auto":
        return "fp32"
    return resolve_precision(recipe.precision, device)


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or Inf: the model is garbage, so there is no result to report."""


# Epochs between checks that the loss is still finite (each check waits for the device).
FINITE_CHECK_EVERY = 10


@dataclass
class SeedResult:
    seed: int
    test_accuracy: float  # fraction in [0, 1]
    epoch_losses: list[float]
    train_seconds: float  # batched mode: the batch's time divided by its models
    eval_seconds: float
    model: nn.Module | None = field(default=None, repr=False)
    confusion: list[list[int]] | None = field(default=None, repr=False)  # [true class][predicted class] test counts
    lr: float | None = None  # the learning rate this model trained with
    mode: str = "sequential"  # or "batched"
    precision: str = "fp32"  # as resolved on the device ("auto" -> fp32 or bf16)


class Normalize(nn.Module):
    """Per-channel (x - mean) / std on tensors already on the device."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def as_pixels(x: torch.Tensor) -> torch.Tensor:
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with hard (int) or soft (probability rows) targets."""
    return F.cross_entropy(logits, targets)


def _optimizer(recipe: Recipe, params) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


def epochs_trained(recipe: Recipe) -> int:
    """How many epochs the loop runs: ``recipe.epochs``, or one more under ``dc_step`` (DC's
    ``for ep in range(Epoch + 1)``, ``Epoch`` being its ``epoch_eval_train``)."""
    return recipe.epochs + 1 if recipe.scheduler == "dc_step" else recipe.epochs


class _DCStep(torch.optim.lr_scheduler.MultiStepLR):
    """DC's evaluation schedule (VICO-UoE/DatasetCondensation ``utils.evaluate_synset``, copied by
    DC-Bench's ``EvaluatorUtils.evaluate_synset_dataset``): ``Epoch + 1`` epochs; after epoch
    ``Epoch // 2 + 1`` (0-based) the lr drops x0.1 and a *new* SGD optimizer is built, so the
    momentum buffers start again. Here: the same lr drop (at scheduler step ``epochs // 2 + 2``) and
    the optimizer's state cleared at that step, which is what a new optimizer of the same kind,
    hyper-parameters and lr is (DC-Bench's Adam branch, which keeps its optimizer, is not this)."""

    def __init__(self, optimizer: torch.optim.Optimizer, epochs: int):
        self.reset_at = epochs // 2 + 2
        super().__init__(optimizer, milestones=[self.reset_at], gamma=0.1)

    def step(self):
        super().step()
        if self.last_epoch == self.reset_at:
            self.optimizer.state.clear()


def _scheduler(recipe: Recipe, optimizer) -> torch.optim.lr_scheduler.LRScheduler | None:
    if recipe.scheduler == "dc_step":
        return _DCStep(optimizer, recipe.epochs)
    if recipe.scheduler == "step":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[recipe.epochs // 2], gamma=0.1)
    if recipe.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=recipe.epochs, eta_min=recipe.lr_min)
    if recipe.scheduler == "cosine_half":  # RDED / EDC (DD-Ranking's 'cosine'): ends at lr / 2
        epochs = recipe.epochs
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 0.5 * (1.0 + math.cos(math.pi * e / epochs / 2)))
    return None


# --------------------------------------------------------------------------- test passes

# Prepared (converted, normalised, preprocessed) test sets, per test tensor: a cell evaluates
# dozens of models on one test set, which is converted once instead of once per pass. Keyed by
# the tensor's id and in-place version; an entry goes when its tensor does.
_PREPARED: dict[int, tuple[weakref.ref, dict]] = {}
_PREPARED_PER_TENSOR = 2  # e.g. with and without a ZCA preprocess
_EVAL_BATCH: dict[tuple, int] = {}  # CUDA: the largest test batch that fitted, per model and shape


class _LazyPrepared:
    """A test set read lazily (``stream:`` datasets, too large to hold converted): each slice is
    read, converted and normalised when a test pass asks for it, so memory stays one chunk."""

    def __init__(self, images, normalize: nn.Module, device: torch.device, memory_format=torch.contiguous_format):
        self.images, self.normalize, self.device, self.memory_format = images, normalize, device, memory_format

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.images.shape)

    def __len__(self) -> int:
        return len(self.images)

    def contiguous(self, memory_format=torch.contiguous_format) -> "_LazyPrepared":
        return _LazyPrepared(self.images, self.normalize, self.device, memory_format)

    def __getitem__(self, index: slice) -> torch.Tensor:
        with torch.inference_mode():
            x = self.normalize(as_pixels(self.images[index].to(self.device, non_blocking=True)))
        return x.contiguous(memory_format=self.memory_format)


def _prepared(images: torch.Tensor, normalize: nn.Module, key, device: torch.device, chunk: int) -> torch.Tensor:
    """``normalize(as_pixels(images))`` on ``device``, computed once per (tensor, key, device);
    lazily, a chunk at a time, for images that are not a tensor (read from files on demand)."""
    if not isinstance(images, torch.Tensor):
        return _LazyPrepared(images, normalize, device)
    entry = _PREPARED.get(id(images))
    if entry is None or entry[0]() is not images:
        ident = id(images)
        entry = (weakref.ref(images, lambda _ref, ident=ident: _PREPARED.pop(ident, None)), {})
        _PREPARED[ident] = entry
    cache = entry[1]
    full_key = (key, getattr(images, "_version", 0) if not images.is_inference() else -1, str(device))
    if full_key not in cache:
        with torch.inference_mode():
            parts = [normalize(as_pixels(images[i : i + chunk].to(device, non_blocking=True)))
                     for i in range(0, len(images), chunk)]
            prepared = torch.cat(parts) if parts else images.new_zeros((0,), dtype=torch.float32, device=device)
        while len(cache) >= _PREPARED_PER_TENSOR:
            cache.pop(next(iter(cache)))
        cache[full_key] = (prepared, normalize)  # the module too: its id is in the key, keep it alive
    return cache[full_key][0]


def standard_layout(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the row-major strides of its shape: a copy only where they differ. A 1-channel
    batch may carry stride 1 on its channel axis (contiguous all the same); oneDNN's bf16 convolution
    takes a path about 4x slower on that layout (digits training 11.3 s against 3.0 s). Applied to
    bf16 work only: fp32 keeps the layout its numbers were measured with (see the README). Images
    that are not a tensor (read from files on demand) pass through."""
    if not isinstance(t, torch.Tensor):
        return t
    expected, step = [], 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= max(size, 1)
    if t.stride() == tuple(reversed(expected)):
        return t
    return t.clone(memory_format=torch.contiguous_format)  # row-major strides, whatever t's were


def _largest_fitting(fn, n: int, batch: int, device: torch.device, memo_key) -> list:
    """``[fn(start, stop), ...]`` over ``range(n)`` in chunks. On CUDA the first chunk is the whole
    range (or the size that fitted before), halved on out-of-memory and remembered."""
    if device.type == "cuda":
        batch = _EVAL_BATCH.get(memo_key, max(n, 1))
    while True:
        try:
            return [fn(i, min(i + batch, n)) for i in range(0, n, batch)]
        except torch.cuda.OutOfMemoryError:
            if device.type != "cuda" or batch == 1:
                raise
            batch = max(1, batch // 2)
            torch.cuda.empty_cache()
        finally:
            if device.type == "cuda":
                _EVAL_BATCH[memo_key] = batch


def _confusion(forward, x: torch.Tensor, labels: torch.Tensor, num_classes: int, batch: int, device: torch.device,
               precision: str, memo_key) -> torch.Tensor:
    """Test counts per (true class, predicted class), on the CPU: K x K for one model, or S x K x K
    when ``forward(x_chunk)`` gives S x b x K logits (S models on the same images)."""
    k2 = num_classes * num_classes

    def chunk(i, j):
        with autocast(precision, device):
            predicted = forward(standard_layout(x[i:j]) if precision == "bf16" else x[i:j]).argmax(-1)
        pairs = labels[i:j] * num_classes + predicted
        models = 1 if pairs.dim() == 1 else pairs.shape[0]
        if pairs.dim() == 2:  # model s counts in its own K x K block
            pairs = pairs + torch.arange(models, device=pairs.device)[:, None] * k2
        return torch.bincount(pairs.flatten(), minlength=models * k2)

    parts = _largest_fitting(chunk, len(labels), batch, device, memo_key)
    counts = torch.stack(parts).sum(0) if parts else torch.zeros(k2, dtype=torch.long)
    return counts.view(-1, num_classes, num_classes).squeeze(0).cpu()


@torch.inference_mode()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalize: nn.Module,
             batch_size: int = 1024, precision: str = "fp32") -> float:
    """Top-1 accuracy (a fraction) of ``model`` on pixel ``images``, in large batches; ``normalize``
    maps pixels to the model's input (the normalisation, or a preprocess such as ZCA in its place)."""
    device = next(model.parameters()).device
    model.eval()
    x = _prepared(images, normalize, ("module", id(normalize)), device, batch_size)
    y = labels.to(device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    for hits in _largest_fitting(lambda i, j: _hits(model, x[i:j], y[i:j], precision, device), len(y), batch_size,
                                 device, (type(model).__name__, tuple(x.shape[1:]), 1)):
        correct += hits
    return correct.item() / max(1, len(labels))


def _hits(model, x, y, precision, device) -> torch.Tensor:
    x = standard_layout(x) if precision == "bf16" else x
    with autocast(precision, device):
        return (model(x).argmax(-1) == y).sum()


@torch.inference_mode()
def evaluate_confusion(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalize: nn.Module,
                       num_classes: int, batch_size: int = 1024, precision: str = "fp32") -> torch.Tensor:
    """Test counts per (true class, predicted class), on the CPU: the accuracy is its trace over
    the number of images, and the matrix is what a report shows of the model's mistakes."""
    device = next(model.parameters()).device
    model.eval()
    x = _prepared(images, normalize, ("module", id(normalize)), device, batch_size)
    return _confusion(model, x, labels.to(device), num_classes, batch_size, device, precision,
                      (type(model).__name__, tuple(x.shape[1:]), 1))


# --------------------------------------------------------------------------- modes

MODES = ("sequential", "batched")
# Batched mode, upper bounds per step (memory): models, and images (models x batch) on the CPU.
MAX_MODELS_PER_STEP = 32
CPU_IMAGES_PER_STEP = 1024


def choose_mode(requested: str | bool | None, device: torch.device, runs: int, *, objective: bool = False,
                recipe: Recipe | None = None) -> str:
    """Which mode trains ``runs`` models of one call (the rule, from ``bench/engine_throughput.py``):

    * ``sequential`` whenever the batched mode cannot run the job: an ``objective`` (adversarial
      training needs the model itself), ``compile`` / ``channels_last`` (sequential switches),
      ``grad_clip`` (a per-model gradient norm), or a model with dropout (``train_and_evaluate``
      checks: vmap cannot draw it per model);
    * otherwise, automatically: ``batched`` on CUDA for two models or more (a 3-layer ConvNet step
      leaves a GPU mostly idle, so S models in one step cost little more than one), ``sequential``
      on the CPU and for a single model (measured by ``bench/engine_throughput.py`` on a 2-core
      EPYC: the CPU step is compute-bound already at 10 images and the grouped convolutions of the
      batched mode are no faster there than S dense ones; see bench/README.md).

    ``requested`` (``train_and_evaluate(batched=...)``): ``None``/``"auto"`` applies the rule;
    ``True``/``"batched"`` forces the batched mode where it can run (even for one model: the
    benchmark measures its overhead); ``False``/``"sequential"`` forces sequential."""
    if requested in (False, "sequential"):
        return "sequential"
    if requested not in (None, "auto", True, "batched"):
        raise ValueError(f"batched must be None/'auto', True/'batched' or False/'sequential', got {requested!r}")
    if objective or (recipe is not None and (recipe.compile or recipe.channels_last or recipe.grad_clip is not None)):
        return "sequential"
    if requested in (True, "batched"):
        return "batched"
    return "batched" if device.type == "cuda" and runs >= 2 else "sequential"


# --------------------------------------------------------------------------- the loop

AUG_SEED_OFFSET = 1_000_003  # the augmentation generator of seed s is seeded with s + this


class _Loop:
    """What every model of one call shares: the data on the device, hooks, recipe, precision."""

    def __init__(self, model_name, images, targets, normalize, recipe, augment, loss, objective, device,
                 model_kwargs, num_classes, precision, bar, desc="train"):
        self.model_name, self.images, self.targets, self.normalize = model_name, images, targets, normalize
        self.recipe, self.augment, self.loss, self.objective, self.device = recipe, augment, loss, objective, device
        self.model_kwargs, self.num_classes, self.precision, self.bar = model_kwargs or {}, num_classes, precision, bar
        self.desc = desc
        self.n = len(images)
        self.channels, self.height, self.width = images.shape[1:]

    def new_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return create_model(self.model_name, self.channels, self.num_classes, (self.height, self.width),
                            **self.model_kwargs).to(self.device)

    def batch(self, idx: torch.Tensor, aug_gen: torch.Generator):
        x, y = self.normalize(as_pixels(self.images[idx])), self.targets[idx]
        if self.augment is not None:
            x, y = self.augment(x, y, aug_gen)
        return x, y

    def optimizer(self, lr: float, params):
        recipe = self.recipe if lr == self.recipe.lr else replace(self.recipe, lr=lr)
        optimizer = _optimizer(recipe, params)
        return optimizer, _scheduler(recipe, optimizer)


def _train_sequential(loop: _Loop, seed: int, lrs: Sequence[float]) -> list[tuple[nn.Module, list[float], float]]:
    """One model per lr in ``lrs``, all from ``seed``: each trained as it would be alone. Several lrs
    train in lockstep (:func:`lockstep`): one batch per step, drawn and augmented once, and each
    model's loss hook sees that same batch object, so a relabelling teacher runs once per step
    for all of them (``TeacherRelabel`` keeps its last batch's logits)."""
    recipe, dev = loop.recipe, loop.device
    models = []
    for _ in lrs:
        model = loop.new_model(seed)  # the same initial weights for every lr, as trained alone
        models.append(model.to(memory_format=torch.channels_last) if recipe.channels_last else model)
    if recipe.compile:
        compile_cache_dir()  # kernels cached per instruction set (a stale one trained to NaN)
    step_models = [torch.compile(m) if recipe.compile else m for m in models]
    order_gen = generator(seed)  # shuffling: CPU generator, identical on every device
    aug_gen = generator(seed + AUG_SEED_OFFSET, dev)
    steppers = [loop.optimizer(lr, m.parameters()) for lr, m in zip(lrs, models)]
    epoch_losses = [[] for _ in lrs]
    synchronize(dev)
    start = time.perf_counter()
    for m in models:
        m.train()
    epochs = epochs_trained(recipe)
    for epoch in range(epochs):
        order = torch.randperm(loop.n, generator=order_gen).to(dev)
        totals = [torch.zeros((), device=dev) for _ in lrs]
        for i in range(0, loop.n, recipe.batch_size):
            idx = order[i : i + recipe.batch_size]
            x, y = loop.batch(idx, aug_gen)
            if recipe.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            for model, step_model, (optimizer, _), total in zip(models, step_models, steppers, totals):
                with autocast(loop.precision, dev):
                    if loop.objective is None:
                        batch_loss = loop.loss(step_model(x).float(), y, x)
                    else:
                        batch_loss = loop.objective(step_model, x, y, aug_gen)
                optimizer.zero_grad(set_to_none=True)
                batch_loss.backward()
                if recipe.grad_clip is not None:
                    nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
                optimizer.step()
                total += batch_loss.detach() * len(idx)
        for (_, scheduler), losses, total in zip(steppers, epoch_losses, totals):
            if scheduler is not None:
                scheduler.step()
            losses.append(total)
        loop.bar.update(len(lrs))
        if (epoch + 1) % FINITE_CHECK_EVERY == 0 or epoch + 1 == epochs:
            for lr, losses in zip(lrs, epoch_losses):
                _check_finite(losses, loop.desc, seed, recipe, lr)
    synchronize(dev)
    seconds = (time.perf_counter() - start) / len(lrs)
    # one sync per model, not per step
    return [(m, (torch.stack(losses) / loop.n).tolist(), seconds) for m, losses in zip(models, epoch_losses)]


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


def _many_losses(loss: LossHook, logits: torch.Tensor, ys: list, xs: list) -> torch.Tensor:
    """(S,) losses of S models: the hook's ``many`` where it has one, else one call per model."""
    many = getattr(loss, "many", None)
    if many is not None:
        return many(logits, ys, xs)
    return torch.stack([loss(logits[s], ys[s], xs[s]) for s in range(len(xs))])


def _train_batched(loop: _Loop, runs: list[tuple[int, float]]) -> tuple[StackedModels, list[list[float]], float]:
    """Train ``runs`` (seed, lr) at once; each model as :func:`_train_sequential` would, up to rounding."""
    recipe, dev = loop.recipe, loop.device
    stack = StackedModels([loop.new_model(seed) for seed, _ in runs])
    by_lr: dict[float, list[nn.Parameter]] = {}
    for model, (_, lr) in zip(stack.models, runs):
        by_lr.setdefault(lr, []).extend(model.parameters())
    steppers = [loop.optimizer(lr, params) for lr, params in by_lr.items()]  # one per lr: its own scheduler
    seeds = list(dict.fromkeys(seed for seed, _ in runs))  # distinct, in order: models sharing one share batches
    order_gens = {s: generator(s) for s in seeds}
    aug_gens = {s: generator(s + AUG_SEED_OFFSET, dev) for s in seeds}
    losses_per_epoch = []
    synchronize(dev)
    start = time.perf_counter()
    stack.train()
    epochs = epochs_trained(recipe)
    for epoch in range(epochs):
        orders = {s: torch.randperm(loop.n, generator=order_gens[s]).to(dev) for s in seeds}
        total = torch.zeros(len(runs), device=dev)
        for i in range(0, loop.n, recipe.batch_size):
            batches = {s: loop.batch(orders[s][i : i + recipe.batch_size], aug_gens[s]) for s in seeds}
            xs = [batches[seed][0] for seed, _ in runs]
            ys = [batches[seed][1] for seed, _ in runs]
            with autocast(loop.precision, dev):
                logits = stack(torch.stack(xs)).float()
                losses = _many_losses(loop.loss, logits, ys, xs)
            for optimizer, _ in steppers:
                optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            for optimizer, _ in steppers:
                optimizer.step()
            total += losses.detach() * len(xs[0])
        for _, scheduler in steppers:
            if scheduler is not None:
                scheduler.step()
        losses_per_epoch.append(total)
        loop.bar.update(len(runs))
        if (epoch + 1) % FINITE_CHECK_EVERY == 0 or epoch + 1 == epochs:
            for s_, (seed, lr) in enumerate(runs):
                _check_finite([t[s_] for t in losses_per_epoch], loop.desc, seed, recipe, lr)
    synchronize(dev)
    train_seconds = time.perf_counter() - start
    per_model = (torch.stack(losses_per_epoch) / loop.n).T.tolist()
    return stack, per_model, train_seconds


def _probe(model_name: str, images: torch.Tensor, num_classes: int, model_kwargs: dict | None) -> nn.Module:
    """The architecture only (meta device): no memory, no draws from the seeded generator."""
    with torch.device("meta"):
        return create_model(model_name, images.shape[1], num_classes, tuple(images.shape[2:]), **(model_kwargs or {}))


def _models_per_step(runs: int, batch: int, device: torch.device) -> int:
    """How many models one batched step holds (memory): at most MAX_MODELS_PER_STEP, and on the
    CPU at most CPU_IMAGES_PER_STEP images in all."""
    cap = MAX_MODELS_PER_STEP
    if device.type != "cuda":
        cap = min(cap, max(1, CPU_IMAGES_PER_STEP // max(1, batch)))
    return max(1, min(runs, cap))


def train_and_evaluate(
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
) -> list[SeedResult]:
    """Train one model per seed on (``train_images``, ``train_targets``) and test each.

    ``train_images`` are pixels (uint8 or float in [0, 1]); ``train_targets`` are int class
    labels or per-image target rows (soft labels). ``preprocess`` (ZCA whitening) maps pixels to the
    model's input in place of the mean/std normalisation, on training and test batches alike (MTT,
    DATM and DD-Ranking whiten [0, 1] pixels, not normalised ones). ``objective`` replaces ``loss(model(x), y, x)``
    as the per-batch objective (adversarial training); it may not be combined with ``loss``.
    ``lrs`` gives each seed its own learning rate (default: the recipe's for all; a seed may then
    repeat, e.g. one seed at every lr of a search). ``batched`` picks the mode (:func:`choose_mode`;
    default: automatic). Returns one :class:`SeedResult` per (seed, lr), in order.
    """
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
    dev = resolve_device(device)
    precision = run_precision(recipe, dev, objective is not None)
    mode = choose_mode(batched, dev, len(seeds), objective=objective is not None, recipe=recipe)
    if mode == "batched":
        if random_layers := stochastic_layers(_probe(model_name, train_images, num_classes, model_kwargs)):
            if batched in (True, "batched"):
                raise ValueError(f"batched=True: {model_name} has random layers {random_layers[:3]} (dropout), "
                                 "which one vectorised pass cannot draw per model; train it with batched=False")
            mode = "sequential"
    normalize = Normalize(mean, std).to(dev) if preprocess is None else preprocess.to(dev)
    bar = tqdm(total=len(seeds) * epochs_trained(recipe), desc=desc, disable=not progress, leave=False)
    images = train_images.to(dev)
    loop = _Loop(model_name, standard_layout(images) if precision == "bf16" else images, train_targets.to(dev),
                 normalize, recipe, augment,
                 loss or cross_entropy_loss, objective, dev, model_kwargs, num_classes, precision, bar, desc)
    norm_key = ("normalize", tuple(map(float, mean)), tuple(map(float, std)), id(preprocess))

    def test_set() -> torch.Tensor:  # after the first training, as before (hooks see training batches first)
        return _prepared(test_images, normalize, norm_key, dev, recipe.eval_batch_size)

    test_y = test_labels.to(dev)
    memo = (model_name, repr(sorted((model_kwargs or {}).items())), tuple(test_images.shape[1:]))
    runs = list(zip(seeds, lrs))
    results = []
    if mode == "sequential":
        stochastic = bool(stochastic_layers(_probe(model_name, train_images, num_classes, model_kwargs)))
        by_run: dict[int, SeedResult] = {}
        for group in lockstep(runs, objective=objective is not None, stochastic=stochastic):
            seed = runs[group[0]][0]
            trained = _train_sequential(loop, seed, [runs[i][1] for i in group])
            for i, (model, epoch_losses, train_seconds) in zip(group, trained):
                start = time.perf_counter()
                with torch.inference_mode():
                    model.eval()
                    x = test_set().contiguous(memory_format=torch.channels_last) if recipe.channels_last else test_set()
                    confusion = _confusion(model, x, test_y, num_classes, recipe.eval_batch_size, dev, precision,
                                           (*memo, 1))
                    accuracy = confusion.trace().item() / max(1, len(test_y))
                synchronize(dev)
                by_run[i] = SeedResult(seed, accuracy, epoch_losses, train_seconds, time.perf_counter() - start,
                                       model if keep_models else None, confusion.tolist(), runs[i][1], mode, precision)
        results = [by_run[i] for i in range(len(runs))]
    else:
        step = _models_per_step(len(runs), min(recipe.batch_size, loop.n), dev)
        for first in range(0, len(runs), step):
            chunk = runs[first : first + step]
            stack, epoch_losses, train_seconds = _train_batched(loop, chunk)
            start = time.perf_counter()
            with torch.inference_mode():
                stack.eval()
                per_model_batch = max(1, recipe.eval_batch_size // len(chunk))
                confusions = _confusion(stack.forward_shared, test_set(), test_y, num_classes, per_model_batch, dev,
                                        precision, (*memo, len(chunk))).expand(len(chunk), num_classes, num_classes)
            synchronize(dev)
            eval_seconds = (time.perf_counter() - start) / len(chunk)
            models = stack.release()
            for (seed, lr), model, confusion, losses in zip(chunk, models, confusions, epoch_losses):
                results.append(SeedResult(seed, confusion.trace().item() / max(1, len(test_y)), losses,
                                          train_seconds / len(chunk), eval_seconds, model if keep_models else None,
                                          confusion.tolist(), lr, mode, precision))
    bar.close()
    return results


def _check_finite(epoch_losses: list[torch.Tensor], desc: str, seed: int, recipe: Recipe, lr: float | None = None) -> None:
    """Stop a training whose loss is no longer finite, naming the evaluation and the first bad epoch."""
    losses = torch.stack(epoch_losses)
    bad = (~torch.isfinite(losses)).nonzero()
    if len(bad):
        epoch = int(bad[0]) + 1
        raise NonFiniteLossError(f"{desc}: training loss became {losses[epoch - 1].item()} at epoch {epoch} of "
                                 f"{epochs_trained(recipe)} (seed {seed}, lr {recipe.lr if lr is None else lr}): stopped, "
                                 "no result recorded")
