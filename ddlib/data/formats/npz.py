"""``.npz`` with ``images`` and ``labels`` (optionally ``soft_labels``, ``lr``, ``normalized``, ``zca_space``):
uint8 or float pixels, NCHW, NHWC or N x H x W. Read with ``allow_pickle=False``: no objects."""

from __future__ import annotations

import numpy as np

from ddlib.data.formats.base import DistilledSetError, SetPath, set_fields, set_format, short


@set_format("npz", priority=40, detect=lambda src: src.path.is_file() and src.suffix == ".npz",
            detects="a .npz file")
def read(src: SetPath) -> dict:
    """The named arrays of an ``.npz`` archive, never unpickling an object; a lone ``.npy`` array is refused."""
    path = src.path
    try:
        # Open the file ourselves: np.load leaks its handle when the zip is corrupt.
        with open(path, "rb") as fh:
            npz = np.load(fh, allow_pickle=False)
            if not isinstance(npz, np.lib.npyio.NpzFile):
                raise DistilledSetError(f"{path}: unknown format: a single .npy array, expected an .npz archive")
            with npz:
                arrays = {k: npz[k] for k in npz.files}
    except DistilledSetError:
        raise
    except Exception as exc:
        raise DistilledSetError(f"{path}: unreadable or corrupt file ({type(exc).__name__}: {short(exc)})") from exc
    return set_fields(path, arrays)
