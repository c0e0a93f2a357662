"""File-backed dataset loaders: mnist, fashionmnist, cifar10, cifar100, svhn, tinyimagenet, ImageFolder.

Registered into :mod:`ddlib.data.datasets` on import. Every loader reads what the user already has on disk
(a torchvision folder, an ImageFolder tree, an ``.npz``) and downloads only when asked to with
``download=True``, so a benchmark never silently fetches data or measures something else than
what its config names.

ImageFolder trees (CIFAR-10 as JPEGs has 60,000 files) are decoded once with a thread pool and
kept as one uint8 array in a disk cache under ``${DDLIB_CACHE:-~/.cache/ddlib}``, so the second
process start loads in about a second. The cache never lives in the user's data folder, which may
be read-only or shared.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ddlib.data.datasets import Dataset, DatasetError, register_dataset, register_prefix

__all__ = [
    "cache_dir",
    "extract_archive",
    "decode_image_files",
    "image_array",
    "load_imagefolder_dataset",
    "IMAGE_EXTENSIONS",
]

# Same extensions torchvision's ImageFolder accepts, compared case-insensitively (Tiny ImageNet uses .JPEG).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Bump when the layout of cached arrays changes, so old cache files are never misread.
_CACHE_FORMAT = 1
_CHUNK = 256  # images per decode task: large enough to amortise task overhead, small enough to balance

MNIST_CLASSES = tuple(str(i) for i in range(10))
# torchvision.datasets.FashionMNIST.classes, copied so the .npz path need not import torchvision (~2 s);
# tests check the two stay equal.
FASHIONMNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)


def cache_dir() -> Path:
    """Where decoded arrays and extracted archives go: ``$DDLIB_CACHE``, else ``~/.cache/ddlib``."""
    env = os.environ.get("DDLIB_CACHE")
    return Path(env if env else "~/.cache/ddlib").expanduser()


# --------------------------------------------------------------------------- root handling


def _require_root(name: str, root: Path | None, download: bool) -> Path:
    """The folder to read ``name`` from; a clear error instead of guessing when none was given."""
    if root is None:
        if download:
            # Somewhere that is ours to write to; never the current directory.
            return cache_dir() / "datasets"
        raise DatasetError(
            f"dataset {name!r} needs a data folder: pass root=... to load_dataset or set the "
            f"DDLIB_DATA environment variable (or pass download=True to fetch it with torchvision)"
        )
    root = Path(root).expanduser()
    if not root.exists() and not download:
        raise DatasetError(f"{name}: {root} does not exist")
    return root


def _torchvision_root(root: Path, base_folder: str) -> Path | None:
    """The root torchvision wants (the parent of ``base_folder``) if ``root`` is or holds that folder."""
    if root.name == base_folder and root.is_dir():
        return root.parent
    if (root / base_folder).is_dir():
        return root
    return None


def _is_archive(path: Path) -> bool:
    n = path.name.lower()
    return path.is_file() and n.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip"))


def _split_tree(root: Path, aliases: Sequence[str] = ()) -> Path | None:
    """The folder holding ``train/`` plus ``test/`` or ``val/``: ``root`` itself or ``root/<alias>``."""
    for cand in [root, *(root / a for a in aliases)]:
        if (cand / "train").is_dir() and ((cand / "test").is_dir() or (cand / "val").is_dir()):
            return cand
    return None


def _archive_tree(archive: Path) -> Path:
    """Extract an archive given as ``root`` into the cache (never beside the archive)."""
    digest = hashlib.sha1(str(archive.resolve()).encode()).hexdigest()[:12]
    stem = archive.name.split(".")[0] or "archive"
    return extract_archive(archive, cache_dir() / "extracted" / f"{stem}-{digest}")


# --------------------------------------------------------------------------- archives


def _find_train_parent(folder: Path) -> Path | None:
    """``folder`` if it holds ``train/``, else its only child that does (archives often wrap one folder)."""
    if (folder / "train").is_dir():
        return folder
    hits = [c for c in sorted(folder.iterdir()) if c.is_dir() and (c / "train").is_dir()] if folder.is_dir() else []
    return hits[0] if hits else None


def extract_archive(archive: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Extract a tar/tar.gz/zip of an ImageFolder tree into ``dest`` once; return the folder holding ``train/``.

    Extraction goes to a temporary sibling folder that is renamed to ``dest`` at the end, so a
    crash or a concurrent process never leaves a half-extracted ``dest`` that later looks complete.
    """
    archive = Path(archive).expanduser()
    dest = Path(dest).expanduser()
    if dest.exists():
        found = _find_train_parent(dest)
        if found is not None:
            return found
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()  # an empty leftover; rename would replace it anyway, but be explicit
        else:
            raise DatasetError(f"{dest} exists but holds no train/ folder; remove it to re-extract {archive}")
    if not archive.is_file():
        raise DatasetError(f"archive {archive} does not exist")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the extracted tree is ordinary data
    try:
        name = archive.name.lower()
        try:
            if name.endswith(".zip"):
                with zipfile.ZipFile(archive) as zf:
                    zf.extractall(tmp)  # zipfile strips absolute paths and '..' itself
            else:
                with tarfile.open(archive) as tf:
                    if hasattr(tarfile, "data_filter"):
                        tf.extractall(tmp, filter="data")  # refuses paths escaping tmp, links out, devices
                    else:  # pragma: no cover - Python < 3.11.4
                        for m in tf.getmembers():
                            if m.name.startswith("/") or ".." in Path(m.name).parts:
                                raise DatasetError(f"{archive}: unsafe member path {m.name!r}")
                        tf.extractall(tmp)
        except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DatasetError(f"cannot extract {archive}: {exc}") from exc
        try:
            os.rename(tmp, dest)
        except OSError:
            if _find_train_parent(dest) is None:  # not a concurrent winner: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    found = _find_train_parent(dest)
    if found is None:
        raise DatasetError(f"archive {archive} holds no train/ folder (extracted to {dest})")
    return found


# --------------------------------------------------------------------------- scanning ImageFolder trees


def _walk_images(folder: Path) -> list[str]:
    """Image files under ``folder`` (recursive, so ``<class>/images/*.JPEG`` works), sorted by path."""
    out: list[str] = []
    stack = [str(folder)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    if e.is_dir():
                        stack.append(e.path)
                    elif e.name.lower().endswith(IMAGE_EXTENSIONS):
                        out.append(e.path)
        except OSError as exc:
            raise DatasetError(f"cannot list {d}: {exc}") from exc
    out.sort()
    return out


def _class_folders(split_dir: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise DatasetError(f"cannot list {split_dir}: {exc}") from exc


def _scan_class_split(split_dir: Path, classes: Sequence[str] | None = None) -> tuple[list[str], list[str], list[int]]:
    """(class names, files, labels) for ``split_dir/<class>/...``; ``classes`` fixes the expected names."""
    found = _class_folders(split_dir)
    if classes is None:
        classes = found
        if not classes:
            raise DatasetError(f"{split_dir} holds no class folders")
    elif list(found) != list(classes):
        raise DatasetError(_class_mismatch(split_dir, classes, found))
    files: list[str] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        fs = _walk_images(split_dir / c)
        if not fs:
            raise DatasetError(f"class folder {split_dir / c} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        files += fs
        labels += [i] * len(fs)
    return list(classes), files, labels


def _class_mismatch(split_dir: Path, expected: Sequence[str], found: Sequence[str]) -> str:
    only_train = sorted(set(expected) - set(found))
    only_here = sorted(set(found) - set(expected))
    return (
        f"class folders of {split_dir} differ from train/: "
        f"missing {only_train[:10]}{'...' if len(only_train) > 10 else ''}, "
        f"extra {only_here[:10]}{'...' if len(only_here) > 10 else ''}"
    )


def _scan_eval_split(tree: Path, classes: list[str]) -> tuple[Path, list[str], list[int], list[str]]:
    """The labelled held-out split: ``test/<class>``, ``val/<class>``, or Tiny ImageNet's annotated ``val/``.

    Returns (split folder, files, labels, extra files whose change must invalidate the cache).
    ``test/images/`` alone is Tiny ImageNet's unlabelled test set, so it is skipped, not read as one class.
    """
    test, val = tree / "test", tree / "val"
    if test.is_dir() and _class_folders(test) not in ([], ["images"]):
        _, files, labels = _scan_class_split(test, classes)
        return test, files, labels, []
    if val.is_dir():
        ann = val / "val_annotations.txt"
        if ann.is_file():
            files, labels = _read_val_annotations(ann, val, classes)
            return val, files, labels, [str(ann)]
        _, files, labels = _scan_class_split(val, classes)
        return val, files, labels, []
    if test.is_dir():
        raise DatasetError(f"{test} holds no class folders (unlabelled test images?) and {val} does not exist")
    raise DatasetError(f"{tree} has train/ but neither test/ nor val/")


def _read_val_annotations(ann: Path, val: Path, classes: list[str]) -> tuple[list[str], list[int]]:
    """Tiny ImageNet's ``val/images/*.JPEG`` labelled by ``val_annotations.txt`` (file<TAB>wnid<TAB>box...)."""
    index = {c: i for i, c in enumerate(classes)}
    pairs: list[tuple[str, int]] = []
    try:
        lines = ann.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read {ann}: {exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise DatasetError(f"{ann}:{n}: expected '<file>\\t<class>...', got {line!r}")
        fname, wnid = parts[0].strip(), parts[1].strip()
        if wnid not in index:
            raise DatasetError(f"{ann}:{n}: class {wnid!r} has no folder in train/")
        path = val / "images" / fname
        if not path.is_file():
            raise DatasetError(f"{ann}:{n}: {path} does not exist")
        pairs.append((str(path), index[wnid]))
    if not pairs:
        raise DatasetError(f"{ann} lists no images")
    pairs.sort()
    return [p for p, _ in pairs], [lab for _, lab in pairs]


# --------------------------------------------------------------------------- decoding + disk cache


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


# --------------------------------------------------------------------------- ImageFolder


def _load_tree(
    name: str,
    tree: Path,
    *,
    channels: int | None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    num_classes: int | None = None,
) -> Dataset:
    """A Dataset from ``tree/train/<class>/*`` and its labelled test/val split, through the disk cache."""
    train_dir = tree / "train"
    classes, train_files, train_labels = _scan_class_split(train_dir)
    if num_classes is not None and len(classes) != num_classes:
        raise DatasetError(f"{name}: expected {num_classes} class folders in {train_dir}, found {len(classes)}")
    eval_dir, test_files, test_labels, extra_files = _scan_eval_split(tree, classes)
    files = train_files + test_files
    tag = f"imagefolder-{tree.name}" if name.startswith("imagefolder:") else name  # readable cache file names
    images, tmean, tstd, cache_file, from_cache = decode_image_files(
        files, root=tree, n_train=len(train_files), channels=channels, tag=tag, extra_files=extra_files
    )
    n = len(train_files)
    images_t = torch.from_numpy(images)
    extensions = sorted({os.path.splitext(p)[1].lower() for p in files})
    extra = {
        "layout": "imagefolder",
        "test_split": eval_dir.name,
        "file_extensions": tuple(extensions),
        "cache_file": str(cache_file) if cache_file else None,
        "from_cache": from_cache,
        "computed_mean": tmean,
        "computed_std": tstd,
    }
    if (tree / "words.txt").is_file():  # Tiny ImageNet: wnid -> readable names
        extra["class_descriptions"] = _read_words(tree / "words.txt", classes)
    return Dataset(
        name=name,
        train_images=images_t[:n],
        train_labels=torch.tensor(train_labels, dtype=torch.int64),
        test_images=images_t[n:],
        test_labels=torch.tensor(test_labels, dtype=torch.int64),
        class_names=tuple(classes),
        mean=tuple(mean) if mean is not None else tmean,
        std=tuple(std) if std is not None else tstd,
        source=str(tree),
        extra=extra,
    )


def _read_words(path: Path, classes: Sequence[str]) -> tuple[str, ...]:
    wanted = set(classes)
    names: dict[str, str] = {}
    try:
        for line in path.read_text(errors="replace").splitlines():
            k, _, v = line.partition("\t")
            if k in wanted:
                names[k] = v.strip()
    except OSError:
        return ()
    return tuple(names.get(c, c) for c in classes)


@register_prefix("imagefolder")
def load_imagefolder_dataset(path: str | os.PathLike, name: str | None = None) -> Dataset:
    """Any ImageFolder tree: ``path/train/<class>/*`` with ``path/test/<class>/*`` (or ``val/``).

    ``path`` may also be a .tar/.tar.gz/.zip of such a tree (extracted into the cache). Images are
    RGB unless every one is grayscale; all must share one size; mean/std come from the training pixels.
    """
    path = Path(path).expanduser()
    label = name or f"imagefolder:{path}"
    if _is_archive(path):
        path = _archive_tree(path)
    if not path.exists():
        raise DatasetError(f"{label}: {path} does not exist")
    if not path.is_dir():
        raise DatasetError(f"{label}: {path} is not a folder (expected train/ and test/ or val/ inside)")
    tree = _split_tree(path)
    if tree is None:
        raise DatasetError(f"{label}: {path} needs a train/ folder and a test/ or val/ folder of class folders")
    return _load_tree(label, tree, channels=None)


# --------------------------------------------------------------------------- npz + torchvision helpers


def _to_nchw(arr: np.ndarray, path: Path, key: str) -> torch.Tensor:
    """N x H x W, N x H x W x C or N x C x H x W (C in 1, 3) to an N x C x H x W uint8/float32 tensor."""
    if arr.ndim == 3:
        arr = arr[:, None]
    elif arr.ndim == 4 and arr.shape[-1] in (1, 3) and arr.shape[1] not in (1, 3):
        arr = arr.transpose(0, 3, 1, 2)
    elif not (arr.ndim == 4 and arr.shape[1] in (1, 3)):
        raise DatasetError(f"{path}: {key} has shape {arr.shape}; expected N x H x W or N x C x H x W")
    if arr.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(arr))
    if np.issubdtype(arr.dtype, np.floating):
        if arr.size and (arr.min() < 0 or arr.max() > 1):
            raise DatasetError(f"{path}: {key} is float but not in [0, 1] (range {arr.min()}..{arr.max()})")
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    if np.issubdtype(arr.dtype, np.integer) and (arr.size == 0 or (arr.min() >= 0 and arr.max() <= 255)):
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.uint8))
    raise DatasetError(f"{path}: {key} has dtype {arr.dtype}; expected uint8 or float in [0, 1]")


def _labels(arr, path: Path | str, key: str, n: int, num_classes: int) -> torch.Tensor:
    arr = np.asarray(arr)
    if arr.ndim == 2 and 1 in arr.shape:  # (N, 1) column vectors, as some exporters write
        arr = arr.reshape(-1)
    if arr.ndim != 1 or len(arr) != n:
        raise DatasetError(f"{path}: {key} has shape {arr.shape}; expected ({n},) to match the images")
    if not np.issubdtype(arr.dtype, np.integer):
        raise DatasetError(f"{path}: {key} has dtype {arr.dtype}; expected integer class indices")
    if n and (arr.min() < 0 or arr.max() >= num_classes):
        raise DatasetError(f"{path}: {key} has labels {arr.min()}..{arr.max()}; expected 0..{num_classes - 1}")
    return torch.from_numpy(arr.astype(np.int64))


def _from_npz(name: str, path: Path, class_names, mean, std) -> Dataset:
    """Keras-style ``x_train/y_train/x_test/y_test`` arrays; no pickles are loaded."""
    keys = ("x_train", "y_train", "x_test", "y_test")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DatasetError(f"{path}: missing keys {missing} (found {sorted(z.files)}); expected {list(keys)}")
            arrays = {k: z[k] for k in keys}
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - bad zip, truncated file, pickled object arrays...
        raise DatasetError(f"cannot read {path}: {exc}") from exc
    xtr = _to_nchw(arrays["x_train"], path, "x_train")
    xte = _to_nchw(arrays["x_test"], path, "x_test")
    if xtr.shape[1:] != xte.shape[1:]:
        raise DatasetError(f"{path}: x_train images are {tuple(xtr.shape[1:])} but x_test are {tuple(xte.shape[1:])}")
    k = len(class_names)
    return Dataset(
        name=name,
        train_images=xtr,
        train_labels=_labels(arrays["y_train"], path, "y_train", len(xtr), k),
        test_images=xte,
        test_labels=_labels(arrays["y_test"], path, "y_test", len(xte), k),
        class_names=tuple(class_names),
        mean=mean,
        std=std,
        source=str(path),
        extra={"layout": "npz"},
    )


def _torchvision(name: str, fn, tv_root: Path, download: bool):
    """Call a torchvision dataset constructor, turning its errors into ones that name the folder."""
    try:
        return fn(str(tv_root), download)
    except (RuntimeError, OSError, ValueError) as exc:
        raise DatasetError(f"{name}: cannot read torchvision files under {tv_root}: {exc}") from exc


def _not_found(name: str, root: Path, looked_for: str) -> DatasetError:
    return DatasetError(f"{name}: nothing usable under {root}: looked for {looked_for}; pass download=True to fetch it")


# --------------------------------------------------------------------------- MNIST-like


def _load_mnist_like(name, root, download, *, npz_names, tv_name, aliases, class_names, mean, std) -> Dataset:
    root = _require_root(name, root, download)
    if root.is_file():
        if root.suffix.lower() == ".npz":
            return _from_npz(name, root, class_names, mean, std)
        raise DatasetError(f"{name}: {root} is a file but not an .npz; pass the .npz or a folder")
    for folder in [root, *(root / a for a in aliases)]:
        for n in npz_names:
            if (folder / n).is_file():
                return _from_npz(name, folder / n, class_names, mean, std)
    tv_root = _torchvision_root(root, tv_name)
    if tv_root is None:
        if not download:
            raise _not_found(name, root, f"{' or '.join(npz_names)} or a torchvision {tv_name}/raw folder")
        tv_root = root
    import torchvision  # imported late: it costs ~2 s and the .npz path does not need it

    tv_cls = getattr(torchvision.datasets, tv_name)
    train = _torchvision(name, lambda r, d: tv_cls(r, train=True, download=d), tv_root, download)
    test = _torchvision(name, lambda r, d: tv_cls(r, train=False, download=d), tv_root, download)
    return Dataset(
        name=name,
        train_images=train.data[:, None].contiguous(),
        train_labels=train.targets.to(torch.int64),
        test_images=test.data[:, None].contiguous(),
        test_labels=test.targets.to(torch.int64),
        class_names=tuple(class_names),
        mean=mean,
        std=std,
        source=str(Path(tv_root) / tv_name),
        extra={"layout": "torchvision"},
    )


@register_dataset("mnist")
def load_mnist(root: Path | None, download: bool = False) -> Dataset:
    """MNIST: ``mnist.npz`` (x_train/y_train/x_test/y_test) or a torchvision ``MNIST/`` folder."""
    return _load_mnist_like(
        "mnist", root, download, npz_names=("mnist.npz",), tv_name="MNIST", aliases=("mnist", "MNIST"),
        class_names=MNIST_CLASSES, mean=(0.1307,), std=(0.3081,),
    )


@register_dataset("fashionmnist")
def load_fashionmnist(root: Path | None, download: bool = False) -> Dataset:
    """Fashion-MNIST: ``fashion-mnist.npz``/``fashionmnist.npz`` or a torchvision ``FashionMNIST/`` folder."""
    return _load_mnist_like(
        "fashionmnist", root, download, npz_names=("fashion-mnist.npz", "fashionmnist.npz"),
        tv_name="FashionMNIST", aliases=("fashionmnist", "fashion-mnist", "FashionMNIST"),
        class_names=FASHIONMNIST_CLASSES, mean=(0.2861,), std=(0.3530,),
    )


# --------------------------------------------------------------------------- CIFAR


def _load_cifar(name, root, download, *, tv_name, base_folder, aliases, num_classes, mean, std) -> Dataset:
    root = _require_root(name, root, download)
    if _is_archive(root):
        root = _archive_tree(root)
    tv_root = _torchvision_root(root, base_folder)
    if tv_root is None:
        tree = _split_tree(root, aliases)
        if tree is not None:
            return _load_tree(name, tree, channels=3, mean=mean, std=std, num_classes=num_classes)
        if not download:
            raise _not_found(
                name, root,
                f"{base_folder}/ (torchvision) or train/ + test/ class folders (ImageFolder, also under {'/, '.join(aliases)}/)",
            )
        tv_root = root
    import torchvision  # imported late: it costs ~2 s and the ImageFolder path does not need it

    tv_cls = getattr(torchvision.datasets, tv_name)
    train = _torchvision(name, lambda r, d: tv_cls(r, train=True, download=d), tv_root, download)
    test = _torchvision(name, lambda r, d: tv_cls(r, train=False, download=d), tv_root, download)
    src = Path(tv_root) / base_folder
    return Dataset(
        name=name,
        train_images=torch.from_numpy(np.ascontiguousarray(train.data.transpose(0, 3, 1, 2))),
        train_labels=_labels(train.targets, src, "train labels", len(train.data), len(train.classes)),
        test_images=torch.from_numpy(np.ascontiguousarray(test.data.transpose(0, 3, 1, 2))),
        test_labels=_labels(test.targets, src, "test labels", len(test.data), len(train.classes)),
        class_names=tuple(train.classes),
        mean=mean,
        std=std,
        source=str(src),
        extra={"layout": "torchvision"},
    )


@register_dataset("cifar10")
def load_cifar10(root: Path | None, download: bool = False) -> Dataset:
    """CIFAR-10: torchvision ``cifar-10-batches-py/`` or an ImageFolder tree (mean/std as in the DC code)."""
    return _load_cifar(
        "cifar10", root, download, tv_name="CIFAR10", base_folder="cifar-10-batches-py",
        aliases=("cifar10", "CIFAR10", "cifar-10"), num_classes=10,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2023, 0.1994, 0.2010),
    )


@register_dataset("cifar100")
def load_cifar100(root: Path | None, download: bool = False) -> Dataset:
    """CIFAR-100 (fine labels): torchvision ``cifar-100-python/`` or an ImageFolder tree."""
    return _load_cifar(
        "cifar100", root, download, tv_name="CIFAR100", base_folder="cifar-100-python",
        aliases=("cifar100", "CIFAR100", "cifar-100"), num_classes=100,
        mean=(0.5071, 0.4866, 0.4409), std=(0.2673, 0.2564, 0.2762),
    )


# --------------------------------------------------------------------------- SVHN


@register_dataset("svhn")
def load_svhn(root: Path | None, download: bool = False) -> Dataset:
    """SVHN (train + test, no extra): torchvision's ``train_32x32.mat``/``test_32x32.mat``, label 10 read as 0."""
    name = "svhn"
    root = _require_root(name, root, download)
    folder = next((f for f in (root, root / "svhn", root / "SVHN") if (f / "train_32x32.mat").is_file()), None)
    if folder is None:
        if not download:
            raise _not_found(name, root, "train_32x32.mat and test_32x32.mat (also under svhn/ or SVHN/)")
        folder = root
    import torchvision  # imported late: it costs ~2 s

    SVHN = torchvision.datasets.SVHN
    train = _torchvision(name, lambda r, d: SVHN(r, split="train", download=d), folder, download)
    test = _torchvision(name, lambda r, d: SVHN(r, split="test", download=d), folder, download)
    return Dataset(
        name=name,
        train_images=torch.from_numpy(np.ascontiguousarray(train.data)),
        train_labels=_labels(train.labels, folder, "train labels", len(train.data), 10),
        test_images=torch.from_numpy(np.ascontiguousarray(test.data)),
        test_labels=_labels(test.labels, folder, "test labels", len(test.data), 10),
        class_names=MNIST_CLASSES,
        mean=(0.4377, 0.4438, 0.4728),
        std=(0.1980, 0.2010, 0.1970),
        source=str(folder),
        extra={"layout": "torchvision"},
    )


# --------------------------------------------------------------------------- Tiny ImageNet


@register_dataset("tinyimagenet")
def load_tinyimagenet(root: Path | None, download: bool = False) -> Dataset:
    """Tiny ImageNet (64x64 RGB): original ``tiny-imagenet-200`` layout or an ImageFolder tree.

    The held-out split is ``test/<wnid>`` if present, else ``val/<wnid>`` or the original
    ``val/images`` + ``val_annotations.txt`` (the original ``test/`` has no labels).
    """
    name = "tinyimagenet"
    if root is None and download:
        raise DatasetError("tinyimagenet cannot be downloaded by ddlib (torchvision has no loader for it); "
                           "get tiny-imagenet-200.zip and pass its folder (or the zip) as root")
    root = _require_root(name, root, False)
    if _is_archive(root):
        root = _archive_tree(root)
    tree = _split_tree(root, ("tiny-imagenet-200", "tinyimagenet", "tiny-imagenet"))
    if tree is None:
        raise DatasetError(
            f"{name}: nothing usable under {root}: looked for train/ plus test/ or val/ "
            f"(also under tiny-imagenet-200/); ddlib cannot download it"
        )
    return _load_tree(name, tree, channels=3, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
