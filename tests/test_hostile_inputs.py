"""Hostile input, table-driven: each row is a bad params file or input file and the message it must
give (naming the file and the problem). Every row goes through `python -m ddlib run` (in-process):
exit status 2, one clear line, no traceback, and nothing written to the store (not even the
database file), so no FINISHED run and nothing half-written.

Then what is not an error any more (16-bit PNGs, uint8 images in a DC-format file, braces in file
names, relative teacher checkpoints), trust (``trusted: true``) and non-finite training.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from ddlib.cli import main as cli_main
from ddlib.data.datasets import load_dataset
from ddlib.data.distilled import DistilledSetError, load
from ddlib.run.runner import expand, load_grid

pytestmark = pytest.mark.usefixtures("one_thread")

DIGITS = dict(classes=10, shape=(1, 8, 8))
BASE = {
    "protocol": "label_robust",
    "params": {"dataset": "digits", "seeds": [0], "recipe": {"epochs": 1}, "real_recipe": {"epochs": 1}},
    "grid": {"method": ["pub"], "ipc": [1]},
}
NAS_ARCHS = [
    "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|nor_conv_3x3~2|",
    "|avg_pool_3x3~0|+|nor_conv_1x1~0|skip_connect~1|+|nor_conv_1x1~0|skip_connect~1|skip_connect~2|",
    "|nor_conv_1x1~0|+|none~0|nor_conv_3x3~1|+|nor_conv_3x3~0|avg_pool_3x3~1|nor_conv_1x1~2|",
]


def good_images(n_per_class: int = 1, shape=DIGITS["shape"]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(DIGITS["classes"]).repeat_interleave(n_per_class)
    return torch.rand((len(labels), *shape), generator=g), labels


class Payload:
    """Unpickling it runs a shell command (it must never run)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# --------------------------------------------------------------------------- builders
# Each returns (grid mapping, or raw YAML text) and writes what it needs under tmp.


def _with_set(write):
    """A grid whose method 'pub' reads the file (or folder) ``write(tmp)`` creates."""
    def build(tmp: Path):
        path = write(tmp)
        return {**BASE, "methods": {"pub": {"kind": "file", "path": str(path)}}}
    return build


def _pt(name: str, payload) -> callable:
    def write(tmp: Path) -> Path:
        path = tmp / name
        torch.save(payload() if callable(payload) else payload, path)
        return path
    return _with_set(write)


def _truncated(tmp: Path) -> Path:
    path = tmp / "truncated.pt"
    images, labels = good_images()
    torch.save({"images": images, "labels": labels}, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _pickle_bomb(tmp: Path) -> Path:
    path = tmp / "bomb.pt"
    images, labels = good_images()
    torch.save({"images": images, "labels": labels, "provenance": {"x": Payload(tmp / "PWNED")}}, path)
    return path


def _dc_scaled(tmp: Path) -> Path:
    path = tmp / "dc_scaled.pt"
    images, labels = good_images()
    torch.save({"data": [[images * 1e30, labels]]}, path)
    return path


def _png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _folder(classes: list[str]):
    def write(tmp: Path) -> Path:
        root = tmp / "folder_set"
        for c in classes:
            _png(root / c / "a.png", np.full((8, 8), 128, dtype=np.uint8))
        return root
    return _with_set(write)


def _params(**changes):
    def build(tmp: Path):
        grid = {**BASE, "params": {**BASE["params"]}, "grid": {"method": ["random"], "ipc": [1]}}
        for key, value in changes.items():
            if key in ("grid", "colour"):
                grid[key] = value
            else:
                grid["params"][key] = value
        return grid
    return build


def _text(text: str | bytes):
    return lambda tmp: text


def _teacher_for_another_arch(tmp: Path):
    from ddlib.models import create_model

    path = tmp / "convnet_teacher.pt"
    torch.save(create_model("convnet", 1, 10, (8, 8)).state_dict(), path)
    grid = _params(preset="sre2l", teacher_checkpoints=[str(path)])(tmp)
    return grid


def _nan_teacher(tmp: Path):
    """An SRe2L teacher (a ResNet-18 for digits) whose first convolution's weights are NaN."""
    from ddlib.models import create_model

    path = tmp / "nan_teacher.pt"
    state = create_model("resnet18_bn", 1, 10, (8, 8)).state_dict()
    state["conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(state, path)
    return _params(preset="sre2l", teacher_checkpoints=[str(path)])(tmp)


def _mtt_nan_lr(tmp: Path) -> Path:
    """An MTT folder whose learned lr (lr_best.pt) is NaN."""
    root = tmp / "mtt_set"
    root.mkdir()
    images, labels = good_images()
    for name, value in (("images", images), ("labels", labels), ("lr", torch.tensor(float("nan")))):
        torch.save(value, root / f"{name}_best.pt")
    return root


def _privacy_members(members: int, test_size: int):
    return lambda tmp: {"protocol": "privacy", "grid": {"method": ["random"], "ipc": [1]},
                        "params": {"dataset": "digits", "seeds": [0], "members": members, "test_size": test_size}}


def _model_for_another_arch(tmp: Path):
    """A released model (``kind: checkpoint``) whose weights are a ResNet-18's, named as a ConvNet."""
    from ddlib.models import create_model

    path = tmp / "released_seed0.pt"
    torch.save(create_model("resnet18_bn", 1, 10, (8, 8)).state_dict(), path)
    return {"protocol": "adversarial",
            "params": {"dataset": "digits", "seeds": [0], "ipc": 1, "attacks": ["fgsm"], "attack_size": 10},
            "grid": {"method": ["released"]},
            "methods": {"released": {"kind": "checkpoint", "model": "convnet", "path": str(tmp / "released_seed{seed}.pt"),
                                     "expected_accuracy": "unknown"}}}


def _nas(rows: list[str], columns=("ArchitectureString", "accuracy"), num_archs: int = 2):
    def build(tmp: Path):
        csv = tmp / "gt.csv"
        csv.write_text(",".join(columns) + "\n" + "".join(f"{a},{50 + i}\n" for i, a in enumerate(rows)))
        return {"protocol": "nas", "params": {"dataset": "digits", "seeds": [0], "recipe": {"epochs": 1},
                                              "real_recipe": {"epochs": 1}, "ground_truth": str(csv),
                                              "gt_column": "accuracy", "num_archs": num_archs},
                "grid": {"method": ["random"], "ipc": [1]}}
    return build


def _npz(name: str, **arrays):
    def write(tmp: Path) -> Path:
        path = tmp / name
        np.savez(path, **{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in arrays.items()})
        return path
    return _with_set(write)


def _folder_with(extra: str):
    """A 10-class ImageFolder set with one more entry in class 0: a dangling link or a GIF."""
    def write(tmp: Path) -> Path:
        root = tmp / "folder_set"
        for c in range(10):
            _png(root / str(c) / "a.png", np.full((8, 8), 128, dtype=np.uint8))
        if extra == "dangling":
            (root / "0" / "b.png").symlink_to(tmp / "nowhere.png")
        else:
            Image.fromarray(np.full((8, 8), 128, dtype=np.uint8)).save(root / "0" / "c.gif")
        return root
    return _with_set(write)


def _methods(methods: dict, grid=None):
    return lambda tmp: {**BASE, "grid": grid or BASE["grid"], "methods": methods}


def _empty_data_root(tmp: Path):
    (tmp / "empty").mkdir()
    return _params(data_root=str(tmp / "empty"))(tmp) | {"params": {**BASE["params"], "dataset": "mnist",
                                                                    "data_root": str(tmp / "empty")}}


ALIAS_BOMB = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
              "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
              "protocol: label_robust\nparams: {dataset: digits, seeds: *f}\n")

images, labels = good_images()
TABLE = [
    # (id, builder, message regex; the file named in the message is checked separately)
    ("truncated-pt", _with_set(_truncated), r"truncated\.pt: unreadable or corrupt file"),
    ("pickle-runs-code", _with_set(_pickle_bomb), r"bomb\.pt: refused to unpickle.*posix\.system.*`trusted: true`"),
    ("images-int32", _pt("int.pt", {"images": (images * 100).int(), "labels": labels}),
     r"int\.pt: images must be float pixels, got dtype torch\.int32"),
    ("labels-float", _pt("flabels.pt", {"images": images, "labels": labels.float()}),
     r"flabels\.pt: labels must be integer class indices, got dtype torch\.float32"),
    ("nan-images", _pt("nan.pt", {"images": images.masked_fill(images > 0.9, float("nan")), "labels": labels}),
     r"nan\.pt: images contain \d+ NaN/Inf values"),
    ("inf-images", _pt("inf.pt", {"images": images.masked_fill(images > 0.9, float("inf")), "labels": labels}),
     r"inf\.pt: (images contain \d+ NaN/Inf values|read as pixels but values span)"),
    ("labels-out-of-range", _pt("range.pt", {"images": images, "labels": labels + 1}),
     r"range\.pt: labels out of range: expected 0\.\.9 for digits, found 10"),
    ("class-count", _pt("nine.pt", {"images": images[:9], "labels": labels[:9]}),
     r"nine\.pt: classes missing \(no images\): 9 \(9\)"),
    ("ipc-mismatch", _pt("ipc2.pt", lambda: dict(zip(("images", "labels"), good_images(2)))),
     r"ipc2\.pt: holds 2 images per class, but the grid cell asks for ipc=1"),
    ("image-size", _pt("big.pt", lambda: dict(zip(("images", "labels"), good_images(1, (1, 16, 16))))),
     r"big\.pt: image shape does not match the dataset: expected \(1, 8, 8\) for digits, got \(1, 16, 16\)"),
    ("channels", _pt("rgb.pt", lambda: dict(zip(("images", "labels"), good_images(1, (3, 8, 8))))),
     r"rgb\.pt: image shape does not match the dataset: expected \(1, 8, 8\) for digits, got \(3, 8, 8\)"),
    ("empty-set", _pt("empty.pt", {"images": torch.zeros(0, 1, 8, 8), "labels": torch.zeros(0, dtype=torch.long)}),
     r"empty\.pt: the set holds no images"),
    ("dc-values-x1e30", _with_set(_dc_scaled), r"dc_scaled\.pt: de-normalised with digits's mean/std .* far outside"),
    ("imagefolder-duplicate-class", _folder([*map(str, range(10)), "03"]),
     r"folder_set: two class folders name the same class"),
    ("imagefolder-missing-class", _folder([str(c) for c in range(9)]), r"folder_set: classes missing \(no images\): 9"),
    ("unknown-top-level-key", _params(colour="red"), r"unknown top-level key\(s\) \['colour'\]"),
    ("unknown-param", _params(epoch=3), r"unknown parameter\(s\) \['epoch'\]"),  # a typo of epochs
    ("wrong-type-ipc", _params(grid={"method": ["random"], "ipc": ["one"]}), r"ipc must be a positive integer, got 'one'"),
    ("wrong-type-seeds", _params(seeds="0"), r"seeds must be a non-empty list of integers"),
    ("negative-epochs", _params(recipe={"epochs": -3}), r"epochs must be a positive integer, got -3"),
    ("ipc-0", _params(grid={"method": ["random"], "ipc": [0]}), r"ipc must be a positive integer, got 0"),
    ("lr-nan", _text("protocol: label_robust\nparams: {dataset: digits, recipe: {lr: .nan}}\n"
                     "grid: {method: [random], ipc: [1]}\n"),
     r"lr must be a finite non-negative number, got nan"),
    ("device-tpu", _params(device="tpu"), r"device must be auto, cpu, cuda, cuda:N or mps, got 'tpu'"),
    ("data-root-missing", _params(data_root="/nonexistent/ddlib/data"), r"data_root: /nonexistent/ddlib/data does not exist"),
    ("teacher-for-another-arch", _teacher_for_another_arch,
     r"convnet_teacher\.pt: does not fit 'resnet18_bn' for digits"),
    ("model-checkpoint-for-another-arch", _model_for_another_arch,
     r"released_seed0\.pt: does not fit 'convnet' for digits"),
    ("nas-csv-missing-columns", _nas(NAS_ARCHS, columns=("arch_string", "accuracy")),
     r"gt\.csv: no architecture column \(ArchitectureString or arch\)"),
    ("nas-csv-too-few-rows", _nas(NAS_ARCHS, num_archs=5),
     r"gt\.csv: cannot draw 5 distinct architectures from a table of 3"),
    ("params-not-utf8", _text("protocol: label_robust\nparams: {dataset: digits}\n# caf\xe9\n".encode("latin-1")),
     r"not UTF-8 text \(byte 0xe9 on line 3\)"),
    # the third round (issue 21)
    ("flag-string-false-npz", _npz("strflag.npz", images=images, labels=labels, normalized=np.array("False")),
     r"strflag\.npz: normalized must be true or false \(a boolean\), got 'False' \(a string\)"),
    ("flag-string-false-pt", _pt("strflag.pt", {"images": images, "labels": labels, "normalized": "false"}),
     r"strflag\.pt: normalized must be true or false \(a boolean\), got 'false' \(a string\)"),
    ("declared-pixels-x1e4", _pt("x1e4.pt", {"images": images * 1e4, "labels": labels, "normalized": False}),
     r"x1e4\.pt: read as pixels \(declared\) but values span \[.*\], far outside \[0, 1\]"),
    ("declared-normalised-x1e30", _pt("x1e30.pt", {"images": images * 1e30, "labels": labels, "normalized": True}),
     r"x1e30\.pt: de-normalised with digits's mean/std \(declared\), the images span"),
    ("method-source-not-a-mapping", _methods({"x": "file.pt"}, {"method": ["x"], "ipc": [1]}),
     r"methods\.x: method 'x': source must be a mapping with a 'kind'.*got 'file\.pt'"),
    ("method-source-a-list", _methods({"x": [1, 2]}, {"method": ["x"], "ipc": [1]}),
     r"methods\.x: method 'x': source must be a mapping with a 'kind'.*got \[1, 2\]"),
    ("method-name-a-list", _params(grid={"method": [["a", "b"]], "ipc": [1]}),
     r"grid\.method: each method must be a name, got \['a', 'b'\]"),
    ("epochs-true", _params(recipe={"epochs": True}), r"epochs must be a positive integer, got True"),
    ("seed-overflow", _params(seeds=[99999999999999999999]),
     r"seeds must lie in 0\.\.4294967295 .*got 99999999999999999999"),
    ("data-root-without-data", _empty_data_root, r"dataset 'mnist' at .*empty: .*"),
    ("imagefolder-superscript-class", _folder([*map(str, range(9)), "\u00b2"]),
     r"folder_set: class folders not recognised: \u00b2"),
    ("imagefolder-dangling-link", _folder_with("dangling"), r"folder_set: 0/b\.png is a dangling link"),
    ("imagefolder-gif", _folder_with("gif"), r"folder_set: 0/c\.gif is an image format this reader does not take \(\.gif\)"),
    ("yaml-alias-bomb", _text(ALIAS_BOMB), r"expands to over 1,000,000 values through its aliases"),
    ("duplicate-yaml-key", _text("protocol: label_robust\nparams: {dataset: digits}\ngrid: {method: [random], ipc: [1]}\n"
                                 "grid: {method: [dm], ipc: [1]}\n"),
     r"duplicate key 'grid' \(first given on line 3\)"),
    # issue 53.7: control bytes, a learned lr or teacher weights no training can use, members past the data
    ("params-nul-byte", _text(b"protocol: label_robust\nparams: {dataset: digits}\x00\n"),
     r"control character 0x00 on line 2, column 26"),
    ("params-bel-byte", _text('protocol: label_robust\nparams: {dataset: "dig\x07its"}\n'),
     r"control character 0x07 on line 2, column 23"),
    ("learned-lr-negative", _pt("lrneg.pt", {"images": images, "labels": labels, "lr": -1.0}),
     r"lrneg\.pt: the learned learning rate \(lr\) must be a positive finite number, got -1\.0"),
    ("learned-lr-nan-mtt", _with_set(_mtt_nan_lr),
     r"mtt_set: the learned learning rate \(lr\) must be a positive finite number, got nan"),
    ("teacher-nan-weights", _nan_teacher,
     r"nan_teacher\.pt: 1 weight tensor\(s\) hold NaN/Inf values \(conv1\.weight\)"),
    ("privacy-members-past-the-data", _privacy_members(100000, 50),
     r"members must be at most 25 here \(half of the smaller split: \d+ training and 50 test images of digits\), "
     r"got 100000"),
]


@pytest.mark.parametrize("case,build,message", TABLE, ids=[row[0] for row in TABLE])
def test_hostile_input_is_refused_before_anything_runs(case, build, message, tmp_path, mlflow_store, capsys):
    content = build(tmp_path)
    params = tmp_path / "grid.yaml"
    if isinstance(content, bytes):
        params.write_bytes(content)
    elif isinstance(content, str):
        params.write_text(content)
    else:
        params.write_text(yaml.safe_dump(content))
    assert cli_main(["run", str(params)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and len(err) < 1000, err  # one line of normal size
    assert err.startswith(f"error: {params}: "), err  # names the params file ...
    assert re.search(message, err), err  # ... and the file and the problem
    assert not (tmp_path / "PWNED").exists()  # nothing was unpickled into running code
    assert not mlflow_store.exists() or not any(mlflow_store.iterdir())  # nothing written to the store


def test_the_table_covers_every_case_of_the_issue():
    ids = {row[0] for row in TABLE}
    assert len(TABLE) == 50 and len(ids) == len(TABLE)


# --------------------------------------------------------------------------- what reads correctly now


def test_16_bit_png_keeps_its_scale(tmp_path):
    """A 16-bit grayscale PNG is scaled from 0-65535 (PIL's convert("L") clipped it: every pixel
    above 255 became white)."""
    digits = load_dataset("digits")
    root = tmp_path / "set16"
    value = 32768  # half of 16-bit full scale
    for c in range(10):
        _png(root / str(c) / "a.png", np.full((8, 8), value, dtype=np.uint16))
    ds = load(root, digits)
    assert Image.open(root / "0" / "a.png").mode.startswith("I")
    assert torch.allclose(ds.images, torch.full_like(ds.images, value / 65535), atol=1e-6)

    # the dataset loaders (ImageFolder trees, decoded to uint8): 32768 / 257 -> 128, not clipped to 255
    from ddlib.data.decode import _decode_files

    decoded = _decode_files(sorted(str(p) for p in root.rglob("*.png")), channels=None)
    assert decoded.shape == (10, 1, 8, 8) and decoded.dtype == np.uint8 and set(np.unique(decoded)) == {128}


def test_uint8_images_in_a_dc_file_are_pixels_not_rescaled_twice(tmp_path):
    digits = load_dataset("digits")
    pixels = torch.arange(10 * 64, dtype=torch.int64).remainder(256).to(torch.uint8).view(10, 1, 8, 8)
    path = tmp_path / "dc_uint8.pt"
    torch.save({"data": [[pixels, torch.arange(10)]]}, path)
    ds = load(path, digits)
    assert torch.equal(ds.images, pixels.float() / 255)  # not de-normalised on top


def test_braces_in_a_file_name_are_literal(tmp_path, monkeypatch):
    images, labels = good_images()
    torch.save({"images": images, "labels": labels}, tmp_path / "set{v2}_ipc1.pt")
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "grid.yaml"
    params.write_text(yaml.safe_dump({**BASE, "methods": {"pub": {"kind": "file", "path": "set{v2}_ipc{ipc}.pt"}}}))
    cell = expand(load_grid(params))[0]
    from ddlib.methods.sources import obtain_set

    out = obtain_set("pub", cell["source"], load_dataset("digits"), 1)
    assert torch.equal(out.images, images)


def test_relative_teacher_checkpoints_are_taken_from_where_ddlib_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "grid.yaml"
    params.write_text(yaml.safe_dump(_params(preset="sre2l", teacher_checkpoints=["teachers/t0.pt"])(tmp_path)))
    (cell,) = expand(load_grid(params))
    assert cell["teacher_checkpoints"] == [str(tmp_path / "teachers" / "t0.pt")]


# --------------------------------------------------------------------------- trust


def _dc_file(path: Path, accs) -> Path:
    images, labels = good_images()
    torch.save({"data": [[images, labels]], "accs_all_exps": {"ConvNet": accs}}, path)
    return path


def test_dc_files_with_numpy_scalars_load_safely_without_trust(tmp_path):
    """DC-format files keep their accuracies as numpy.float64: the allow-list (weights_only=True)
    suffices, no full unpickling and no `trusted: true` needed."""
    from ddlib.data.formats import torch_load

    path = _dc_file(tmp_path / "dc.pt", [np.float64(0.5), np.float64(0.25)])
    obj, safe = torch_load(path)
    assert safe and obj["accs_all_exps"]["ConvNet"] == [0.5, 0.25]
    assert load(path, load_dataset("digits")).provenance["accs_all_exps"] == {"ConvNet": [0.5, 0.25]}


def test_shared_dc_files_load_with_the_allow_list(shared_data):
    from ddlib.data.formats import torch_load

    files = sorted((shared_data / "distilled").glob("dc_*.pt"))
    assert files
    for path in files:
        obj, safe = torch_load(path)
        assert safe, path  # weights_only=True with the numpy allow-list: no trusted: true needed
        assert isinstance(obj["accs_all_exps"]["ConvNet"][0], np.floating)


def test_untrusted_file_needing_unpickling_is_refused_and_trusted_true_loads_it(tmp_path):
    from fractions import Fraction

    digits = load_dataset("digits")
    images, labels = good_images()
    path = tmp_path / "legacy.pt"
    torch.save({"images": images, "labels": labels, "provenance": {"ratio": Fraction(1, 3)}}, path)
    with pytest.raises(DistilledSetError, match=r"legacy\.pt: refused to unpickle.*fractions\.Fraction.*`trusted: true`"):
        load(path, digits)
    assert torch.equal(load(path, digits, trusted=True).images, images)

    from ddlib.methods.sources import obtain_set, validate_source

    spec = validate_source("legacy", {"kind": "file", "path": str(path), "trusted": True})
    assert torch.equal(obtain_set("legacy", spec, digits, 1).images, images)
    with pytest.raises(ValueError, match="trusted has the wrong type"):
        validate_source("legacy", {"kind": "file", "path": str(path), "trusted": "yes"})


def test_a_dry_run_unpickles_nothing_even_for_a_trusted_file(tmp_path, mlflow_store, capsys):
    """`trusted: true` allows full unpickling when the set runs; a dry run (of a grid, or of `ddlib
    score`) runs no file's code: it says what it would load, and the payload never runs."""
    path = _pickle_bomb(tmp_path)
    grid = {**BASE, "methods": {"pub": {"kind": "file", "path": str(path), "trusted": True}}}
    params = tmp_path / "grid.yaml"
    params.write_text(yaml.safe_dump(grid))
    assert cli_main(["run", str(params), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"input file cell pub-ipc1-convnet: {path}: not loaded (trusted: true" in out, out
    assert not (tmp_path / "PWNED").exists()
    assert cli_main(["score", str(path), "--dataset", "digits", "--trusted", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "a dry run does not unpickle" in err and "give --ipc" in err and err.count("\n") == 1
    assert cli_main(["score", str(path), "--dataset", "digits", "--trusted", "--dry-run", "--ipc", "1"]) == 0
    assert "not loaded (trusted: true" in capsys.readouterr().out
    assert not (tmp_path / "PWNED").exists()
    assert not mlflow_store.exists() or not (mlflow_store / "mlflow.db").exists()  # a dry run writes no store


def test_a_set_whose_file_name_is_not_utf8_is_refused_before_mlflow(tmp_path, mlflow_store, capsys):
    raw = os.fsencode(tmp_path) + b"/set\xff.npz"
    np.savez(raw.decode("utf-8", "surrogateescape"), images=images.numpy(), labels=labels.numpy())
    name = os.fsdecode(raw)
    assert cli_main(["score", name, "--dataset", "digits"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the file name holds bytes that are not UTF-8; rename it" in err, err
    assert not (mlflow_store / "mlflow.db").exists()


def test_an_imagefolder_set_reads_bmp_files_beside_png(tmp_path):
    root = tmp_path / "set"
    for c in range(10):
        _png(root / str(c) / "a.png", np.full((8, 8), 64 * (c % 4), dtype=np.uint8))
    Image.fromarray(np.full((8, 8), 255, dtype=np.uint8)).save(root / "0" / "b.bmp")
    (root / "0" / ".DS_Store").write_bytes(b"\0")  # hidden files are skipped
    ds = load(root, load_dataset("digits"), allow_unequal=True)
    assert ds.class_counts[0] == 2 and float(ds.images[ds.labels == 0].max()) == 1.0


# --------------------------------------------------------------------------- non-finite training


def test_training_whose_loss_becomes_nan_fails_naming_evaluation_and_epoch(mlflow_store):
    from ddlib.store import tracking
    from ddlib.engine.train import NonFiniteLossError
    from ddlib.protocols import label_robust

    cell = label_robust.open_cell(dataset="digits", method="random", ipc=1, seeds=[0],
                                  recipe={"epochs": 30, "lr": 1e12}, real_recipe={"epochs": 1}, lr_policy="fixed")
    distilled = label_robust.obtain(cell)
    with pytest.raises(NonFiniteLossError, match=r"syn_hard: training loss became (nan|inf) at epoch \d+ of 30"):
        label_robust.evaluate(cell, distilled)
    run = tracking.client().get_run(cell.run_id)
    assert run.info.status == "FAILED" and "syn_hard" in run.data.tags["ddlib.error"]
    assert "lrs_mean" not in run.data.metrics
