"""The test pass: top-1 accuracy, confusion counts and calibration sums of trained models, in inference mode.

A cell tests dozens of models on one test set, so the set is converted and normalised once
(cached per test tensor and in-place version, :func:`_prepared`) and run in the largest batches
that fit on a GPU (:func:`_largest_fitting`). :class:`Normalize` and :func:`as_pixels` map stored
pixels to a model's input, here and in the training loop alike.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Sequence

import torch
import torch.nn as nn

from ddlib.data.layout import standard_layout
from ddlib.engine.device import autocast, resolve_device, synchronize

__all__ = ["Normalize", "as_pixels", "model_accuracy", "model_confusion", "standard_layout", "PreparedTestSet",
           "CALIBRATION_BINS", "test_trained", "forget_test_batches"]


class Normalize(nn.Module):
    """Per-channel (x - mean) / std on tensors already on the device."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def as_pixels(x: torch.Tensor) -> torch.Tensor:
    """Pixels as floats in [0, 1]: uint8 images divided by 255, float images as they are."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()



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


def forget_test_batches() -> None:
    """Forget the CUDA test batches remembered after an out-of-memory halving. Called when a cell
    opens: a cell in a warm kernel then tests in the batches a fresh process would (after another
    cell's halving it would test in smaller batches, which on a GPU may pick other kernels)."""
    _EVAL_BATCH.clear()


def _largest_fitting(fn, n: int, batch: int, device: torch.device, memo_key) -> list:
    """``[fn(start, stop), ...]`` over ``range(n)`` in chunks. On CUDA the first chunk is the whole
    range (or the size that fitted before in this cell), halved on out-of-memory and remembered."""
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


# Calibration (Guo et al. 2017, "On calibration of modern neural networks"): confidences in 15
# equal-width bins ((m-1)/15, m/15], summed in the same pass as the confusion counts.
CALIBRATION_BINS = 15


def _calibration_sums(logits: torch.Tensor, labels: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """S x (3B + 1) sums over a chunk: per confidence bin the images, the correct ones and their
    confidences (the softmax probability of the predicted class), then the summed NLL of the true class.
    One-hot products, not bincount: deterministic on CUDA."""
    logp = logits.float().log_softmax(-1)
    if logp.dim() == 2:
        logp, predicted = logp.unsqueeze(0), predicted.unsqueeze(0)
    y = labels.expand(predicted.shape)
    confidence = logp.gather(-1, predicted.unsqueeze(-1)).squeeze(-1).exp()
    nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    bins = (confidence * CALIBRATION_BINS).ceil().long().clamp_(1, CALIBRATION_BINS) - 1
    onehot = torch.nn.functional.one_hot(bins, CALIBRATION_BINS).float()  # S x b x B
    correct = (predicted == y).float()
    return torch.cat([onehot.sum(1), torch.einsum("sb,sbk->sk", correct, onehot),
                      torch.einsum("sb,sbk->sk", confidence, onehot), nll.sum(1, keepdim=True)], 1)


def _test_counts(forward, x: torch.Tensor, labels: torch.Tensor, num_classes: int, batch: int, device: torch.device,
                 precision: str, memo_key) -> tuple[torch.Tensor, torch.Tensor]:
    """Test counts per (true class, predicted class), on the CPU: K x K for one model, or S x K x K
    when ``forward(x_chunk)`` gives S x b x K logits (S models on the same images); and, from the same
    logits, each model's calibration sums (S x (3B + 1), float64: :func:`_calibration_sums`)."""
    k2 = num_classes * num_classes

    def chunk(i, j):
        with autocast(precision, device):
            logits = forward(standard_layout(x[i:j]))
            predicted = logits.argmax(-1)
        pairs = labels[i:j] * num_classes + predicted
        models = 1 if pairs.dim() == 1 else pairs.shape[0]
        if pairs.dim() == 2:  # model s counts in its own K x K block
            pairs = pairs + torch.arange(models, device=pairs.device)[:, None] * k2
        return torch.bincount(pairs.flatten(), minlength=models * k2), _calibration_sums(logits, labels[i:j], predicted)

    parts = _largest_fitting(chunk, len(labels), batch, device, memo_key)
    counts = torch.stack([p[0] for p in parts]).sum(0) if parts else torch.zeros(k2, dtype=torch.long)
    sums = (torch.stack([p[1].cpu().double() for p in parts]).sum(0) if parts
            else torch.zeros(1, 3 * CALIBRATION_BINS + 1, dtype=torch.float64))
    return counts.view(-1, num_classes, num_classes).squeeze(0).cpu(), sums


def _confusion(*args) -> torch.Tensor:
    return _test_counts(*args)[0]


@torch.inference_mode()
def model_accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalize: nn.Module,
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
    x = standard_layout(x)
    with autocast(precision, device):
        return (model(x).argmax(-1) == y).sum()


@torch.inference_mode()
def model_confusion(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalize: nn.Module,
                       num_classes: int, batch_size: int = 1024, precision: str = "fp32") -> torch.Tensor:
    """Test counts per (true class, predicted class), on the CPU: the accuracy is its trace over
    the number of images, and the matrix is what a report shows of the model's mistakes."""
    device = next(model.parameters()).device
    model.eval()
    x = _prepared(images, normalize, ("module", id(normalize)), device, batch_size)
    return _confusion(model, x, labels.to(device), num_classes, batch_size, device, precision,
                      (type(model).__name__, tuple(x.shape[1:]), 1))


class PreparedTestSet:
    """The test set of one ``train_and_test`` call: prepared on first use (after the first
    training, so hooks see training batches first) and shared by every model the call tests."""

    def __init__(self, images, labels: torch.Tensor, normalize: nn.Module, key, device: torch.device,
                 num_classes: int, batch_size: int, precision: str, memo_key: tuple):
        self.images, self.labels, self.normalize, self.key, self.device = images, labels.to(device), normalize, key, device
        self.num_classes, self.batch_size, self.precision, self.memo_key = num_classes, batch_size, precision, memo_key

    @classmethod
    def of_call(cls, test_images, test_labels, normalize: nn.Module, *, mean, std, preprocess, device: torch.device,
                num_classes: int, batch_size: int, precision: str, model_name: str, model_kwargs: dict | None):
        """The test set of a ``train_and_test`` call (or of a model trained by one, tested later:
        :func:`test_trained`), keyed so both share one prepared copy and batch size."""
        norm_key = ("normalize", tuple(map(float, mean)), tuple(map(float, std)), id(preprocess))
        memo_key = (model_name, repr(sorted((model_kwargs or {}).items())), tuple(test_images.shape[1:]))
        return cls(test_images, test_labels, normalize, norm_key, device, num_classes, batch_size, precision, memo_key)

    def confusions(self, forward, models: int = 1, channels_last: bool = False) -> torch.Tensor:
        """S x K x K test counts: ``forward`` is one model (S = 1) or gives S x b x K logits."""
        return self.counts(forward, models, channels_last)[0]

    def counts(self, forward, models: int = 1, channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """S x K x K test counts and S x (3B + 1) calibration sums, from one pass over the test set."""
        x = _prepared(self.images, self.normalize, self.key, self.device, self.batch_size)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        k = self.num_classes
        confusion, sums = _test_counts(forward, x, self.labels, k, max(1, self.batch_size // models), self.device,
                                       self.precision, (*self.memo_key, models))
        return confusion.expand(models, k, k), sums.expand(models, -1)

    def test_one(self, model: nn.Module, channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One model's K x K counts, calibration sums and seconds (the sequential mode's test pass)."""
        start = time.perf_counter()
        with torch.inference_mode():
            model.eval()
            confusions, sums = self.counts(model, 1, channels_last)
        synchronize(self.device)
        return confusions[0], sums[0], time.perf_counter() - start

    def accuracy(self, confusion: torch.Tensor) -> float:
        return confusion.trace().item() / max(1, len(self.labels))


def test_trained(trained, model_name: str, test_images, test_labels, *, num_classes: int, mean, std, recipe,
                 preprocess: nn.Module | None = None, device="auto", model_kwargs=None):
    """``trained`` (a :class:`ddlib.engine.train.SeedResult` with its model kept) tested on another
    test set exactly as a ``train_and_test`` call with that set tests it: the same prepared set,
    batches, precision and layout. An lr search's model of the chosen lr is tested so instead of
    being trained again. Returns a copy of ``trained`` with that test's numbers."""
    dev = resolve_device(device)
    normalize = Normalize(mean, std).to(dev) if preprocess is None else preprocess.to(dev)
    tests = PreparedTestSet.of_call(test_images, test_labels, normalize, mean=mean, std=std, preprocess=preprocess,
                                    device=dev, num_classes=num_classes, batch_size=recipe.eval_batch_size,
                                    precision=trained.precision, model_name=model_name, model_kwargs=model_kwargs)
    confusion, sums, seconds = tests.test_one(trained.model, recipe.channels_last)
    return dataclasses.replace(trained, test_accuracy=tests.accuracy(confusion), eval_seconds=seconds,
                               confusion=confusion.tolist(), calibration=sums.tolist())
