"""Distribution Matching (Zhao & Bilen, WACV 2023), the suite's reference distiller.

Per class, DM matches the mean embedding of real and synthetic images under a freshly
initialised ConvNet each iteration; the synthetic images are the only parameters. It is cheap
(no inner training loop), so the demo can score a real distilled set next to the baselines.
Differences from the paper's code, for speed on a CPU: DSA augmentation is not applied (it
arrives with the augmentation registry), and all classes share one forward pass (instance
norm is per-sample, so the embeddings are the same).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ddlib.data.datasets import Dataset
from ddlib.engine.device import generator, resolve_device
from ddlib.data.distilled import DistilledSet
from ddlib.models import create_model
from ddlib.methods.select import kcenter_subset, random_subset
from ddlib.engine.test_pass import Normalize, as_pixels

__all__ = ["distribution_matching"]

INITS = ("real", "kcenter", "noise")


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
    normalize = Normalize(dataset.mean, dataset.std).to(dev)
    g = generator(seed)
    if init == "real":
        start = random_subset(dataset, ipc, seed)
    elif init == "kcenter":
        start = kcenter_subset(dataset, ipc, seed, device=dev, epochs=init_epochs)
    else:
        start = random_subset(dataset, ipc, seed)
        start.images = torch.randn(start.images.shape, generator=g) * 0.2 + 0.5
    syn = normalize(start.images.to(dev)).detach().requires_grad_(True)
    optimizer = torch.optim.SGD([syn], lr=lr_img, momentum=momentum)

    real_images = dataset.train_images.to(dev)
    real_by_class = [torch.nonzero(dataset.train_labels == c).flatten() for c in range(dataset.num_classes)]
    syn_by_class = [torch.nonzero(start.labels == c).flatten().to(dev) for c in range(dataset.num_classes)]
    channels, height, width = dataset.image_shape
    losses = []
    for _ in tqdm(range(iterations), desc="DM", disable=not progress, leave=False):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
        net = create_model(model, channels, dataset.num_classes, (height, width)).to(dev).train()
        for p in net.parameters():
            p.requires_grad_(False)
        picks = [idx[torch.randperm(len(idx), generator=g)[:batch_real]] for idx in real_by_class]
        real_batch = normalize(as_pixels(real_images[torch.cat(picks).to(dev)]))
        with torch.no_grad():
            real_emb = net.embed(real_batch)
        syn_emb = net.embed(syn)
        loss = torch.zeros((), device=dev)
        offset = 0
        for c, pick in enumerate(picks):
            real_mean = real_emb[offset : offset + len(pick)].mean(0)
            offset += len(pick)
            loss = loss + ((real_mean - syn_emb[syn_by_class[c]].mean(0)) ** 2).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
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
        },
    )
