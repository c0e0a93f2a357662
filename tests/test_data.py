"""Dataset registry and loaders: splits, caching, error messages, and real files where present.

Synthetic files are written to tmp_path so every layout is exercised without any real data;
the real MNIST / CIFAR-10 (JPEG) checks skip where ``../shared/data`` is absent.
"""

from __future__ import annotations

import os
import pickle
import random
import struct
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import ddlib.data.datasets as data
import ddlib.data.decode
import ddlib.data.loaders as src
from ddlib.data.datasets import DatasetError, load_dataset
from ddlib.data.loaders import extract_archive, load_imagefolder_dataset

_USER_CACHE = os.environ.get("DDLIB_CACHE")  # before the autouse fixture below redirects it
FILE_BACKED = ["mnist", "fashionmnist", "cifar10", "cifar100", "svhn", "tinyimagenet"]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No test reads the developer's $DDLIB_DATA or writes into their decode cache."""
    monkeypatch.delenv("DDLIB_DATA", raising=False)
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "ddlib-cache"))


def _pixel(cls: int, i: int) -> tuple[int, int, int]:
    """A distinct, exactly recoverable colour per (class, index) so decoding can be checked pixel for pixel."""
    return (10 + 40 * cls, 5 + 7 * i, 200 - 30 * cls)


def make_tree(
    root: Path,
    classes=("cat", "ant", "bee"),
    n_train: int = 3,
    n_test: int = 2,
    size=(6, 5),
    mode: str = "RGB",
    test_split: str = "test",
) -> Path:
    """A tiny ImageFolder tree of PNGs: ``root/train/<class>/i.png`` and ``root/<test_split>/<class>/i.png``."""
    for split, n in (("train", n_train), (test_split, n_test)):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            ci = sorted(classes).index(c)
            for i in range(n):
                rgb = _pixel(ci, i)
                color = rgb[0] if mode == "L" else rgb
                Image.new(mode, size, color).save(d / f"{i}.png")
    return root


# --------------------------------------------------------------------------- digits + registry


def test_digits_split_sizes_and_pixels():
    ds = data.load_digits_dataset()
    assert len(ds.train_labels) == 1347 and len(ds.test_labels) == 450
    assert ds.train_images.shape == (1347, 1, 8, 8) and ds.test_images.shape == (450, 1, 8, 8)
    assert ds.train_images.dtype == torch.float32 and ds.train_labels.dtype == torch.int64
    assert 0.0 <= float(ds.train_images.min()) and float(ds.train_images.max()) <= 1.0
    assert ds.num_classes == 10 and ds.channels == 1


def test_digits_split_is_stratified():
    ds = data.load_digits_dataset()
    tr = np.bincount(ds.train_labels.numpy(), minlength=10)
    te = np.bincount(ds.test_labels.numpy(), minlength=10)
    assert (tr > 0).all() and (te > 0).all()
    frac = te / (tr + te)
    # per class, round(25 %) of that class's images go to test: within one image of 25 %
    assert np.all(np.abs(frac - 0.25) <= 1.0 / (tr + te))


def test_digits_split_is_deterministic_and_ignores_global_rng():
    np.random.seed(123)
    torch.manual_seed(123)
    random.seed(123)
    a = data.load_digits_dataset()
    np.random.seed(999)
    np.random.rand(17)
    torch.rand(5)
    b = data.load_digits_dataset()
    assert a is not b  # really two loads, not the cache
    assert torch.equal(a.train_images, b.train_images) and torch.equal(a.test_labels, b.test_labels)
    assert torch.equal(a.train_labels, b.train_labels)


def test_load_dataset_caches_per_process():
    assert load_dataset("digits") is load_dataset("digits")


def test_unknown_dataset():
    with pytest.raises(DatasetError, match="unknown dataset 'nope'.*digits"):
        load_dataset("nope")


@pytest.mark.parametrize("name", FILE_BACKED)
def test_missing_root_names_dataset_and_how_to_give_one(name):
    with pytest.raises(DatasetError) as err:
        load_dataset(name)
    msg = str(err.value)
    assert repr(name) in msg and "root=" in msg and "DDLIB_DATA" in msg


@pytest.mark.parametrize("name", FILE_BACKED)
def test_missing_or_empty_folder_errors_without_downloading(name, tmp_path):
    with pytest.raises(DatasetError, match="does not exist") as err:
        load_dataset(name, root=tmp_path / "absent")
    assert str(tmp_path / "absent") in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="nothing usable") as err:
        load_dataset(name, root=empty)
    assert str(empty) in str(err.value)
    assert list(empty.iterdir()) == []  # nothing was fetched or written


# --------------------------------------------------------------------------- MNIST-like


def _write_npz(path: Path, n_train=12, n_test=5, hw=28, seed=0):
    rng = np.random.RandomState(seed)
    arrays = dict(
        x_train=rng.randint(0, 256, (n_train, hw, hw)).astype(np.uint8),
        y_train=rng.randint(0, 10, n_train).astype(np.int64),
        x_test=rng.randint(0, 256, (n_test, hw, hw)).astype(np.uint8),
        y_test=rng.randint(0, 10, n_test).astype(np.int64),
    )
    np.savez(path, **arrays)
    return arrays


def test_mnist_from_synthetic_npz_file_folder_and_env(tmp_path, monkeypatch):
    arrays = _write_npz(tmp_path / "mnist.npz")
    for root in (tmp_path / "mnist.npz", tmp_path):
        ds = src.load_mnist(root=root, download=False)
        assert ds.train_images.shape == (12, 1, 28, 28) and ds.train_images.dtype == torch.uint8
        assert np.array_equal(ds.train_images[:, 0].numpy(), arrays["x_train"])
        assert np.array_equal(ds.test_labels.numpy(), arrays["y_test"])
        assert ds.mean == (0.1307,) and ds.std == (0.3081,)
        assert ds.class_names == tuple("0123456789")
    monkeypatch.setenv("DDLIB_DATA", str(tmp_path))
    assert load_dataset("mnist").source == str(tmp_path / "mnist.npz")


def test_npz_wrong_keys_and_unreadable(tmp_path):
    np.savez(tmp_path / "mnist.npz", images=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(DatasetError, match="missing keys") as err:
        src.load_mnist(root=tmp_path, download=False)
    assert str(tmp_path / "mnist.npz") in str(err.value) and "x_train" in str(err.value)
    (tmp_path / "mnist.npz").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match="cannot read") as err:
        src.load_mnist(root=tmp_path, download=False)
    assert str(tmp_path / "mnist.npz") in str(err.value)


def test_npz_labels_out_of_range(tmp_path):
    a = _write_npz(tmp_path / "x.npz")
    a["y_train"][0] = 10
    np.savez(tmp_path / "x.npz", **a)
    with pytest.raises(DatasetError, match="y_train has labels 0..10"):
        src.load_mnist(root=tmp_path / "x.npz", download=False)


def test_fashionmnist_npz_class_names(tmp_path):
    import torchvision

    _write_npz(tmp_path / "fashion-mnist.npz")
    ds = data.load_dataset("fashionmnist", root=tmp_path)
    assert ds.class_names == tuple(torchvision.datasets.FashionMNIST.classes)  # our copy must not drift
    assert ds.class_names[0] == "T-shirt/top" and ds.mean == (0.2861,)


def _write_idx(path: Path, arr: np.ndarray):
    code = 0x0803 if arr.ndim == 3 else 0x0801  # uint8 type, then the number of dimensions
    with open(path, "wb") as f:
        f.write(struct.pack(">I", code) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(np.uint8).tobytes())


def test_mnist_from_torchvision_layout(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.RandomState(1)
    xtr, ytr = rng.randint(0, 256, (7, 28, 28)), rng.randint(0, 10, 7)
    xte, yte = rng.randint(0, 256, (3, 28, 28)), rng.randint(0, 10, 3)
    _write_idx(raw / "train-images-idx3-ubyte", xtr)
    _write_idx(raw / "train-labels-idx1-ubyte", ytr)
    _write_idx(raw / "t10k-images-idx3-ubyte", xte)
    _write_idx(raw / "t10k-labels-idx1-ubyte", yte)
    for root in (tmp_path, tmp_path / "MNIST"):  # parent, or the dataset's own folder
        ds = src.load_mnist(root=root, download=False)
        assert ds.train_images.shape == (7, 1, 28, 28) and ds.test_images.shape == (3, 1, 28, 28)
        assert ds.train_images.dtype == torch.uint8 and ds.train_labels.dtype == torch.int64
        assert np.array_equal(ds.train_images[:, 0].numpy(), xtr)
        assert np.array_equal(ds.test_labels.numpy(), yte)


def test_mnist_shared_npz(shared_data):
    ds = load_dataset("mnist", root=shared_data)
    assert ds.train_images.shape == (60000, 1, 28, 28) and ds.test_images.shape == (10000, 1, 28, 28)
    assert ds.train_images.dtype == torch.uint8 and ds.train_labels.dtype == torch.int64
    assert int(ds.train_labels.min()) == 0 and int(ds.train_labels.max()) == 9
    assert set(ds.test_labels.tolist()) == set(range(10))
    # the published normalisation constant matches the pixels
    assert abs(float(ds.pixels("train").mean()) - ds.mean[0]) < 1e-3


# --------------------------------------------------------------------------- CIFAR torchvision layout


def test_cifar10_from_torchvision_layout(tmp_path, monkeypatch):
    import torchvision

    # Real CIFAR files are md5-checked by torchvision; synthetic ones cannot pass that check.
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    rng = np.random.RandomState(2)
    batches = {}
    for f in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
        batches[f] = {"data": rng.randint(0, 256, (2, 3072)).astype(np.uint8), "labels": list(rng.randint(0, 10, 2))}
        (base / f).write_bytes(pickle.dumps(batches[f]))
    (base / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    for root in (tmp_path, base):
        ds = src.load_cifar10(root=root, download=False)
        assert ds.train_images.shape == (10, 3, 32, 32) and ds.test_images.shape == (2, 3, 32, 32)
        assert ds.class_names == tuple(names)
        # torchvision stores channel-planar rows: image 0 of batch 1 must come back unchanged
        assert np.array_equal(ds.train_images[0].numpy().reshape(-1), batches["data_batch_1"]["data"][0])
        assert ds.test_labels.tolist() == [int(v) for v in batches["test_batch"]["labels"]]


# --------------------------------------------------------------------------- ImageFolder


def test_imagefolder_shapes_labels_class_order_and_pixels(tmp_path):
    tree = make_tree(tmp_path / "tree")
    ds = load_dataset(f"imagefolder:{tree}")
    assert ds.class_names == ("ant", "bee", "cat")  # sorted folder order, not creation order
    assert ds.train_images.shape == (9, 3, 5, 6) and ds.test_images.shape == (6, 3, 5, 6)
    assert ds.train_images.dtype == torch.uint8 and ds.train_labels.dtype == torch.int64
    assert ds.train_labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ds.test_labels.tolist() == [0, 0, 1, 1, 2, 2]
    # train/bee/1.png is the 5th training image: every pixel has its exact colour
    assert ds.train_images[4].reshape(3, -1).T.unique(dim=0).tolist() == [list(_pixel(1, 1))]
    # mean/std computed from training pixels
    px = ds.pixels("train")
    assert np.allclose(ds.mean, px.mean(dim=(0, 2, 3)).tolist(), atol=1e-5)
    assert np.allclose(ds.std, px.std(dim=(0, 2, 3), unbiased=False).tolist(), atol=1e-4)
    assert ds.extra["file_extensions"] == (".png",)


def test_imagefolder_grayscale_detected_and_mixed_becomes_rgb(tmp_path):
    gray = make_tree(tmp_path / "gray", mode="L")
    ds = load_imagefolder_dataset(gray)
    assert ds.train_images.shape == (9, 1, 5, 6) and len(ds.mean) == 1
    assert int(ds.train_images[3, 0, 0, 0]) == _pixel(1, 0)[0]
    # one colour image among grayscale ones: everything becomes RGB, grey replicated to 3 channels
    Image.new("RGB", (6, 5), (1, 2, 3)).save(gray / "test" / "cat" / "9.png")
    ds = load_imagefolder_dataset(gray)
    assert ds.train_images.shape == (9, 3, 5, 6) and ds.test_images.shape == (7, 3, 5, 6)
    assert ds.train_images[3, :, 0, 0].tolist() == [_pixel(1, 0)[0]] * 3
    assert ds.test_images[-1, :, 0, 0].tolist() == [1, 2, 3]


def test_imagefolder_mixed_sizes_error_names_file(tmp_path):
    tree = make_tree(tmp_path / "tree")
    odd = tree / "train" / "bee" / "1.png"
    Image.new("RGB", (7, 5), (0, 0, 0)).save(odd)
    with pytest.raises(DatasetError, match="share one size") as err:
        load_imagefolder_dataset(tree)
    assert str(odd) in str(err.value)


def test_imagefolder_errors_name_path_and_problem(tmp_path):
    tree = make_tree(tmp_path / "tree")
    (tree / "test" / "dog").mkdir()
    Image.new("RGB", (6, 5)).save(tree / "test" / "dog" / "0.png")
    with pytest.raises(DatasetError, match=r"differ from train/.*extra \['dog'\]") as err:
        load_imagefolder_dataset(tree)
    assert str(tree / "test") in str(err.value)

    tree2 = make_tree(tmp_path / "tree2")
    bad = tree2 / "train" / "ant" / "0.png"
    bad.write_bytes(b"garbage")
    with pytest.raises(DatasetError, match="cannot read image") as err:
        load_imagefolder_dataset(tree2)
    assert str(bad) in str(err.value)

    with pytest.raises(DatasetError, match="does not exist"):
        load_imagefolder_dataset(tmp_path / "nothing")
    (tmp_path / "flat").mkdir()
    with pytest.raises(DatasetError, match="needs a train/ folder") as err:
        load_imagefolder_dataset(tmp_path / "flat")
    assert str(tmp_path / "flat") in str(err.value)


def test_imagefolder_val_split_used_when_no_test(tmp_path):
    tree = make_tree(tmp_path / "tree", test_split="val", n_test=1)
    ds = load_imagefolder_dataset(tree)
    assert ds.test_images.shape[0] == 3 and ds.extra["test_split"] == "val"


def test_disk_cache_written_outside_data_and_reused(tmp_path, monkeypatch):
    cache = tmp_path / "my-cache"
    monkeypatch.setenv("DDLIB_CACHE", str(cache))
    tree = make_tree(tmp_path / "tree")
    before = sorted(p for p in tree.rglob("*"))
    first = load_imagefolder_dataset(tree)
    assert first.extra["from_cache"] is False
    files = list((cache / "decoded").glob("*.npz"))
    assert len(files) == 1 and first.extra["cache_file"] == str(files[0])
    assert sorted(p for p in tree.rglob("*")) == before  # nothing written into the data folder

    # the second load must not decode: make decoding impossible and check it still works
    with monkeypatch.context() as m:
        m.setattr(ddlib.data.decode, "_decode_files", lambda *a, **k: pytest.fail("decoded instead of using the cache"))
        second = load_imagefolder_dataset(tree)
    assert second.extra["from_cache"] is True
    assert torch.equal(first.train_images, second.train_images) and second.mean == first.mean

    # a changed tree gets a new key (and the stale file is replaced)
    Image.new("RGB", (6, 5), (9, 9, 9)).save(tree / "train" / "ant" / "7.png")
    third = load_imagefolder_dataset(tree)
    assert third.extra["from_cache"] is False and third.train_images.shape[0] == 10
    assert [str(p) for p in (cache / "decoded").glob("*.npz")] == [third.extra["cache_file"]]


def test_corrupt_disk_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path / "c"))
    tree = make_tree(tmp_path / "tree")
    first = load_imagefolder_dataset(tree)
    cache_file = Path(first.extra["cache_file"])
    cache_file.write_bytes(cache_file.read_bytes()[:100])  # truncated
    with pytest.warns(UserWarning, match="ignoring unreadable decoded cache"):
        again = load_imagefolder_dataset(tree)
    assert again.extra["from_cache"] is False and torch.equal(again.train_images, first.train_images)
    assert load_imagefolder_dataset(tree).extra["from_cache"] is True  # rewritten and readable


def test_tinyimagenet_original_layout(tmp_path):
    root = tmp_path / "tiny-imagenet-200"
    wnids = ["n02", "n01"]
    for w in wnids:
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        (root / "train" / w / f"{w}_boxes.txt").write_text("ignored\n")
        for i in range(2):
            Image.new("RGB", (64, 64), (i, 0, 0)).save(d / f"{w}_{i}.JPEG")
    Image.new("L", (64, 64), 50).save(root / "train" / "n01" / "images" / "n01_2.JPEG")  # some are grayscale
    (root / "val" / "images").mkdir(parents=True)
    (root / "test" / "images").mkdir(parents=True)  # unlabelled test set: must be skipped
    Image.new("RGB", (64, 64)).save(root / "test" / "images" / "test_0.JPEG")
    lines = []
    for i, w in enumerate(["n01", "n02", "n02"]):
        Image.new("RGB", (64, 64), (0, i, 0)).save(root / "val" / "images" / f"val_{i}.JPEG")
        lines.append(f"val_{i}.JPEG\t{w}\t0\t0\t10\t10")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    (root / "words.txt").write_text("n01\tgoldfish\nn02\tsalamander\nn99\tother\n")

    ds = load_dataset("tinyimagenet", root=tmp_path)  # parent of tiny-imagenet-200/
    assert ds.class_names == ("n01", "n02") and ds.extra["class_descriptions"] == ("goldfish", "salamander")
    assert ds.train_images.shape == (5, 3, 64, 64) and ds.test_images.shape == (3, 3, 64, 64)
    assert ds.train_labels.tolist() == [0, 0, 0, 1, 1] and ds.test_labels.tolist() == [0, 1, 1]
    assert ds.train_images[2, :, 0, 0].tolist() == [50, 50, 50]  # grayscale JPEG read as RGB
    assert ds.mean == (0.485, 0.456, 0.406)


def test_cifar10_imagefolder_wrong_class_count(tmp_path):
    make_tree(tmp_path / "cifar10")
    with pytest.raises(DatasetError, match="expected 10 class folders") as err:
        load_dataset("cifar10", root=tmp_path)
    assert str(tmp_path / "cifar10" / "train") in str(err.value)


# --------------------------------------------------------------------------- archives


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_extract_archive_once(tmp_path, kind, monkeypatch):
    tree = make_tree(tmp_path / "src" / "mydata")
    archive = tmp_path / f"mydata.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for p in tree.rglob("*.png"):
                zf.write(p, p.relative_to(tree.parent))  # wrapped in mydata/
    else:
        with tarfile.open(archive, "w:gz") as tf:
            tf.add(tree / "train", "train")
            tf.add(tree / "test", "test")
    dest = tmp_path / "out"
    found = extract_archive(archive, dest)
    assert (found / "train" / "ant" / "0.png").is_file() and (found / "test").is_dir()
    assert found == (dest / "mydata" if kind == "zip" else dest)
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]  # temp dir renamed away
    # a second call re-uses the extraction: opening the archive again would fail here
    with monkeypatch.context() as m:
        m.setattr(tarfile, "open", lambda *a, **k: pytest.fail("extracted twice"))
        m.setattr(zipfile, "ZipFile", lambda *a, **k: pytest.fail("extracted twice"))
        assert extract_archive(archive, dest) == found
    ds = load_imagefolder_dataset(found)
    assert ds.class_names == ("ant", "bee", "cat")


def test_extract_archive_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        extract_archive(tmp_path / "missing.tar.gz", tmp_path / "out")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(DatasetError, match="cannot extract") as err:
        extract_archive(bad, tmp_path / "out")
    assert str(bad) in str(err.value) and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- real CIFAR-10 (JPEG)


@pytest.mark.slow
def test_cifar10_jpeg_tree(cifar10_jpeg_root, monkeypatch):
    """The first run decodes 60,000 JPEGs (~10 s on 2 cores); later runs read the decode cache."""
    # The real cache (not tmp_path), so the decode is paid once per machine, not once per test run.
    if _USER_CACHE:
        monkeypatch.setenv("DDLIB_CACHE", _USER_CACHE)
    else:
        monkeypatch.delenv("DDLIB_CACHE", raising=False)
    ds = load_dataset("cifar10", root=cifar10_jpeg_root)
    assert ds.train_images.shape == (50000, 3, 32, 32) and ds.test_images.shape == (10000, 3, 32, 32)
    assert ds.train_images.dtype == torch.uint8
    assert ds.class_names == (
        "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
    )
    assert np.bincount(ds.train_labels.numpy()).tolist() == [5000] * 10
    assert np.bincount(ds.test_labels.numpy()).tolist() == [1000] * 10
    assert ds.mean == (0.4914, 0.4822, 0.4465)
    # the JPEG pixels agree with the published CIFAR-10 channel means
    assert np.allclose(ds.extra["computed_mean"], ds.mean, atol=3e-3)


def test_digits_are_scikit_learns_load_digits_bit_for_bit():
    """digits reads sklearn's table without importing sklearn: the same pixels, labels and order."""
    import numpy as np
    from sklearn.datasets import load_digits

    from ddlib.data.datasets import _digits_table

    bunch = load_digits()
    table = _digits_table()
    assert np.array_equal(table[:, :-1], bunch.data) and np.array_equal(table[:, -1].astype(int), bunch.target)
    # and the layout: row-major, as every dataset's (ddlib.data.layout; NumPy's indexing gives stride 1
    # on the channel axis, on which the convolutions round otherwise and run slower)
    from ddlib.data.datasets import load_dataset

    digits = load_dataset("digits")
    assert digits.train_images.stride() == (64, 64, 8, 1) and digits.test_images.stride() == (64, 64, 8, 1)
