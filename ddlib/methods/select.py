"""Selection baselines: a random subset and K-Center, returned as a :class:`DistilledSet`.

A distilled set only means something next to a subset of real images of the same size that is
evaluated the same way; these are those subsets.

K-Center (``kcenter``) is DC-Bench's (Cui et al., NeurIPS 2022 D&B, appendix A.1 and Algorithm 1;
its Table 9 calls it "Kmeans", its released sets "kmeans-emb"): a ConvNet is trained one epoch on
the real training set; per class, k-means with k = IPC (scikit-learn, k-means++ starts, up to 300
iterations) clusters the class's embeddings, and the real image nearest each centre is kept. It
picks typical images. DC-Bench did not release this code; what the paper leaves open is fixed
here and recorded in the set's provenance: the feature ConvNet (depth 3, depth 4 for images of
64 px and more, as DC-Bench's ConvNets follow the dataset) is trained with DC's recipe (SGD 0.01,
momentum 0.9, weight decay 5e-4, batch 256, no schedule); k-means runs ``n_init=10`` starts (the
scikit-learn default of DC-Bench's time, before 1.4); two centres nearest the same image take the
next-nearest unused one, so every class keeps IPC distinct images.

``kcenter_greedy`` is greedy farthest-point selection (Sener & Savarese, ICLR 2018) in the same
features: it starts near the class mean and then adds the point farthest from those chosen, so
it picks outliers (on digits at IPC 10 it scores below random). Kept for those who want it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ddlib.data.datasets import Dataset
from ddlib.engine.device import generator, resolve_device
from ddlib.data.distilled import DistilledSet
from ddlib.engine.test_pass import Normalize, as_pixels
from ddlib.engine.recipe import Recipe
from ddlib.engine.train import train_and_test
from ddlib.methods import cost

__all__ = ["random_subset", "baseline_subset", "BASELINE_STREAM", "kcenter_subset", "kcenter_greedy_subset",
           "subset_from_indices", "farthest_point_indices", "kmeans_nearest_indices", "feature_model_name", "KMEANS_MAX_ITER"]

KMEANS_MAX_ITER = 300  # DC-Bench: scikit-learn's KMeans, up to 300 iterations
KMEANS_N_INIT = 10


def subset_from_indices(dataset: Dataset, indices: torch.Tensor, method: str, provenance: dict) -> DistilledSet:
    """The training images at ``indices`` (sorted) as a set of hard labels, with where it came from."""
    indices = indices.sort().values
    return DistilledSet(
        images=as_pixels(dataset.train_images[indices]).clone(),  # the subset's pixels only (a streamed set: read)
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


# The spawn key of the random baselines' stream (numpy SeedSequence): see baseline_subset.
BASELINE_STREAM = 0xBA5E


def baseline_subset(dataset: Dataset, ipc: int, seed: int) -> DistilledSet:
    """The random baseline of evaluation seed ``seed`` (DD-Ranking's random subset): ``ipc`` real
    training images per class, drawn from a stream of its own, disjoint from every method's draws.

    Why its own stream: methods draw with torch's generator seeded by their ``seed`` (the ``random``
    method, DM's real-image start), and torch's CPU generator keeps only the low 32 bits of a seed, so
    no offset of the seed gives a different stream. Drawn with torch at the evaluation seed, the
    built-in ``random`` method (seed 0) was evaluation seed 0's baseline itself, and its seed-0 IOR
    was 0 by construction. The baselines draw instead from numpy's PCG64 under a SeedSequence with
    spawn key :data:`BASELINE_STREAM` (numpy's mechanism for independent streams), which no method
    uses: the same seed gives the same baseline in every cell and process, and a method's set is
    a baseline only by the chance of two independent uniform draws coinciding."""
    import numpy as np

    _check_ipc(dataset, ipc)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed), spawn_key=(BASELINE_STREAM,))))
    chosen = []
    for c in range(dataset.num_classes):
        idx = torch.nonzero(dataset.train_labels == c).flatten()
        chosen.append(idx[torch.from_numpy(rng.permutation(len(idx))[:ipc])])
    return subset_from_indices(dataset, torch.cat(chosen), "random",
                               {"seed": seed, "ipc": ipc, "stream": f"baseline (SeedSequence spawn key {BASELINE_STREAM:#x})"})


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


def kmeans_nearest_indices(features: torch.Tensor, k: int, seed: int = 0, n_init: int = KMEANS_N_INIT,
                           max_iter: int = KMEANS_MAX_ITER) -> torch.Tensor:
    """DC-Bench's K-Center in one class: k-means (scikit-learn, k-means++, ``random_state=seed``)
    with ``k`` clusters, then, per centre in cluster order, the nearest point not taken by an
    earlier centre. Returns ``k`` distinct row indices of ``features``."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    x = features.float().numpy()
    if k >= len(x):
        return torch.arange(len(x))[:k]
    # small problems run 10x faster on one thread (thread start-up dominates); large ones use all cores
    with threadpool_limits(1 if x.size * k < 50_000_000 else None):
        centres = KMeans(n_clusters=k, n_init=n_init, max_iter=max_iter, random_state=seed).fit(x).cluster_centers_
    dist = torch.cdist(torch.from_numpy(centres).double(), torch.from_numpy(x).double())
    chosen: list[int] = []
    taken: set[int] = set()
    for row in dist:
        nearest = next(i for i in row.argsort().tolist() if i not in taken)
        chosen.append(nearest)
        taken.add(nearest)
    return torch.tensor(chosen, dtype=torch.long)


def feature_model_name(dataset: Dataset) -> str:
    """The ConvNet DC-Bench would use for these images: depth 3, depth 4 from 64 px (Tiny ImageNet)."""
    return "convnet_d4" if min(dataset.image_size) >= 64 else "convnet"


def cache_path(dataset: Dataset, name: str, identity: dict) -> Path:
    """Where a result trained once per machine lives: ``$DDLIB_CACHE/features/<dataset>-<name>-<key>.pt``,
    the key a digest of ``identity`` (everything the result depends on)."""
    import hashlib
    import json

    from ddlib.data.datasets import cache_dir

    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "features" / f"{dataset.name}-{name}-{key}.pt"


def cache_store(path, payload: dict) -> None:
    """Save ``payload`` at ``path`` atomically: parallel workers never read half a file."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def training_identity(dataset: Dataset, model: str, recipe: Recipe, dev: torch.device) -> dict:
    """What a network trained on the whole training set depends on, besides its seed(s)."""
    from ddlib.data.digest import tensor_digest

    return {"data": tensor_digest(dataset.train_images, dataset.train_labels),
            "test": tensor_digest(dataset.test_images, dataset.test_labels),
            "model": model, "recipe": recipe.to_dict(), **kernel_identity(dev)}


def kernel_identity(dev: torch.device) -> dict:
    """What a cached result's bits depend on besides its inputs (a home folder may be shared by
    machines): :func:`ddlib.engine.device.machine_identity` (torch, CPU model and instruction set, GPUs,
    cuDNN), the device kind, on a GPU its model (a machine may hold two kinds) and, on the CPU, the
    thread count (CPU results are bit-identical only for one thread count); and the data's memory layout
    (row-major since :mod:`ddlib.data.layout`: results cached before it are not read); and the training
    engine's revision (:data:`ddlib.specs.keys.ENGINE_REVISION`: the networks and sets it makes change with it)."""
    from ddlib.engine.device import machine_identity
    from ddlib.specs.keys import ENGINE_REVISION

    return {**machine_identity(), "layout": "row-major", "engine": ENGINE_REVISION, "device": dev.type,
            **({"threads": torch.get_num_threads()} if dev.type == "cpu" else {}),
            **({"device_name": torch.cuda.get_device_name(dev)} if dev.type == "cuda" else {})}


def feature_recipe(epochs: int) -> Recipe:
    """DC's recipe (SGD 0.01, momentum 0.9, weight decay 5e-4, batch 256, no schedule) in fp32: the
    networks that select real images train with it."""
    return Recipe(epochs=epochs, batch_size=256, lr=0.01, scheduler="none", precision="fp32")


def _feature_network(dataset: Dataset, seed: int, model: str, dev: torch.device, epochs: int):
    """The trained feature ConvNet and its test accuracy, trained once per machine: its weights are
    cached under ``$DDLIB_CACHE/features`` by what they depend on (the training images and labels, the
    model, recipe, seed, torch's version), so the K-Center cells of a grid (and DM started from
    K-Center images) do not each train it again. Loading gives the very weights training gives."""
    from ddlib.models import create_model

    recipe = feature_recipe(epochs)
    identity = {**training_identity(dataset, model, recipe, dev), "seed": seed}
    path = cache_path(dataset, model, identity)
    if path.is_file():
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
            net = create_model(model, dataset.channels, dataset.num_classes, dataset.image_size).to(dev)
            net.load_state_dict(stored["state_dict"])
            cost.timed(stored)  # its training's seconds count toward the set's construction cost
            return net.eval(), {"accuracy": float(stored["test_accuracy"]), "precision": stored["precision"], "from": "cache"}
        except Exception:  # noqa: BLE001 - a damaged cache entry: train again
            pass
    with cost.watch() as took:
        (trained,) = train_and_test(
            model, dataset.train_images, dataset.train_labels, dataset.test_images, dataset.test_labels,
            num_classes=dataset.num_classes, mean=dataset.mean, std=dataset.std, recipe=recipe, seeds=[seed],
            device=dev, keep_models=True,
        )
    cache_store(path, {"state_dict": {k: v.detach().cpu() for k, v in trained.model.state_dict().items()},
                       "test_accuracy": trained.test_accuracy, "precision": trained.precision, "identity": identity,
                       **cost.stored(took)})
    return trained.model.eval(), {"accuracy": trained.test_accuracy, "precision": trained.precision, "from": "trained"}


def _embeddings(dataset: Dataset, seed: int, model: str | None, device, epochs: int) -> tuple[torch.Tensor, dict]:
    """Embeddings of every training image under a ConvNet trained ``epochs`` on the training set.
    In fp32 always: the set a method selects must not depend on whether the machine computes bf16."""
    dev = resolve_device(device)
    model = model or feature_model_name(dataset)
    net, trained = _feature_network(dataset, seed, model, dev, epochs)
    normalize = Normalize(dataset.mean, dataset.std).to(dev)
    with torch.inference_mode():
        feats = torch.cat([
            net.embed(normalize(as_pixels(dataset.train_images[i : i + 1024].to(dev)))).cpu()
            for i in range(0, len(dataset.train_labels), 1024)
        ])
    return feats, {"feature_model": model, "feature_epochs": epochs, "feature_precision": trained["precision"],
                   "feature_model_test_accuracy": trained["accuracy"], "feature_model_from": trained["from"]}


def _per_class(dataset: Dataset, pick) -> torch.Tensor:
    chosen = []
    for c in range(dataset.num_classes):
        idx = torch.nonzero(dataset.train_labels == c).flatten()
        chosen.append(idx[pick(idx)])
    return torch.cat(chosen)


def kcenter_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None, device: str = "auto",
                   epochs: int = 1, n_init: int = KMEANS_N_INIT) -> DistilledSet:
    """DC-Bench's K-Center: per class, the real images nearest the ``ipc`` k-means centres of the
    embeddings of a ConvNet trained ``epochs`` (1, as in DC-Bench) on the training set. ``model``:
    the feature network (default: :func:`feature_model_name`). The same seed gives the same images
    on the CPU."""
    _check_ipc(dataset, ipc)
    feats, about = _embeddings(dataset, seed, model, device, epochs)
    chosen = _per_class(dataset, lambda idx: kmeans_nearest_indices(feats[idx], ipc, seed=seed, n_init=n_init))
    provenance = {"seed": seed, "ipc": ipc, **about, "selection": "k-means centres' nearest images (DC-Bench)",
                  "kmeans_n_init": n_init, "kmeans_max_iter": KMEANS_MAX_ITER}
    return subset_from_indices(dataset, chosen, "kcenter", provenance)


def kcenter_greedy_subset(dataset: Dataset, ipc: int, seed: int = 0, model: str | None = None,
                          device: str = "auto", epochs: int = 1) -> DistilledSet:
    """Greedy farthest-point K-Center per class in the same features as :func:`kcenter_subset`."""
    _check_ipc(dataset, ipc)
    feats, about = _embeddings(dataset, seed, model, device, epochs)
    chosen = _per_class(dataset, lambda idx: farthest_point_indices(feats[idx], ipc))
    provenance = {"seed": seed, "ipc": ipc, **about, "selection": "greedy farthest point (Sener & Savarese)"}
    return subset_from_indices(dataset, chosen, "kcenter_greedy", provenance)
