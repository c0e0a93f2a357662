"""Archives of ImageFolder trees (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz, .zip): detected by name and
extracted once into the cache (``ddlib.data.datasets.cache_dir``), never beside the archive, which may
sit in a read-only or shared folder."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from ddlib.data.datasets import DatasetError, cache_dir

__all__ = ["ARCHIVE_SUFFIXES", "is_archive", "extracted_tree", "extract_archive"]

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")


def is_archive(path: Path) -> bool:
    """A file whose name ends in one of :data:`ARCHIVE_SUFFIXES`."""
    n = path.name.lower()
    return path.is_file() and n.endswith(ARCHIVE_SUFFIXES)



def extracted_tree(archive: Path) -> Path:
    """Extract an archive given as ``root`` into the cache (never beside the archive)."""
    digest = hashlib.sha1(str(archive.resolve()).encode()).hexdigest()[:12]
    stem = archive.name.split(".")[0] or "archive"
    return extract_archive(archive, cache_dir() / "extracted" / f"{stem}-{digest}")



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

