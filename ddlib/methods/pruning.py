"""Data-pruning baselines of the coreset literature at scale (issue 57.2): AUM and CCS, each a subset of
``ipc`` real training images per class, selected per class. Imports the coresets' score runs and caches.

* ``aum`` (area under the margin; Pleiss et al., NeurIPS 2020, "Identifying Mislabeled Data using the
  Area Under the Margin Ranking"): a dedicated run of the feature ConvNet (DC's recipe, fp32, ``epochs``
  20 by default, like ``forgetting``) records, at every presentation of every training image (its
  mini-batch's forward pass, before the step: Pleiss's ``AUMCalculator.update`` on the training logits),
  the margin ``M_t(x) = z_y(x) - max_{j != y} z_j(x)`` of the logits ``z`` and the assigned label ``y``;
  ``AUM(x)`` is its mean over the epochs. Low AUM is hard (a negative AUM: the network keeps preferring
  another class, Pleiss's sign of a mislabelled image). Per class the ``ipc`` lowest-AUM images are kept:
  the hardest, as ``forgetting`` and ``el2n`` keep the hardest (the pruning literature's direction,
  CCS's repository: AUM with ``--data-score-descending 0``); ties by a permutation drawn from ``seed``.
* ``ccs`` (coverage-centric coreset selection; Zheng et al., ICLR 2023, Algorithm 1): given a difficulty
  score (``score``: ``aum``, the paper's, by default; ``forgetting`` or ``el2n``), drop the hardest
  ``hard_cutoff`` (β) fraction, split the remaining scores' range into ``strata`` (k = 50) strata of equal
  width, and share the budget over them from the stratum with fewest images up, each taking
  ``min(|stratum|, floor(budget left / strata left))`` (:func:`ccs_budgets`), drawn uniformly at random
  inside the stratum (``seed``). Per class here: every class keeps ``ipc`` images (cutoff, strata and
  budget are the class's), where the paper selects over the whole training set. β = 0.3 by default: the
  paper's (and its README's) setting for CIFAR-10 at 90 % pruning, the highest rate it reports there;
  a set of a few images per class prunes far more.

Deviations, said where they matter: the networks are DC's ConvNet trained 20 epochs of DC's recipe (the
papers: ResNets, 200 epochs); AUM on logits as Pleiss defines it (CCS's scoring script accumulates the
margin of softmax probabilities, which ranks differently); the hard cutoff leaves at least ``ipc`` images
in a class; forgetting's never-learned images (infinitely hard) that survive the cutoff join the hardest
stratum; strata of equal size are served hardest-last (lower difficulty first, a stable sort: CCS's code
leaves that order to ``torch.argsort``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ddlib.data.datasets import Dataset
from ddlib.data.distilled import DistilledSet
from ddlib.engine.device import generator, resolve_device
from ddlib.methods.coresets import _cached, _el2n_scores, _forgetting_scores, _top_per_class, recorded_run
from ddlib.methods.select import (_check_ipc, _per_class, feature_model_name, feature_recipe, subset_from_indices,
                                  training_identity)

__all__ = ["margins", "aum_scores", "ccs_budgets", "ccs_indices", "aum_subset", "ccs_subset", "CCS_SCORES",
           "CCS_HARD_CUTOFF", "CCS_STRATA"]

CCS_SCORES = ("aum", "forgetting", "el2n")
CCS_HARD_CUTOFF = 0.3  # Zheng et al.: CIFAR-10 at 90 % pruning (their README's --mis-ratio 0.3)
CCS_STRATA = 50  # Zheng et al.: k = 50


# --------------------------------------------------------------------------- the rules (pure)


def margins(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Pleiss's margin of each row: the assigned label's logit minus the largest other logit."""
    assigned = logits.gather(1, labels.long().unsqueeze(1)).squeeze(1)
    others = logits.masked_fill(F.one_hot(labels.long(), logits.shape[1]).bool(), -math.inf)
    return assigned - others.max(1).values


def aum_scores(history: torch.Tensor) -> torch.Tensor:
    """AUM of each example from ``history`` (epochs x examples of margins): the mean over the epochs."""
    return history.double().mean(0)


def ccs_budgets(sizes: list[int], budget: int) -> list[int]:
    """CCS's allocation: strata visited from the smallest up (ties: the lower stratum first), each
    taking ``min(size, floor(budget left / strata left))``; returns each stratum's share, in stratum order."""
    shares = [0] * len(sizes)
    left = budget
    for visited, s in enumerate(sorted(range(len(sizes)), key=lambda i: sizes[i])):
        shares[s] = min(sizes[s], left // (len(sizes) - visited))
        left -= shares[s]
    return shares


def ccs_indices(difficulty: torch.Tensor, k: int, gen: torch.Generator, hard_cutoff: float = CCS_HARD_CUTOFF,
                strata: int = CCS_STRATA) -> torch.Tensor:
    """CCS in one class: ``k`` row indices of ``difficulty`` (higher: harder). The hardest
    ``floor(hard_cutoff x n)`` go first (ties by a permutation from ``gen``; at least ``k`` stay), the rest
    fall into ``strata`` equal-width strata of their range, shared by :func:`ccs_budgets`, drawn uniformly."""
    n = len(difficulty)
    perm = torch.randperm(n, generator=gen)
    hardest_first = perm[torch.sort(difficulty[perm], descending=True, stable=True).indices]
    kept = hardest_first[min(math.floor(hard_cutoff * n), max(0, n - k)):].sort().values
    values = difficulty[kept].double()
    finite = values[values.isfinite()]
    values = values.clamp(max=float(finite.max()) if len(finite) else 0.0).nan_to_num(0.0)  # inf: the hardest stratum
    low, width = float(values.min()), (float(values.max()) - float(values.min())) / strata
    stratum = ((values - low) / width).floor().long().clamp(0, strata - 1) if width > 0 else torch.zeros_like(kept)
    shares = ccs_budgets(torch.bincount(stratum, minlength=strata).tolist(), k)
    chosen = []
    for s, share in enumerate(shares):
        members = kept[stratum == s]
        chosen.append(members[torch.randperm(len(members), generator=gen)[:share]])
    return torch.cat(chosen)


# --------------------------------------------------------------------------- the score run (trained once, cached)


def _aum_scores(dataset: Dataset, seed: int, model: str, dev: torch.device, epochs: int):
    recipe = feature_recipe(epochs)

    def compute():
        history, trained = recorded_run(dataset, seed, model, dev, epochs, "cross_entropy+margins",
                                        lambda logits, labels: margins(logits.float(), labels), torch.float32)
        scores = aum_scores(history)
        return scores, {"score_model_test_accuracy": trained.test_accuracy, "negative_aum": int((scores < 0).sum())}

    return _cached(dataset, "aum", {**training_identity(dataset, model, recipe, dev), "seed": seed}, compute)


def difficulty_scores(dataset: Dataset, score: str, seed: int, model: str, dev: torch.device, epochs: int,
                      num_models: int) -> tuple[torch.Tensor, dict]:
    """Each training image's difficulty under ``score`` (higher: harder; AUM negated), cached per machine."""
    if score == "aum":
        aum, about = _aum_scores(dataset, seed, model, dev, epochs)
        return -aum, about
    if score == "forgetting":
        return _forgetting_scores(dataset, seed, model, dev, epochs)
    return _el2n_scores(dataset, seed, model, dev, epochs, num_models)


# --------------------------------------------------------------------------- the subsets


def aum_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None, device: str = "auto",
               epochs: int = 20) -> DistilledSet:
    """The ``ipc`` lowest-AUM (hardest) images per class over ``epochs`` of training the feature ConvNet."""
    _check_ipc(dataset, ipc)
    model = model or feature_model_name(dataset)
    difficulty, about = difficulty_scores(dataset, "aum", seed, model, resolve_device(device), epochs, 1)
    provenance = {"seed": seed, "ipc": ipc, "score_model": model, "score_epochs": epochs, **about,
                  "selection": "lowest AUM per class (Pleiss et al.), ties by seed"}
    return subset_from_indices(dataset, _top_per_class(dataset, difficulty, ipc, seed), "aum", provenance)


def ccs_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None, device: str = "auto",
               score: str = "aum", epochs: int = 20, num_models: int = 10, hard_cutoff: float = CCS_HARD_CUTOFF,
               strata: int = CCS_STRATA) -> DistilledSet:
    """Coverage-centric selection per class on ``score`` (its network(s) trained ``epochs``; ``num_models``
    for ``el2n`` only): the hardest ``hard_cutoff`` dropped, the rest sampled across ``strata`` strata."""
    _check_ipc(dataset, ipc)
    if score not in CCS_SCORES:
        raise ValueError(f"ccs: score must be one of {CCS_SCORES}, got {score!r}")
    if not 0 <= hard_cutoff < 1:
        raise ValueError(f"ccs: hard_cutoff must be in [0, 1), got {hard_cutoff!r}")
    if strata < 1 or num_models < 1:
        raise ValueError(f"ccs: strata and num_models must be at least 1, got {strata} and {num_models}")
    model = model or feature_model_name(dataset)
    difficulty, about = difficulty_scores(dataset, score, seed, model, resolve_device(device), epochs, num_models)
    gen = generator(seed)
    chosen = _per_class(dataset, lambda idx: ccs_indices(difficulty[idx], ipc, gen, hard_cutoff, strata))
    provenance = {"seed": seed, "ipc": ipc, "score": score, "score_model": model, "score_epochs": epochs,
                  **({"score_models": num_models} if score == "el2n" else {}), **about, "hard_cutoff": hard_cutoff,
                  "strata": strata, "selection": "coverage-centric (Zheng et al.): hardest cut, stratified per class"}
    return subset_from_indices(dataset, chosen, "ccs", provenance)
