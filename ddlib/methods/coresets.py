"""Coreset baselines beside random and K-Center (issue 27.4): herding, forgetting and EL2N, each a
subset of ``ipc`` real training images per class, selected per class, evaluated like every other set.

* ``herding`` (Welling, ICML 2009, as iCaRL's exemplar selection, Rebuffi et al., CVPR 2017, Alg. 4):
  per class, greedily add the image whose embedding brings the mean of the chosen embeddings closest
  to the class mean: the k-th pick is ``argmin_x || mu - (x + sum of the k-1 chosen) / k ||`` over the
  images not chosen yet. Two variants, two names:

  - ``herding``: in K-Center's embeddings, the same feature ConvNet (``select._embeddings``, trained
    ``epochs``, 1 by default, with DC's recipe, cached), not L2-normalised: cheap, and *not* the
    baseline of DC's tables.
  - ``herding_dc``: the coreset baseline of DC's, DSA's and DM's tables (Zhao et al. 2021: "greedily
    adds samples into the coreset so that the mean vector is approaching the whole dataset mean", in
    the features of a network trained on the whole training set) as iCaRL herds: the feature ConvNet
    trained to convergence (:data:`HERDING_DC_EPOCHS` of DC's recipe; DC gives no number) and every
    embedding L2-normalised before the class mean is taken (iCaRL's code: ``D / ||D||``; on unit
    vectors its ``w_t += mu - x`` loop and Algorithm 4 pick the same images).

  Neither DC nor DC-Bench released selection code (VICO-UoE/DatasetCondensation only loads herding
  sets). Ties: the lowest index.
* ``forgetting`` (Toneva et al., ICLR 2019; ranked per class here, globally in the paper): a dedicated run
  of the feature ConvNet (DC's recipe, fp32, ``epochs`` 20 by default) records, at every presentation of
  every training image (its mini-batch's forward pass, before the step), whether it was classified
  correctly; a forgetting event is a presentation classified wrongly right after one classified correctly.
  Images never classified correctly count as forgotten infinitely often (Toneva's code ranks them first).
  Per class the most-forgotten images are kept, as DC's tables do ("samples that are easy to forget");
  ties (the many never-forgotten images) are broken by a permutation drawn from ``seed``.
* ``el2n`` (Paul et al., NeurIPS 2021; ranked per class here, globally in the paper): the L2 norm of
  softmax output minus one-hot label, averaged over ``num_models`` networks (10, as Paul et al.) each
  trained ``epochs`` (20: Paul et al.'s CIFAR-10 scores are taken at epoch 20) with DC's recipe, in eval
  mode on the un-augmented training image; per class the highest-scoring (hardest) images are kept, Paul
  et al.'s pruning keeps those.

Each trains once per machine: the scores are cached under ``$DDLIB_CACHE/features`` keyed by the
training data, model, recipe, seed(s), torch's version, the device type and :data:`REVISION`; a
seed gives the same subset on the CPU (on CUDA, cuDNN may differ in the last digits).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from ddlib.data.datasets import Dataset
from ddlib.data.distilled import DistilledSet
from ddlib.engine.device import generator, resolve_device
from ddlib.engine.test_pass import Normalize, as_pixels
from ddlib.engine.train import train_and_test
from ddlib.methods import cost
from ddlib.methods.select import (_check_ipc, _embeddings, _per_class, cache_path, cache_store, feature_model_name,
                                  feature_recipe, subset_from_indices, training_identity)

__all__ = ["REVISION", "HERDING_DC_EPOCHS", "herding_indices", "forgetting_counts", "el2n_scores", "top_indices",
           "herding_subset", "herding_dc_subset", "forgetting_subset", "el2n_subset"]

REVISION = 1  # of the cached scores: bump when what a score run computes changes
# herding_dc's feature network: "trained on the whole training set" (DC), to convergence; DC gives no
# number: 50 epochs of DC's recipe (SGD 0.01, no schedule) fit CIFAR-10's training set with a ConvNet
HERDING_DC_EPOCHS = 50


# --------------------------------------------------------------------------- the rules (pure)


def herding_indices(features: torch.Tensor, k: int) -> torch.Tensor:
    """Herding in one class: ``k`` distinct row indices of ``features``, in the order chosen; the
    t-th minimises the distance between the class mean and the mean of the t chosen rows."""
    x = features.double()
    mu, total = x.mean(0), torch.zeros(x.shape[1], dtype=torch.float64)
    taken = torch.zeros(len(x), dtype=torch.bool)
    chosen: list[int] = []
    for t in range(1, min(k, len(x)) + 1):
        gap = ((t * mu - total) - x).pow(2).sum(1)  # t^2 x the squared distance of the running mean to mu
        gap[taken] = math.inf
        i = int(gap.argmin())
        chosen.append(i)
        taken[i] = True
        total += x[i]
    return torch.tensor(chosen, dtype=torch.long)


def forgetting_counts(history: torch.Tensor) -> torch.Tensor:
    """Forgetting events per example from ``history`` (presentations x examples, true where the
    presentation was classified correctly): the 1 -> 0 transitions between successive presentations;
    ``inf`` for an example never classified correctly (Toneva et al.)."""
    h = history.bool()
    counts = (h[:-1] & ~h[1:]).sum(0).double()
    counts[~h.any(0)] = math.inf
    return counts


def el2n_scores(probabilities: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """EL2N of each example: ``|| p - onehot(y) ||_2`` for each model's softmax ``p`` (models x
    examples x classes), averaged over the models (the mean of the norms, as Paul et al.)."""
    onehot = F.one_hot(labels.long(), probabilities.shape[-1]).to(probabilities.dtype)
    return (probabilities - onehot).norm(dim=-1).mean(0)


def top_indices(scores: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """The ``k`` highest ``scores`` (``inf`` first), ties in the order of a permutation drawn from ``gen``."""
    perm = torch.randperm(len(scores), generator=gen)
    order = torch.sort(scores[perm], descending=True, stable=True).indices
    return perm[order[:k]]


# --------------------------------------------------------------------------- score runs (trained once, cached)


def _cached(dataset: Dataset, name: str, identity: dict, compute: Callable[[], tuple[torch.Tensor, dict]]):
    """(scores, about) from the cache where ``identity`` was computed before, else ``compute()``, stored."""
    identity = {**identity, "scores": name, "revision": REVISION}
    path = cache_path(dataset, name, identity)
    if path.is_file():
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
            scores, about = stored["scores"], {**stored["about"], "scores_from": "cache"}
            cost.timed(stored)  # the run's seconds count toward the set's construction cost
            return scores, about
        except Exception:  # noqa: BLE001 - a damaged cache entry: compute again
            pass
    with cost.watch() as took:
        scores, about = compute()
    cache_store(path, {"scores": scores.cpu(), "about": about, "identity": identity, **cost.stored(took)})
    return scores.cpu(), {**about, "scores_from": "computed"}


class _Recorder:
    """Cross-entropy that also records a value per training example at each of its presentations (``measure(logits,
    labels)``: forgetting's "classified correctly", AUM's margin). The targets carry the example's index:
    ``label + classes * index``."""

    def __init__(self, name: str, measure, dtype: torch.dtype, classes: int, examples: int, epochs: int,
                 device: torch.device):
        self.name, self.measure, self.classes = name, measure, classes
        self.history = torch.zeros(epochs, examples, dtype=dtype, device=device)
        self.seen = torch.zeros(examples, dtype=torch.long, device=device)

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        labels, index = targets % self.classes, targets // self.classes
        self.history[self.seen[index], index] = self.measure(logits.detach(), labels)
        self.seen[index] += 1
        return F.cross_entropy(logits, labels)


def recorded_run(dataset: Dataset, seed: int, model: str, dev: torch.device, epochs: int, name: str, measure,
                 dtype: torch.dtype):
    """Train the score network once (the feature recipe, ``epochs``), recording ``measure`` per example and
    presentation: (the epochs x examples history on the CPU, the trained model's result)."""
    n, k = len(dataset.train_labels), dataset.num_classes
    record = _Recorder(name, measure, dtype, k, n, epochs, dev)
    targets = dataset.train_labels.long() + k * torch.arange(n)
    (trained,) = train_and_test(model, dataset.train_images, targets, dataset.test_images, dataset.test_labels,
                                num_classes=k, mean=dataset.mean, std=dataset.std, recipe=feature_recipe(epochs),
                                seeds=[seed], loss=record, device=dev)
    return record.history.cpu(), trained


def _forgetting_scores(dataset: Dataset, seed: int, model: str, dev: torch.device, epochs: int):
    recipe = feature_recipe(epochs)

    def compute():
        history, trained = recorded_run(dataset, seed, model, dev, epochs, "cross_entropy+presentations",
                                        lambda logits, labels: logits.argmax(1) == labels, torch.bool)
        counts = forgetting_counts(history)
        return counts, {"score_model_test_accuracy": trained.test_accuracy,
                        "never_learned": int(counts.isinf().sum()), "never_forgotten": int((counts == 0).sum())}

    return _cached(dataset, "forgetting", {**training_identity(dataset, model, recipe, dev), "seed": seed}, compute)


def _el2n_scores(dataset: Dataset, seed: int, model: str, dev: torch.device, epochs: int, models: int):
    recipe = feature_recipe(epochs)
    seeds = [seed * models + i for i in range(models)]  # disjoint for different seeds

    def compute():
        trained = train_and_test(model, dataset.train_images, dataset.train_labels, dataset.test_images,
                                 dataset.test_labels, num_classes=dataset.num_classes, mean=dataset.mean,
                                 std=dataset.std, recipe=recipe, seeds=seeds, device=dev, keep_models=True)
        normalize = Normalize(dataset.mean, dataset.std).to(dev)
        total = torch.zeros(len(dataset.train_labels), dtype=torch.float64)
        with torch.inference_mode():
            for result in trained:
                net = result.model.eval()
                for i in range(0, len(total), 1024):
                    x = normalize(as_pixels(dataset.train_images[i : i + 1024].to(dev)))
                    p = net(x).float().softmax(1).cpu().double()
                    total[i : i + 1024] += el2n_scores(p.unsqueeze(0), dataset.train_labels[i : i + 1024])
        accuracies = [r.test_accuracy for r in trained]
        return total / models, {"score_models_test_accuracy": sum(accuracies) / len(accuracies)}

    return _cached(dataset, "el2n", {**training_identity(dataset, model, recipe, dev), "seeds": seeds}, compute)


# --------------------------------------------------------------------------- the subsets


def herding_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None, device: str = "auto",
                   epochs: int = 1, normalize: bool = False, method: str = "herding") -> DistilledSet:
    """Herding per class in K-Center's embeddings (the feature ConvNet trained ``epochs``), each
    embedding scaled to unit L2 norm first where ``normalize`` (iCaRL)."""
    _check_ipc(dataset, ipc)
    feats, about = _embeddings(dataset, seed, model, device, epochs)
    if normalize:
        feats = F.normalize(feats.double(), dim=1)
    chosen = _per_class(dataset, lambda idx: herding_indices(feats[idx], ipc))
    provenance = {"seed": seed, "ipc": ipc, **about, "features_l2_normalised": normalize,
                  "selection": "herding: running mean nearest the class mean"}
    return subset_from_indices(dataset, chosen, method, provenance)


def herding_dc_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None, device: str = "auto",
                      epochs: int = HERDING_DC_EPOCHS) -> DistilledSet:
    """The herding baseline of DC's, DSA's and DM's tables, as iCaRL herds: the feature ConvNet
    trained to convergence, its embeddings L2-normalised."""
    return herding_subset(dataset, ipc, seed=seed, model=model, device=device, epochs=epochs, normalize=True,
                          method="herding_dc")


def _top_per_class(dataset: Dataset, scores: torch.Tensor, ipc: int, seed: int) -> torch.Tensor:
    gen = generator(seed)
    return _per_class(dataset, lambda idx: top_indices(scores[idx], ipc, gen))


def forgetting_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None, device: str = "auto",
                      epochs: int = 20) -> DistilledSet:
    """The ``ipc`` most-forgotten images per class over ``epochs`` of training the feature ConvNet."""
    _check_ipc(dataset, ipc)
    model = model or feature_model_name(dataset)
    counts, about = _forgetting_scores(dataset, seed, model, resolve_device(device), epochs)
    provenance = {"seed": seed, "ipc": ipc, "score_model": model, "score_epochs": epochs, **about,
                  "selection": "most forgetting events per class (Toneva et al.), ties by seed"}
    return subset_from_indices(dataset, _top_per_class(dataset, counts, ipc, seed), "forgetting", provenance)


def el2n_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None, device: str = "auto",
                epochs: int = 20, num_models: int = 10) -> DistilledSet:
    """The ``ipc`` highest-EL2N images per class, the score averaged over ``num_models`` networks at ``epochs``."""
    _check_ipc(dataset, ipc)
    if num_models < 1:
        raise ValueError(f"el2n: num_models must be at least 1, got {num_models}")
    model = model or feature_model_name(dataset)
    scores, about = _el2n_scores(dataset, seed, model, resolve_device(device), epochs, num_models)
    provenance = {"seed": seed, "ipc": ipc, "score_model": model, "score_epochs": epochs, "score_models": num_models,
                  **about, "selection": "highest EL2N per class (Paul et al.)"}
    return subset_from_indices(dataset, _top_per_class(dataset, scores, ipc, seed), "el2n", provenance)
