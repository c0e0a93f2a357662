"""Distilled-set loading: every format reads to the same pixels, and every kind of bad file is refused
with a message naming the file and the problem (a silently wrong set would give a wrong score)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ddlib.data.datasets import Dataset
from ddlib.data.distilled import DistilledSet, DistilledSetError, image_grid, load, save, validate

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DISTILLED = SHARED / "distilled"

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)


def make_dataset(name, shape, classes, mean, std) -> Dataset:
    """A stand-in real dataset: only the metadata and image shape matter to the loader."""
    gen = torch.Generator().manual_seed(0)
    n = 2 * len(classes)
    labels = torch.arange(len(classes)).repeat(2)
    return Dataset(
        name=name,
        train_images=torch.rand((n, *shape), generator=gen),
        train_labels=labels,
        test_images=torch.rand((n, *shape), generator=gen),
        test_labels=labels.clone(),
        class_names=tuple(classes),
        mean=tuple(mean),
        std=tuple(std),
        source="test stub",
    )


@pytest.fixture
def fake_dataset():
    """Factory ``fake_dataset(name, shape, classes, mean, std)`` for a stub :class:`Dataset`."""
    return make_dataset


@pytest.fixture
def cifar10(fake_dataset):
    return fake_dataset("cifar10", (3, 32, 32), CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD)


@pytest.fixture
def mnist(fake_dataset):
    return fake_dataset("mnist", (1, 28, 28), [str(i) for i in range(10)], MNIST_MEAN, MNIST_STD)


def pixels(n_per_class=2, shape=(3, 32, 32), classes=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand((n_per_class * classes, *shape), generator=gen)
    labels = torch.arange(classes).repeat_interleave(n_per_class)
    return images, labels


def normalise(images, mean, std):
    return (images - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def refused(path, **kwargs) -> str:
    """Load ``path`` expecting a refusal; return the message after checking it names the file."""
    with pytest.raises(DistilledSetError) as info:
        load(path, **kwargs)
    message = str(info.value)
    assert message.startswith(str(path)), message
    return message


# --------------------------------------------------------------------------- formats


def test_dc_format_denormalises_and_records_accuracies(tmp_path, cifar10):
    images, labels = pixels()
    other, _ = pixels(seed=1)
    path = tmp_path / "res_DC_CIFAR10_ConvNet_2ipc.pt"
    accs = {"ConvNet": [np.float64(0.25), np.float64(0.27)], "MLP": np.array([0.2, 0.21])}
    data = [[normalise(other, CIFAR10_MEAN, CIFAR10_STD), labels], [normalise(images, CIFAR10_MEAN, CIFAR10_STD), labels]]
    torch.save({"data": data, "accs_all_exps": accs}, path)

    ds = load(path, cifar10)
    assert torch.allclose(ds.images, images, atol=1e-5)
    assert ds.labels.dtype == torch.int64 and torch.equal(ds.labels, labels)
    assert ds.ipc == 2 and ds.method == path.stem and ds.source == str(path)
    assert ds.provenance["format"] == "dc"
    assert ds.provenance["experiment_index"] == 1 and ds.provenance["num_experiments"] == 2
    assert ds.provenance["accs_all_exps"] == {"ConvNet": [0.25, 0.27], "MLP": [0.2, 0.21]}
    assert all(type(v) is float for v in ds.provenance["accs_all_exps"]["ConvNet"])

    first = load(path, cifar10, experiment_index=0, method="DC")
    assert torch.allclose(first.images, other, atol=1e-5) and first.method == "DC"
    assert first.provenance["experiment_index"] == 0
    # Caller override: treat the stored values as pixels (they are then far outside [0, 1], but the caller said so).
    raw = load(path, cifar10, normalized=False)
    assert torch.allclose(raw.images, data[1][0])


def test_mtt_directory_and_images_file(tmp_path, cifar10):
    images, labels = pixels()
    run = tmp_path / "mtt-run"
    run.mkdir()
    torch.save(normalise(images, CIFAR10_MEAN, CIFAR10_STD).requires_grad_(), run / "images_best.pt")
    torch.save(labels, run / "labels_best.pt")
    torch.save(torch.tensor(0.0123), run / "lr_best.pt")

    ds = load(run, cifar10)
    assert torch.allclose(ds.images, images, atol=1e-5)
    assert torch.equal(ds.labels, labels)
    assert isinstance(ds.learned_lr, float) and math.isclose(ds.learned_lr, 0.0123, rel_tol=1e-6)
    assert ds.method == "mtt-run" and ds.provenance["format"] == "mtt" and ds.soft_labels is None

    by_file = load(run / "images_best.pt", cifar10)
    assert torch.equal(by_file.images, ds.images) and by_file.method == "mtt-run"


def test_mtt_soft_labels_take_argmax(tmp_path, cifar10):
    images, labels = pixels()
    soft = torch.nn.functional.one_hot(labels, 10).float() * 5 + torch.rand(len(labels), 10)
    torch.save(normalise(images, CIFAR10_MEAN, CIFAR10_STD), tmp_path / "images_best.pt")
    torch.save(soft, tmp_path / "labels_best.pt")
    ds = load(tmp_path, cifar10)
    assert torch.equal(ds.labels, labels)
    assert torch.equal(ds.soft_labels, soft)
    assert ds.learned_lr is None


def test_plain_pt_pixels_soft_labels_and_lr(tmp_path, cifar10):
    images, labels = pixels()
    soft = torch.softmax(torch.randn(len(labels), 10), dim=1)
    path = tmp_path / "plain.pt"
    torch.save({"images": images, "labels": labels, "soft_labels": soft, "lr": 0.01}, path)
    ds = load(path, cifar10)
    assert torch.equal(ds.images, images) and torch.equal(ds.labels, labels)
    assert torch.equal(ds.soft_labels, soft) and ds.learned_lr == 0.01
    assert ds.method == "plain" and ds.provenance["format"] == "pt"


def test_plain_pt_normalised_by_flag_or_argument(tmp_path, cifar10):
    images, labels = pixels()
    stored = normalise(images, CIFAR10_MEAN, CIFAR10_STD)
    flagged = tmp_path / "flagged.pt"
    torch.save({"images": stored, "labels": labels, "normalized": True}, flagged)
    assert torch.allclose(load(flagged, cifar10).images, images, atol=1e-5)

    unflagged = tmp_path / "unflagged.pt"
    torch.save({"images": stored, "labels": labels}, unflagged)
    assert torch.allclose(load(unflagged, cifar10, normalized=True).images, images, atol=1e-5)


def test_npz_uint8_nhwc(tmp_path, cifar10):
    images, labels = pixels()
    as_uint8 = (images * 255).round().to(torch.uint8)
    path = tmp_path / "set.npz"
    np.savez(path, images=as_uint8.permute(0, 2, 3, 1).numpy(), labels=labels.numpy().astype(np.int32))
    ds = load(path, cifar10)
    assert ds.images.dtype == torch.float32 and ds.image_shape == (3, 32, 32)
    assert torch.equal(ds.images, as_uint8.float() / 255)
    assert ds.labels.dtype == torch.int64 and torch.equal(ds.labels, labels)


def test_npz_float_nchw_with_soft_labels(tmp_path, cifar10):
    images, labels = pixels()
    soft = np.eye(10, dtype=np.float32)[labels.numpy()]
    path = tmp_path / "set.npz"
    np.savez(path, images=images.numpy(), labels=labels.numpy(), soft_labels=soft)
    ds = load(path, cifar10)
    assert torch.equal(ds.images, images)
    assert torch.equal(ds.soft_labels, torch.from_numpy(soft))


def test_npz_grayscale_nhw_and_nhwc(tmp_path, mnist):
    images, labels = pixels(shape=(1, 28, 28))
    for name, arr in [("nhw", images[:, 0].numpy()), ("nhwc", images.permute(0, 2, 3, 1).numpy())]:
        path = tmp_path / f"{name}.npz"
        np.savez(path, images=arr, labels=labels.numpy())
        ds = load(path, mnist)
        assert ds.image_shape == (1, 28, 28) and torch.equal(ds.images, images), name


def write_imagefolder(root: Path, images: torch.Tensor, labels: torch.Tensor, names, ext=".png"):
    as_uint8 = (images * 255).round().to(torch.uint8)
    for i, (img, label) in enumerate(zip(as_uint8, labels)):
        folder = root / names[int(label)]
        folder.mkdir(parents=True, exist_ok=True)
        arr = img.permute(1, 2, 0).numpy()
        Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr).save(folder / f"{i:03d}{ext}")
    return as_uint8.float() / 255


def test_imagefolder_with_class_names(tmp_path, cifar10):
    images, labels = pixels()
    expected = write_imagefolder(tmp_path / "grid", images, labels, CIFAR10_CLASSES)
    (tmp_path / "grid" / "airplane" / "notes.txt").write_text("ignored")
    ds = load(tmp_path / "grid", cifar10)
    assert torch.equal(ds.labels, labels)
    assert torch.equal(ds.images, expected)  # PNG is lossless
    assert ds.method == "grid" and ds.provenance["format"] == "imagefolder"
    assert ds.provenance["ignored_files"] == ["airplane/notes.txt"]  # not an image: skipped, and said


def test_imagefolder_with_indices_grayscale(tmp_path, mnist):
    images, labels = pixels(shape=(1, 28, 28))
    expected = write_imagefolder(tmp_path / "syn", images, labels, [str(i) for i in range(10)])
    ds = load(tmp_path / "syn", mnist)
    assert ds.image_shape == (1, 28, 28)
    assert torch.equal(ds.labels, labels) and torch.equal(ds.images, expected)


def test_imagefolder_jpeg_rgb_converted_to_dataset_channels(tmp_path, mnist):
    images, labels = pixels(shape=(3, 28, 28))  # RGB JPEGs for a grayscale dataset: converted to "L"
    write_imagefolder(tmp_path / "jpg", images, labels, [str(i) for i in range(10)], ext=".jpg")
    ds = load(tmp_path / "jpg", mnist)
    assert ds.image_shape == (1, 28, 28) and ds.ipc == 2
    assert 0.0 <= float(ds.images.min()) and float(ds.images.max()) <= 1.0


def test_save_load_round_trip(tmp_path, cifar10):
    images, labels = pixels()
    original = DistilledSet(
        images=images * 1.6 - 0.3,  # synthetic pixels may stray outside [0, 1]: kept as they are
        labels=labels,
        num_classes=10,
        soft_labels=torch.softmax(torch.randn(len(labels), 10), dim=1),
        learned_lr=0.005,
        method="MyMethod",
        provenance={"format": "dc", "accs_all_exps": {"ConvNet": [0.4, 0.41]}, "note": "x"},
    )
    path = save(original, tmp_path / "out" / "set.pt")
    assert torch.load(path, weights_only=True)["method"] == "MyMethod"  # no pickled objects
    back = load(path, cifar10)
    assert torch.equal(back.images, original.images)
    assert torch.equal(back.labels, original.labels)
    assert torch.equal(back.soft_labels, original.soft_labels)
    assert back.learned_lr == original.learned_lr
    assert back.method == original.method
    assert back.provenance == original.provenance
    assert back.num_classes == original.num_classes


def test_round_trip_without_optional_fields(tmp_path, mnist):
    images, labels = pixels(shape=(1, 28, 28))
    original = DistilledSet(images=images, labels=labels, num_classes=10, method="m")
    back = load(save(original, tmp_path / "set.pt"), mnist)
    assert torch.equal(back.images, images) and back.soft_labels is None and back.learned_lr is None
    assert back.provenance == {"format": "pt"}


def test_zca_space_sets_are_kept_as_stored_and_flagged(tmp_path, cifar10):
    # MTT/DATM with --zca save whitened images (values far outside [0, 1]): read as they are, marked,
    # never de-normalised as if they were normalised pixels (the protocol inverts the whitening)
    images, labels = pixels()
    whitened = torch.randn(images.shape, generator=torch.Generator().manual_seed(1)) * 4
    torch.save({"images": whitened, "labels": labels, "zca_space": True}, tmp_path / "flagged.pt")
    back = load(tmp_path / "flagged.pt", cifar10)
    assert back.zca_space and torch.equal(back.images, whitened) and "zca_space" in back.provenance
    mtt = tmp_path / "mtt"
    mtt.mkdir()
    torch.save(whitened, mtt / "images_best.pt")
    torch.save(labels, mtt / "labels_best.pt")
    assert not torch.equal(load(mtt, cifar10).images, whitened)  # an MTT folder is read as normalised by default
    flagged = load(mtt, cifar10, zca_space=True)  # the source spec's zca_space: true
    assert flagged.zca_space and torch.equal(flagged.images, whitened)
    again = load(save(flagged, tmp_path / "saved.pt"), cifar10)
    assert again.zca_space and torch.equal(again.images, whitened)
    assert not load(save(DistilledSet(images, labels, 10), tmp_path / "pixels.pt"), cifar10).zca_space


@pytest.mark.parametrize("shape,max_per_class,ncol", [((3, 32, 32), 10, 3), ((1, 28, 28), 2, 2)])
def test_image_grid(tmp_path, shape, max_per_class, ncol):
    images, labels = pixels(n_per_class=3, shape=shape)
    ds = DistilledSet(images=images * 3 - 1, labels=labels, num_classes=10)  # out of range: clamped for display
    out = image_grid(ds, tmp_path / "grid" / "set.png", max_per_class=max_per_class)
    assert out.exists()
    with Image.open(out) as img:
        h, w = shape[1:]
        assert img.size == (ncol * (w + 2) + 2, 10 * (h + 2) + 2)
    assert torch.equal(ds.images, images * 3 - 1)  # the set itself is untouched


def test_image_grid_unequal_classes(tmp_path):
    labels = torch.tensor([0, 0, 0, 1])
    ds = DistilledSet(images=torch.rand(4, 3, 8, 8), labels=labels, num_classes=2)
    with Image.open(image_grid(ds, tmp_path / "g.png")) as img:
        assert img.size == (3 * 10 + 2, 2 * 10 + 2)


# --------------------------------------------------------------------------- real DC files

REAL = [
    ("dc_cifar10_convnet_ipc1.pt", "cifar10", 1, 0.265),
    ("dc_cifar10_convnet_ipc10.pt", "cifar10", 10, 0.422),
    ("dc_mnist_convnet_ipc1.pt", "mnist", 1, 0.91),
]


@pytest.mark.skipif(not DISTILLED.is_dir(), reason=f"shared data not present at {DISTILLED}")
@pytest.mark.parametrize("name,dataset_name,ipc,convnet_acc", REAL)
def test_real_dc_files(name, dataset_name, ipc, convnet_acc, cifar10, mnist):
    dataset = cifar10 if dataset_name == "cifar10" else mnist
    ds = load(DISTILLED / name, dataset)
    assert ds.ipc == ipc and len(ds) == 10 * ipc and ds.class_counts == [ipc] * 10
    assert ds.image_shape == dataset.image_shape
    assert ds.provenance["format"] == "dc"
    accs = ds.provenance["accs_all_exps"]
    assert all(isinstance(a, float) for a in accs["ConvNet"])
    assert abs(float(np.mean(accs["ConvNet"])) - convnet_acc) < 0.02
    # De-normalised, so pixel-scale: centred in [0, 1] with DC's usual overshoot, not normalised (std ~1, min < -2).
    lo, hi, mean = float(ds.images.min()), float(ds.images.max()), float(ds.images.mean())
    print(f"{name}: ipc={ds.ipc} pixels min={lo:.3f} max={hi:.3f} mean={mean:.3f}")
    assert -2.0 < lo < 0.5 and 0.5 < hi < 3.0 and 0.0 < mean < 1.0
    q01, q99 = torch.quantile(ds.images.flatten(), torch.tensor([0.01, 0.99])).tolist()
    assert -0.5 < q01 and q99 < 2.0


@pytest.mark.skipif(not DISTILLED.is_dir(), reason=f"shared data not present at {DISTILLED}")
def test_real_mnist_experiments(mnist):
    path = DISTILLED / "dc_mnist_convnet_ipc1.pt"
    last, first = load(path, mnist), load(path, mnist, experiment_index=0)
    assert last.provenance["experiment_index"] == 4 and first.provenance["experiment_index"] == 0
    assert not torch.equal(last.images, first.images)
    assert "5 experiment(s)" in refused(path, dataset=mnist, experiment_index=5)


@pytest.mark.skipif(not DISTILLED.is_dir(), reason=f"shared data not present at {DISTILLED}")
def test_real_mnist_file_refused_for_cifar10(cifar10):
    path = DISTILLED / "dc_mnist_convnet_ipc1.pt"
    assert "expected (3, 32, 32) for cifar10, got (1, 28, 28)" in refused(path, dataset=cifar10)


# --------------------------------------------------------------------------- refusals


def save_plain(path, **entries):
    torch.save(entries, path)
    return path


def test_refuses_missing_path(tmp_path, cifar10):
    assert "no such file" in refused(tmp_path / "nope.pt", dataset=cifar10)


def test_refuses_truncated_pt(tmp_path, cifar10):
    images, labels = pixels()
    whole = save_plain(tmp_path / "whole.pt", images=images, labels=labels)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    message = refused(cut, dataset=cifar10)
    assert "unreadable or corrupt" in message


def test_refuses_garbage_pt(tmp_path, cifar10):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"this is not a torch file\x00\x01\x02" * 10)
    assert "unreadable or corrupt" in refused(path, dataset=cifar10)


def test_refuses_corrupt_npz(tmp_path, cifar10):
    path = tmp_path / "bad.npz"
    path.write_bytes(b"PK\x03\x04 truncated zip")
    assert "unreadable or corrupt" in refused(path, dataset=cifar10)


def test_refuses_corrupt_png(tmp_path, cifar10):
    images, labels = pixels()
    write_imagefolder(tmp_path / "f", images, labels, CIFAR10_CLASSES)
    (tmp_path / "f" / "cat" / "broken.png").write_bytes(b"\x89PNG not really")
    message = refused(tmp_path / "f", dataset=cifar10)
    assert "unreadable or corrupt image" in message and "broken.png" in message


@pytest.mark.parametrize("kind", ["extension", "bare tensor", "unknown keys", "empty dir"])
def test_refuses_unknown_format(tmp_path, cifar10, kind):
    if kind == "extension":
        path = tmp_path / "set.h5"
        path.write_bytes(b"\x89HDF")
    elif kind == "bare tensor":
        path = tmp_path / "tensor.pt"
        torch.save(torch.zeros(3), path)
    elif kind == "unknown keys":
        path = save_plain(tmp_path / "weights.pt", state_dict={"w": torch.zeros(1)})
    else:
        path = tmp_path / "empty"
        path.mkdir()
    assert "unknown format" in refused(path, dataset=cifar10)


def test_refuses_missing_keys(tmp_path, cifar10):
    images, _ = pixels()
    path = save_plain(tmp_path / "nolabels.pt", images=images)
    message = refused(path, dataset=cifar10)
    assert "missing keys" in message and "labels" in message

    npz = tmp_path / "nolabels.npz"
    np.savez(npz, images=images.numpy())
    assert "missing keys" in refused(npz, dataset=cifar10)


def test_refuses_mtt_without_labels(tmp_path, cifar10):
    images, _ = pixels()
    torch.save(images, tmp_path / "images_best.pt")
    message = refused(tmp_path / "images_best.pt", dataset=cifar10)
    assert "labels" in message


def test_refuses_wrong_image_shape(tmp_path, cifar10):
    images, labels = pixels(shape=(1, 28, 28))
    path = save_plain(tmp_path / "mnistlike.pt", images=images, labels=labels)
    assert "expected (3, 32, 32) for cifar10, got (1, 28, 28)" in refused(path, dataset=cifar10)


def test_refuses_wrong_image_size_in_imagefolder(tmp_path, cifar10):
    images, labels = pixels(shape=(3, 16, 16))
    write_imagefolder(tmp_path / "small", images, labels, CIFAR10_CLASSES)
    assert "expected (3, 32, 32) for cifar10, got (3, 16, 16)" in refused(tmp_path / "small", dataset=cifar10)


def test_refuses_label_count_mismatch(tmp_path, cifar10):
    images, labels = pixels()
    path = save_plain(tmp_path / "n.pt", images=images, labels=labels[:-1])
    assert "number of labels (19) does not match number of images (20)" in refused(path, dataset=cifar10)


def test_refuses_float_labels(tmp_path, cifar10):
    images, labels = pixels()
    path = save_plain(tmp_path / "f.pt", images=images, labels=labels.float())
    assert "labels must be integer" in refused(path, dataset=cifar10)


def test_refuses_labels_out_of_range(tmp_path, cifar10):
    images, labels = pixels()
    labels = labels.clone()
    labels[0], labels[1] = 10, -1
    path = save_plain(tmp_path / "r.pt", images=images, labels=labels)
    message = refused(path, dataset=cifar10)
    assert "labels out of range" in message and "0..9" in message and "10" in message and "-1" in message


def test_refuses_missing_classes(tmp_path, cifar10):
    images, labels = pixels()
    keep = (labels != 3) & (labels != 7)
    path = save_plain(tmp_path / "m.pt", images=images[keep], labels=labels[keep])
    message = refused(path, dataset=cifar10)
    assert "classes missing" in message and "3 (cat)" in message and "7 (horse)" in message


def test_refuses_unequal_classes_unless_allowed(tmp_path, cifar10):
    images, labels = pixels()
    path = save_plain(tmp_path / "u.pt", images=images[1:], labels=labels[1:])
    message = refused(path, dataset=cifar10)
    assert "unequal images per class" in message and "airplane=1" in message and "automobile=2" in message
    assert "allow_unequal" in message
    ds = load(path, cifar10, allow_unequal=True)
    assert ds.class_counts[0] == 1 and ds.ipc == 2


def test_refuses_nan_images(tmp_path, cifar10):
    images, labels = pixels()
    images[3, 0, 0, 0] = float("nan")
    images[4, 1, 2, 3] = float("inf")
    path = save_plain(tmp_path / "nan.pt", images=images, labels=labels)
    assert "images contain 2 NaN/Inf values" in refused(path, dataset=cifar10)


def test_refuses_nan_in_normalised_dc_file(tmp_path, cifar10):
    images, labels = pixels()
    images[0, 0, 0, 0] = float("nan")
    path = tmp_path / "dc.pt"
    torch.save({"data": [[images, labels]], "accs_all_exps": {}}, path)
    assert "NaN/Inf" in refused(path, dataset=cifar10)


def test_refuses_non_finite_soft_labels(tmp_path, cifar10):
    images, labels = pixels()
    soft = torch.full((20, 10), 0.1)
    soft[5, 5] = float("inf")
    path = save_plain(tmp_path / "s.pt", images=images, labels=labels, soft_labels=soft)
    assert "soft labels contain 1 NaN/Inf" in refused(path, dataset=cifar10)


def test_refuses_soft_labels_wrong_shape(tmp_path, cifar10):
    images, labels = pixels()
    path = save_plain(tmp_path / "s.pt", images=images, labels=labels, soft_labels=torch.rand(20, 100))
    assert "soft labels must be N x num_classes = (20, 10), got (20, 100)" in refused(path, dataset=cifar10)


def test_refuses_values_far_outside_pixel_range(tmp_path, cifar10):
    images, labels = pixels()
    path = tmp_path / "scaled.npz"
    np.savez(path, images=images.numpy() * 255, labels=labels.numpy())  # float 0-255: neither pixels nor uint8
    message = refused(path, dataset=cifar10)
    assert "far outside [0, 1]" in message and "normalized=True" in message and "uint8" in message

    tens = tmp_path / "tens.npz"  # 0-10 values declared as pixels: never trained on as pixels
    np.savez(tens, images=images.numpy() * 10, labels=labels.numpy())
    assert "read as pixels (declared) but values span" in refused(tens, dataset=cifar10, normalized=False)

    stored = normalise(images, CIFAR10_MEAN, CIFAR10_STD)
    pt = save_plain(tmp_path / "normalised.pt", images=stored, labels=labels)
    assert "normalized=True" in refused(pt, dataset=cifar10)
    assert torch.allclose(load(pt, cifar10, normalized=True).images, images, atol=1e-5)


def test_refuses_unrecognised_class_folders(tmp_path, cifar10):
    images, labels = pixels()
    names = list(CIFAR10_CLASSES)
    names[2] = "birb"
    write_imagefolder(tmp_path / "f", images, labels, names)
    message = refused(tmp_path / "f", dataset=cifar10)
    assert "class folders not recognised: birb" in message


def test_validate_accepts_in_memory_set(cifar10):
    images, labels = pixels()
    validate(DistilledSet(images=images, labels=labels, num_classes=10), cifar10, "<memory>")
    with pytest.raises(DistilledSetError, match="^<memory>: classes missing"):
        validate(DistilledSet(images=images[:2], labels=labels[:2], num_classes=10), cifar10, "<memory>")
