"""Decoding image files into one uint8 array, with a thread pool and a disk cache.

An ImageFolder tree (CIFAR-10 as JPEGs has 60,000 files) is decoded once and kept as one uint8 array
(plus the training pixels' mean/std) in ``cache_dir()/decoded``, keyed by :func:`_signature` (the tree's
path, file list and newest mtime), so the second process start loads in about a second and any change
to the tree decodes again.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from ddlib.data.datasets import DatasetError, cache_dir

__all__ = ["image_array", "decode_image_files", "histogram_stats"]

# Bump when the layout of cached arrays changes, so old cache files are never misread.
_CACHE_FORMAT = 1
_CHUNK = 256  # images per decode task: large enough to amortise task overhead, small enough to balance

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def image_array(im, mode: str, full_range: bool = False) -> np.ndarray:
    """An opened PIL image as an array in ``mode`` ("L" or "RGB"): uint8 pixels, or with
    ``full_range`` float32 in [0, 1]. 16-bit grayscale (PNG) is scaled from 0-65535: PIL's own
    ``convert`` clips it to 0-255, turning every pixel above 255 (almost all) white."""
    if im.mode in _SIXTEEN_BIT_MODES:
        arr = np.asarray(im).astype(np.float64)
        top = 65535.0 if im.mode != "I" or arr.max() > 255 else 255.0  # "I": a 16-bit PNG in older PIL
        grey = arr / top
        out = np.repeat(grey[..., None], 3, axis=2) if mode == "RGB" else grey
        return out.astype(np.float32) if full_range else np.round(out * 255).astype(np.uint8)
    if im.mode != mode:
        im = im.convert(mode)
    arr = np.asarray(im, dtype=np.uint8)
    return arr.astype(np.float32) / 255.0 if full_range else arr


def _decode_chunk(paths: Sequence[str], channels: int | None) -> list:
    """Decode a few files; returns arrays (H x W for grayscale, H x W x 3 for colour) or the exception.

    Runs in worker threads: PIL releases the GIL while decoding, so threads scale on small JPEGs.
    """
    from PIL import Image

    out: list = []
    for p in paths:
        try:
            with Image.open(p) as im:
                if channels == 1:
                    want = "L"
                elif channels == 3:
                    want = "RGB"
                else:  # auto: keep grayscale as is; anything else becomes RGB
                    want = "L" if im.mode in ("L", *_SIXTEEN_BIT_MODES) else "RGB"
                out.append(image_array(im, want))
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the file's problem
            out.append(exc)
    return out


def _num_workers() -> int:
    # PIL releases the GIL only in the decoder proper; for 32x32 JPEGs ~60 % of each image's time is
    # Python-side header parsing under the GIL, so threads beyond the core count only add contention.
    return max(2, min(8, os.cpu_count() or 1))


def _decode_files(files: Sequence[str], channels: int | None) -> np.ndarray:
    """All ``files`` into one N x C x H x W uint8 array, preallocated so peak memory is ~1x the result.

    With ``channels=None`` the result has 1 channel if every image is grayscale ("L"), else 3
    (grayscale images are replicated into RGB). Every image must have the first image's size.
    """
    n = len(files)
    if n == 0:
        raise DatasetError("no image files to decode")
    out: np.ndarray | None = None
    ref_hw: tuple[int, int] | None = None
    chunks = [files[i : i + _CHUNK] for i in range(0, n, _CHUNK)]
    pool = ThreadPoolExecutor(max_workers=_num_workers())
    try:
        i = 0
        for result in pool.map(_decode_chunk, chunks, [channels] * len(chunks)):
            for arr in result:
                path = files[i]
                if isinstance(arr, Exception):
                    raise DatasetError(f"cannot read image {path}: {arr}") from arr
                hw = arr.shape[:2]
                if out is None:
                    ref_hw = hw
                    c = 3 if (channels == 3 or arr.ndim == 3) else 1
                    out = np.empty((n, c, hw[0], hw[1]), dtype=np.uint8)
                elif hw != ref_hw:
                    raise DatasetError(
                        f"image {path} is {hw[1]}x{hw[0]} (WxH) but {files[0]} is {ref_hw[1]}x{ref_hw[0]}: "
                        f"all images must share one size"
                    )
                if arr.ndim == 3 and out.shape[1] == 1:  # first colour image after grayscale ones
                    rgb = np.empty((n, 3) + out.shape[2:], dtype=np.uint8)
                    rgb[:i] = out[:i]  # broadcasts the grey channel to R, G and B
                    out = rgb
                out[i] = arr.transpose(2, 0, 1) if arr.ndim == 3 else arr  # grey broadcasts over C
                i += 1
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on an error, do not decode the rest first
    assert out is not None
    return out


def _channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and (population) std of uint8 pixels, in [0, 1] units, via 256-bin histograms."""
    return histogram_stats([np.bincount(images[:, c].reshape(-1), minlength=256) for c in range(images.shape[1])])


def histogram_stats(histograms: Sequence[np.ndarray]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std, in [0, 1] units, from each channel's 256-bin histogram of
    uint8 pixels (exact; histograms of batches add up, so a streaming pass gives the same numbers)."""
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for hist in histograms:
        hist = np.asarray(hist, dtype=np.float64)
        total = hist.sum()
        m = float((hist * values).sum() / total)
        var = float((hist * values**2).sum() / total - m * m)
        means.append(m)
        stds.append(max(var, 0.0) ** 0.5)
    return tuple(means), tuple(stds)


def _signature(root: Path, files: Sequence[str], channels: int | None, extra_files: Sequence[str]) -> str:
    """Cache key of a tree: its absolute path, file count, newest mtime and the list of relative paths.

    Adding, removing, renaming or touching a file changes the key; stat-ing 60,000 files takes
    a fraction of a second, far less than decoding them.
    """
    newest = 0.0
    for p in list(files) + list(extra_files):
        try:
            newest = max(newest, os.stat(p).st_mtime)
        except OSError as exc:
            raise DatasetError(f"cannot stat {p}: {exc}") from exc
    h = hashlib.sha1()
    base = str(root.resolve())
    h.update(f"{_CACHE_FORMAT}|{base}|{channels}|{len(files)}|{newest!r}|".encode())
    cut = len(str(root)) + 1
    for p in files:
        h.update(p[cut:].encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()[:20]


def decode_image_files(
    files: Sequence[str],
    *,
    root: Path,
    n_train: int,
    channels: int | None = None,
    tag: str = "images",
    extra_files: Sequence[str] = (),
) -> tuple[np.ndarray, tuple[float, ...], tuple[float, ...], Path | None, bool]:
    """Decode ``files`` (all under ``root``) through the disk cache.

    Returns (images N x C x H x W uint8, train mean, train std, cache file or None, loaded from cache).
    Mean/std cover the first ``n_train`` images and are cached with them. A cache file that cannot
    be read or does not match is ignored and rebuilt; a cache folder we cannot write is only a warning.
    """
    sig = _signature(root, files, channels, extra_files)
    root_hash = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:10]
    safe_tag = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in tag)[:40] or "images"
    folder = cache_dir() / "decoded"
    path = folder / f"{safe_tag}-{root_hash}-{sig}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                images = z["images"]
                mean = tuple(float(v) for v in z["mean"])
                std = tuple(float(v) for v in z["std"])
                ok = int(z["n_train"]) == n_train
            if ok and images.dtype == np.uint8 and images.ndim == 4 and images.shape[0] == len(files):
                return images, mean, std, path, True
            warnings.warn(f"ignoring stale decoded cache {path} (does not match {root}); rebuilding", stacklevel=3)
        except Exception as exc:  # noqa: BLE001 - corrupt/truncated cache: rebuild, never crash
            warnings.warn(f"ignoring unreadable decoded cache {path} ({exc}); rebuilding", stacklevel=3)
    images = _decode_files(files, channels)
    mean, std = _channel_stats(images[:n_train]) if n_train else ((), ())
    written: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                # Uncompressed: loading 180 MB uncompressed is faster than inflating it.
                np.savez(f, images=images, mean=np.array(mean), std=np.array(std), n_train=np.array(n_train))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        written = path
        for old in folder.glob(f"{safe_tag}-{root_hash}-*.npz"):  # older versions of the same tree
            if old != path:
                old.unlink(missing_ok=True)
    except OSError as exc:
        warnings.warn(f"could not write decoded cache {path} ({exc}); the next load will decode again", stacklevel=3)
    return images, mean, std, written, False

