#!/usr/bin/env python
"""The leakage check's near-duplicate threshold on real data (``ddlib.data.overlap``), and its speed.

For each dataset (CIFAR-10 (JPEG) and MNIST from ``../shared/data``, digits built in):

* **same image** (should match): 1,000 test images re-encoded as JPEG at quality 75 and 30, with
  Gaussian pixel noise of std 0.02 and 0.05, a brightness shift of +0.05 and a contrast of 0.9; the
  share whose distance to its original is under the threshold, and the 99.9 % quantile of the distance;
* **distinct images** (should not): how many test images have *another* test image, and how many
  a training image, within the threshold (label agreement of the train matches, and for CIFAR-10
  every match is written to ``bench/results/leakage_pairs_<dataset>.png`` to look at: on CIFAR-10
  (JPEG) they are the same photo, the dataset's own duplicates);
* the distance from each image of a DC-distilled set (``distilled/``) to its nearest test image;
* timings of :func:`~ddlib.data.overlap.find_overlap`: 10 and 500 images against the 10,000 test
  images (with the training split's digests), on this CPU.

Writes ``bench/results/leakage_threshold.json`` and prints a summary. Not part of the test suite.

    .venv/bin/python bench/leakage_threshold.py            # ~1-2 min on 2 cores
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import machine_info  # noqa: E402
from ddlib.data.overlap import NEAR_THRESHOLD, digests, find_overlap, fingerprints, nearest  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "bench" / "results"


def jpeg(images: torch.Tensor, quality: int) -> torch.Tensor:
    from PIL import Image

    out = []
    for img in images:
        array = img.permute(1, 2, 0).numpy()
        buffer = io.BytesIO()
        Image.fromarray(array[..., 0] if array.shape[2] == 1 else array).save(buffer, "JPEG", quality=quality)
        back = torch.from_numpy(np.array(Image.open(buffer)))
        out.append(back[None] if back.ndim == 2 else back.permute(2, 0, 1))
    return torch.stack(out)


def datasets() -> dict:
    from ddlib.data.datasets import load_dataset
    from ddlib.data.overlap import quantize

    out = {}
    digits = load_dataset("digits")
    out["digits"] = (quantize(digits.train_images), digits.train_labels, quantize(digits.test_images), digits.test_labels)
    if (SHARED / "mnist.npz").is_file():
        z = np.load(SHARED / "mnist.npz")
        out["mnist"] = (torch.from_numpy(z["x_train"])[:, None], torch.from_numpy(z["y_train"]),
                        torch.from_numpy(z["x_test"])[:, None], torch.from_numpy(z["y_test"]))
    if (SHARED / "cifar10-jpeg.tar.gz").is_file():
        from ddlib.data.loaders import extract_archive
        from ddlib.data.datasets import cache_dir

        root = extract_archive(SHARED / "cifar10-jpeg.tar.gz", cache_dir() / "cifar10-jpeg")
        ds = load_dataset("cifar10", root)
        out["cifar10"] = (ds.train_images, ds.train_labels, ds.test_images, ds.test_labels)
    return out


def distilled_sets() -> dict:
    found = {}
    for name, file, mean, std in (("cifar10", "dc_cifar10_convnet_ipc10.pt", (0.4914, 0.4822, 0.4465),
                                   (0.2023, 0.1994, 0.2010)),
                                  ("mnist", "dc_mnist_convnet_ipc1.pt", (0.1307,), (0.3081,))):
        path = SHARED / "distilled" / file
        if path.is_file():
            images = torch.load(path, weights_only=False)["data"][-1][0]  # a trusted file of the shared data
            found[name] = (file, images * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1))
    return found


def self_nearest(fp: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """Each fingerprint's distance to its nearest *other* fingerprint of the same split."""
    out = []
    norms = (fp * fp).sum(1)
    for start in range(0, len(fp), chunk):
        q = fp[start:start + chunk]
        d2 = (q * q).sum(1, keepdim=True) + norms[None] - 2 * q @ fp.T
        d2[torch.arange(len(q)), torch.arange(start, start + len(q))] = float("inf")
        out.append(d2.min(1).values.clamp_min(0).sqrt())
    return torch.cat(out)


def measure(name: str, data: tuple, dc: dict, seed: int = 0) -> dict:
    train, train_labels, test, test_labels = data
    g = torch.Generator().manual_seed(seed)
    sample = test[torch.randperm(len(test), generator=g)[:1000]]
    pixels = sample.float() / 255
    variants = {"jpeg75": jpeg(sample, 75), "jpeg30": jpeg(sample, 30),
                "noise0.02": (pixels + 0.02 * torch.randn(pixels.shape, generator=g)).clamp(0, 1),
                "noise0.05": (pixels + 0.05 * torch.randn(pixels.shape, generator=g)).clamp(0, 1),
                "brightness+0.05": (pixels + 0.05).clamp(0, 1), "contrast0.9": pixels * 0.9 + 0.05}
    own = fingerprints(sample)
    same = {}
    for key, images in variants.items():
        d = (fingerprints(images) - own).norm(dim=1)
        same[key] = {"matched": round(float((d < NEAR_THRESHOLD).float().mean()), 4),
                     "q999": round(float(torch.quantile(d, 0.999)), 4)}
    test_fp, train_fp = fingerprints(test), fingerprints(train)
    within_test = self_nearest(test_fp)
    to_train, index = nearest(test_fp, train_fp)
    hit = to_train < NEAR_THRESHOLD
    agree = train_labels[index] == test_labels
    result = {"test_images": len(test), "train_images": len(train), "same_image": same,
              "test_with_another_test_image": int((within_test < NEAR_THRESHOLD).sum()),
              "test_with_a_train_image": int(hit.sum()), "of_which_same_label": int((hit & agree).sum()),
              "test_labels_of_train_matches": torch.bincount(test_labels[hit], minlength=10).tolist()}
    if name in dc:
        file, images = dc[name]
        d, _ = nearest(fingerprints(images), test_fp)
        result["distilled"] = {"file": file, "images": len(images), "min_distance_to_test": round(float(d.min()), 4)}
    if name == "cifar10" and hit.any():
        from torchvision.utils import save_image

        pairs = torch.stack([torch.stack([test[i], train[index[i]]]) for i in hit.nonzero().flatten()]).flatten(0, 1)
        RESULTS.mkdir(parents=True, exist_ok=True)
        save_image(pairs.float() / 255, RESULTS / f"leakage_pairs_{name}.png", nrow=8, padding=2)
    return result


def timings(data: tuple, repeats: int = 3) -> dict:
    train, _, test, _ = data
    g = torch.Generator().manual_seed(1)
    known = set(digests(train))
    cases = {"10_vs_test": train[torch.randperm(len(train), generator=g)[:10]].float() / 255 + 1e-3,
             "500_vs_test": train[torch.randperm(len(train), generator=g)[:500]].float() / 255 + 1e-3}
    out = {}
    for key, images in cases.items():
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            find_overlap(images, test, "test", known)
            seconds.append(time.perf_counter() - started)
        out[key] = round(min(seconds), 3)
    started = time.perf_counter()
    digests(train)
    out["digests_of_the_training_split"] = round(time.perf_counter() - started, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    record = {"machine": machine_info(), "threshold": NEAR_THRESHOLD, "datasets": {}}
    found, dc = datasets(), distilled_sets()
    for name, data in found.items():
        record["datasets"][name] = measure(name, data, dc)
        record["datasets"][name]["timings_s"] = timings(data)
        print(name, json.dumps(record["datasets"][name]))
    record["machine"]["load_average_end"] = [round(v, 2) for v in __import__("os").getloadavg()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "leakage_threshold.json").write_text(json.dumps(record, indent=2))
    print(f"cpu: {record['machine']['cpu_model']} ({record['machine']['cpu_family_model']}), "
          f"{record['machine']['threads']} threads, load {record['machine']['load_average_start']}")


if __name__ == "__main__":
    main()
