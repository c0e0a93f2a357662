"""Test-set leakage: which images of a set are images of a held-out split (test, validation).

Two checks, both on pixels in [0, 1] (or uint8), whatever the set's format:

* **exact**: the image quantised to uint8 (``round(255 x)``, clamped to [0, 1]) is byte-identical to a
  split image of the same shape (a digest of the bytes; a float round trip through a normalised
  file quantises back to the same bytes).
* **near**: the distance between *fingerprints* is under :data:`NEAR_THRESHOLD`. A fingerprint is the
  image as a 12 x 12 grayscale thumbnail (ITU-R 601 luma, area-averaged: ``adaptive_avg_pool2d``),
  minus its mean, divided by its RMS contrast (at least :data:`CONTRAST_FLOOR`, so that flat images
  are compared by their absolute differences instead of their amplified noise); the distance is the
  RMS of the difference of two fingerprints (0: the same picture; about 1.4: unrelated pictures of
  normal contrast). It ignores brightness and contrast changes, JPEG re-encoding and pixel noise; it
  does not catch flips, crops or shifts of more than a pixel (a learned feature space would, at the
  price of a model and its own false matches).

The threshold, measured on CIFAR-10 (JPEG) (``bench/leakage_threshold.py`` regenerates the numbers):
re-encodings at JPEG quality 30, Gaussian pixel noise of std 0.05, a brightness shift of 0.05 and a
contrast of 0.9 of 1,000 test images all match (99.9 % quantile of their distance 0.11 or less); 4
test images match another test image and 16 a training image, and every one of these 20 pairs is the
same photo (CIFAR-10's own duplicates, as Barz & Denzler, "Do we train on test data?", 2020, found).
Simple glyphs match across writers: 3.2 % of MNIST's test images (all of them ones) have a distinct
training image within the threshold; on the 8 x 8 digits none.

A set image that is itself an image of the training split (``training``) is the data a set may use:
its exact matches in a split are the dataset's own duplicates (counted, never leakage), and it is not
searched for near-duplicates.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["THUMBNAIL", "CONTRAST_FLOOR", "NEAR_THRESHOLD", "MEASURE", "Match", "Overlap", "quantize", "digests",
           "fingerprints", "nearest", "find_overlap"]

THUMBNAIL = 12  # side of the grayscale thumbnail a fingerprint is made of
CONTRAST_FLOOR = 0.1  # the smallest RMS contrast a thumbnail is divided by (pixels in [0, 1])
NEAR_THRESHOLD = 0.12  # a distance under it is a near-duplicate (see the module docstring)
MEASURE = (f"exact: uint8 pixels byte-identical; near: RMS distance < {NEAR_THRESHOLD} of {THUMBNAIL}x{THUMBNAIL} "
           f"grayscale thumbnails, mean removed, divided by max(RMS contrast, {CONTRAST_FLOOR})")
_LUMA = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class Match:
    """A set image (``index``) and its nearest split image (``split_index``): an exact copy, a
    near-duplicate (``distance`` < the threshold), or, with ``training``, the dataset's own duplicate."""

    index: int
    split_index: int
    distance: float
    exact: bool
    training: bool = False


@dataclass(frozen=True)
class Overlap:
    """The matches of a set's images in one split (``split``: ``test``, ``val``; ``size``: its images)."""

    split: str
    size: int
    set_size: int
    matches: tuple[Match, ...]
    threshold: float = NEAR_THRESHOLD

    @property
    def exact(self) -> list[Match]:
        """Set images identical to a split image (the dataset's own duplicates left out)."""
        return [m for m in self.matches if m.exact and not m.training]

    @property
    def near(self) -> list[Match]:
        """Set images within the threshold of a split image but not identical (the dataset's own duplicates left out)."""
        return [m for m in self.matches if not m.exact and not m.training]

    @property
    def leaked(self) -> list[Match]:
        """The set's images that are split images (exact or near), the dataset's duplicates left out."""
        return [m for m in self.matches if not m.training]

    @property
    def dataset(self) -> list[Match]:
        """Training images of the set that are also split images: the dataset's own duplicates."""
        return [m for m in self.matches if m.training]

    def summary(self, split_name: str | None = None) -> str:
        """One line: ``2 of 10 images are test images (2 exact, 0 near-duplicates)``; empty when none."""
        if not self.leaked:
            return ""
        name = split_name or self.split
        return (f"{len(self.leaked)} of {self.set_size} images are {name} images ({len(self.exact)} exact, "
                f"{len(self.near)} near-duplicate{'s' if len(self.near) != 1 else ''})")

    def pairs(self, limit: int = 8) -> str:
        """``set 3 = test 117, set 5 ~ test 2034 (0.04)``: the first ``limit`` leaked pairs."""
        shown = [f"set {m.index} {'=' if m.exact else '~'} {self.split} {m.split_index}"
                 + ("" if m.exact else f" ({m.distance:.2f})") for m in self.leaked[:limit]]
        more = len(self.leaked) - limit
        return ", ".join(shown) + (f", and {more} more" if more > 0 else "")


def quantize(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels on the CPU: uint8 as it is, float pixels clamped to [0, 1] and rounded to 1/255."""
    images = images.detach().cpu()
    if images.dtype == torch.uint8:
        return images
    return (images.float().clamp(0, 1) * 255).round().to(torch.uint8)


def _chunks(images, chunk: int):
    """``images`` ``chunk`` at a time, each a tensor: a streamed set (``FileImages``) is decoded a
    chunk at a time, never whole."""
    chunk = min(chunk, getattr(images, "decode_limit", chunk))
    for start in range(0, len(images), chunk):
        yield images[start:start + chunk]


def digests(images: torch.Tensor, chunk: int = 8192) -> list[bytes]:
    """A 16-byte digest of each image's uint8 pixels and shape (:func:`quantize`)."""
    out = []
    for part in _chunks(images, chunk):
        pixels = quantize(part).contiguous()
        shape = str(tuple(pixels.shape[1:])).encode()
        flat = pixels.reshape(len(pixels), -1).numpy()
        out += [hashlib.blake2b(shape + row.tobytes(), digest_size=16).digest() for row in flat]
    return out


def fingerprints(images: torch.Tensor, device: torch.device | str | None = None, chunk: int = 8192) -> torch.Tensor:
    """N x THUMBNAIL² float32 fingerprints (see the module docstring), on ``device``."""
    device = torch.device(device) if device is not None else images.device
    out = []
    for x in _chunks(images, chunk):
        x = x.to(device)
        x = x.float() / 255 if x.dtype == torch.uint8 else x.float().clamp(0, 1)
        x = F.adaptive_avg_pool2d(x, THUMBNAIL)  # before the luma: both are linear, the thumbnail is smaller
        if x.shape[1] == 3:
            x = (x * torch.tensor(_LUMA, device=device).view(1, 3, 1, 1)).sum(1)
        x = x.mean(1) if x.dim() == 4 else x
        x = x.flatten(1)
        x = x - x.mean(1, keepdim=True)
        scale = x.shape[1] ** 0.5
        contrast = x.norm(dim=1, keepdim=True) / scale
        out.append(x / contrast.clamp_min(CONTRAST_FLOOR) / scale)  # / scale: distances are RMS differences
    return torch.cat(out) if out else torch.zeros(0, THUMBNAIL * THUMBNAIL, device=device)


def nearest(queries: torch.Tensor, keys: torch.Tensor, budget: int = 2 ** 24) -> tuple[torch.Tensor, torch.Tensor]:
    """For each fingerprint of ``queries``, the distance to its nearest of ``keys`` and that key's
    index; in chunks of at most ``budget`` distances, on the fingerprints' device."""
    if len(keys) == 0 or len(queries) == 0:
        return torch.full((len(queries),), float("inf")), torch.full((len(queries),), -1, dtype=torch.long)
    key_norms = (keys * keys).sum(1)
    step = max(1, budget // len(keys))
    distances, indices = [], []
    for start in range(0, len(queries), step):
        q = queries[start:start + step]
        d2 = (q * q).sum(1, keepdim=True) + key_norms[None] - 2 * q @ keys.T
        value, index = d2.min(1)
        distances.append(value.clamp_min(0).sqrt().cpu())
        indices.append(index.cpu())
    return torch.cat(distances), torch.cat(indices)


def find_overlap(images: torch.Tensor, split_images: torch.Tensor, split: str = "test",
                 training: torch.Tensor | set[bytes] | None = None, threshold: float = NEAR_THRESHOLD,
                 device: torch.device | str | None = None) -> Overlap:
    """The set images (N x C x H x W pixels) that are images of ``split_images``: exact copies and
    near-duplicates, each with its nearest split image. ``training``: the training split's images (or
    their :func:`digests`); set images among them are the data a set may use (see the module docstring).
    ``device``: where the distances are computed (default: the CPU)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    set_digests = digests(images)
    known = training if isinstance(training, set) else set(digests(training)) if training is not None else set()
    first: dict[bytes, int] = {}
    for i, d in enumerate(digests(split_images)):
        first.setdefault(d, i)
    matches: dict[int, Match] = {}
    for i, d in enumerate(set_digests):
        if d in first:
            matches[i] = Match(i, first[d], 0.0, True, d in known)
    search = [i for i, d in enumerate(set_digests) if i not in matches and d not in known]
    if search:
        distance, index = nearest(fingerprints(images[search], device), fingerprints(split_images, device))
        for i, dist, j in zip(search, distance.tolist(), index.tolist()):
            if dist < threshold:
                matches[i] = Match(i, j, round(dist, 4), False)
    return Overlap(split, len(split_images), len(images), tuple(matches[i] for i in sorted(matches)), threshold)
