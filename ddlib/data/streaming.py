"""Large ImageFolder datasets (ImageNet-1K) read lazily: a streaming stand-in for the image tensor.

``imagefolder:<path>`` decodes a whole tree into one uint8 array (cached on disk): right for
CIFAR-sized data, impossible for ImageNet-1K (1.28 M images, ~190 GB at 224 px). ``stream:<path>``
reads the same ``train/<class>/*``, ``test/<class>/*`` (or ``val/``) layout into a
:class:`~ddlib.data.datasets.Dataset` whose ``train_images`` and ``test_images`` are
:class:`FileImages`: a list of files that behaves like an N x C x H x W uint8 tensor where the
training loop and the evaluation touch it:

* ``images[idx]`` with at most ``decode_limit`` items (a training batch, an evaluation slice)
  reads and decodes those files and returns a real tensor on the view's device;
* a larger selection (a validation split, a reduced set, one class's images) is another lazy
  view, never decoded as a whole; ``.to(device)`` records the device and reads nothing;
* its content digest (the reuse keys of :mod:`ddlib.protocols.cell`) hashes the files' relative
  paths, sizes and modification times, not their pixels.

So the full-data reference and teachers (:func:`ddlib.engine.train.train_and_test` on the
whole training set) hold one batch of pixels at a time: peak memory is bounded by the batch, not
by the dataset (``tests/test_streaming.py`` measures it). Per-channel mean and std are computed in
one streaming pass (256-bin histograms per channel, exact) unless given. Every image must have the
first one's size unless ``size`` is given (then each is resized, shorter side to ``size``, and
centre-cropped to ``size`` x ``size``, the usual ImageNet preprocessing). Random and K-Center subsets
read only their own images; ZCA whitening (fitted on the whole training set) and the DM distiller
are not made for streamed data: use ``imagefolder:`` for those.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ddlib.data.datasets import Dataset, DatasetError, register_prefix

__all__ = ["FileImages", "stream_imagefolder", "DECODE_LIMIT"]

DECODE_LIMIT = 4096  # selections up to this size are decoded (batches); larger ones stay lazy (subsets)


def _decode(path: str, channels: int, size: tuple[int, int], resize: int | None) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            if resize is not None:
                w, h = im.size
                scale = resize / min(w, h)
                im = im.resize((max(resize, round(w * scale)), max(resize, round(h * scale))), Image.BILINEAR)
                w, h = im.size
                left, top = (w - resize) // 2, (h - resize) // 2
                im = im.crop((left, top, left + resize, top + resize))
            arr = np.asarray(im, dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the file's problem
        raise DatasetError(f"cannot read image {path}: {exc}") from exc
    if arr.shape[:2] != size:
        raise DatasetError(f"image {path} is {arr.shape[1]}x{arr.shape[0]} (WxH), but the dataset's images are "
                           f"{size[1]}x{size[0]}: give stream_imagefolder(..., size=S) to resize every image")
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


class FileImages:
    """N x C x H x W uint8 images read from ``files`` on demand (see the module docstring)."""

    dtype = torch.uint8

    def __init__(self, files: Sequence[str], channels: int, size: tuple[int, int], root: str | None = None,
                 resize: int | None = None, device: torch.device | str = "cpu", decode_limit: int = DECODE_LIMIT,
                 workers: int | None = None):
        self.files = np.asarray(files, dtype=object)
        self.channels, self.size, self.root, self.resize = channels, tuple(size), root, resize
        self.device = torch.device(device)
        self.decode_limit = decode_limit
        self.workers = workers or max(1, min(8, os.cpu_count() or 1))

    # ------------------------------------------------------------------ tensor-like surface

    @property
    def shape(self) -> torch.Size:
        """(N, C, H, W), known without decoding an image."""
        return torch.Size((len(self.files), self.channels, *self.size))

    def __len__(self) -> int:
        return len(self.files)

    def dim(self) -> int:
        """4, as for an N x C x H x W tensor (callers check it before batching)."""
        return 4

    def _view(self, files, device=None) -> "FileImages":
        return FileImages(files, self.channels, self.size, self.root, self.resize, device or self.device,
                          self.decode_limit, self.workers)

    def to(self, device=None, *args, **kwargs) -> "FileImages":
        """A view on ``device``: decoded batches land there (nothing is read now)."""
        return self._view(self.files, torch.device(device) if device is not None else self.device)

    def cpu(self) -> "FileImages":
        """A view whose decoded batches land on the CPU (nothing is read now)."""
        return self.to("cpu")

    def detach(self) -> "FileImages":
        """Itself: decoded files carry no graph (callers detach any tensor they are given)."""
        return self

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return torch.from_numpy(self._read([self.files[int(index)]])[0]).to(self.device)
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        files = self.files[index]
        if len(files) > self.decode_limit:
            return self._view(files)
        return torch.from_numpy(self._read(list(files))).to(self.device, non_blocking=True)

    def _read(self, files: list[str]) -> np.ndarray:
        out = np.empty((len(files), self.channels, *self.size), dtype=np.uint8)
        if len(files) < 8 or self.workers == 1:
            for i, path in enumerate(files):
                out[i] = _decode(path, self.channels, self.size, self.resize)
            return out
        with ThreadPoolExecutor(self.workers) as pool:  # PIL releases the GIL while decoding
            for i, arr in enumerate(pool.map(lambda p: _decode(p, self.channels, self.size, self.resize), files)):
                out[i] = arr
        return out

    def float(self) -> torch.Tensor:
        """Every image as a float tensor (0-255, as ``uint8_tensor.float()``): reads them all, for a
        subset or a set small enough to hold (the training loop never calls it)."""
        if not len(self):
            return torch.empty((0, *self.shape[1:]), device=self.device)
        return torch.cat([batch.float() for batch in self.batches(self.decode_limit)])

    def batches(self, batch_size: int = 256):
        """The images in order, ``batch_size`` at a time (decoded tensors)."""
        for i in range(0, len(self), batch_size):
            yield self[i : i + batch_size]

    def content_digest(self) -> str:
        """What identifies the data without reading it: relative paths, sizes, mtimes, preprocessing."""
        h = hashlib.sha256(f"{self.shape}|{self.resize}".encode())
        cut = len(self.root) + 1 if self.root else 0
        for path in self.files:
            st = os.stat(path)
            h.update(f"{path[cut:]}|{st.st_size}|{st.st_mtime_ns}\0".encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"FileImages({len(self)} files, shape={tuple(self.shape)}, device={self.device})"


def _channel_stats(images: FileImages, batch_size: int = 64) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and std of uint8 pixels in [0, 1] units, one batch at a time."""
    from ddlib.data.decode import histogram_stats

    hist = np.zeros((images.channels, 256), dtype=np.int64)
    for batch in images.cpu().batches(batch_size):
        arr = batch.numpy()
        for c in range(images.channels):
            hist[c] += np.bincount(arr[:, c].reshape(-1), minlength=256)
    return histogram_stats(list(hist))


def stream_imagefolder(path: str | os.PathLike, name: str | None = None, size: int | None = None,
                       mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                       channels: int | None = None) -> Dataset:
    """A Dataset over ``path/train/<class>/*`` and ``path/test`` (or ``val``) whose images are read
    lazily (:class:`FileImages`). ``size``: resize every image (shorter side, then centre crop);
    ``mean``/``std``: the normalisation (default: computed from the training images, one pass)."""
    from PIL import Image

    from ddlib.data.tree_scan import scan_class_split, scan_eval_split

    tree = Path(path).expanduser()
    if not (tree / "train").is_dir():
        raise DatasetError(f"{tree}: no train/ folder (expected train/<class>/*, test/<class>/* or val/)")
    classes, train_files, train_labels = scan_class_split(tree / "train")
    eval_dir, test_files, test_labels, _ = scan_eval_split(tree, classes)
    with Image.open(train_files[0]) as first:
        channels = channels or (1 if first.mode in ("L", "1", "I;16") else 3)
        hw = (size, size) if size else (first.size[1], first.size[0])
    root = str(tree.resolve())
    train = FileImages(train_files, channels, hw, root=root, resize=size)
    test = FileImages(test_files, channels, hw, root=root, resize=size)
    if mean is None or std is None:
        mean, std = _channel_stats(train)
    extensions = sorted({os.path.splitext(p)[1].lower() for p in train_files + test_files})
    return Dataset(name=name or f"stream:{tree}", train_images=train,  # type: ignore[arg-type]
                   train_labels=torch.tensor(train_labels, dtype=torch.int64), test_images=test,  # type: ignore[arg-type]
                   test_labels=torch.tensor(test_labels, dtype=torch.int64), class_names=tuple(classes),
                   mean=tuple(mean), std=tuple(std), source=str(tree),
                   extra={"layout": "imagefolder", "streaming": True, "test_split": eval_dir.name,
                          "file_extensions": tuple(extensions), "resize": size})


@register_prefix("stream")
def load_stream_dataset(path: str | os.PathLike, name: str | None = None) -> Dataset:
    """``stream:<path>``: :func:`stream_imagefolder` with every image at the first one's size;
    ``stream:<path>?size=S``: every image resized to S x S (shorter side, centre crop)."""
    text, _, size = str(path).partition("?size=")
    if size and not size.isdigit():
        raise DatasetError(f"stream:{path}: size must be a positive integer, got {size!r}")
    return stream_imagefolder(text, name=name, size=int(size) if size else None)
