"""Set formats are registered readers: adding one is this one file (the ``toy`` format below), and
:func:`ddlib.data.distilled.load` reads it like the built-ins, with every check they get."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ddlib.data.datasets import load_dataset
from ddlib.data.distilled import DistilledSetError, load
from ddlib.data.formats import FORMATS, SetPath, formats, set_format


# --------------------------------------------------------------------------- a toy format, all in this file
# A ``.toy`` text file: one image per line, "<label>: <pixel> <pixel> ..." with 0-255 pixels of C x H x W.


@set_format("toy", detects="a .toy text file", detect=lambda src: src.path.is_file() and src.suffix == ".toy")
def read_toy(src: SetPath) -> dict:
    labels, images = [], []
    for n, line in enumerate(src.path.read_text().splitlines(), 1):
        label, _, values = line.partition(":")
        if not values:
            raise DistilledSetError(f"{src.path}:{n}: expected '<label>: <pixels>'")
        labels.append(int(label))
        images.append(np.array(values.split(), dtype=np.uint8).reshape(src.dataset.image_shape))
    return {"images": np.stack(images), "labels": np.array(labels), "default_normalized": False,
            "stem": src.path.stem}


def write_toy(path, images, labels):
    path.write_text("".join(f"{int(c)}: {' '.join(map(str, img.reshape(-1).tolist()))}\n"
                            for img, c in zip(images, labels)))
    return path


# --------------------------------------------------------------------------- tests


def test_a_format_registered_in_one_file_is_read_by_load(tmp_path):
    digits = load_dataset("digits")
    images = torch.randint(0, 256, (20, *digits.image_shape), generator=torch.Generator().manual_seed(0),
                           dtype=torch.uint8)
    labels = torch.arange(10).repeat(2)
    ds = load(write_toy(tmp_path / "mine.toy", images, labels), digits)
    assert ds.provenance["format"] == "toy" and ds.method == "mine" and ds.ipc == 2
    assert torch.equal(ds.images, images.float() / 255) and torch.equal(ds.labels, labels)
    # the built-in checks apply to the new format as they do to every other
    with pytest.raises(DistilledSetError, match=r"unequal\.toy: unequal images per class"):
        load(write_toy(tmp_path / "unequal.toy", images[:11], labels[:11]), digits)
    with pytest.raises(DistilledSetError, match=r"bad\.toy:1: expected '<label>: <pixels>'"):
        (tmp_path / "bad.toy").write_text("3 no colon\n")
        load(tmp_path / "bad.toy", digits)


def test_formats_are_asked_in_priority_order_and_an_unknown_file_lists_them(tmp_path):
    assert {"dc", "imagefolder", "mtt", "npz", "pt", "toy"} <= set(FORMATS)
    order = [entry.name for entry in formats()]
    # a new format (priority 0) before the built-ins; MTT's images_<tag>.pt before the .pt readers,
    # DC's 'data' dict before the plain dict that reads every other .pt
    assert order.index("toy") < order.index("mtt") < order.index("dc") < order.index("pt")
    path = tmp_path / "set.h5"
    path.write_bytes(b"\x89HDF")
    with pytest.raises(DistilledSetError,
                       match=r"set\.h5: unknown format '\.h5'; expected a \.toy text file, .*a \.npz file or an ImageFolder"):
        load(path, load_dataset("digits"))
