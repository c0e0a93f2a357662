"""Selection baselines: a random subset and K-Center, both returned as a :class:`DistilledSet`.

A distilled set only means something next to a subset of real images of the same size that is
evaluated the same way; these are those subsets.
"""

from __future__ import annotations

import torch

from ddlib.data.datasets import Dataset
from ddlib.engine.device import generator, resolve_device
from ddlib.data.distilled import DistilledSet
from ddlib.engine.train import Normalize, Recipe, as_pixels, train_and_evaluate

__all__ = ["random_subset", "kcenter_subset", "subset_from_indices", "farthest_point_indices"]


def subset_from_indices(dataset: Dataset, indices: torch.Tensor, method: str, provenance: dict) -> DistilledSet:
    indices = indices.sort().values
    return DistilledSet(
        images=dataset.pixels("train")[indices].clone(),
        labels=dataset.train_labels[indices].clone(),
        num_classes=dataset.num_classes,
        method=method,
        source=f"{method} subset of {dataset.name}",
        provenance={**provenance, "indices": indices.tolist()},
    )


def _check_ipc(dataset: Dataset, ipc: int) -> None:
    counts = torch.bincount(dataset.train_labels, minlength=dataset.num_classes)
    if ipc < 1 or ipc > int(counts.min()):
        raise ValueError(f"ipc must be in [1, {int(counts.min())}] for {dataset.name}, got {ipc}")


def random_subset(dataset: Dataset, ipc: int, seed: int = 0) -> DistilledSet:
    """``ipc`` real training images per class, drawn uniformly; the same seed gives the same images."""
    _check_ipc(dataset, ipc)
    g = generator(seed)
    chosen = []
    for c in range(dataset.num_classes):
        idx = torch.nonzero(dataset.train_labels == c).flatten()
        chosen.append(idx[torch.randperm(len(idx), generator=g)[:ipc]])
    return subset_from_indices(dataset, torch.cat(chosen), "random", {"seed": seed, "ipc": ipc})


def farthest_point_indices(features: torch.Tensor, k: int) -> torch.Tensor:
    """Greedy K-Center: start at the point nearest the mean, then repeatedly add the point
    farthest from all chosen centres (Sener & Savarese 2018)."""
    first = torch.cdist(features.mean(0, keepdim=True), features).argmin()
    chosen = [int(first)]
    min_dist = torch.cdist(features[first : first + 1], features).squeeze(0)
    for _ in range(1, k):
        nxt = int(min_dist.argmax())
        chosen.append(nxt)
        min_dist = torch.minimum(min_dist, torch.cdist(features[nxt : nxt + 1], features).squeeze(0))
    return torch.tensor(chosen, dtype=torch.long)


def kcenter_subset(
    dataset: Dataset, ipc: int, seed: int = 0, model: str = "convnet", device: str = "auto", epochs: int = 1
) -> DistilledSet:
    """K-Center per class in the feature space of a ConvNet trained ``epochs`` (1, as in DC-Bench)
    on the full training set."""
    _check_ipc(dataset, ipc)
    dev = resolve_device(device)
    recipe = Recipe(epochs=epochs, batch_size=256, lr=0.01, scheduler="none")
    (trained,) = train_and_evaluate(
        model, dataset.train_images, dataset.train_labels, dataset.test_images, dataset.test_labels,
        num_classes=dataset.num_classes, mean=dataset.mean, std=dataset.std, recipe=recipe, seeds=[seed],
        device=dev, keep_models=True,
    )
    net = trained.model.eval()
    normalize = Normalize(dataset.mean, dataset.std).to(dev)
    with torch.inference_mode():
        feats = torch.cat([
            net.embed(normalize(as_pixels(dataset.train_images[i : i + 1024].to(dev)))).cpu()
            for i in range(0, len(dataset.train_labels), 1024)
        ])
    chosen = []
    for c in range(dataset.num_classes):
        idx = torch.nonzero(dataset.train_labels == c).flatten()
        chosen.append(idx[farthest_point_indices(feats[idx], ipc)])
    provenance = {"seed": seed, "ipc": ipc, "feature_model": model, "feature_epochs": epochs,
                  "feature_model_test_accuracy": trained.test_accuracy}
    return subset_from_indices(dataset, torch.cat(chosen), "kcenter", provenance)
