"""Distribution Matching (Zhao & Bilen, WACV 2023), the suite's reference distiller.

Per class, DM matches the mean embedding of real and synthetic images under a freshly
initialised ConvNet each iteration; the synthetic images are the only parameters. It is cheap
(no inner training loop), so the demo can score a real distilled set next to the baselines.
Differences from the paper's code, for speed on a CPU: DSA augmentation is not applied (it
arrives with the augmentation registry), and all classes share one forward pass (instance
norm is per-sample, so the embeddings are the same).

The real side of an iteration (its fresh network's seed and its real batch) depends on the seed,
not on the synthetic images, so its class means are cached per machine under
``$DDLIB_CACHE/features`` (keyed by the data, network, real batch, iterations, the generator's
state, the ``dm`` revision, torch's version, the CPU model and instruction set, GPUs, device and thread count): DM from real
and from K-Center images or noise, or at another IPC, with the same seed reuses them, bit for bit (the
demo's six DM cells embed the real batches once). Noise starts draw their noise from a generator of
their own (seed + :data:`NOISE_SEED_OFFSET`), so their real side is DM's (before revision 2 of the
``dm`` source they drew it from the real side's generator first: every IPC had other real batches, and
the real embeddings were computed again). Networks with dropout (whose real pass draws from the global
generator) are never cached, and neither are means over 64 MB (CIFAR-10 at 20,000 iterations: 1.6 GB).

The distilled set itself is cached the same way (``dm-set-ipc<N>``, keyed by the data, every option, the
``dm`` and ``kcenter`` revisions and the machine): a second cell, protocol or ``--force`` rerun asking for
the same DM set on the same machine reads it instead of distilling again (20,000 iterations on CIFAR-10
are GPU-hours), bit for bit the set distilling gives; its provenance says ``from: cache``. Not for
networks with dropout (above): skipping their distillation would leave the global generator elsewhere.
"""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from ddlib.data.datasets import Dataset
from ddlib.engine.device import generator, resolve_device
from ddlib.engine.stacked import stochastic_layers
from ddlib.data.distilled import DistilledSet
from ddlib.data.device_copies import on_device
from ddlib.data.layout import standard_layout
from ddlib.models import create_model
from ddlib.methods import cost
from ddlib.methods.revisions import SET_REVISIONS
from ddlib.methods.select import cache_path, cache_store, kcenter_subset, kernel_identity, random_subset
from ddlib.engine.test_pass import Normalize, as_pixels

__all__ = ["distribution_matching"]

INITS = ("real", "kcenter", "noise")
NOISE_SEED_OFFSET = 2_000_003  # a noise start of seed s draws its images from a generator seeded with s + this


def distribution_matching(
    dataset: Dataset,
    ipc: int,
    *,
    iterations: int = 200,
    lr_img: float = 1.0,
    momentum: float = 0.5,
    batch_real: int = 64,
    model: str = "convnet",
    init: str = "real",
    init_epochs: int = 1,
    seed: int = 0,
    device: str = "auto",
    progress: bool = False,
) -> DistilledSet:
    """Distil ``ipc`` images per class with DM. ``init``: random real images (the paper),
    K-Center images (DC-Bench's: nearest the k-means centres in the features of a ConvNet trained
    ``init_epochs`` on the real data, :func:`ddlib.methods.select.kcenter_subset`), or Gaussian noise: DC-Bench's
    combination of selection and synthesis. The same seed gives the same images on the CPU."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    dev = resolve_device(device)
    options = {"ipc": ipc, "iterations": iterations, "lr_img": lr_img, "momentum": momentum, "batch_real": batch_real,
               "model": model, "init": init, "init_epochs": init_epochs, "seed": seed}
    # the caches' common key (None: a network with dropout, never cached: module docstring)
    identity = None if _draws_in_forward(model, dataset) else _identity(dataset, dev)
    path = _set_path(dataset, options, identity) if identity is not None else None
    if path is not None and (stored := _load_set(path, dataset, ipc)) is not None:
        if init != "noise" and "init_indices" not in stored.provenance:  # cached before the start was recorded
            stored.provenance["init_indices"] = _start(dataset, ipc, init, seed, dev, init_epochs).provenance["indices"]
        return stored
    with cost.watch() as took:
        out = _distil(dataset, dev, identity, **options, progress=progress)
    if path is not None:
        cache_store(path, {"images": out.images, "labels": out.labels, "provenance": dict(out.provenance),
                           **cost.stored(took)})
    out.provenance["from"] = "distilled"
    return out


def _distil(dataset: Dataset, dev: torch.device, identity: dict | None, *, ipc: int, iterations: int, lr_img: float,
            momentum: float, batch_real: int, model: str, init: str, init_epochs: int, seed: int,
            progress: bool) -> DistilledSet:
    normalize = Normalize(dataset.mean, dataset.std).to(dev)
    g = generator(seed)
    start = _start(dataset, ipc, init, seed, dev, init_epochs)
    syn = normalize(standard_layout(start.images).to(dev)).detach().requires_grad_(True)  # ddlib.data.layout
    optimizer = torch.optim.SGD([syn], lr=lr_img, momentum=momentum)

    real_images = on_device(dataset.train_images, dev)  # row-major, as every Dataset holds them; kept on the device
    real_by_class = [torch.nonzero(dataset.train_labels == c).flatten() for c in range(dataset.num_classes)]
    syn_by_class = [torch.nonzero(start.labels == c).flatten().to(dev) for c in range(dataset.num_classes)]
    channels, height, width = dataset.image_shape
    # the real batches' class means, cached per seed (module docstring); never for a network with dropout
    cache = _real_means_path(dataset, identity, model, iterations, batch_real, g) if identity is not None else None
    cached = _load_real_means(cache, iterations, dataset.num_classes, dev) if cache is not None else None
    computed: list[torch.Tensor] | None = [] if cache is not None and cached is None else None  # on the device: no sync per step
    losses, real_seconds = [], 0.0  # the real side's time, kept with its means (CPU only: CUDA queues kernels)
    for it in tqdm(range(iterations), desc="DM", disable=not progress, leave=False):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
        net = create_model(model, channels, dataset.num_classes, (height, width)).to(dev).train()
        for p in net.parameters():
            p.requires_grad_(False)
        picks = [idx[torch.randperm(len(idx), generator=g)[:batch_real]] for idx in real_by_class]
        if cached is not None:
            real_means = cached[it]
        else:
            started = time.perf_counter()
            real_batch = normalize(as_pixels(real_images[torch.cat(picks).to(dev)]))
            with torch.no_grad():
                real_emb = net.embed(real_batch)
            real_means = torch.stack([chunk.mean(0) for chunk in real_emb.split([len(pick) for pick in picks])])
            real_seconds += time.perf_counter() - started
            if computed is not None:
                computed.append(real_means)
                if real_means.numel() * real_means.element_size() * iterations > REAL_MEANS_MAX_BYTES:
                    computed = None  # too large to keep (CIFAR-10 at 20,000 iterations: 1.6 GB)
        syn_emb = net.embed(syn)
        loss = torch.zeros((), device=dev)
        for c in range(dataset.num_classes):
            loss = loss + ((real_means[c] - syn_emb[syn_by_class[c]].mean(0)) ** 2).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    if computed:
        cache_store(cache, {"means": torch.stack(computed).cpu(), "seconds": real_seconds if dev.type == "cpu" else None})
    mean, std = normalize.mean, normalize.std
    pixels = (syn.detach() * std + mean).cpu()
    return DistilledSet(
        images=pixels,
        labels=start.labels.clone(),
        num_classes=dataset.num_classes,
        method="dm",
        source=f"ddlib.methods.dm.distribution_matching on {dataset.name}",
        provenance={
            "ipc": ipc, "iterations": iterations, "lr_img": lr_img, "momentum": momentum, "batch_real": batch_real,
            "model": model, "init": init, "init_epochs": init_epochs, "seed": seed,
            "final_loss": float(torch.stack(losses)[-1]) if losses else None,
            # the training images the set started from (its members: ddlib.protocols.membership); none from noise
            **({"init_indices": start.provenance["indices"]} if init != "noise" else {}),
        },
    )


def _start(dataset: Dataset, ipc: int, init: str, seed: int, dev: torch.device, init_epochs: int):
    """The images DM starts from (``init``); a noise start keeps the random draw's labels only."""
    if init == "real":
        return random_subset(dataset, ipc, seed)
    if init == "kcenter":
        return kcenter_subset(dataset, ipc, seed, device=dev, epochs=init_epochs)
    start = random_subset(dataset, ipc, seed)
    start.images = torch.randn(start.images.shape, generator=generator(seed + NOISE_SEED_OFFSET)) * 0.2 + 0.5
    return start


REAL_MEANS_MAX_BYTES = 64 * 2**20  # larger runs compute them every time instead of holding them


def _identity(dataset: Dataset, dev: torch.device) -> dict:
    """What every cached result of DM depends on besides its options: the data (its digest, computed
    once per call), the normalisation, the ``dm`` revision (results of older code are never read) and
    the machine (:func:`ddlib.methods.select.kernel_identity`)."""
    from ddlib.data.digest import tensor_digest

    return {"data": tensor_digest(dataset.train_images, dataset.train_labels), "mean": list(map(float, dataset.mean)),
            "std": list(map(float, dataset.std)), **kernel_identity(dev), "revision": SET_REVISIONS.get("dm", 1)}


def _set_path(dataset: Dataset, options: dict, identity: dict):
    """Where a distilled set lives once made: keyed by :func:`_identity`, every option and the
    ``kcenter`` revision (a K-Center start runs it), so that only a run that would make the very same
    bits reads it."""
    return cache_path(dataset, f"dm-set-ipc{options['ipc']}",
                      {**identity, **options, "kcenter_revision": SET_REVISIONS.get("kcenter", 1)})


def _load_set(path, dataset: Dataset, ipc: int) -> DistilledSet | None:
    if not path.is_file():
        return None
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
        images, labels, provenance = stored["images"], stored["labels"], dict(stored["provenance"])
    except Exception:  # noqa: BLE001 - a damaged cache entry: distil again
        return None
    if len(labels) != ipc * dataset.num_classes or images.shape[1:] != dataset.train_images.shape[1:]:
        return None
    cost.timed(stored)  # its distillation's seconds count toward the set's construction cost
    return DistilledSet(images=images, labels=labels, num_classes=dataset.num_classes, method="dm",
                        source=f"ddlib.methods.dm.distribution_matching on {dataset.name}",
                        provenance={**provenance, "from": "cache"})


def _draws_in_forward(model: str, dataset: Dataset) -> bool:
    """Whether the network's forward pass in train mode draws random numbers (dropout, drop path)."""
    return bool(stochastic_layers(create_model(model, dataset.channels, dataset.num_classes, dataset.image_size)))


def _real_means_path(dataset: Dataset, identity: dict, model: str, iterations: int, batch_real: int,
                     g: torch.Generator):
    """Where the real class means of a DM run live: keyed by :func:`_identity`, the network, the real
    batch, the iterations and the generator's state at the loop's start (which fixes every iteration's
    network seed and real batch)."""
    import hashlib

    return cache_path(dataset, "dm-real-means", {**identity, "model": model, "iterations": iterations,
                                                 "batch_real": batch_real,
                                                 "generator": hashlib.sha256(g.get_state().numpy().tobytes()).hexdigest()})


def _load_real_means(path, iterations: int, classes: int, dev: torch.device) -> torch.Tensor | None:
    if not path.is_file():
        return None
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
        means = stored["means"]
    except Exception:  # noqa: BLE001 - a damaged cache entry: compute again
        return None
    if means.shape[:2] != (iterations, classes):
        return None
    cost.timed(stored)  # the real side's seconds (None where not measured) count toward the set's cost
    return means.to(dev)
